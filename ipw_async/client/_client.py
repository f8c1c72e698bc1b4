"""The streaming client: a request out to one of the APIs a run speaks (OpenAI chat,
completions and Responses, Anthropic Messages), SSE events stamped on arrival into a record,
every failure a typed outcome."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from .._clock import now_ns
from ..records import ErrorType, RequestRecord, Status
from ..telemetry.http import redact_url, redact_urls
from ..transport import Clock, ConnectionPool, Network, PoolTransport
from ._events import (
    ChatParser,
    EventStream,
    MessagesParser,
    ResponsesParser,
    StreamParser,
    error_message,
    fail,
)


@dataclass(frozen=True)
class Api:
    """One API a run can speak: where its calls go under the base URL, how its replies read,
    and whether a stream carries its token counts only when asked (OpenAI's
    ``stream_options.include_usage``; the Responses and Messages APIs always send them)."""

    path: str
    parser: type[StreamParser]
    asks_usage: bool = False


APIS: dict[str, Api] = {
    "chat": Api("/chat/completions", ChatParser, asks_usage=True),
    "completions": Api("/completions", ChatParser, asks_usage=True),
    "responses": Api("/responses", ResponsesParser),
    "messages": Api("/messages", MessagesParser),
}
ENDPOINTS = tuple(APIS)  # --endpoint's choices
ANTHROPIC_VERSION = "2023-06-01"  # the Messages API version whose events the parser reads


def api_headers(endpoint: str, api_key: str | None) -> dict[str, str]:
    """The headers ``endpoint``'s API wants on every call: ``api_key`` as Anthropic's
    ``x-api-key`` with the API version it requires for messages, as a bearer token otherwise."""
    if endpoint == "messages":
        return {"anthropic-version": ANTHROPIC_VERSION} | ({"x-api-key": api_key} if api_key else {})
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


class ServerUnreachable(Exception):
    """The server could not be used at all; the message says what to do."""


@dataclass(frozen=True)
class ClientConfig:
    base_url: str
    endpoint: str = "chat"  # one of ENDPOINTS
    api_key: str | None = None
    connect_timeout: float = 10.0
    read_timeout: float = 300.0
    max_connections: int = 64

    def __repr__(self) -> str:  # never print the key, nor a secret in the URL
        return f"ClientConfig(base_url={redact_url(self.base_url)!r}, endpoint={self.endpoint!r})"


def api_url(base_url: str, path: str) -> str:
    """``path`` (``/models``) under ``base_url``, whose query (``?api-version=…``, a gateway's
    ``?key=…``) stays at the end, where the server reads it."""
    base, asked, query = base_url.partition("?")
    return f"{base.rstrip('/')}{path}{asked}{query}"


def _classify(exc: BaseException) -> ErrorType:
    if isinstance(exc, httpx.TimeoutException):
        return ErrorType.TIMEOUT
    if isinstance(exc, httpx.ConnectError | httpx.ProxyError):
        return ErrorType.CONNECT
    if isinstance(exc, httpx.TransportError):
        return ErrorType.DISCONNECT
    return ErrorType.OTHER


def transport_failed(record: RequestRecord, exc: BaseException) -> None:
    """The request failed in the transport: the record says how, in the transport's words."""
    if record.error_type is ErrorType.DISCONNECT:
        # the transport's own explanation replaces "the stream ended early"
        record.status, record.error_type, record.error_message = Status.OK, None, None
    kind = _classify(exc)
    fail(record, kind, f"{type(exc).__name__}: {exc}" if str(exc) else kind.value)


class StreamingClient:
    """One connection pool sized to the load; a failed request is an outcome, and only a
    request that never ran (sent as the server closed a pooled connection) is sent again.

    The hot path reads the transport directly: httpx's response machinery over the same
    transport costs a few µs more per event (``benchmarks/client_overhead.py`` measures it).
    """

    def __init__(
        self, config: ClientConfig, t0_ns: int, network: Network | None = None, clock: Clock = now_ns
    ) -> None:
        self.config = config
        self.t0_ns = t0_ns
        self.clock = clock
        api = APIS[config.endpoint]
        self._parser = api.parser
        url = api_url(config.base_url, api.path)
        headers = "content-type: application/json\r\naccept: text/event-stream\r\nuser-agent: ipw-async\r\n"
        headers += "".join(f"{k}: {v}\r\n" for k, v in api_headers(config.endpoint, config.api_key).items())
        self._headers = headers.encode()
        self._pool = ConnectionPool(
            config.max_connections,
            connect_timeout_s=config.connect_timeout,
            read_timeout_s=config.read_timeout,
            network=network,
            clock=clock,
        )
        self._route = self._pool.route(url)

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def send(self, record: RequestRecord, body: bytes) -> None:
        """Send one streaming request and fill ``record``; never raises but for cancellation."""
        t0 = self.t0_ns
        parser = self._parser(record, t0)
        exchange = None
        headers = self._headers + b"x-ipw-request-id: %d\r\n" % record.request_id
        try:
            record.sent_ns = self.clock() - t0
            exchange = await self._pool.request(self._route, b"POST", headers, body)
            record.sent_ns = exchange.sent_ns - t0  # the attempt that was answered
            record.reconnects = exchange.retries
            record.headers_ns = exchange.headers_ns - t0
            record.http_status = exchange.status
            if exchange.status >= 400:
                detail = error_message(await exchange.read())
                fail(record, ErrorType.HTTP, f"HTTP {exchange.status}: {detail}")
                return
            kind = exchange.header(b"content-type")
            if kind.startswith("application/json"):  # a whole completion: stream=true ignored
                await exchange.read()
                fail(
                    record,
                    ErrorType.NOT_STREAMING,
                    f"the server answered with one {kind} body, not an event stream: "
                    "it ignored stream=true, so no token timing can be measured",
                )
                return
            events = EventStream(parser, t0)
            exchange.stream_to(events.receive)
            await exchange.finished()
            events.end()
            parser.close()
        except asyncio.CancelledError:
            parser.close()
            record.status = Status.CANCELLED
            record.error_type = ErrorType.CANCELLED
            record.error_message = "the run was interrupted while this request was in flight"
            raise
        except Exception as exc:  # every transport failure is a recorded outcome
            parser.close()
            transport_failed(record, exc)
        finally:
            if exchange is not None and not exchange.done:
                exchange.abandon()
            if record.closed_ns is None:
                record.closed_ns = self.clock() - t0


async def list_models(
    base_url: str, api_key: str | None, timeout: float = 10.0, endpoint: str = "chat"
) -> list[str]:
    """The server's models, through the run's own transport (its TLS and proxy rules), asked
    with the key as ``endpoint``'s API sends it; raises ServerUnreachable with an actionable
    one-line message."""
    shown = redact_url(base_url)
    if not base_url.startswith(("http://", "https://")):
        raise ServerUnreachable(f"invalid --base-url {shown!r}: expected http(s)://host:port/v1")
    headers = api_headers(endpoint, api_key)
    url = api_url(base_url, "/models")
    try:
        transport = PoolTransport(ConnectionPool(1, connect_timeout_s=timeout, read_timeout_s=timeout))
        async with httpx.AsyncClient(transport=transport, timeout=timeout) as http:
            response = await http.get(url, headers=headers)
    except httpx.ConnectError:
        raise ServerUnreachable(
            f"cannot connect to {shown}: is the server running? "
            "(omit --base-url to use the built-in simulator)"
        ) from None
    except httpx.TimeoutException:
        raise ServerUnreachable(f"{shown} did not answer within {timeout:.0f} s") from None
    except httpx.HTTPError as exc:
        raise ServerUnreachable(f"cannot use {shown}: {redact_urls(str(exc))}") from None
    anthropic = endpoint == "messages"
    if response.status_code in (401, 403):
        variable = "ANTHROPIC_API_KEY" if anthropic else "OPENAI_API_KEY"
        raise ServerUnreachable(
            f"{shown} rejected the API key (HTTP {response.status_code}); set --api-key or {variable}"
        )
    if response.status_code == 404:
        api = "Anthropic-compatible" if anthropic else "OpenAI-compatible"
        raise ServerUnreachable(
            f"no {api} API at {shown} (GET /models gave 404); the base URL usually ends in /v1"
        )
    if response.status_code >= 400:
        hint = "; it may still be starting, try again shortly" if response.status_code == 503 else ""
        raise ServerUnreachable(
            f"{shown} answered GET /models with HTTP {response.status_code}: "
            f"{error_message(response.content)}{hint}"
        )
    try:
        return [m["id"] for m in response.json().get("data", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ServerUnreachable(f"{api_url(shown, '/models')} did not return an OpenAI model list") from None
