"""What the proxy reads from a call's body, and the one change it may make to it.

A call's energy is split by its tokens, and a chat or completions stream carries its token
counts only when asked (OpenAI's ``stream_options.include_usage``; the Responses and Messages
APIs always send them). A streamed call that does not say either way is sent asking; the
usage-only event that brings (no choices, the call's usage) is the proxy's, and is kept from
the caller, who gets every other event as the upstream sent it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec


class _Body(msgspec.Struct):
    """The fields the proxy looks at; the rest (the conversation's text) is only skipped over."""

    stream: object = None
    stream_options: object = None
    messages: list[msgspec.Raw] | None = None
    input: list[msgspec.Raw] | str | None = None  # OpenAI Responses: the messages, or one prompt
    prompt: object = None


class _Message(msgspec.Struct):  # a message, or a Responses input item
    content: object = None
    output: object = None  # a function call's output, sent back as a Responses input item


_body = msgspec.json.Decoder(_Body).decode
_message = msgspec.json.Decoder(_Message).decode
_ASK_USAGE = b',"stream_options":{"include_usage":true}}'


@dataclass(frozen=True)
class Call:
    """A call as the proxy forwards it: the bytes it sends, and whether it asked for usage."""

    sent: bytes
    asked_usage: bool  # the usage-only event of its stream is the proxy's, not the caller's
    _body: _Body | None

    def prompt(self) -> str:
        """What the call adds to its conversation: the last message's (or input item's) text,
        or the prompt."""
        body = self._body
        if body is None:
            return ""
        if isinstance(body.input, str):
            return body.input
        messages = body.messages or body.input
        if messages:
            try:
                last = _message(messages[-1])
            except (msgspec.DecodeError, msgspec.ValidationError):
                return ""
            content = last.output if last.content is None else last.content
            if isinstance(content, list):  # content parts (or blocks): their text
                return "\n".join(_text(p) for p in content if isinstance(p, dict))
            return "" if content is None else str(content)
        return body.prompt if isinstance(body.prompt, str) else ""


def _text(part: dict[str, object]) -> str:
    """A content part's text; an Anthropic ``tool_result`` block holds its result as its own
    ``content``, a string or text blocks (read one level deep: a caller's nesting is not ours
    to follow)."""
    if "text" in part:
        return str(part["text"])
    inner = part.get("content")
    if isinstance(inner, list):
        return "\n".join(str(p.get("text", "")) for p in inner if isinstance(p, dict))
    return "" if inner is None else str(inner)


def read_call(body: bytes, ask_usage: bool) -> Call:
    """``body`` read once; with ``ask_usage``, a streamed call that leaves usage open asks for it."""
    try:
        parsed = _body(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return Call(body, False, None)  # the upstream's to refuse
    if not ask_usage or parsed.stream is not True:
        return Call(body, False, parsed)
    options = parsed.stream_options
    if options is None:
        end = body.rstrip().rfind(b"}")  # a JSON object: its closing brace is its last byte
        return Call(body[:end] + _ASK_USAGE + body[end + 1 :], True, parsed)
    if isinstance(options, dict) and "include_usage" not in options:
        payload = msgspec.json.decode(body)
        payload["stream_options"] = options | {"include_usage": True}
        return Call(msgspec.json.encode(payload), True, parsed)
    return Call(body, False, parsed)  # the caller said


class _Event(msgspec.Struct):
    choices: list[msgspec.Raw] | None = None
    usage: object = None


_event = msgspec.json.Decoder(_Event).decode
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class WithoutUsage:
    """A stream's bytes for its caller less the usage-only event: whole events are passed on
    as they complete (a caller cannot use part of one), the rest when the stream ends."""

    def __init__(self) -> None:
        self._tail = b""

    def __call__(self, data: bytes) -> bytes:
        data = self._tail + data
        ends = list(_EVENT_END.finditer(data))
        if not ends:
            self._tail = data
            return b""
        cut = ends[-1].end()
        ready, self._tail = data[:cut], data[cut:]
        if b'"usage"' not in ready:
            return ready
        kept, start = [], 0
        for end in ends:
            event = ready[start : end.end()]
            if not _usage_only(event):
                kept.append(event)
            start = end.end()
        return b"".join(kept)

    def rest(self) -> bytes:
        tail, self._tail = self._tail, b""
        return tail


def _usage_only(event: bytes) -> bool:
    if b'"usage"' not in event:
        return False
    data = b"".join(line[5:].lstrip() for line in event.splitlines() if line.startswith(b"data:"))
    try:
        parsed = _event(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return parsed.choices == [] and parsed.usage is not None
