"""A simulated request's answer as each API gives it (OpenAI chat and completions, OpenAI
Responses, Anthropic Messages): streamed as server-sent events, token by token as the engine
makes them, or collected into one body; and its error bodies."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from aiohttp import web

from .._clock import now_ns
from .engine import SimRequest
from .faults import FaultStats, StreamFaults

# Anthropic's error types for the OpenAI ones the simulator gives
_ANTHROPIC_ERRORS = {
    "NotFoundError": "not_found_error",
    "rate_limit_exceeded": "rate_limit_error",
    "server_error": "api_error",
}


def error_body(message: str, kind: str, code: int, api: str = "chat") -> dict[str, object]:
    """An error as ``api`` words it: Anthropic's for messages, OpenAI's for the rest."""
    if api == "messages":
        return {"type": "error", "error": {"type": _ANTHROPIC_ERRORS.get(kind, kind), "message": message}}
    return {"error": {"message": message, "type": kind, "code": code}}


def sse(payload: dict[str, object], event: str | None = None) -> bytes:
    data = b"data: " + json.dumps(payload).encode() + b"\n\n"
    return data if event is None else b"event: " + event.encode() + b"\n" + data


@dataclass
class Answer:
    """One request's answer, written as the engine hands out its tokens; a subclass per API
    says what goes before the tokens, each token's event, what goes after, and the whole body."""

    model: str
    number: int  # the server's count of requests: the answer's id
    request: SimRequest
    caching: bool  # report cached prompt tokens, as servers with prefix caching do
    tool_call: tuple[str, str] | None = None  # (id, name): the tokens stream as its arguments
    include_usage: bool = False  # chat's stream_options.include_usage; the other APIs always say

    @property
    def tokens(self) -> list[str]:
        return self.request.tokens

    @property
    def finish(self) -> str:
        return self.request.finish_reason

    def opening(self) -> bytes:
        """The events before the first token."""
        return b""

    def token_event(self, i: int, token: str) -> bytes:
        raise NotImplementedError

    def closing(self, text: str) -> bytes:
        """The events after the last token; ``text`` is every token's."""
        raise NotImplementedError

    def whole(self, text: str) -> dict[str, object]:
        """The answer as one body."""
        raise NotImplementedError

    def error_event(self) -> bytes:
        raise NotImplementedError

    async def collect(self) -> dict[str, object]:
        """The whole answer in one body, once the engine has made every token."""
        parts = []
        while (token := await self.request.out.get()) is not None:
            parts.append(token)
        return self.whole("".join(parts))

    async def stream(
        self, request: web.Request, faults: StreamFaults, stall_s: float, stats: FaultStats
    ) -> web.StreamResponse:
        """Each token as an event as the engine makes it, with ``faults`` injected at their
        token, between the API's opening and closing events."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        opening = self.opening()
        if opening:
            await resp.write(opening)
        parts: list[str] = []
        while (token := await self.request.out.get()) is not None:
            if len(parts) == faults.at and not await self._inject(request, resp, faults, stall_s, stats):
                return resp
            await resp.write(self.token_event(len(parts), token))
            parts.append(token)
        await resp.write(self.closing("".join(parts)))
        await resp.write_eof()
        stats.completed += 1
        return resp

    async def _inject(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        faults: StreamFaults,
        stall_s: float,
        stats: FaultStats,
    ) -> bool:
        """Inject the stream's faults; False when one of them ends it."""
        key = self.request.key
        if faults.error_event:
            stats.inject(key, "error_event")
            await resp.write(self.error_event())
            return False
        if faults.disconnect:
            stats.inject(key, "disconnect")
            assert request.transport is not None
            request.transport.close()
            return False
        if faults.malformed:
            stats.inject(key, "malformed")
            await resp.write(b'data: {"choices": [{"delta": \n\n')
        if faults.stall:
            stats.inject(key, "stall")
            await asyncio.sleep(stall_s)
        return True


@dataclass
class Completion(Answer):
    """OpenAI's chat completion: a role-only chunk, a chunk per token, the finish, the usage
    when asked for, and [DONE]."""

    chat = True
    _template: str = field(init=False, default="")

    def __post_init__(self) -> None:
        # Token chunks go out through a fixed template: the per-token path of a zero-delay
        # benchmark must cost the server as little as the client.
        template = json.dumps(self._chunk("\x00", None)).replace("%", "%%").replace('"\\u0000"', "%s")
        self._template = "data: " + template[:-1] + ', "ipw_sent_ns": %d, "ipw_tokens": 1}\n\n'

    @property
    def rid(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.number}"

    def _chunk(
        self, text: str | None, finish: str | None, role: bool = False, header: bool = False
    ) -> dict[str, object]:
        if not self.chat:
            choice: dict[str, object] = {"index": 0, "text": text or "", "finish_reason": finish}
            return self._envelope("text_completion", choice)
        delta: dict[str, object] = {"role": "assistant", "content": ""} if role else {}
        if text is not None and self.tool_call is not None:
            call: dict[str, object] = {"index": 0, "function": {"arguments": text}}
            if header:  # the first piece names the call, as OpenAI's stream does
                call_id, name = self.tool_call
                call = {
                    "index": 0,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": text},
                }
            delta["tool_calls"] = [call]
        elif text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return self._envelope("chat.completion.chunk", choice)

    def _envelope(self, kind: str, choice: dict[str, object]) -> dict[str, object]:
        return {
            "id": self.rid,
            "object": kind,
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
        }

    def _usage(self) -> dict[str, object]:
        prompt = self.request.prompt_tokens
        usage: dict[str, object] = {
            "prompt_tokens": prompt,
            "completion_tokens": len(self.tokens),
            "total_tokens": prompt + len(self.tokens),
        }
        if self.caching:
            usage["prompt_tokens_details"] = {"cached_tokens": self.request.cached_tokens}
        return usage

    def opening(self) -> bytes:
        # a role-only first chunk, as vLLM and llama.cpp send
        return sse(self._chunk(None, None, role=True)) if self.chat else b""

    def token_event(self, i: int, token: str) -> bytes:
        if i == 0 and self.tool_call is not None:
            return sse(self._chunk(token, None, header=True) | {"ipw_sent_ns": now_ns(), "ipw_tokens": 1})
        return (self._template % (json.dumps(token), now_ns())).encode()

    def closing(self, text: str) -> bytes:
        events = [sse(self._chunk(None if self.chat else "", self.finish))]
        if self.include_usage:
            final = self._chunk(None, None)
            final["choices"] = []
            final["usage"] = self._usage()
            events.append(sse(final))
        events.append(b"data: [DONE]\n\n")
        return b"".join(events)

    def error_event(self) -> bytes:
        return sse(error_body("simulated engine failure", "server_error", 500))

    def whole(self, text: str) -> dict[str, object]:
        message: dict[str, object] = {"role": "assistant", "content": text}
        if self.tool_call is not None:
            call_id, name = self.tool_call
            function = {"name": name, "arguments": text}
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        choice: dict[str, object] = (
            {"index": 0, "message": message, "finish_reason": self.finish}
            if self.chat
            else {"index": 0, "text": text, "finish_reason": self.finish}
        )
        return self._envelope("chat.completion" if self.chat else "text_completion", choice) | {
            "usage": self._usage()
        }


@dataclass
class TextCompletion(Completion):
    """OpenAI's (text) completion: chunks of ``text``, no role chunk, no tool calls."""

    chat = False


@dataclass
class ResponsesAnswer(Answer):
    """OpenAI's Responses API: typed events naming themselves in ``event:`` and ``type``, one
    output item (a message, or the function call), and the whole response, usage included,
    only in the last event: ``response.completed``, or ``response.incomplete`` when the
    answer was cut at ``max_output_tokens``."""

    _sequence: int = field(init=False, default=0)

    def _event(self, kind: str, **fields: object) -> bytes:
        self._sequence += 1
        return sse({"type": kind, "sequence_number": self._sequence - 1, **fields}, event=kind)

    @property
    def _item_id(self) -> str:
        return f"{'fc' if self.tool_call else 'msg'}_{self.number}"

    def _item(self, text: str, status: str) -> dict[str, object]:
        if self.tool_call is not None:
            call_id, name = self.tool_call
            kind = {"type": "function_call", "call_id": call_id, "name": name, "arguments": text}
            return {"id": self._item_id, "status": status} | kind
        content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
        return {
            "id": self._item_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def _status(self) -> str:
        return "incomplete" if self.finish == "length" else "completed"

    def _response(self, status: str, output: list[object], usage: object = None) -> dict[str, object]:
        return {
            "id": f"resp_{self.number}",
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "model": self.model,
            "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "error": None,
            "instructions": None,
            "tools": [],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "usage": usage,
        }

    def _usage(self) -> dict[str, object]:
        prompt, output = self.request.prompt_tokens, len(self.tokens)
        return {
            "input_tokens": prompt,  # cached ones included, counted again in the details
            "input_tokens_details": {"cached_tokens": self.request.cached_tokens},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + output,
        }

    def opening(self) -> bytes:
        events = [
            self._event("response.created", response=self._response("in_progress", [])),
            self._event("response.output_item.added", output_index=0, item=self._item("", "in_progress")),
        ]
        if self.tool_call is None:
            part = {"type": "output_text", "text": "", "annotations": []}
            added = {"item_id": self._item_id, "output_index": 0, "content_index": 0, "part": part}
            events.append(self._event("response.content_part.added", **added))
        return b"".join(events)

    def token_event(self, i: int, token: str) -> bytes:
        stamp = {"ipw_sent_ns": now_ns(), "ipw_tokens": 1}
        if self.tool_call is not None:
            kind, where = "response.function_call_arguments.delta", {}
        else:
            kind, where = "response.output_text.delta", {"content_index": 0, "logprobs": []}
        return self._event(kind, item_id=self._item_id, output_index=0, delta=token, **where, **stamp)

    def closing(self, text: str) -> bytes:
        at = {"item_id": self._item_id, "output_index": 0}
        if self.tool_call is not None:
            events = [self._event("response.function_call_arguments.done", **at, arguments=text)]
        else:
            part = {"type": "output_text", "text": text, "annotations": []}
            events = [
                self._event("response.output_text.done", **at, content_index=0, text=text, logprobs=[]),
                self._event("response.content_part.done", **at, content_index=0, part=part),
            ]
        item = self._item(text, "completed")
        events.append(self._event("response.output_item.done", output_index=0, item=item))
        status = self._status()
        events.append(
            self._event(f"response.{status}", response=self._response(status, [item], self._usage()))
        )
        return b"".join(events)

    def error_event(self) -> bytes:
        return self._event("error", code="server_error", message="simulated engine failure", param=None)

    def whole(self, text: str) -> dict[str, object]:
        return self._response(self._status(), [self._item(text, "completed")], self._usage())


def _arguments(text: str) -> object:
    """A tool call's streamed arguments as the object Anthropic's ``input`` is; arguments cut
    at max_tokens are no JSON, and give none."""
    try:
        return json.loads(text)
    except ValueError:
        return {}


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


@dataclass
class MessagesAnswer(Answer):
    """Anthropic's Messages API: ``message_start`` with the prompt's usage, one content block
    (text, or the tool_use whose input the tokens are) streamed by deltas, ``message_delta``
    with the stop reason and output tokens, ``message_stop``. Its ``input_tokens`` leaves out
    the prompt tokens read from the cache, which ``cache_read_input_tokens`` counts."""

    def _event(self, kind: str, **fields: object) -> bytes:
        return sse({"type": kind, **fields}, event=kind)

    def _usage(self, output: int) -> dict[str, object]:
        cached = self.request.cached_tokens
        return {
            "input_tokens": self.request.prompt_tokens - cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": output,
        }

    def _message(self, content: list[object], stop: str | None, output: int) -> dict[str, object]:
        return {
            "id": f"msg_{self.number}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": self._usage(output),
        }

    def _block(self, text: str, whole: bool) -> dict[str, object]:
        if self.tool_call is None:
            return {"type": "text", "text": text}
        call_id, name = self.tool_call
        return {"type": "tool_use", "id": call_id, "name": name, "input": _arguments(text) if whole else {}}

    def _start(self) -> bytes:
        """Sent with the first token, once the engine has admitted the request: the prompt's
        cached tokens are known only then."""
        return b"".join(
            [
                self._event("message_start", message=self._message([], None, 1)),
                self._event("content_block_start", index=0, content_block=self._block("", whole=False)),
                self._event("ping"),
            ]
        )

    def token_event(self, i: int, token: str) -> bytes:
        delta = (
            {"type": "text_delta", "text": token}
            if self.tool_call is None
            else {"type": "input_json_delta", "partial_json": token}
        )
        event = self._event("content_block_delta", index=0, delta=delta, ipw_sent_ns=now_ns(), ipw_tokens=1)
        return self._start() + event if i == 0 else event

    def closing(self, text: str) -> bytes:
        stop = {"stop_reason": _STOP_REASONS.get(self.finish, self.finish), "stop_sequence": None}
        return b"".join(
            [
                b"" if self.tokens else self._start(),
                self._event("content_block_stop", index=0),
                self._event("message_delta", delta=stop, usage={"output_tokens": len(self.tokens)}),
                self._event("message_stop"),
            ]
        )

    def error_event(self) -> bytes:
        return self._event("error", error={"type": "api_error", "message": "simulated engine failure"})

    def whole(self, text: str) -> dict[str, object]:
        stop = _STOP_REASONS.get(self.finish, self.finish)
        return self._message([self._block(text, whole=True)], stop, len(self.tokens))


REPLIES: dict[str, type[Answer]] = {
    "chat": Completion,
    "completions": TextCompletion,
    "responses": ResponsesAnswer,
    "messages": MessagesAnswer,
}
