"""The OpenAI-compatible streaming client over ipw-async's own transport."""

from ._client import ClientConfig, ServerUnreachable, StreamingClient, api_url, list_models, transport_failed
from ._events import EventStream, StreamParser, error_message

__all__ = [
    "ClientConfig",
    "EventStream",
    "ServerUnreachable",
    "StreamParser",
    "StreamingClient",
    "api_url",
    "error_message",
    "list_models",
    "transport_failed",
]
