"""A labelled estimate of CPU package power, for hosts with no CPU energy counter."""

from __future__ import annotations

import os

from .base import Meter, Quantity, Reading, SourceInfo, TelemetrySource
from .host import CpuUtilisation, import_psutil

# Default TDP when none is given: a rough per-logical-core figure, clamped to the range of
# real parts (a small laptop chip to a large server socket).
_W_PER_CORE = 10.0
_MIN_TDP_W = 15.0
_MAX_TDP_W = 280.0

# Package power rises faster than linearly at low utilisation: the first busy core wakes the
# uncore (caches, memory controller, interconnect) and boosts the clock, while later cores add
# less as frequency drops under the power limit. u ** 0.75 is concave with f(0)=0 and f(1)=1.
_CURVE_EXPONENT = 0.75


class CpuModelSource(TelemetrySource):
    """Estimated CPU power: ``idle + (tdp - idle) * util ** 0.75``, never a measurement.

    ``idle_fraction`` is idle power as a fraction of ``tdp_w``; utilisation is system-wide.
    """

    name = "cpu-model"

    def __init__(self, tdp_w: float | None = None, idle_fraction: float = 0.3) -> None:
        if tdp_w is not None and tdp_w <= 0:
            raise ValueError(f"tdp_w must be positive, got {tdp_w}")
        if not 0.0 <= idle_fraction <= 1.0:
            raise ValueError(f"idle_fraction must be in [0, 1], got {idle_fraction}")
        if tdp_w is None:
            cores = os.cpu_count() or 1
            assumed = cores * _W_PER_CORE
            self.tdp_w = min(_MAX_TDP_W, max(_MIN_TDP_W, assumed))
            clamp = f", clamped to {self.tdp_w:g} W" if self.tdp_w != assumed else ""
            self._tdp_origin = f" (assumed {_W_PER_CORE:g} W/core × {cores} cores{clamp})"
        else:
            self.tdp_w = float(tdp_w)
            self._tdp_origin = ""
        self.idle_w = self.tdp_w * idle_fraction
        self._column = f"{self.name}.{Quantity.POWER_W}"
        self._util: CpuUtilisation | None = None

    def open(self) -> SourceInfo:
        self._util = CpuUtilisation(import_psutil("the cpu-model estimate"))
        return SourceInfo(
            columns=[self._column],
            meters=[Meter(channel=self.name, kind="estimate", accelerator=False)],
            description=f"estimate: TDP {self.tdp_w:g} W{self._tdp_origin} × utilisation curve; "
            "not a measurement",
        )

    def read(self) -> Reading:
        assert self._util is not None, "read() before open()"
        try:
            percent = self._util.percent()
        except OSError:
            percent = None
        power = None if percent is None else self.power_at(percent / 100.0)
        return Reading({self._column: power})

    def power_at(self, util: float) -> float:
        """Modelled package power (W) at a utilisation in [0, 1]."""
        return self.idle_w + (self.tdp_w - self.idle_w) * min(1.0, max(0.0, util)) ** _CURVE_EXPONENT
