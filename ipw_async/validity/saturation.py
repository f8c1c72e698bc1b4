"""Over-saturation: requests arriving faster than the server finishes them.

An over-saturated server has no steady state: the requests waiting for it, and each one's wait
for its first token, grow for as long as the load lasts, and so do the figures a run reports
(queued requests hold no GPU work but accrue static energy). Both signals are tested over the
last :data:`WINDOW_S` seconds of the run, cut into :data:`BINS` bins of equal time so that the
samples are nearly independent (requests that overlap are not): the outstanding requests'
time-average per bin (from arrival, so a client-side queue counts), and the median wait from
arrival to first token of the first tokens that came in the bin. The run is over-saturated when
both rise, each significantly (one-sided t-test on the bins' regression slope, p < 0.001) and
materially (by at least :data:`MIN_RISE` of its mean level across the window). A closed loop
holds its outstanding requests constant, so only a ramp (excluded: the window starts where it
ends) or an open loop can trip it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

import numpy as np
from scipy import stats

MIN_S = 10.0  # seconds of load before any verdict
WINDOW_S = 60.0
BINS = 10
MIN_BINS = 6  # bins with first tokens in them, for the TTFT trend
MIN_RISE = 0.25
P_VALUE = 0.001
GRID_S = 0.05  # in-flight is read this often for its bin means
MAX_LOOKS = 600  # a finished run is looked at as the live watch would, at most this many times


@dataclass(frozen=True)
class Trend:
    """A signal's least-squares line over the window's bins."""

    slope_per_s: float
    rise: float  # the line's change across the window, over the signal's mean
    t: float  # slope / its standard error
    bins: int

    @property
    def rising(self) -> bool:
        return self.t > _critical_t(self.bins - 2) and self.rise >= MIN_RISE


@cache
def _critical_t(dof: int) -> float:
    return float(stats.t.ppf(1 - P_VALUE, dof))


def trend(centers_s: np.ndarray, values: np.ndarray) -> Trend | None:
    """The slope of ``values`` against time, with its t statistic; None under 3 finite bins.

    Least squares in closed form: the live watch looks every second on the event loop, where
    ``scipy.stats.linregress`` would cost 0.3 ms of argument checks per line of 10 points."""
    keep = np.isfinite(values)
    x, y = centers_s[keep], values[keep]
    if x.size < 3 or np.ptp(x) == 0:
        return None
    dx, mean = x - x.mean(), float(y.mean())
    sxx = float(dx @ dx)
    slope = float(dx @ (y - mean)) / sxx
    residual = y - mean - slope * dx
    stderr = np.sqrt(float(residual @ residual) / (x.size - 2) / sxx)
    t = slope / stderr if stderr > 0 else (np.inf if slope > 0 else -np.inf if slope < 0 else 0.0)
    rise = slope * float(np.ptp(x)) / mean if mean > 0 else 0.0
    return Trend(slope, float(rise), float(t), int(x.size))


@dataclass
class Arrivals:
    """A run's requests as the detector sees them, in seconds of the run clock: when each
    arrived (its scheduled time), when it ended (NaN while open), and each first token's time
    and its wait from arrival. Sorted once, so that each look costs its window, not the run."""

    arrived_s: np.ndarray
    ended_s: np.ndarray
    first_token_s: np.ndarray
    wait_s: np.ndarray
    already: int = 0  # outstanding before the first of these arrived (a live window's start)

    def __post_init__(self) -> None:
        self.arrived_s = np.sort(self.arrived_s)
        self.ended_s = np.sort(self.ended_s[np.isfinite(self.ended_s)])
        have = np.isfinite(self.first_token_s)
        order = np.argsort(self.first_token_s[have], kind="stable")
        self.first_token_s, self.wait_s = self.first_token_s[have][order], self.wait_s[have][order]

    def outstanding(self, grid_s: np.ndarray) -> np.ndarray:
        arrived = np.searchsorted(self.arrived_s, grid_s, "right")
        return self.already + arrived - np.searchsorted(self.ended_s, grid_s, "right")

    def first_tokens(self, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
        """First tokens in ``[lo, hi]``: their times and their waits."""
        a, b = np.searchsorted(self.first_token_s, [lo, hi], "left")
        return self.first_token_s[a:b], self.wait_s[a:b]


@dataclass
class Check:
    """One look at the window ``[start_s, now_s]``."""

    at_s: float
    in_flight: Trend | None
    ttft: Trend | None

    @property
    def oversaturated(self) -> bool:
        return bool(self.in_flight and self.ttft and self.in_flight.rising and self.ttft.rising)

    def describe(self) -> str:
        assert self.in_flight is not None and self.ttft is not None
        return (
            f"requests in flight rose {self.in_flight.rise:.0%} and the wait for a first token "
            f"{self.ttft.rise:.0%} over the last {min(self.at_s, WINDOW_S):.0f} s"
        )


def check(arrivals: Arrivals, start_s: float, now_s: float) -> Check | None:
    """Both signals' trends over the last :data:`WINDOW_S` s before ``now_s`` (not before
    ``start_s``); None before :data:`MIN_S` s of load."""
    if now_s - start_s < MIN_S:
        return None
    lo = max(start_s, now_s - WINDOW_S)
    edges = np.linspace(lo, now_s, BINS + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    grid = np.arange(lo + GRID_S / 2, now_s, GRID_S)
    level = arrivals.outstanding(grid)
    slot = np.minimum(((grid - lo) / (now_s - lo) * BINS).astype(int), BINS - 1)
    in_flight = np.bincount(slot, weights=level, minlength=BINS) / np.maximum(
        np.bincount(slot, minlength=BINS), 1
    )
    times, wait = arrivals.first_tokens(lo, now_s)  # in time order: each bin is a slice
    waits = np.array([_median(part) for part in np.split(wait, np.searchsorted(times, edges[1:-1]))])
    ttft = trend(centers, waits) if np.isfinite(waits).sum() >= MIN_BINS else None
    return Check(now_s, trend(centers, in_flight), ttft)


def _median(values: np.ndarray) -> float:
    """``np.median`` without its wrapper's 90 µs: ten of these per look, on the event loop."""
    if not values.size:
        return np.nan
    ordered = np.sort(values)
    return float(ordered[(values.size - 1) // 2] + ordered[values.size // 2]) / 2


def onset(arrivals: Arrivals, start_s: float, end_s: float) -> float:
    """When the pile-up began: the knot of the best flat-then-rising line through the
    outstanding requests (1 s bins), searched over the window."""
    edges = np.arange(start_s, end_s + 1.0, 1.0)
    centers = (edges[:-1] + edges[1:]) / 2
    level = arrivals.outstanding(centers)
    best, at = np.inf, start_s
    for knot in centers[:-2]:
        hinge = np.maximum(centers - knot, 0.0)
        design = np.column_stack([np.ones_like(centers), hinge])
        _, residual, *_ = np.linalg.lstsq(design, level, rcond=None)
        sse = float(residual[0]) if residual.size else 0.0
        if sse < best:
            best, at = sse, float(knot)
    return at


def assess(arrivals: Arrivals, start_s: float, end_s: float) -> dict[str, Any]:
    """The run's verdict as ``summary.json`` gives it: the checks a live watch would have made
    every second (every :data:`MAX_LOOKS`-th of the run on a longer one), the first that fired,
    and when the pile-up began."""
    step_s = max(1.0, (end_s - start_s) / MAX_LOOKS)
    base: dict[str, Any] = {
        "oversaturated": None,
        "reason": None,
        "detected_s": None,
        "began_s": None,
        "share_of_run": None,
        "window_s": WINDOW_S,
        "test": f"in-flight and first-token wait both rising (p < {P_VALUE:g}, by ≥ {MIN_RISE:.0%})",
    }
    if end_s - start_s < MIN_S:
        return base | {"reason": f"under {MIN_S:.0f} s of load: too short to tell"}
    last: Check | None = None
    for now in np.arange(start_s + MIN_S, end_s + step_s / 2, step_s):
        last = check(arrivals, start_s, min(float(now), end_s))
        if last is not None and last.oversaturated:
            began = onset(arrivals, start_s, end_s)
            return base | {
                "oversaturated": True,
                "reason": last.describe(),
                "detected_s": last.at_s,
                "began_s": began,
                "share_of_run": (end_s - began) / (end_s - start_s),
                "trends": _trends(last),
            }
    return base | {"oversaturated": False, "trends": _trends(last) if last else None}


def _trends(last: Check) -> dict[str, Any]:
    return {
        name: None if t is None else asdict(t) | {"rising": t.rising}
        for name, t in (("in_flight", last.in_flight), ("ttft", last.ttft))
    }
