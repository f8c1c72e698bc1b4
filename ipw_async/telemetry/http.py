"""GET over kept-alive HTTP/1.1 (or TLS) to telemetry endpoints: agents, exporters, the simulator.

Sources are read from threads with no event loop (the sampler's, an agent's stream reader), and
a connection per read would cost more than the read, so this is ``http.client`` with a kept-alive
connection per thread. Credentials (a bearer token, a URL's user and password) ride in the
headers and never in a URL, a label or a message.
"""

from __future__ import annotations

import base64
import http.client
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from .base import SourceUnavailable

# the environment variable an agent's token may be given in, on both sides (never the command
# line, where `ps` shows it)
AGENT_TOKEN_ENV = "IPW_ASYNC_AGENT_TOKEN"

# what a failed GET raises: the caller's source is then unavailable, or its reading missing
ERRORS = (OSError, http.client.HTTPException)


class Unauthorized(http.client.HTTPException):
    """The endpoint refused our credentials (401 or 403)."""


@dataclass(frozen=True)
class Endpoint:
    """Where a telemetry server answers and how to be let in."""

    scheme: str  # http or https
    host: str
    port: int
    path: str
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # Authorization: never shown
    tls: ssl.SSLContext | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        """``host:port``: names the endpoint's channels (gpu0@gpu-host:9180), credentials left out."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        """The URL as shown to a user and written to files: no credentials."""
        return f"{self.scheme}://{self.label}{self.path}"

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.tls is not None:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.tls)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``: for run.json and messages. A user name
    alone goes too: services that take a token put it there (``https://TOKEN@host``)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.username is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = "***" if parts.password is None else f"{parts.username}:***"
    return parts._replace(netloc=f"{user}@{netloc}").geturl()


def endpoint(
    url: str,
    what: str,
    example: str,
    *,
    token: str | None = None,
    ca_file: Path | None = None,
    default_path: str = "",
) -> Endpoint:
    """``url`` (a scheme is optional) as an :class:`Endpoint`; SourceUnavailable unless it is
    http(s) with a host. A user and password in the URL become basic auth; ``token`` a bearer
    header; ``ca_file`` the CA an https endpoint's certificate is verified by."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SourceUnavailable(f"{redact_url(url)!r} is not {what}; give one like {example}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise SourceUnavailable(f"{redact_url(url)!r} has no valid port; give one like {example}") from None
    headers: dict[str, str] = {}
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    tls = None
    if parts.scheme == "https":
        try:
            tls = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        except (OSError, ssl.SSLError) as exc:
            raise SourceUnavailable(f"cannot use {ca_file} as a CA certificate ({exc})") from None
    return Endpoint(parts.scheme, parts.hostname, port, parts.path or default_path, headers, tls)


def read_token(path: Path) -> str:
    """The token in a file (its first line, stripped); ValueError saying what is wrong."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token.splitlines()[0].strip()


def check_status(response: http.client.HTTPResponse, body: bytes) -> None:
    """Raise for any answer but 200: :class:`Unauthorized` for a refusal."""
    if response.status in (401, 403):
        raise Unauthorized(f"HTTP {response.status}: {body[:200].decode('utf-8', 'replace').strip()}")
    if response.status != 200:
        raise http.client.HTTPException(f"HTTP {response.status}: {body[:200]!r}")


class KeptAlive:
    """One kept-alive connection per thread to one endpoint."""

    def __init__(self, target: Endpoint, timeout: float) -> None:
        self.endpoint = target
        self._timeout = timeout
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
                conn = self._local.conn = self.endpoint.connection(self._timeout)
                with self._lock:
                    self._open.add(conn)
            try:
                conn.request("GET", path, headers=self.endpoint.headers)
                response = conn.getresponse()
                body = response.read()
            except ERRORS as exc:
                self._drop(conn)
                stale = isinstance(exc, ConnectionError | http.client.RemoteDisconnected)
                if stale and reused and attempt == 0:
                    continue
                raise
            check_status(response, body)
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
