"""GET over kept-alive HTTP/1.1 (or TLS) to telemetry endpoints: agents, exporters, the simulator.

Sources are read from threads with no event loop (the sampler's, an agent's stream reader), and
a connection per read would cost more than the read, so this is ``http.client`` with a kept-alive
connection per thread. Credentials (a bearer token, a URL's user and password) ride in the
headers; a query the user gave is sent as given. None is ever shown: a label is ``host:port``,
and a URL in a file, a log line, a message or an export is :func:`redact_url`'s.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import re
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, unquote_plus, urlsplit

from .base import SourceUnavailable

# the environment variable an agent's token may be given in, on both sides (never the command
# line, where `ps` shows it)
AGENT_TOKEN_ENV = "IPW_ASYNC_AGENT_TOKEN"
# the streams an agent serves at once (its --max-streams); more are refused until one ends
MAX_STREAMS = 4

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
    query: str = field(default="", repr=False)  # sent as given, shown redacted
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # Authorization: never shown
    tls: ssl.SSLContext | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        """``host:port``: names the endpoint's channels (gpu0@gpu-host:9180), credentials left out."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def target(self) -> str:
        """What a GET asks for: the path and the query given with it."""
        return f"{self.path}?{self.query}" if self.query else self.path

    @property
    def url(self) -> str:
        """The URL as shown to a user and written to files: no credentials."""
        return redact_url(f"{self.scheme}://{self.label}{self.target}")

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.tls is not None:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.tls)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


REDACTED = "***"  # what a secret in a URL is written as

# Query parameters that carry a secret, by the words of their name (``X-Amz-Signature`` is x,
# amz, signature; ``apiKey`` api, key): whole words, so ``author`` or ``keyword`` stay readable,
# and the words that end in one of the endings (``sslpassword``, ``refreshtoken``), which end
# no harmless word as "key" ends ``monkey``.
_CREDENTIAL_WORDS = frozenset(
    {
        "key", "sig", "auth", "oauth", "authorization", "pass", "pwd", "passphrase", "session",
        "jwt", "bearer", "accesskey", "authkey", "privatekey", "secretkey", "sessionid", "sessionkey",
    }
)  # fmt: skip
_CREDENTIAL_ENDINGS = (
    "token",
    "secret",
    "password",
    "passwd",
    "signature",
    "credential",
    "credentials",
    "apikey",
)
_NAME_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def is_credential_name(name: str) -> bool:
    """Whether a query parameter called ``name`` carries a secret (``token``, ``api-key``,
    ``X-Amz-Signature``, ``sig``: see the words above), case-insensitively."""
    words = [word.lower() for word in _NAME_WORD.findall(unquote_plus(name))]
    return any(word in _CREDENTIAL_WORDS or word.endswith(_CREDENTIAL_ENDINGS) for word in words)


def _redact_params(params: str) -> str:
    """``a=1&token=x`` as ``a=1&token=***``: each credential's value hidden, the rest as given."""
    out = []
    for pair in params.split("&"):
        name, sep, value = pair.partition("=")
        out.append(f"{name}={REDACTED}" if sep and value and is_credential_name(name) else pair)
    return "&".join(out)


def redact_url(url: str) -> str:
    """``url`` as written to files, logs, messages and exports: the user and password, and the
    values of the query parameters named as credentials (:func:`is_credential_name`), each
    ``***``; the host, port, path and other parameters as given. A user name alone goes too:
    services that take a token put it there (``https://TOKEN@host``). A fragment shaped like a
    query (``#access_token=…``) is treated as one. Split by hand rather than by ``urlsplit``,
    which refuses some malformed URLs (a stray ``[``): a message about a bad URL must still
    hide its secrets."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    rest, hashed, fragment = rest.partition("#")
    rest, asked, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hostport = netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{REDACTED}@{hostport}" if colon else f"{REDACTED}@{hostport}"
    if asked:
        query = _redact_params(query)
    if hashed and "=" in fragment:
        fragment = _redact_params(fragment)
    return f"{scheme}{sep}{netloc}{slash}{path}{asked}{query}{hashed}{fragment}"


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")


def redact_urls(text: str) -> str:
    """``text`` (a message, a log line) with each URL in it as :func:`redact_url` writes it."""
    return _URL.sub(lambda m: redact_url(m.group()), text) if "://" in text else text


def carries_credentials(url: str) -> bool:
    """Whether ``url`` itself holds a secret by :func:`redact_url`'s rule."""
    return redact_url(url) != url


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def in_clear(url: str) -> bool:
    """Whether what is sent to ``url`` crosses a network unencrypted: plain http (the default
    where no scheme is given) to a host other than this machine's loopback."""
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
    except ValueError:  # malformed: nothing is sent to it
        return False
    return parts.scheme == "http" and not is_loopback(parts.hostname or "")


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
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
    except ValueError as exc:  # a stray bracket
        raise SourceUnavailable(
            f"{redact_url(url)!r} is not {what} ({exc}); give one like {example}"
        ) from None
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
    return Endpoint(parts.scheme, parts.hostname, port, parts.path or default_path, parts.query, headers, tls)


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
