"""httpx over the pool, for everything off the hot path (model listing and other short calls)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx

from ._connection import Exchange
from ._pool import ConnectionPool

_OWN = (b"host", b"content-length", b"transfer-encoding", b"connection")


class PoolTransport(httpx.AsyncBaseTransport):
    """An ``httpx.AsyncBaseTransport`` on a :class:`ConnectionPool`: httpx's API over the same
    connections, TLS and proxy rules the streaming client uses."""

    def __init__(self, pool: ConnectionPool | None = None) -> None:
        self.pool = pool or ConnectionPool()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            route = self.pool.route(str(request.url))
        except ValueError as exc:
            raise httpx.UnsupportedProtocol(str(exc)) from None
        headers = b"".join(k + b": " + v + b"\r\n" for k, v in request.headers.raw if k.lower() not in _OWN)
        body = b"".join([part async for part in request.stream])  # type: ignore[union-attr]
        exchange = await self.pool.request(route, request.method.encode(), headers, body)
        return httpx.Response(
            exchange.status,
            headers=exchange.headers,
            stream=_Body(exchange),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        await self.pool.aclose()


class _Body(httpx.AsyncByteStream):
    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange

    async def __aiter__(self) -> AsyncIterator[bytes]:
        exchange = self._exchange
        chunks: list[bytes] = []
        ready = asyncio.Event()

        def sink(_: int, data: bytes) -> None:
            chunks.append(data)
            ready.set()

        exchange.stream_to(sink)
        exchange.when_done(ready.set)
        while True:
            if not chunks and not exchange.done:
                await ready.wait()
                ready.clear()
            if chunks:
                data = b"".join(chunks)
                chunks.clear()
                yield data
            elif exchange.done:
                await exchange.finished()  # raises the transport's error, if it failed
                return

    async def aclose(self) -> None:
        if not self._exchange.done:
            self._exchange.abandon()
