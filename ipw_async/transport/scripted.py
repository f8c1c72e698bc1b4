"""A scripted network for tests: the transport's real connections and parser, fed bytes a
script says a server sent, at the times it says, on a clock the script moves.

    network = ScriptedNetwork(Reply.sse([(40 * MS, b'data: {...}'), (45 * MS, b"data: [DONE]")]))
    client = StreamingClient(config, t0_ns=0, network=network, clock=network.clock)

Each request written takes the next reply; its pieces arrive in order, each at its time
after the request (the clock moves there first), so stamps are exact and tests need no sleep.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ._connection import Connection

MS = 1_000_000


class ManualClock:
    """A clock that stands still until the script moves it (ns)."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


@dataclass
class Reply:
    """What the server sends for one request: ``(ns after the request, bytes)`` pieces, then
    a close when ``close`` is set (a hang-up mid-body, or the end of an unframed body)."""

    pieces: list[tuple[int, bytes]] = field(default_factory=list)
    close: bool = False

    @classmethod
    def sse(
        cls, events: list[tuple[int, bytes]], *, headers_ns: int | None = None, end_ns: int | None = None
    ) -> Reply:
        """A chunked event stream: the headers at ``headers_ns`` (default: with the first
        event), each event in its own chunk at its time, the last chunk at ``end_ns``."""
        at = headers_ns if headers_ns is not None else events[0][0] if events else 0
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        pieces = [(at, head)] + [(t, chunk(event + b"\n\n")) for t, event in events]
        pieces.append((pieces[-1][0] if end_ns is None else end_ns, b"0\r\n\r\n"))
        return cls(pieces)

    @classmethod
    def body(
        cls, status: int, body: bytes, *, content_type: str = "application/json", at_ns: int = 0
    ) -> Reply:
        """A whole response with a Content-Length."""
        head = b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (
            status,
            content_type.encode(),
            len(body),
        )
        return cls([(at_ns, head + body)])

    @classmethod
    def hang_up(cls, at_ns: int = 0) -> Reply:
        """The server closes the connection without a byte of response."""
        return cls([], close=True) if at_ns == 0 else cls([(at_ns, b"")], close=True)


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class ScriptedNetwork:
    """Connections whose server follows the script; ``refuse`` fails every connect."""

    def __init__(self, *replies: Reply, refuse: bool = False) -> None:
        self.clock = ManualClock()
        self.replies = deque(replies)
        self.requests: list[bytes] = []  # every request written, whole
        self.opened = 0
        self.refuse = refuse

    async def open(
        self,
        host: str,
        port: int,
        factory: Callable[[], Connection],
        tls: ssl.SSLContext | None,
        server_hostname: str | None,
    ) -> Connection:
        if self.refuse:
            raise ConnectionRefusedError(111, "Connection refused")
        connection = factory()
        connection.connection_made(_Socket(self, connection))
        self.opened += 1
        return connection

    async def start_tls(self, connection: Connection, tls: ssl.SSLContext, server_hostname: str) -> None:
        """The script has no TLS: the tunnel's bytes go on in the clear."""


class _Socket(asyncio.Transport):
    def __init__(self, network: ScriptedNetwork, protocol: Connection) -> None:
        super().__init__()
        self._network = network
        self._protocol = protocol
        self._closed = False

    def write(self, data: bytes) -> None:  # type: ignore[override]
        if self._closed:
            return
        network = self._network
        network.requests.append(data)
        reply = network.replies.popleft() if network.replies else Reply([], close=True)
        loop = asyncio.get_running_loop()
        base = network.clock.now
        for at, piece in reply.pieces:
            loop.call_soon(self._arrive, base + at, piece)
        if reply.close:
            loop.call_soon(self.close)

    def _arrive(self, t: int, data: bytes) -> None:
        if self._closed:
            return
        clock = self._network.clock
        clock.now = max(clock.now, t)
        if data:
            self._protocol.data_received(data)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            asyncio.get_running_loop().call_soon(self._protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self._closed
