"""A meter as a virtual counter: cumulative energy E(t) at knots, whatever the meter gives.

A cumulative counter is re-timed to when each value was made (its learned update grid, else
the midpoint between reads); a power-only meter is integrated by the trapezoid rule (a power the
device averaged over a window reaches it that much later: the counter keeps the window). Resumed
sessions count nothing across their gap, and a counter is extended (imputed, at its mean
power) over requests its data does not reach.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from .._clock import NS
from ..telemetry.base import Meter
from ..telemetry.grid import CounterGrid, last_updates


@dataclass
class VirtualCounter:
    t: np.ndarray  # ns since run start, strictly increasing
    e: np.ndarray  # joules, non-decreasing
    imputed: np.ndarray  # per knot interval: True where the energy was imputed
    # the device averaged the power it reported over this long (ns): a step's energy reaches
    # the counter spread evenly over the window after it (0: as it was drawn)
    window_ns: float = 0.0
    # per knot interval, how many of the meter's own intervals it holds (None: one each): a
    # power meter's energy kept over stretches of readings (:mod:`.pooling`)
    held: np.ndarray | None = None

    @property
    def energies(self) -> np.ndarray:
        """Joules per knot interval."""
        return np.diff(self.e)


def _gap_mask(t: np.ndarray, factor: float) -> np.ndarray:
    dt = np.diff(t)
    if dt.size == 0:
        return np.zeros(0, dtype=bool)
    typical = float(np.median(dt))
    return dt > factor * max(typical, 1.0)


def counter_knots(
    t: np.ndarray, e: np.ndarray, grids: tuple[CounterGrid, ...] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """Knots from a cumulative counter that updates more slowly than it is read.

    A value first seen at t_i was produced somewhere after t_{i-1}: at the last update of
    the counter's learned ``grids`` when there are any, else at the midpoint, its best
    guess. Repeated reads of a stale value carry no information and are dropped.
    """
    if t.size < 2:
        return t.astype(float), e.astype(float)
    changed = np.flatnonzero(np.diff(e) > 0) + 1
    at = (t[changed - 1] + t[changed]) / 2.0
    if grids:
        update = last_updates(grids, t[changed].astype(float))
        before = t[changed - 1]
        # an update the grid puts just before the read that still saw the old value is within
        # the grid's own error: it came just after that read; one it cannot explain: midpoint
        resolution = max(g.resolution_ns for g in grids)
        near = before - update < resolution
        at = np.where(update > before, update, np.where(near, before, at))
    # the first value, too, was made at the grid's update before its read (a 500 ms counter's
    # first interval otherwise spans up to half a period too little time: 93 W for 70 W idle)
    first = last_updates(grids, t[:1].astype(float)) if grids else t[:1]
    kt = np.concatenate((first, at))
    ke = np.concatenate(([e[0]], e[changed]))
    if t[-1] > kt[-1] and changed.size == 0:
        kt, ke = np.append(kt, t[-1]), np.append(ke, e[-1])
    return kt.astype(float), ke.astype(float)


def series(telemetry: pl.DataFrame, time_column: str, value_column: str) -> tuple[np.ndarray, np.ndarray] | None:
    """A column's non-null readings in time order, or None with fewer than two."""
    if time_column not in telemetry.columns or value_column not in telemetry.columns:
        return None
    rows = telemetry.select(time_column, value_column).drop_nulls()
    if rows.height < 2:
        return None
    t = rows.get_column(time_column).to_numpy().astype(float)
    v = rows.get_column(value_column).to_numpy().astype(float)
    order = np.argsort(t, kind="stable")
    return t[order], v[order]


def _continued(t: np.ndarray, e: np.ndarray, breaks: tuple[int, ...]) -> np.ndarray:
    """A counter made non-decreasing within each session, each session continuing from the
    previous one's last reading (the gap between them counts nothing)."""
    out = np.empty_like(e)
    edges = [0, *np.searchsorted(t, sorted(breaks)).tolist(), t.size]
    carry = None
    for a, b in itertools.pairwise(edges):
        if a >= b:
            continue
        part = np.maximum.accumulate(e[a:b])
        out[a:b] = part if carry is None else part - part[0] + carry
        carry = out[b - 1]
    return out


def virtual_counter(
    telemetry: pl.DataFrame, meter: Meter, gap_factor: float, breaks: tuple[int, ...] = ()
) -> VirtualCounter | None:
    """A meter's cumulative energy as knots, or None when it produced no usable data.

    At each of ``breaks`` (where a resumed session began) the time since the previous session's
    last reading counts no energy: the run was not running, and a new process's counter (the
    simulator's) may have started again from zero."""
    window = 0.0
    if meter.kind == "counter" and meter.energy_column in telemetry.columns:
        read = series(telemetry, meter.time_column, meter.energy_column)
        if read is None:
            return None
        kt, ke = counter_knots(read[0], _continued(*read, breaks), meter.grids)
    elif meter.power_column in telemetry.columns:
        read = series(telemetry, meter.time_column, meter.power_column)
        if read is None:
            return None
        kt, p = read
        ke = np.concatenate(([0.0], np.cumsum((p[1:] + p[:-1]) / 2.0 * np.diff(kt) / NS)))
        window = meter.window_ns
    else:
        return None
    keep = np.concatenate(([True], np.diff(kt) > 0))
    kt, ke = kt[keep], ke[keep]
    for b in breaks:
        i = int(np.searchsorted(kt, b))
        if 0 < i < kt.size:
            ke[i:] += ke[i - 1] - ke[i]
    if kt.size < 2:
        return None
    return VirtualCounter(kt, ke, _gap_mask(kt, gap_factor), window)


def extend_counter(vc: VirtualCounter, start: float, end: float) -> VirtualCounter:
    """Cover [start, end] by extrapolating at the mean covered power (those intervals are imputed)."""
    t, e, imp = vc.t, vc.e, vc.imputed
    rate = (e[-1] - e[0]) / (t[-1] - t[0])
    if start < t[0]:
        t = np.concatenate(([start], t))
        e = np.concatenate(([e[0] - rate * (vc.t[0] - start)], e))
        imp = np.concatenate(([True], imp))
    if end > t[-1]:
        t = np.append(t, end)
        e = np.append(e, e[-1] + rate * (end - t[-2]))
        imp = np.append(imp, True)
    return VirtualCounter(t, e, imp, vc.window_ns)


def covering(vc: VirtualCounter | None, sent: np.ndarray, end: np.ndarray) -> VirtualCounter | None:
    """``vc`` extended (imputed) to cover every request window."""
    if vc is None or not sent.size:
        return vc
    return extend_counter(vc, float(sent.min()), float(end.max()))


def idle_power(vc: VirtualCounter, window_ns: tuple[int, int]) -> float | None:
    """The meter's mean power over its own knots inside ``window_ns`` (a quarter second at least).

    Only the intervals inside: one that straddles the window's end holds load too, and spread
    by interpolation it read 108 W for 70 W idle with a 500 ms counter."""
    a, b = window_ns
    inside = np.flatnonzero((vc.t >= a) & (vc.t <= b))
    if inside.size < 2 or vc.t[inside[-1]] - vc.t[inside[0]] < 0.25 * NS:
        return None
    first, last = inside[0], inside[-1]
    return float((vc.e[last] - vc.e[first]) / ((vc.t[last] - vc.t[first]) / NS))


def counter_timing(meter: Meter) -> dict[str, Any]:
    """How a counter's reads were timed, and the grids to time them the same way again."""
    if meter.kind != "counter":
        return {}
    periods = sorted({round(g.period_ns / 1e6, 1) for g in meter.grids})
    if not periods:
        timing = "midpoint between reads (no update grid learned)"
    elif periods == [0.0]:
        timing = "as read (it updates about as often as it is read)"
    else:
        timing = f"last update on its learned grid ({', '.join(f'{p:g}' for p in periods)} ms)"
    return {"counter_timing": timing, "counter_grids": [g.as_dict() for g in meter.grids]}


def energy_over(
    telemetry: pl.DataFrame,
    meters: list[Meter],
    windows: list[list[tuple[int, int]]],
    breaks: tuple[int, ...] = (),
    gap_factor: float = 4.0,
) -> list[float | None]:
    """What ``meters`` measured (together) over each item's windows (ns since run start): the
    whole device's energy, not a share; null where a meter's data does not cover a window."""
    counters = [virtual_counter(telemetry, m, gap_factor, breaks) for m in meters]
    if not counters:
        return [None] * len(windows)
    out: list[float | None] = []
    for spans in windows:
        total: float | None = 0.0
        for vc in counters:
            for a, b in spans:
                if vc is None or a < vc.t[0] or b > vc.t[-1] or total is None:
                    total = None
                    break
                total += float(np.interp(b, vc.t, vc.e) - np.interp(a, vc.t, vc.e))
        out.append(total)
    return out
