"""OpenAI-compatible streaming client: stamps every SSE event on arrival, parses it afterwards."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from ._clock import now_ns
from .records import ErrorType, RequestRecord, Status


class ServerUnreachable(Exception):
    """The server could not be used at all; the message says what to do."""


@dataclass(frozen=True)
class ClientConfig:
    base_url: str
    endpoint: str = "chat"  # chat | completions
    api_key: str | None = None
    max_tokens: int = 256
    temperature: float | None = 0.0
    params: dict[str, Any] = field(default_factory=dict)
    connect_timeout: float = 10.0
    read_timeout: float = 300.0
    max_connections: int = 64

    def __repr__(self) -> str:  # never print the key
        return f"ClientConfig(base_url={self.base_url!r}, endpoint={self.endpoint!r})"


def _classify(exc: BaseException, streaming: bool) -> ErrorType:
    """Map a transport failure to what happened.

    The aiohttp exception under httpx's is the truth: the transport maps every aiohttp
    connection error, a server hanging up mid-stream included, to httpx.ConnectTimeout.
    """
    chain: list[BaseException] = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 8:
        chain.append(chain[-1].__cause__)
    native = [e for e in chain if isinstance(e, aiohttp.ClientError | TimeoutError)]
    for e in native:
        if isinstance(e, aiohttp.ServerTimeoutError | TimeoutError):
            return ErrorType.TIMEOUT
        if isinstance(e, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
            return ErrorType.DISCONNECT
        if isinstance(e, aiohttp.ClientConnectorError):
            return ErrorType.CONNECT
        if isinstance(e, aiohttp.ClientConnectionError):
            return ErrorType.DISCONNECT if streaming else ErrorType.CONNECT
    if isinstance(exc, httpx.TimeoutException):
        return ErrorType.TIMEOUT
    if isinstance(exc, httpx.ConnectError):
        return ErrorType.CONNECT
    if isinstance(exc, httpx.TransportError):
        return ErrorType.DISCONNECT if streaming else ErrorType.CONNECT
    return ErrorType.OTHER


def _describe(exc: BaseException) -> str:
    """The failure in the words of the exception that saw it (aiohttp's, not httpx's remap)."""
    native = exc
    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, aiohttp.ClientError | OSError | TimeoutError):
            native = cause
        cause = cause.__cause__
    return f"{type(native).__name__}: {native}".strip().rstrip(":")


def _stale(exc: BaseException, quick: bool) -> bool:
    """True when a request failed on a connection that was already closed: it could not be
    written, or (``quick``) the server's hang-up came back at once with no response."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, aiohttp.ClientConnectionResetError):
            return True
        if quick and isinstance(cause, aiohttp.ServerDisconnectedError):
            return True
        cause = cause.__cause__
    return False


def _error_message(body: bytes) -> str:
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return body[:200].decode("utf-8", "replace").strip()
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or err)[:300]
    return str(err)[:300]


_decode = json.JSONDecoder().decode  # on str: skips json.loads' byte-encoding sniffing


class StreamParser:
    """Reads SSE events into a record as they arrive: stamped on arrival, parsed right after.

    Parsing per read (rather than at the end of the stream) spreads the work, so no request
    holds the event loop for a whole stream's worth of JSON. ``t0_ns`` puts the server's own
    send stamps (absolute, same clock) on the run's timeline.

    A chunk is token-bearing when it carries content or reasoning text; role-only and
    usage-only chunks are not tokens. An error object in the stream makes the request fail.
    """

    __slots__ = ("_content", "_reasoning", "done", "record", "t0_ns")

    def __init__(self, record: RequestRecord, t0_ns: int = 0) -> None:
        self.record = record
        self.t0_ns = t0_ns
        self.done = False
        self._content: list[str] = []
        self._reasoning: list[str] = []

    def feed(self, t: int, raw: bytes) -> None:
        record = self.record
        if record.first_event_ns is None:
            record.first_event_ns = t
        if raw[:6] == b"data: " and b"\n" not in raw:  # the common case: one data line
            data = raw[6:]
        else:
            data = b"".join(line[5:].lstrip() for line in raw.split(b"\n") if line.startswith(b"data:"))
        if not data:
            return  # comments, keep-alives, event: lines without data
        if data == b"[DONE]":
            self.done = True
            return
        try:
            obj = _decode(data.decode())
        except (ValueError, UnicodeDecodeError):
            _fail(record, ErrorType.MALFORMED, f"event is not JSON: {data[:80]!r}")
            return
        if not isinstance(obj, dict):
            _fail(record, ErrorType.MALFORMED, f"event is not a JSON object: {data[:80]!r}")
            return
        if obj.get("error") is not None:
            _fail(record, ErrorType.STREAM, _error_message(data))
            return
        timings = obj.get("timings")  # llama.cpp's own account of the request
        if timings:
            record.server_prompt_ms = timings.get("prompt_ms")
            record.server_tpot_ms = timings.get("predicted_per_token_ms")
        usage = obj.get("usage")
        if usage:
            record.usage_output_tokens = usage.get("completion_tokens", record.usage_output_tokens)
            record.prompt_tokens = usage.get("prompt_tokens", record.prompt_tokens)
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                record.cached_prompt_tokens = details["cached_tokens"]
        for choice in obj.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            calls = None
            if delta is not None:
                text = delta.get("content")
                thought = delta.get("reasoning_content") or delta.get("reasoning")
                calls = delta.get("tool_calls")
                if calls:
                    _add_tool_calls(record, calls)
            else:
                text, thought = choice.get("text"), None
            if text or thought or calls:
                if record.first_token_ns is None:
                    record.first_token_ns = t
                record.last_token_ns = t
                record.chunk_ns.append(t)
                record.chunk_tokens.append(int(obj.get("ipw_tokens", 1)))
                server_ns = obj.get("ipw_sent_ns")
                record.chunk_server_ns.append(None if server_ns is None else server_ns - self.t0_ns)
                if text:
                    self._content.append(text)
                if thought:
                    self._reasoning.append(thought)
            if choice.get("finish_reason"):
                record.finish_reason = choice["finish_reason"]

    def close(self) -> None:
        """The stream ended: join the text, and fail the record if it ended too early."""
        record = self.record
        record.answer = "".join(self._content)
        record.reasoning = "".join(self._reasoning)
        if not self.done and record.finish_reason is None and record.status is Status.OK:
            said = "sent no event" if record.first_event_ns is None else "ended before it said it was done"
            _fail(record, ErrorType.DISCONNECT, f"the stream {said}")


def _add_tool_calls(record: RequestRecord, deltas: list[dict[str, Any]]) -> None:
    """Streamed tool calls arrive in pieces: the first names the call, the rest extend its
    JSON arguments; ``index`` says which call a piece belongs to."""
    calls = record.tool_calls
    for delta in deltas:
        index = delta.get("index", len(calls) - 1 if calls else 0)
        while len(calls) <= index:
            calls.append({"id": None, "name": "", "arguments": ""})
        call = calls[index]
        if delta.get("id"):
            call["id"] = delta["id"]
        function = delta.get("function") or {}
        if function.get("name"):
            call["name"] += function["name"]
        if function.get("arguments"):
            call["arguments"] += function["arguments"]


def apply_events(record: RequestRecord, events: list[tuple[int, bytes]], t0_ns: int = 0) -> None:
    """Fill a record from a whole stream's events (arrival time since run start, raw bytes)."""
    parser = StreamParser(record, t0_ns)
    for t, raw in events:
        parser.feed(t, raw)
    parser.close()


def _fail(record: RequestRecord, kind: ErrorType, message: str) -> None:
    if record.status is Status.OK:  # the first failure is the one that explains the rest
        record.status = Status.ERROR
        record.error_type = kind
        record.error_message = message


class ArrivalStamps:
    """Stamps bytes where they arrive: in the connection's ``data_received``, which the event
    loop runs for every readable socket before any waiting task resumes.

    With many streams, a task that stamps its own reads stamps late by however many other
    streams ran first; this does not. Each stamp is paired with the reader's running byte
    count, so an event gets the time of the read that completed it. It reaches into the
    aiohttp connection under httpx; where that shape is not found it stays inactive and the
    caller stamps its own reads.
    """

    def __init__(self, response: httpx.Response, t0_ns: int, headers_ns: int) -> None:
        self.points: list[tuple[int, int]] = []  # (payload bytes received so far, time)
        self._next = 0
        self._protocol: Any = None
        stream = getattr(response.stream, "_stream", response.stream)
        native = getattr(stream, "_aiohttp_response", None)
        connection = getattr(native, "connection", None)
        protocol = getattr(connection, "protocol", None)
        reader = getattr(native, "content", None)
        if protocol is None or not hasattr(reader, "total_bytes"):
            return
        # bytes that came in with the headers arrived when the headers did
        self.points.append((reader.total_bytes, headers_ns))
        original = protocol.data_received

        def stamped(data: bytes) -> None:
            t = now_ns() - t0_ns
            original(data)
            self.points.append((reader.total_bytes, t))

        protocol.data_received = stamped
        self._protocol = protocol

    @property
    def active(self) -> bool:
        return self._protocol is not None

    def time_of(self, offset: int) -> int | None:
        """When the byte at ``offset`` (exclusive end) arrived; offsets must not go backwards."""
        points = self.points
        i = self._next
        while i < len(points) and points[i][0] < offset:
            i += 1
        self._next = i
        return points[i][1] if i < len(points) else None

    def detach(self) -> None:
        if self._protocol is not None:
            del self._protocol.data_received  # back to the class's method before the pool reuses it
            self._protocol = None


class StreamingClient:
    """One connection pool sized to the load, no retries: a failed request is an outcome."""

    def __init__(self, config: ClientConfig, t0_ns: int) -> None:
        self.config = config
        self.t0_ns = t0_ns
        base = config.base_url.rstrip("/")
        self._url = f"{base}/chat/completions" if config.endpoint == "chat" else f"{base}/completions"
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        limit = config.max_connections

        def session() -> aiohttp.ClientSession:
            # Built here rather than by the transport: its default pool caps at 100 connections.
            connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, force_close=False)
            return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))

        self._http = httpx.AsyncClient(
            transport=AiohttpTransport(client=session),
            headers=headers,
            timeout=httpx.Timeout(config.read_timeout, connect=config.connect_timeout, pool=None),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    def prompt_fields(self, prompt: str, stop: tuple[str, ...] = ()) -> dict[str, Any]:
        """One user prompt as the configured endpoint takes it (chat messages, or a completion
        prompt with its stop sequences)."""
        if self.config.endpoint == "chat":
            return {"messages": [{"role": "user", "content": prompt}]}
        return {"prompt": prompt} | ({"stop": list(stop)} if stop else {})

    def payload(self, model: str, fields: dict[str, Any], max_tokens: int | None = None) -> bytes:
        """A streaming request body: ``fields`` (messages or prompt, tools, stop, …) over the
        run's defaults, and the user's ``--param`` values over everything."""
        cfg = self.config
        payload: dict[str, Any] = {
            "model": model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_tokens or cfg.max_tokens,
        }
        if cfg.temperature is not None:
            payload["temperature"] = cfg.temperature
        payload.update(fields)
        payload.update(cfg.params)
        return json.dumps(payload).encode()

    # A pooled keep-alive connection can be closing by the time a request goes out on it:
    # the server hung up between requests (llama.cpp's server does so after most streams).
    # Either the write fails, or the server's close arrives within a millisecond or so, with
    # no byte of response. Such a request never ran, so it is sent again on another
    # connection instead of being recorded as a server failure; a server that ran a request
    # cannot fail it that fast. Counted per record; every other failure is an outcome.
    MAX_RECONNECTS = 2
    STALE_WINDOW_NS = 50_000_000

    async def _open(self, record: RequestRecord, body: bytes) -> httpx.Response:
        headers = {"x-ipw-request-id": str(record.request_id)}
        while True:
            record.sent_ns = now_ns() - self.t0_ns
            request = self._http.build_request("POST", self._url, content=body, headers=headers)
            try:
                return await self._http.send(request, stream=True)
            except httpx.TransportError as exc:
                quick = now_ns() - self.t0_ns - record.sent_ns < self.STALE_WINDOW_NS
                if record.reconnects >= self.MAX_RECONNECTS or not _stale(exc, quick):
                    raise
                record.reconnects += 1

    async def send(self, record: RequestRecord, body: bytes) -> None:
        """Send one streaming request and fill ``record``; never raises but for cancellation."""
        t0 = self.t0_ns
        parser = StreamParser(record, t0)
        streaming = False
        try:
            response = await self._open(record, body)
            try:
                record.headers_ns = now_ns() - t0
                record.http_status = response.status_code
                if response.status_code >= 400:
                    detail = _error_message(await response.aread())
                    _fail(record, ErrorType.HTTP, f"HTTP {response.status_code}: {detail}")
                    return
                kind = response.headers.get("content-type", "")
                if kind.startswith("application/json"):  # a whole completion: stream=true ignored
                    await response.aread()
                    _fail(
                        record,
                        ErrorType.NOT_STREAMING,
                        f"the server answered with one {kind} body, not an event stream: "
                        "it ignored stream=true, so no token timing can be measured",
                    )
                    return
                streaming = True
                arrivals = ArrivalStamps(response, t0, record.headers_ns)
                buf = b""
                start = 0  # stream offset of buf's first byte
                async for chunk in response.aiter_raw():
                    t = now_ns() - t0  # stamped before anything is parsed
                    buf += chunk
                    if b"\n\n" not in buf:
                        if b"\r\n\r\n" not in buf:
                            continue
                        arrivals.detach()  # offsets no longer match the wire: stamp reads
                        buf = buf.replace(b"\r\n", b"\n")
                    *complete, rest = buf.split(b"\n\n")
                    for raw in complete:
                        start += len(raw) + 2
                        at = arrivals.time_of(start) if arrivals.active else None
                        parser.feed(t if at is None else at, raw)
                    buf = rest
                if buf.strip():
                    parser.feed(now_ns() - t0, buf)
            finally:
                if streaming:
                    arrivals.detach()
                await response.aclose()
                record.closed_ns = now_ns() - t0
            parser.close()
        except asyncio.CancelledError:
            parser.close()
            record.status = Status.CANCELLED
            record.error_type = ErrorType.CANCELLED
            record.error_message = "the run was interrupted while this request was in flight"
            raise
        except Exception as exc:  # every transport failure is a recorded outcome
            parser.close()
            if record.error_type is ErrorType.DISCONNECT:
                # the transport's own explanation replaces "the stream ended early"
                record.status, record.error_type, record.error_message = Status.OK, None, None
            kind = _classify(exc, streaming)
            _fail(record, kind, _describe(exc) or kind.value)
            if record.closed_ns is None:
                record.closed_ns = now_ns() - t0


async def list_models(base_url: str, api_key: str | None, timeout: float = 10.0) -> list[str]:
    """The server's models; raises ServerUnreachable with an actionable one-line message."""
    if not base_url.startswith(("http://", "https://")):
        raise ServerUnreachable(f"invalid --base-url {base_url!r}: expected http(s)://host:port/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/models"
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            response = await http.get(url, headers=headers)
    except httpx.ConnectError:
        raise ServerUnreachable(
            f"cannot connect to {base_url}: is the server running? "
            "(omit --base-url to use the built-in simulator)"
        ) from None
    except httpx.TimeoutException:
        raise ServerUnreachable(f"{base_url} did not answer within {timeout:.0f} s") from None
    except httpx.HTTPError as exc:
        raise ServerUnreachable(f"cannot use {base_url}: {exc}") from None
    if response.status_code in (401, 403):
        raise ServerUnreachable(
            f"{base_url} rejected the API key (HTTP {response.status_code}); set --api-key or OPENAI_API_KEY"
        )
    if response.status_code == 404:
        raise ServerUnreachable(
            f"no OpenAI-compatible API at {base_url} (GET /models gave 404); the base URL usually ends in /v1"
        )
    if response.status_code >= 400:
        hint = "; it may still be starting, try again shortly" if response.status_code == 503 else ""
        raise ServerUnreachable(
            f"{base_url} answered GET /models with HTTP {response.status_code}: "
            f"{_error_message(response.content)}{hint}"
        )
    try:
        return [m["id"] for m in response.json().get("data", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ServerUnreachable(f"{base_url}/models did not return an OpenAI model list") from None
