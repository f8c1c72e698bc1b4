"""Telemetry sources by name."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .amdsmi import AmdSmiSource
from .base import TelemetrySource
from .cpu_model import CpuModelSource
from .host import PsutilSource
from .nvml import NvmlSource
from .prometheus import PrometheusSource
from .rapl import RaplSource
from .sim import SimDeviceSource

# A factory takes the GPU selection and the run's process (whose memory psutil reports, from
# whichever process reads it); sources that are not GPUs ignore the first.
SourceFactory = Callable[[Sequence[str] | None, int], TelemetrySource]

_FACTORIES: dict[str, SourceFactory] = {
    "nvml": lambda gpus, pid: NvmlSource(gpus=gpus),
    "amdsmi": lambda gpus, pid: AmdSmiSource(gpus=gpus),
    "rapl": lambda gpus, pid: RaplSource(),
    "psutil": lambda gpus, pid: PsutilSource(pid),
    "cpu-model": lambda gpus, pid: CpuModelSource(),
}


def available_source_names() -> list[str]:
    """The names :func:`make_source` accepts."""
    return list(_FACTORIES)


def make_source(name: str, *, gpus: Sequence[str] | None = None, pid: int | None = None) -> TelemetrySource:
    """A new, unopened source; ``gpus`` selects GPUs by index or UUID for GPU sources, ``pid``
    the run's process (this one by default)."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(
            f"unknown telemetry source {name!r}; valid names: {', '.join(available_source_names())}"
        ) from None
    pid = os.getpid() if pid is None else pid
    source = factory(gpus, pid)
    source.recipe = {"name": name, "gpus": list(gpus) if gpus is not None else None, "pid": pid}
    return source


def from_recipe(recipe: dict[str, Any]) -> TelemetrySource:
    """The source a :attr:`TelemetrySource.recipe` describes, new and unopened (in the sampler's
    own process, :mod:`.process`)."""
    if recipe["name"] == "sim":
        return SimDeviceSource(recipe["root_url"])
    if recipe["name"] == "prometheus":
        ca_file = recipe["ca_file"]
        return PrometheusSource(
            recipe["url"], token=recipe["token"], ca_file=None if ca_file is None else Path(ca_file)
        )
    return make_source(recipe["name"], gpus=recipe["gpus"], pid=recipe["pid"])
