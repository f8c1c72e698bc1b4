"""When an energy counter really changes, learned by reading it fast for a moment.

A GPU's energy counter updates on its own clock (often every 100 ms) however often it is
read, so a value read at 50 ms intervals may be up to a whole update period old. Timed to the
midpoint between reads, it is off by up to half a read interval, the same offset all run long
(both clocks are periodic), and that offset moves energy across request boundaries. Read
about every 2 ms for a second, at drifting phase so that the reads' own grid does not bias
every update alike, the counter shows its update grid: each read's value can then be timed
to the update that produced it. The device's clock drifts from the host's, and a grid
learned from ten updates is good to some µs per period, so the probe is repeated through the
run and each read is timed by the latest grid learned before it.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog

from .grid import CounterGrid

# How often a probe is repeated, how many times its length it may go on for a slow counter,
# and the least updates it must see to trust a grid (its reads: PROBE_INTERVAL_NS apart).
PROBE_EVERY_NS = 20_000_000_000
SECOND_PROBE_AFTER_NS = 4_000_000_000  # the first two probes: a period from the span between them
PROBE_PATIENCE = 5
MIN_UPDATES = 4
# A probe goes on, up to PIN_PATIENCE times its length, until its reads pin a clean counter's
# phase to PHASE_BAND_NS: each update is bracketed by two reads some 2 ms apart at a random
# offset, so the ten updates of a 100 ms counter in a second leave a band near a third of a ms
# and the grid lands up to 0.4–0.6 ms off (p95 and worst of 200 drawn probes); read twice as
# long, 0.2–0.4 ms (benchmarks/fleet_telemetry.py measures it on a live counter).
PIN_PATIENCE = 2
PHASE_BAND_NS = 200_000
# how finely the sampler tries out tick phases to keep its reads clear of counter updates
CLEARANCE_STEP_NS = 250_000


def learn_grid(t: np.ndarray, e: np.ndarray) -> CounterGrid | None:
    """The update grid of a counter read at short intervals, or None if it shows none.

    None when it changed fewer than ``MIN_UPDATES`` times (slower than the probe is long), or
    when its changes are not periodic: those reads are then timed to the midpoint as before.
    Where no grid fits updates that came within four reads of each other, or between most
    reads, the counter is taken as fast as its reads (period 0): each value timed as read.
    """
    changed = np.flatnonzero(np.diff(e) > 0) + 1
    if changed.size < MIN_UPDATES:
        return None
    start = float(t[0])
    resolution = float(np.median(np.diff(t)))
    updates = (t[changed - 1] + t[changed]) / 2.0  # each to within half a probe read
    period = float(np.median(np.diff(updates)))
    grid = _fit_grid(t, changed, updates, period, start, resolution)
    if grid is None and (period < 4 * resolution or changed.size >= 0.5 * (t.size - 1)):
        # Too few reads an update to time them, and no fit: the value is a few reads old at
        # most. Only where the fit fails: a probe slowed to 6 ms reads on a busy host saw a
        # 20 ms counter this way, and a read timed as it came was then 10 ms off on average.
        return CounterGrid(0.0, 0.0, start)
    return grid


def _fit_grid(
    t: np.ndarray, changed: np.ndarray, updates: np.ndarray, period: float, start: float, resolution: float
) -> CounterGrid | None:
    """The grid through the updates bracketed by ``t`` (changes at ``changed``, timed to
    ``updates``, about ``period`` apart), or None where they do not lie on one."""
    # Number the updates gap by gap, every one of them: the median gap is quantised to the
    # reads' 2 ms, so dividing the whole span by it would drift off a 33.3 ms counter within a
    # second, and so would the gaps between sharp brackets alone (several periods long)
    steps = np.round(np.diff(updates) / period)
    if (steps < 1).any():
        return None  # two updates much closer than the period: not periodic
    k = np.concatenate(([0.0], np.cumsum(steps)))
    # a read delayed by a busy machine brackets its update loosely: leave it out of the fit
    sharp = t[changed] - t[changed - 1] < period / 4
    k, updates, before, after = k[sharp], updates[sharp], t[changed - 1][sharp], t[changed][sharp]
    if updates.size < MIN_UPDATES:
        return None
    slope, intercept = np.polyfit(k, updates, 1)
    if np.max(np.abs(updates - (intercept + slope * k))) > period / 4:
        return None  # not periodic
    residuals = updates - (intercept + slope * k)
    spread = float(np.sqrt(np.sum((k - k.mean()) ** 2)))
    slope_error = float(np.std(residuals)) / spread if spread else 0.0
    period, phase = _within_brackets(k, before, after, slope, intercept, 2 * slope_error)
    scatter = float(np.max(np.abs(updates - (phase + period * k))))
    # the update mid-probe: a period off by some µs tilts the grid least there
    return CounterGrid(period, phase + float(np.median(k).round()) * period, start, max(resolution, scatter))


def settled(t: np.ndarray, e: np.ndarray, grid: CounterGrid) -> bool:
    """Whether more reads would not place ``grid`` better: a counter as fast as its reads, one
    whose sharp brackets leave phases no wider than ``PHASE_BAND_NS``, or one whose brackets
    disagree (its updates jitter, or a read was stamped late: more reads cannot pin it)."""
    if grid.period_ns <= 0:
        return True
    changed = np.flatnonzero(np.diff(e) > 0) + 1
    before, after = t[changed - 1], t[changed]
    sharp = after - before < grid.period_ns / 4
    before, after = before[sharp], after[sharp]
    k = np.round(((before + after) / 2 - grid.phase_ns) / grid.period_ns) * grid.period_ns
    # the phases every bracket allows; below zero, brackets that disagree (a late stamp)
    return bool(np.min(after - k) - np.max(before - k) <= PHASE_BAND_NS)


def _within_brackets(
    k: np.ndarray, before: np.ndarray, after: np.ndarray, slope: float, intercept: float, slack: float
) -> tuple[float, float]:
    """The grid (period, phase) that puts every update deepest inside the reads around it.

    Update k lies between the reads before and after it; reads at drifting phase make those
    brackets agree on a phase far more closely than their midpoints do (a tenth of their
    interval or better). The period stays within ``slack`` of the regression's: a slow
    counter shows a probe few updates, and the deepest grid then tilted as far as 800 ppm.
    The regression's grid where the brackets cannot all hold (a read stamped late)."""
    # unknowns: period and phase as offsets from the regression's (ns), and the margin
    ones = np.ones_like(k)
    a_ub = np.vstack(
        (
            np.column_stack((-k, -ones, ones)),  # before + margin <= phase + k·period
            np.column_stack((k, ones, ones)),  # phase + k·period + margin <= after
        )
    )
    b_ub = np.concatenate((intercept + slope * k - before, after - intercept - slope * k))
    result = linprog(
        c=[0.0, 0.0, -1.0], A_ub=a_ub, b_ub=b_ub, bounds=[(-slack, slack), (None, None), (None, None)]
    )
    if not result.success or result.x[2] <= 0:
        return slope, intercept
    return slope + float(result.x[0]), intercept + float(result.x[1])
