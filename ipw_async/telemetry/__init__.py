"""Telemetry: sources behind one interface, the sampler, and the log it keeps.

The public names load their module on first use: a reader of URLs or grids (the client, the
run directory) needs neither the sampler nor the solver its counter probes use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

_EXPORTS: dict[str, str] = {
    "Meter": "base",
    "OpenSource": "base",
    "Quantity": "base",
    "Reading": "base",
    "SourceInfo": "base",
    "SourceUnavailable": "base",
    "TelemetrySource": "base",
    "Sampler": "sampler",
    "TelemetryLog": "sampler",
    "RemoteAccess": "setup",
    "TelemetrySetup": "setup",
    "open_sources": "setup",
}

__all__ = [
    "Meter",
    "OpenSource",
    "Quantity",
    "Reading",
    "RemoteAccess",
    "Sampler",
    "SourceInfo",
    "SourceUnavailable",
    "TelemetryLog",
    "TelemetrySetup",
    "TelemetrySource",
    "open_sources",
]

if TYPE_CHECKING:
    from .base import Meter, OpenSource, Quantity, Reading, SourceInfo, SourceUnavailable, TelemetrySource
    from .sampler import Sampler, TelemetryLog
    from .setup import RemoteAccess, TelemetrySetup, open_sources

__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())
