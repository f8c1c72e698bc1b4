"""One keep-alive HTTP/1.1 connection, as an asyncio protocol, and the exchange it carries."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httptools
import httpx

Clock = Callable[[], int]
BodySink = Callable[[int, bytes], None]  # (arrival ns, body bytes)


class Exchange:
    """One request and its response.

    Body bytes reach the sink with the time they came off the socket, taken in the protocol's
    ``data_received``: the event loop runs that for a readable socket before any task that
    waits on it resumes, so a stamp is not late by however many other streams ran first
    (:class:`Arrivals`). Bytes that arrive before a sink is attached are held with their stamps.
    """

    __slots__ = (
        "_done",
        "_head",
        "_held",
        "connection",
        "headers",
        "headers_ns",
        "received",
        "retries",
        "sent_ns",
        "status",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, sent_ns: int) -> None:
        self.sent_ns = sent_ns  # when this attempt began (connection acquired or opened)
        self.retries = 0  # attempts sent again because the connection was closing
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_ns = 0
        self.received = 0  # response bytes so far, headers included
        self.connection: Connection | None = None
        self._held: list[tuple[int, bytes]] = []
        self._head: asyncio.Future[None] = loop.create_future()
        self._done: asyncio.Future[None] = loop.create_future()

    def header(self, name: bytes) -> str:
        """A response header's value ('' when absent); ``name`` in lower case."""
        for key, value in self.headers:
            if key.lower() == name:
                return value.decode("latin-1")
        return ""

    async def head(self) -> None:
        """Wait for the status line and headers."""
        await self._head

    def stream_to(self, sink: BodySink) -> None:
        """Hand the body to ``sink`` from now on, held bytes first."""
        for t, data in self._held:
            sink(t, data)
        self._held.clear()
        if self.connection is not None:
            self.connection.sink = sink

    def when_done(self, callback: Callable[[], None]) -> None:
        self._done.add_done_callback(lambda _: callback())

    async def finished(self) -> None:
        """Wait for the end of the body; raises the transport's error if it failed."""
        await self._done

    async def read(self) -> bytes:
        """The whole body (for error bodies and other short responses)."""
        await self._done
        data = b"".join(d for _, d in self._held)
        self._held.clear()
        return data

    def abandon(self) -> None:
        """The caller stops reading: the connection cannot be reused mid-body."""
        connection = self.connection
        if connection is not None and connection.exchange is self:
            connection.close()

    @property
    def done(self) -> bool:
        return self._done.done()

    # called by the connection
    def hold(self, t: int, data: bytes) -> None:
        self._held.append((t, data))

    def headers_in(self, t: int, status: int) -> None:
        self.status = status
        self.headers_ns = t
        if not self._head.done():
            self._head.set_result(None)

    def complete(self) -> None:
        if not self._done.done():
            self._done.set_result(None)

    def fail(self, exc: BaseException) -> None:
        for future in (self._head, self._done):
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: a failure nobody waits for is not an unhandled one


class Arrivals:
    """Reads stamped as they come off the sockets and parsed once the loop has read every
    socket that was ready with them.

    When many streams are readable at once, the loop reads them one after another; parsing
    each read as it comes (some µs) would make every later stamp in the batch late by the
    parsing before it. Deferred to one callback after the batch, a stamp is late only by the
    reads before it.
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: list[tuple[Connection, int, bytes]] = []

    def add(self, connection: Connection, t: int, data: bytes) -> None:
        pending = self._pending
        if not pending:
            asyncio.get_running_loop().call_soon(self.drain)
        pending.append((connection, t, data))

    def drain(self) -> None:
        pending, self._pending = self._pending, []
        for connection, t, data in pending:
            connection.feed(t, data)


class Connection(asyncio.Protocol):
    """A connection to one origin, parsing responses with httptools (llhttp) as bytes arrive."""

    def __init__(
        self,
        clock: Clock,
        release: Callable[[Connection, bool], None],
        read_timeout_s: float | None,
        arrivals: Arrivals,
    ) -> None:
        self.clock = clock
        self._arrivals = arrivals
        self.read_timeout_s = read_timeout_s
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.sink: BodySink = _nowhere  # the exchange's, once it begins
        self.served = 0  # responses completed on this connection
        self.closed = False
        self._release = release
        self._parser: httptools.HttpResponseParser  # a fresh one for each exchange (begin)
        self._t = 0
        self._framed = False  # the body's end is known from its framing, not from a close
        self._timer: asyncio.TimerHandle | None = None

    # asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._arrivals.add(self, self.clock(), data)

    def feed(self, t: int, data: bytes) -> None:
        """Parse bytes that came off the socket at ``t``."""
        self._t = t
        exchange = self.exchange
        if exchange is None:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        exchange.received += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            cause = exc.__context__ or exc
            if not isinstance(exc, httptools.HttpParserCallbackError):
                cause = httpx.RemoteProtocolError(f"the server's response is not valid HTTP/1.1 ({exc})")
            self._abort(cause)

    def eof_received(self) -> bool:
        return False  # close our side too: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._arrivals.drain()  # what came before the close is read first
        self.closed = True
        exchange = self.exchange
        if exchange is None or exchange.done:
            self._release(self, False)
            return
        if exchange.status and not self._framed and exc is None:
            exchange.complete()  # a body that runs to the close (HTTP/1.0, no length) ends here
        else:
            exchange.fail(self._lost(exchange, exc))
        self.exchange = None
        self._release(self, False)

    def _lost(self, exchange: Exchange, exc: Exception | None) -> httpx.TransportError:
        why = f": {exc}" if exc else ""
        if exchange.received == 0:
            return ClosedBeforeResponse(f"the server closed the connection without a response{why}")
        if isinstance(exc, ConnectionResetError):
            return httpx.ReadError(f"the server reset the connection mid-response{why}")
        return httpx.RemoteProtocolError(f"the server closed the connection mid-response{why}")

    # httptools' side
    def on_header(self, name: bytes, value: bytes) -> None:
        self.exchange.headers.append((name, value))  # type: ignore[union-attr]

    def on_headers_complete(self) -> None:
        exchange = self.exchange
        assert exchange is not None
        code = self._parser.get_status_code()
        if code < 200:  # 1xx: an interim answer; the real one follows
            exchange.headers.clear()
            return
        self._framed = any(
            k.lower() in (b"content-length", b"transfer-encoding") for k, _ in exchange.headers
        )
        exchange.headers_in(self._t, code)

    def on_body(self, body: bytes) -> None:
        self.sink(self._t, body)

    def on_message_complete(self) -> None:
        exchange = self.exchange
        if exchange is None or not exchange.status:
            return
        self.exchange = None
        self.served += 1
        exchange.connection = None
        reusable = self._parser.should_keep_alive() and not self.closed
        exchange.complete()
        self._release(self, reusable)

    # the pool's side
    def begin(self, exchange: Exchange, request: bytes) -> None:
        """Send ``request`` and take its response into ``exchange``."""
        self.exchange = exchange
        self.sink = exchange.hold
        exchange.connection = self
        self._parser = httptools.HttpResponseParser(self)
        self._framed = False
        self._t = self.clock()
        self.transport.write(request)  # type: ignore[union-attr]
        if self.read_timeout_s is not None and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.read_timeout_s, self._check_read_timeout)

    def _check_read_timeout(self) -> None:
        """The read timeout, httpx's meaning: no byte for ``read_timeout_s``. One timer per
        connection, moved on only when it fires, rather than one per read."""
        self._timer = None
        if self.exchange is None or self.read_timeout_s is None:
            return
        quiet_s = (self.clock() - self._t) / 1e9
        if quiet_s >= self.read_timeout_s:
            self._abort(httpx.ReadTimeout(f"no byte from the server for {self.read_timeout_s:g} s"))
        else:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.read_timeout_s - quiet_s, self._check_read_timeout)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True

    def _abort(self, exc: BaseException) -> None:
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.fail(exc)
        self.close()


def _nowhere(t: int, data: bytes) -> None:
    raise httpx.RemoteProtocolError("the server sent a body nobody asked for")


class ClosedBeforeResponse(httpx.RemoteProtocolError):
    """The server closed the connection before a byte of response: on a pooled connection
    closing as the request went out, the request never ran."""
