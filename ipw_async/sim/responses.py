"""A simulated request's answer as the OpenAI API gives it: streamed as server-sent events,
token by token as the engine makes them, or collected into one body; and its error bodies."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from aiohttp import web

from .._clock import now_ns
from .engine import SimRequest
from .faults import FaultStats, StreamFaults


def error_body(message: str, kind: str, code: int) -> dict[str, object]:
    return {"error": {"message": message, "type": kind, "code": code}}


def sse(payload: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


@dataclass
class Completion:
    """One request's completion, written as the engine hands out its tokens."""

    chat: bool
    model: str
    rid: str
    request: SimRequest
    caching: bool  # report cached prompt tokens, as servers with prefix caching do
    tool_call: tuple[str, str] | None = None  # (id, name): the tokens stream as its arguments

    @property
    def tokens(self) -> list[str]:
        return self.request.tokens

    @property
    def finish(self) -> str:
        return self.request.finish_reason

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

    async def collect(self) -> dict[str, object]:
        """The whole completion in one body, once the engine has made every token."""
        parts = []
        while (token := await self.request.out.get()) is not None:
            parts.append(token)
        text = "".join(parts)
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

    async def stream(
        self,
        request: web.Request,
        include_usage: bool,
        faults: StreamFaults,
        stall_s: float,
        stats: FaultStats,
    ) -> web.StreamResponse:
        """Each token as an SSE chunk as the engine makes it, with ``faults`` injected at their
        token; then the finish, the usage when asked for, and [DONE]."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if self.chat:  # a role-only first chunk, as vLLM and llama.cpp send
            await resp.write(sse(self._chunk(None, None, role=True)))
        # Token chunks go out through a fixed template: the per-token path of a zero-delay
        # benchmark must cost the server as little as the client.
        template = json.dumps(self._chunk("\x00", None)).replace("%", "%%").replace('"\\u0000"', "%s")
        template = "data: " + template[:-1] + ', "ipw_sent_ns": %d, "ipw_tokens": 1}\n\n'
        i = 0
        while (token := await self.request.out.get()) is not None:
            if i == faults.at and not await self._inject(request, resp, faults, stall_s, stats):
                return resp
            if i == 0 and self.tool_call is not None:
                header = self._chunk(token, None, header=True) | {"ipw_sent_ns": now_ns(), "ipw_tokens": 1}
                await resp.write(sse(header))
            else:
                await resp.write((template % (json.dumps(token), now_ns())).encode())
            i += 1
        await resp.write(sse(self._chunk(None if self.chat else "", self.finish)))
        if include_usage:
            final = self._chunk(None, None)
            final["choices"] = []
            final["usage"] = self._usage()
            await resp.write(sse(final))
        await resp.write(b"data: [DONE]\n\n")
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
            await resp.write(sse(error_body("simulated engine failure", "server_error", 500)))
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
