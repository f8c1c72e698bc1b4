"""GET over kept-alive HTTP/1.1, for sources read every few milliseconds from the sampler's thread
(no event loop there, and a connection per read would cost more than the read)."""

from __future__ import annotations

import http.client
import threading
from urllib.parse import SplitResult, urlsplit

from .base import SourceUnavailable

# what a failed GET raises: the caller's source is then unavailable, or its reading missing
ERRORS = (OSError, http.client.HTTPException)


def http_url(url: str, what: str, example: str) -> SplitResult:
    """``url`` (a scheme is optional) split; SourceUnavailable unless it is http with a host."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise SourceUnavailable(f"{url!r} is not {what}; give one like {example}")
    return parts


class KeptAlive:
    """One kept-alive connection per thread to one server."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self._host, self._port, self._timeout = host, port, timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()

    def get(self, path: str) -> bytes:
        """The body of a 200 answer; one retry on a fresh connection where the server had
        closed the kept-alive one (it idled past the server's keep-alive timeout)."""
        for attempt in (0, 1):
            conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
            reused = conn is not None
            if conn is None:
                conn = self._local.conn = http.client.HTTPConnection(
                    self._host, self._port, timeout=self._timeout
                )
                with self._lock:
                    self._open.add(conn)
            try:
                conn.request("GET", path)
                response = conn.getresponse()
                body = response.read()
            except ERRORS as exc:
                self._drop(conn)
                stale = isinstance(exc, ConnectionError | http.client.RemoteDisconnected)
                if stale and reused and attempt == 0:
                    continue
                raise
            if response.status != 200:
                raise http.client.HTTPException(f"HTTP {response.status}: {body[:200]!r}")
            return body
        raise AssertionError("unreachable")

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        self._local.conn = None
        with self._lock:
            self._open.discard(conn)

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            conns, self._open = self._open, set()
        for conn in conns:
            conn.close()
