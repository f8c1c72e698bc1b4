"""The streaming client over ipw-async's own transport, for each API a run speaks."""

from ._client import (
    APIS,
    ENDPOINTS,
    Api,
    ClientConfig,
    ServerUnreachable,
    StreamingClient,
    api_headers,
    api_url,
    list_models,
    transport_failed,
)
from ._events import (
    ChatParser,
    EventStream,
    MessagesParser,
    ResponsesParser,
    StreamParser,
    error_message,
    fail,
)

__all__ = [
    "APIS",
    "ENDPOINTS",
    "Api",
    "ChatParser",
    "ClientConfig",
    "EventStream",
    "MessagesParser",
    "ResponsesParser",
    "ServerUnreachable",
    "StreamParser",
    "StreamingClient",
    "api_headers",
    "api_url",
    "error_message",
    "fail",
    "list_models",
    "transport_failed",
]
