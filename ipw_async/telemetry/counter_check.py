"""An energy counter checked against its own power readings before it is trusted.

Real counters fail in ways a run cannot see from the counter alone: stuck until a reboot,
counting backwards under concurrent reads, or off by a constant factor (a resolution truncated
to an integer). Over a window of at least :data:`MIN_WINDOW_NS` and :data:`MIN_PERIODS` of the
counter's updates, the counter's rise is compared with the trapezoid integral of the meter's
power column over the same span of reads. They may differ by :data:`BASE_TOLERANCE` (power
sampled every tick misses what happens between ticks, and a power field lags the device) plus
the counter's quantisation: a value read is up to one update period old at each end of the
span, so ``2 × period / window``, plus what a power field that lags the device by up to
:data:`POWER_LAG_S` misplaces across the window's ends: the change of power between them times
that lag (NVML's power usage is a 1 s average on many GPUs, which trails the device by half
of it). A window that opens idle
and closes under load is then not mistaken for a faulty counter.

Past that tolerance, a power field convicts a counter only of a gross fault: a unit or scale
error, off by :data:`GROSS_FACTOR` or more beyond it. Over seconds of bursty load a sampled
power field misses what happens between its readings: on a real H100 under host-bound prefill
bursts, 3 s windows of a correct counter read 0.68–1.26 of its integrated power (within 1.1%
over a whole run), and a check that demoted the counter there put the noisier source under
every query's energy. Such a window is kept, its ratio reported.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import polars as pl

from .._clock import NS
from .base import Meter

MIN_WINDOW_NS = 3 * NS
MIN_PERIODS = 10  # a shorter window leaves the counter's quantisation above 20%
# what a run waits for: 20 updates keep the quantisation within 10%
WANT_PERIODS = 20
MAX_WINDOW_NS = 60 * NS  # a counter slower than 3 s is checked over what a minute shows
BASE_TOLERANCE = 0.10
POWER_LAG_S = 0.5
# below this the power readings say too little energy flowed to judge the counter by
MIN_ENERGY_J = 1.0
MIN_READINGS = 3
# the reads inside a window start and end up to a tick within it: this much of it will do
COVERED = 0.9
# beyond the tolerance, how far off a counter must be for its power to convict it
GROSS_FACTOR = 2.0

OK, STUCK, BACKWARDS, DISAGREES, UNCHECKED = "ok", "stuck", "backwards", "disagrees", "unchecked"
FAILED = (STUCK, BACKWARDS, DISAGREES)
# counter events that mean a value went down: resets (NVML) and backward steps; a wrap is not
BACKWARD_EVENTS = ("resets", "backward")


@dataclass(frozen=True)
class CounterCheck:
    """One counter's verdict: ``ok | stuck | backwards | disagrees | unchecked``, and why."""

    status: str
    reason: str
    start_s: float | None = None  # where the readings checked begin, s since the run's start
    window_s: float | None = None
    counter_j: float | None = None
    power_j: float | None = None
    ratio: float | None = None  # counter_j / power_j
    tolerance: float | None = None  # the most |ratio − 1| may be
    period_ms: float | None = None  # the counter's update period the tolerance allowed for

    @property
    def failed(self) -> bool:
        return self.status in FAILED

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def counter_meters(meters: list[Meter]) -> list[Meter]:
    """The meters whose energy comes from a counter, the ones a check is for."""
    return [m for m in meters if m.kind == "counter"]


def _readings(frame: pl.DataFrame, time_col: str, col: str, window_ns: tuple[int, int]) -> np.ndarray:
    """``(t, value)`` rows of ``col`` inside the window, in time order (failed reads left out)."""
    if time_col not in frame.columns or col not in frame.columns:
        return np.empty((0, 2))
    a, b = window_ns
    rows = frame.select(time_col, col).drop_nulls().filter(pl.col(time_col).is_between(a, b))
    out = rows.to_numpy().astype(float)
    return out[np.argsort(out[:, 0], kind="stable")] if out.size else np.empty((0, 2))


def update_period_ns(meter: Meter, t: np.ndarray, e: np.ndarray) -> float | None:
    """The counter's update period: its learned grids, else the spacing of its value changes."""
    periods = [g.period_ns for g in meter.grids if g.period_ns > 0]
    if periods:
        return float(np.median(periods))
    changes = t[1:][np.diff(e) > 0]
    return float(np.median(np.diff(changes))) if changes.size >= 3 else None


def window_wanted_ns(meter: Meter, frame: pl.DataFrame, start_ns: int) -> int:
    """How long a window the meter's check waits for from ``start_ns``: 3 s, and 20 of its
    updates where the period is known by now, at most a minute."""
    read = _readings(frame, meter.time_column, meter.energy_column, (start_ns, np.iinfo(np.int64).max))
    period = update_period_ns(meter, read[:, 0], read[:, 1]) if read.size else None
    want = max(MIN_WINDOW_NS, int(WANT_PERIODS * period) if period else 0)
    return min(want, MAX_WINDOW_NS)


def _integral(power: np.ndarray, a: float, b: float) -> float:
    """Trapezoid integral (J) of power readings over [a, b] ns, interpolated at the edges."""
    t, p = power[:, 0], power[:, 1]
    inside = (t > a) & (t < b)
    tt = np.concatenate(([a], t[inside], [b]))
    pp = np.concatenate(([np.interp(a, t, p)], p[inside], [np.interp(b, t, p)]))
    return float(np.sum((pp[1:] + pp[:-1]) / 2.0 * np.diff(tt)) / NS)


def _backward_steps(events: dict[str, int] | None, e: np.ndarray) -> int:
    counted = sum(int((events or {}).get(k, 0)) for k in BACKWARD_EVENTS)
    return counted + int(np.sum(np.diff(e) < 0))


def check_counter(
    frame: pl.DataFrame, meter: Meter, window_ns: tuple[int, int], events: dict[str, int] | None = None
) -> CounterCheck:
    """Check one counter meter over ``window_ns`` (ns since run start); ``events`` are its
    resets, wraps and backward steps seen within the window."""
    energy = _readings(frame, meter.time_column, meter.energy_column, window_ns)
    if meter.power_column not in frame.columns:
        return CounterCheck(UNCHECKED, "it reports no power to check its counter against")
    power = _readings(frame, meter.time_column, meter.power_column, window_ns)
    if energy.shape[0] < MIN_READINGS or power.shape[0] < MIN_READINGS:
        return CounterCheck(
            UNCHECKED,
            f"too few readings to check its counter ({energy.shape[0]} of the counter, "
            f"{power.shape[0]} of its power, at least {MIN_READINGS} each)",
        )
    t, e = energy[:, 0], energy[:, 1]
    a, b = float(t[0]), float(t[-1])
    window_s = (b - a) / NS
    period = update_period_ns(meter, t, e)
    period_ms = None if period is None else period / 1e6
    required = max(MIN_WINDOW_NS, MIN_PERIODS * period if period else 0)
    if b - a < COVERED * required:
        need = f"{MIN_WINDOW_NS / NS:g} s" + (
            "" if period is None else f" and {MIN_PERIODS} of its {period_ms:,.0f} ms updates"
        )
        return CounterCheck(
            UNCHECKED,
            f"its readings span {window_s:.1f} s, less than the {need} the counter check needs",
            a / NS,
            window_s,
            period_ms=period_ms,
        )
    counter_j = float(e[-1] - e[0])
    power_j = _integral(power, a, b)
    figures = {
        "start_s": a / NS,
        "window_s": window_s,
        "counter_j": counter_j,
        "power_j": power_j,
        "period_ms": period_ms,
    }
    backward = _backward_steps(events, e)
    if backward:
        times = "once" if backward == 1 else f"{backward} times"
        return CounterCheck(BACKWARDS, f"the counter went backwards {times} in {window_s:.1f} s", **figures)
    if power_j < MIN_ENERGY_J:
        return CounterCheck(
            UNCHECKED,
            f"its power readings add up to {power_j:.2f} J over {window_s:.1f} s, too little to "
            "check the counter against",
            **figures,
        )
    if counter_j <= 0:
        return CounterCheck(
            STUCK,
            f"the counter did not move in {window_s:.1f} s while its power readings add up to {power_j:,.1f} J",
            **figures,
        )
    ratio = counter_j / power_j
    p_a, p_b = np.interp([a, b], power[:, 0], power[:, 1])
    lag = abs(float(p_b - p_a)) * POWER_LAG_S / power_j
    tolerance = BASE_TOLERANCE + (2 * period / (b - a) if period else 0.0) + lag
    figures |= {"ratio": ratio, "tolerance": tolerance}
    side = "above" if ratio > 1 else "below"
    off = f"the counter's {counter_j:,.1f} J in {window_s:.1f} s is {abs(ratio - 1):.0%} {side} its integrated power's {power_j:,.1f} J"
    if not 1 / (GROSS_FACTOR * (1 + tolerance)) < ratio < GROSS_FACTOR * (1 + tolerance):
        return CounterCheck(
            DISAGREES,
            f"{off}, {GROSS_FACTOR:g}× beyond the {tolerance:.0%} tolerance: a unit or scale error",
            **figures,
        )
    if abs(ratio - 1) > tolerance:
        return CounterCheck(
            OK,
            f"{off}, beyond the {tolerance:.0%} tolerance but not a gross fault: a sampled power field "
            "misses bursts between its readings, so the counter is kept",
            **figures,
        )
    return CounterCheck(
        OK,
        f"the counter's {counter_j:,.1f} J in {window_s:.1f} s is within {tolerance:.0%} of its "
        f"integrated power's {power_j:,.1f} J",
        **figures,
    )


def check_counters(
    frame: pl.DataFrame,
    meters: list[Meter],
    window_ns: tuple[int, int],
    events: dict[str, dict[str, int]] | None = None,
) -> dict[str, CounterCheck]:
    """Every counter meter's check over ``window_ns``, by channel; ``events`` (counter resets,
    wraps and backward steps by channel) are those that happened within the window."""
    events = events or {}
    return {
        m.channel: check_counter(frame, m, window_ns, events.get(m.channel)) for m in counter_meters(meters)
    }


def events_since(
    before: dict[str, dict[str, int]], now: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """Counter events between two of the sampler's cumulative counts."""
    return {
        ch: {k: int(v) - int(before.get(ch, {}).get(k, 0)) for k, v in counts.items()}
        for ch, counts in now.items()
    }
