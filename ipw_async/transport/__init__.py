"""HTTP/1.1 under the client, on asyncio protocols and httptools.

Bytes are stamped where they come off the socket, in the protocol's ``data_received``, parsed
once the loop has read every socket that was ready, and handed to a sink as
``(arrival_ns, bytes)``; the streaming client reads exchanges directly,
and :class:`PoolTransport` puts httpx's API over the same pool for everything else.
:class:`~ipw_async.transport.scripted.ScriptedNetwork` stands in for the sockets in tests.
"""

from ._connection import BodySink, Clock, ClosedBeforeResponse, Connection, Exchange
from ._httpx import PoolTransport
from ._pool import ConnectionPool, Network, Route, Sockets, route_for

__all__ = [
    "BodySink",
    "Clock",
    "ClosedBeforeResponse",
    "Connection",
    "ConnectionPool",
    "Exchange",
    "Network",
    "PoolTransport",
    "Route",
    "Sockets",
    "route_for",
]
