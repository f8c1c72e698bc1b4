"""Telemetry sources by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .amdsmi import AmdSmiSource
from .base import TelemetrySource
from .cpu_model import CpuModelSource
from .host import PsutilSource
from .nvml import NvmlSource
from .rapl import RaplSource

# A factory takes the GPU selection; sources that are not GPUs ignore it.
SourceFactory = Callable[[Sequence[str] | None], TelemetrySource]

_FACTORIES: dict[str, SourceFactory] = {
    "nvml": lambda gpus: NvmlSource(gpus=gpus),
    "amdsmi": lambda gpus: AmdSmiSource(gpus=gpus),
    "rapl": lambda gpus: RaplSource(),
    "psutil": lambda gpus: PsutilSource(),
    "cpu-model": lambda gpus: CpuModelSource(),
}


def available_source_names() -> list[str]:
    """The names :func:`make_source` accepts."""
    return list(_FACTORIES)


def make_source(name: str, *, gpus: Sequence[str] | None = None) -> TelemetrySource:
    """A new, unopened source; ``gpus`` selects GPUs by index or UUID for GPU sources."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(
            f"unknown telemetry source {name!r}; valid names: {', '.join(available_source_names())}"
        ) from None
    return factory(gpus)
