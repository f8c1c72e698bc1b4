"""What shows a run's progress, and the run state it shows, kept current while the run goes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..state import RunState

if TYPE_CHECKING:  # a display is chosen before any of these is loaded (the command line)
    from ..results import RunResult
    from ..telemetry import Sampler
    from .health import LoopLag


class Display(Protocol):
    """Something that shows a run's progress: plain lines, a live dashboard, or nothing."""

    async def run(self, state: RunState) -> None: ...  # until cancelled

    def finish(self, result: RunResult) -> None: ...

    def note(self, message: str) -> None: ...


def notes_to(display: Display | None) -> Callable[[str], None]:
    """Where the run's notes go: the display's, or nowhere without one."""
    return display.note if display is not None else _unheard


def _unheard(message: str) -> None:
    pass


async def mirror(state: RunState, sampler: Sampler, lag: LoopLag) -> None:
    """Copy the latest power readings and harness health into the run state, 4 times a second."""
    log = sampler.log
    meters = sampler.meters
    first: dict[str, float] = {}
    while True:
        await asyncio.sleep(0.25)
        for m in meters:
            ms = state.meters[m.channel]
            ms.power_w = log.latest(m.power_column)
            energy = log.latest(m.energy_column)
            if energy is not None:
                first.setdefault(m.channel, energy)
                ms.energy_j = energy - first[m.channel]
        lateness = log.recent("lateness_ns", 200)
        state.sampler_lateness_ms = float(np.percentile(lateness, 99)) / 1e6 if lateness else None
        state.loop_lag_ms = lag.recent_p99()
