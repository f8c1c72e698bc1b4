"""One call forwarded upstream over the run's own transport, its response bytes handed back as
they came (less the usage event the proxy asked for, see :mod:`.call`), and the call stamped
into a record on the way exactly as the run's client stamps its own requests (the same
connection stamps, the same SSE parser for the call's API)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..client import (
    APIS,
    ClientConfig,
    EventStream,
    api_headers,
    api_url,
    error_message,
    fail,
    transport_failed,
)
from ..records import ErrorType, RequestRecord
from ..transport import ConnectionPool, Exchange
from .call import WithoutUsage

# Hop-by-hop headers (RFC 9110 §7.6.1) and those the transport writes itself are not forwarded.
_HOP = frozenset(
    b"connection keep-alive proxy-authenticate proxy-authorization proxy-connection te trailer "
    b"transfer-encoding upgrade host content-length".split()
)
_CREDENTIALS = frozenset({b"authorization", b"x-api-key"})  # OpenAI's bearer key, Anthropic's key
# The proxy reads every response: it asks for one it can read, whatever the caller accepts
# (HTTP clients ask for gzip by default, and hosted APIs give it).
_IDENTITY = b"accept-encoding: identity\r\n"


@dataclass(frozen=True)
class Head:
    """The upstream's status line and the headers worth passing back."""

    status: int
    headers: list[tuple[str, str]]
    streaming: bool  # an event stream, rather than one body


def _passed_back(exchange: Exchange) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in exchange.headers if k.lower() not in _HOP]


class CallerGone(Exception):
    """The caller closed its connection before the response was through."""


Write = Callable[[bytes], Awaitable[None]]  # raises CallerGone


class Relay:
    """Forwards calls to the upstream server at ``config.base_url`` through one connection pool.
    A caller's key (``Authorization`` or ``x-api-key``) goes upstream only with
    ``forward_authorization`` (false where it carries the proxy's own token) and no
    ``config.api_key``, which replaces it in the header the call's API reads."""

    def __init__(self, config: ClientConfig, t0_ns: int, forward_authorization: bool = True) -> None:
        self.base = config.base_url
        self.t0_ns = t0_ns
        self.api_key = config.api_key
        self.forward_authorization = forward_authorization and not config.api_key
        self.pool = ConnectionPool(
            config.max_connections,
            connect_timeout_s=config.connect_timeout,
            read_timeout_s=config.read_timeout,
        )

    async def aclose(self) -> None:
        await self.pool.aclose()

    def _url(self, path: str) -> str:
        """``path`` (``chat/completions``, ``models?…``) under the upstream's URL, whose own query
        (a gateway's ``?api-version=…``) stays at the end beside the caller's."""
        path, asked, query = path.partition("?")
        url = api_url(self.base, f"/{path}")
        return f"{url}{'&' if '?' in url else '?'}{query}" if asked else url

    def _headers(self, headers: list[tuple[bytes, bytes]], request_id: int, endpoint: str = "chat") -> bytes:
        """The caller's headers as forwarded, with what ``endpoint``'s API wants that the caller
        did not send (the operator's key; Anthropic's API version)."""
        lines, sent = [], set()
        for name, value in headers:
            key = name.lower()
            if key in _HOP or key == b"accept-encoding" or key.startswith(b"x-ipw-"):
                continue
            if key in _CREDENTIALS and not self.forward_authorization:
                continue
            lines.append(b"%s: %s\r\n" % (name, value))
            sent.add(key)
        for name, value in api_headers(endpoint, self.api_key).items():
            if name.encode() not in sent:
                lines.append(f"{name}: {value}\r\n".encode())
        lines.append(_IDENTITY)
        lines.append(b"x-ipw-request-id: %d\r\n" % request_id)
        return b"".join(lines)

    async def open(
        self,
        record: RequestRecord,
        method: bytes,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        endpoint: str = "chat",
    ) -> tuple[Head, Exchange] | None:
        """Send the call to ``endpoint``'s API; its response head, or None when it failed before
        one came (the record says why)."""
        route = self.pool.route(self._url(path))
        record.sent_ns = self.pool.clock() - self.t0_ns
        sent = self._headers(headers, record.request_id, endpoint)
        try:
            exchange = await self.pool.request(route, method, sent, body)
        except Exception as exc:  # every transport failure is the call's recorded outcome
            transport_failed(record, exc)
            return None
        t0 = self.t0_ns
        record.sent_ns = exchange.sent_ns - t0
        record.reconnects = exchange.retries
        record.headers_ns = exchange.headers_ns - t0
        record.http_status = exchange.status
        streaming = exchange.header(b"content-type").startswith("text/event-stream")
        return Head(exchange.status, _passed_back(exchange), streaming), exchange

    async def stream(
        self,
        record: RequestRecord,
        exchange: Exchange,
        write: Write,
        hide_usage: bool = False,
        endpoint: str = "chat",
    ) -> None:
        """Hand the event stream to ``write`` as it arrives while parsing it into ``record`` as
        ``endpoint``'s API (less its usage-only event with ``hide_usage``); an upstream that
        fails mid-stream fails the record and raises its error."""
        parser = APIS[endpoint].parser(record, self.t0_ns)
        events = EventStream(parser, self.t0_ns)
        pieces: asyncio.Queue[bytes | None] = asyncio.Queue()
        passed = WithoutUsage() if hide_usage else None

        def arrived(t: int, data: bytes) -> None:
            events.receive(t, data)
            pieces.put_nowait(data if passed is None else passed(data))

        exchange.stream_to(arrived)
        exchange.when_done(lambda: pieces.put_nowait(None))
        try:
            ended = False
            while not ended:
                # what came while the caller's last write was going out goes in one write
                got = [await pieces.get()]
                while not pieces.empty():
                    got.append(pieces.get_nowait())
                ended = got[-1] is None
                data = b"".join(g for g in got if g)
                if ended and passed is not None:
                    data += passed.rest()
                if data:
                    await write(data)
            await exchange.finished()
            events.end()
            parser.close()
        except CallerGone:
            parser.close()
            raise
        except Exception as exc:
            parser.close()
            transport_failed(record, exc)
            raise
        finally:
            if not exchange.done:
                exchange.abandon()

    async def body(self, record: RequestRecord, exchange: Exchange, endpoint: str = "chat") -> bytes:
        """A whole response, read into ``record`` as ``endpoint``'s reply when it is not an error."""
        data = await exchange.read()
        if record.http_status is not None and record.http_status >= 400:
            fail(record, ErrorType.HTTP, f"HTTP {record.http_status}: {error_message(data)}")
        else:
            APIS[endpoint].parser(record, self.t0_ns).whole(data)
        return data

    async def passthrough(
        self,
        method: bytes,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        endpoint: str = "chat",
    ) -> tuple[int, list[tuple[str, str]], bytes] | None:
        """A request that is not measured (``/models``), sent with ``endpoint``'s API headers:
        its status, headers and body, or None when the upstream cannot be reached."""
        route = self.pool.route(self._url(path))
        try:
            exchange = await self.pool.request(route, method, self._headers(headers, 0, endpoint), body)
            data = await exchange.read()
        except Exception:  # the caller hears 502; nothing of the run depends on it
            return None
        return exchange.status, _passed_back(exchange), data
