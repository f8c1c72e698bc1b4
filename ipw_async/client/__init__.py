"""The OpenAI-compatible streaming client over ipw-async's own transport."""

from ._client import (
    ENDPOINTS,
    ClientConfig,
    ServerUnreachable,
    StreamingClient,
    api_url,
    list_models,
    transport_failed,
)
from ._events import EventStream, StreamParser, Timings, Usage, error_message, fail, read_usage

__all__ = [
    "ENDPOINTS",
    "ClientConfig",
    "EventStream",
    "ServerUnreachable",
    "StreamParser",
    "StreamingClient",
    "Timings",
    "Usage",
    "api_url",
    "error_message",
    "fail",
    "list_models",
    "read_usage",
    "transport_failed",
]
