"""A counter's update grid, as a probe learned it (:mod:`.cadence`), and reads timed by it.

Apart from the learning so that a reader of a run's grids (the run directory, finishing, the
sampler's parent) needs numpy only, not the solver the learning uses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

PROBE_INTERVAL_NS = 2_000_000  # a probe's reads, this far apart: a grid's resolution at best


@dataclass(frozen=True)
class CounterGrid:
    """A counter's updates: at ``phase_ns + k × period_ns`` on the run clock, as learned by a
    probe that started at ``learned_at_ns``.

    ``period_ns == 0`` means the counter updates about as fast as it can be read: a value is
    as old as the read, no older.
    """

    period_ns: float
    phase_ns: float = 0.0
    learned_at_ns: float = 0.0
    # how far an update may land from the grid: the probe's read interval, or the updates'
    # own scatter about the grid where the counter's clock jitters more than that
    resolution_ns: float = PROBE_INTERVAL_NS

    def last_update(self, t: np.ndarray) -> np.ndarray:
        """The update each read at ``t`` saw."""
        if self.period_ns <= 0:
            return t
        return self.phase_ns + np.floor((t - self.phase_ns) / self.period_ns) * self.period_ns

    def as_dict(self) -> dict[str, float]:
        return {
            "period_ms": self.period_ns / 1e6,
            "phase_ns": self.phase_ns,
            "learned_at_ns": self.learned_at_ns,
            "resolution_ms": self.resolution_ns / 1e6,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CounterGrid:
        resolution_ms = float(data.get("resolution_ms", PROBE_INTERVAL_NS / 1e6))  # runs before it had one
        return cls(
            float(data["period_ms"]) * 1e6,
            float(data["phase_ns"]),
            float(data["learned_at_ns"]),
            resolution_ms * 1e6,
        )


def chained(grids: tuple[CounterGrid, ...]) -> tuple[CounterGrid, ...]:
    """Each grid with its period refined by the next probe's phase.

    One probe times an update to a fraction of a ms but its period only to some µs (worse
    under load: ±0.4 ms was seen on an H100); two probes 20 s apart are a known number of
    periods apart, so the span between their phases gives the period to a fraction of a µs.
    The count is predicted by the best period known so far and by the later probe's own
    estimate, whichever puts the span nearer a whole number of periods; a probe neither can
    reach starts afresh from its own estimate. The last grid keeps the period before it.
    """
    out = list(grids)
    period = grids[0].period_ns if grids else 0.0
    for i, b in enumerate(grids[1:], start=1):
        a = out[i - 1]
        span = b.phase_ns - a.phase_ns
        counts = [span / p for p in (period, b.period_ns) if p > 0 and b.period_ns > 0]
        best = min(counts, key=lambda c: abs(c - round(c)), default=0.0)
        k = round(best)
        if k > 0 and abs(best - k) < 0.25:
            period = span / k
            out[i - 1] = replace(a, period_ns=period)
            out[i] = replace(b, period_ns=period)
        else:
            period = b.period_ns
    return tuple(out)


def last_updates(grids: tuple[CounterGrid, ...], t: np.ndarray) -> np.ndarray:
    """The update each read at ``t`` saw, by the latest grid learned before it (the first
    grid for reads before any), periods refined by :func:`chained`."""
    grids = chained(grids)
    which = np.clip(np.searchsorted([g.learned_at_ns for g in grids], t, side="right") - 1, 0, None)
    out = np.empty_like(t)
    for i, grid in enumerate(grids):
        mask = which == i
        out[mask] = grid.last_update(t[mask])
    return out
