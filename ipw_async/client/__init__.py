"""The OpenAI-compatible streaming client over ipw-async's own transport."""

from ._client import ClientConfig, ServerUnreachable, StreamingClient, list_models
from ._events import EventStream, StreamParser

__all__ = ["ClientConfig", "EventStream", "ServerUnreachable", "StreamParser", "StreamingClient", "list_models"]
