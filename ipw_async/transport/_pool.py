"""Keep-alive connections to an origin, opened as the load needs them: plain, TLS, or through a
proxy named in the environment."""

from __future__ import annotations

import asyncio
import base64
import ssl
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from .._clock import now_ns
from ..telemetry.http import redact_url
from ._connection import Arrivals, Clock, ClosedBeforeResponse, Connection, Exchange


class Network(Protocol):
    """Where connections come from: the event loop's sockets, or a script in tests."""

    async def open(
        self,
        host: str,
        port: int,
        factory: Callable[[], Connection],
        tls: ssl.SSLContext | None,
        server_hostname: str | None,
    ) -> Connection: ...

    async def start_tls(self, connection: Connection, tls: ssl.SSLContext, server_hostname: str) -> None: ...


class Sockets:
    """The real network: the running loop's TCP connections."""

    async def open(
        self,
        host: str,
        port: int,
        factory: Callable[[], Connection],
        tls: ssl.SSLContext | None,
        server_hostname: str | None,
    ) -> Connection:
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(
            factory, host, port, ssl=tls, server_hostname=server_hostname if tls else None
        )
        return connection

    async def start_tls(self, connection: Connection, tls: ssl.SSLContext, server_hostname: str) -> None:
        loop = asyncio.get_running_loop()
        assert connection.transport is not None
        transport = await loop.start_tls(
            connection.transport, connection, tls, server_hostname=server_hostname
        )
        connection.transport = transport  # type: ignore[assignment]


@dataclass(frozen=True)
class Route:
    """How a request for a URL goes out: which connection, and the request line's target."""

    key: tuple[str, str, int]  # the target origin (scheme, host, port): connections are kept per key
    connect: tuple[str, int]  # where the TCP connection goes: the origin, or a proxy
    tls_host: str | None  # the server name for TLS, for https targets
    tunnel: bytes | None  # a CONNECT request, for an https target through a proxy
    target: bytes  # the request line's target: a path, or an absolute URL through a plain proxy
    fixed: bytes  # header lines every request on this route carries (Host, proxy credentials)


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _proxy(scheme: str, host: str) -> str | None:
    """The proxy the environment names for a URL (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY),
    as curl and httpx read them; loopback never goes through one, so the built-in simulator
    works behind a corporate proxy setting."""
    if _loopback(host):
        return None
    proxies = urllib.request.getproxies_environment()
    if urllib.request.proxy_bypass_environment(host, proxies):
        return None
    return proxies.get(scheme) or proxies.get("all")


def _authority(host: str, port: int, default_port: int | None) -> bytes:
    """``host:port``, without the port when it is the scheme's default."""
    name = f"[{host}]" if ":" in host else host
    text = name if port == default_port else f"{name}:{port}"
    return text.encode("ascii") if text.isascii() else text.encode("idna")


_ROUTES_KEPT = 256  # parsed URLs a pool keeps: a run has one, a proxy a few


def route_for(url: str) -> Route:
    """The route for ``url``; raises ValueError when it cannot be used."""
    parts = urlsplit(url)
    scheme, host = parts.scheme, parts.hostname
    if scheme not in ("http", "https") or not host:
        raise ValueError(f"expected an http:// or https:// URL, got {redact_url(url)!r}")
    default_port = 443 if scheme == "https" else 80
    port = parts.port or default_port
    authority = _authority(host, port, default_port)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    fixed = b"host: " + authority + b"\r\n"
    key = (scheme, host, port)
    proxy = _proxy(scheme, host)
    if proxy is None:
        return Route(key, (host, port), host if scheme == "https" else None, None, path.encode(), fixed)
    via = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if via.scheme != "http" or not via.hostname:
        raise ValueError(f"only http:// proxies are supported, the environment names {redact_url(proxy)!r}")
    auth = b""
    if via.username:
        secret = base64.b64encode(f"{via.username}:{via.password or ''}".encode()).decode()
        auth = f"proxy-authorization: Basic {secret}\r\n".encode()
    connect = (via.hostname, via.port or 80)
    if scheme == "http":  # a plain proxy forwards requests that name their whole URL
        target = f"http://{authority.decode()}{path}".encode()
        return Route(key, connect, None, None, target, fixed + auth)
    hostport = _authority(host, port, None)  # CONNECT names the port always
    tunnel = b"CONNECT " + hostport + b" HTTP/1.1\r\nhost: " + hostport + b"\r\n" + auth + b"\r\n"
    return Route(key, connect, host, tunnel, path.encode(), fixed)


class ConnectionPool:
    """Up to ``max_connections`` keep-alive connections, reused most-recent first.

    A request sent on a pooled connection can meet the server's close of it (servers such as
    llama.cpp's hang up between requests): the write is lost, or the close comes back at once
    with no byte of response. Such a request never ran, so it is sent again on another
    connection, at most ``MAX_RETRIES`` times; a server that ran a request cannot fail it
    that fast, so every other failure is the caller's outcome.
    """

    MAX_RETRIES = 2
    STALE_WINDOW_NS = 50_000_000

    def __init__(
        self,
        max_connections: int = 64,
        *,
        connect_timeout_s: float | None = 10.0,
        read_timeout_s: float | None = 300.0,
        network: Network | None = None,
        clock: Clock = now_ns,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.clock = clock
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._network: Network = network or Sockets()
        self._tls = tls
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[tuple[str, str, int], list[Connection]] = {}
        self._busy: set[Connection] = set()
        self._keys: dict[Connection, tuple[str, str, int]] = {}
        self._routes: dict[str, Route] = {}
        self._arrivals = Arrivals()

    def route(self, url: str) -> Route:
        route = self._routes.get(url)
        if route is None:
            if len(self._routes) >= _ROUTES_KEPT:  # a proxy's callers choose paths and queries
                self._routes.clear()
            route = self._routes[url] = route_for(url)
        return route

    async def request(self, route: Route, method: bytes, headers: bytes, body: bytes) -> Exchange:
        """Send a request (``headers``: header lines, each ending in CRLF) and return its
        exchange once the response's headers are in; raises httpx's transport errors."""
        message = b"".join(
            (method, b" ", route.target, b" HTTP/1.1\r\n", route.fixed, headers,
             b"content-length: %d\r\n\r\n" % len(body), body)
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        retries = 0
        while True:
            sent = self.clock()
            await self._slots.acquire()
            try:
                connection = self._idle_connection(route) or await self._open(route)
            except BaseException:
                self._slots.release()
                raise
            self._busy.add(connection)
            reused = connection.served > 0
            exchange = Exchange(loop, sent)
            exchange.retries = retries
            connection.begin(exchange, message)
            written = self.clock()
            try:
                await exchange.head()
            except ClosedBeforeResponse:
                quick = self.clock() - written < self.STALE_WINDOW_NS
                if not (reused and quick) or retries >= self.MAX_RETRIES:
                    raise
                retries += 1
                continue
            except BaseException:
                exchange.abandon()
                raise
            return exchange

    def _idle_connection(self, route: Route) -> Connection | None:
        idle = self._idle.get(route.key)
        while idle:
            connection = idle.pop()
            if not connection.closed and connection.transport and not connection.transport.is_closing():
                return connection
        return None

    async def _open(self, route: Route) -> Connection:
        host, port = route.connect

        def factory() -> Connection:
            return Connection(self.clock, self._release, self.read_timeout_s, self._arrivals)

        tls = self._context() if route.tls_host else None
        where = f"{host}:{port}"
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if route.tunnel is None:
                    connection = await self._network.open(host, port, factory, tls, route.tls_host)
                else:
                    connection = await self._network.open(host, port, factory, None, None)
                    await self._through(connection, route, tls)  # type: ignore[arg-type]
        except TimeoutError:
            raise httpx.ConnectTimeout(
                f"no connection to {where} within {self.connect_timeout_s:g} s"
            ) from None
        except ssl.SSLError as exc:
            raise httpx.ConnectError(f"the TLS handshake with {where} failed: {exc.reason or exc}") from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {where}: {exc.strerror or exc}") from None
        self._keys[connection] = route.key
        return connection

    async def _through(self, connection: Connection, route: Route, tls: ssl.SSLContext) -> None:
        """Open a tunnel through the proxy with CONNECT, then speak TLS inside it."""
        exchange = Exchange(asyncio.get_running_loop(), self.clock())
        connection.begin(exchange, route.tunnel)  # type: ignore[arg-type]
        await exchange.head()
        connection.exchange = None
        if exchange.status != 200:
            connection.close()
            raise httpx.ProxyError(f"the proxy refused to open a tunnel (HTTP {exchange.status})")
        assert route.tls_host is not None
        await self._network.start_tls(connection, tls, route.tls_host)

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:  # httpx's own defaults: certifi, or SSL_CERT_FILE / SSL_CERT_DIR
            self._tls = httpx.create_ssl_context()
        return self._tls

    def _release(self, connection: Connection, reusable: bool) -> None:
        if connection in self._busy:
            self._busy.discard(connection)
            self._slots.release()
            if reusable:
                self._idle.setdefault(self._keys[connection], []).append(connection)
                return
            connection.close()
        else:
            idle = self._idle.get(self._keys.get(connection, ("", "", 0)), [])
            if connection in idle:
                idle.remove(connection)
        self._keys.pop(connection, None)

    async def aclose(self) -> None:
        for connection in [*self._busy, *(c for idle in self._idle.values() for c in idle)]:
            connection.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports' close callbacks run
