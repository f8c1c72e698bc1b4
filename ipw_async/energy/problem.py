"""What a power-model fit works on: a meter's intervals and the steps the run inferred.

The design maps each step's power to the meter intervals that see it (through the meter's lag,
when a candidate has one); the drift covariates are the device's temperature or its measured
power low-passed, on the run's own clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from scipy import sparse

from .._clock import NS
from .counter import VirtualCounter
from .drift import Drift
from .lag import metered
from .steps import Steps

LAGS_MS = (0.0, 20.0, 40.0, 70.0, 110.0)  # the meter's lag behind the device, tried in turn
DRIFT_TAUS_S = (8.0, 30.0)  # how fast a die warms, where no temperature is reported


class Features(NamedTuple):
    """Each step's work as a fit reads it, summed once: every candidate evaluates it often."""

    decode: np.ndarray  # decode tokens
    context: np.ndarray  # thousands of context tokens its decoders read
    prefill: np.ndarray  # prompt tokens
    position: np.ndarray  # thousands of positions before its prompt tokens, summed
    padded: np.ndarray  # the rows its decode graph ran (its decode tokens where it pads none)


@dataclass
class Problem:
    """One meter's intervals and the run's inferred steps, as every candidate fit needs them."""

    counter: VirtualCounter
    steps: Steps
    static_w: float | None  # measured idle power: static is anchored there
    default_prefill_weight: float
    temperature: tuple[np.ndarray, np.ndarray] | None = None  # the meter's (t, °C) where it has one
    parent: Problem | None = None  # a window's whole run: the die warmed over all of it
    inside: np.ndarray | None = None  # a window's steps, as indices into its parent's
    _designs: dict[float, sparse.csr_matrix] = field(default_factory=dict)
    _drifts: dict[float | None, Drift] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.energy = self.counter.energies
        self.dt = np.diff(self.counter.t) / NS
        self.usable = ~self.counter.imputed
        s = self.steps
        self.features = Features(s.decode, s.context, s.prefill, s.position, s.padded_decode)
        self.has_prefill = bool(s.prefill.any())
        self.has_context = bool(s.entry_context.size and s.context.any())
        self.has_padding = bool(np.any(self.features.padded != s.decode))
        self.scale = max(float(np.median(self.energy[self.usable])), 1e-9) if self.usable.any() else 1.0

    def design(self, lag_ms: float) -> sparse.csr_matrix:
        """Seconds of each step's power the meter sees in each of its intervals."""
        if lag_ms not in self._designs:
            self._designs[lag_ms] = design(self.counter.t, self.steps, lag_ms, self.counter.window_ns)
        return self._designs[lag_ms]

    def drift(self, tau_s: float | None) -> Drift:
        """The drift covariate (coefficient 1): temperature, or measured power low-passed."""
        if self.parent is not None:
            return self.parent.drift(tau_s)
        key = tau_s
        if key not in self._drifts:
            if self.temperature is not None:
                t, temp = self.temperature
                self._drifts[key] = Drift(t, temp - temp[0], 1.0, "temperature_c")
            else:
                self._drifts[key] = _warming(self.counter, float(tau_s or DRIFT_TAUS_S[0]), self.static_w)
        return self._drifts[key]

    def window(self, intervals: int) -> Problem:
        """The problem over ``intervals`` meter intervals in the middle of the run (itself where
        it has no more): a long run's model is chosen there, each candidate fit a fraction of
        the cost, then fitted to the whole run."""
        if self.energy.size <= intervals:
            return self
        first = (self.energy.size - intervals) // 2
        last = first + intervals
        vc = self.counter
        counter = VirtualCounter(
            vc.t[first : last + 1], vc.e[first : last + 1], vc.imputed[first:last], vc.window_ns
        )
        s = self.steps
        # the steps whose power the meter may see in the window (a lag spills up to 4 × 110 ms,
        # an averaging window as long again as it is)
        reach = 4 * max(LAGS_MS) * 1e6 + vc.window_ns
        inside = np.flatnonzero((s.end >= vc.t[first] - reach) & (s.start <= vc.t[last]))
        one = np.arange(inside.size)
        decode, context, prefill, position, padded = (f[inside] for f in self.features)
        steps = Steps(
            s.start[inside], s.end[inside], decode, prefill, np.zeros_like(one), one, decode, prefill,
            context, position, padded_rows=np.where(decode > 0, padded, 0.0),
        )
        return Problem(
            counter, steps, self.static_w, self.default_prefill_weight, self.temperature, parent=self, inside=inside
        )

    def drift_taus(self) -> tuple[float | None, ...]:
        return (None,) if self.temperature is not None else DRIFT_TAUS_S


def _warming(vc: VirtualCounter, tau_s: float, static_w: float | None) -> Drift:
    """The meter's power above static, low-passed over ``tau_s``: how warm the die is."""
    t = (vc.t[:-1] + vc.t[1:]) / 2
    dt = np.diff(vc.t) / NS
    power = vc.energies / np.maximum(dt, 1e-9)
    above = np.maximum(power - (static_w if static_w is not None else float(np.percentile(power, 5))), 0.0)
    h = np.empty_like(above)
    level = 0.0
    for i, (p, d) in enumerate(zip(above, dt, strict=True)):  # first order: knots are few (≤ 10 a s)
        level += (p - level) * (1.0 - np.exp(-d / tau_s))
        h[i] = level
    return Drift(t, h, 1.0, "power_lowpass", tau_s)


def _overlaps(knots: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each span cut at the meter's knots: (knot interval, span, overlap in ns) per piece."""
    first = np.clip(np.searchsorted(knots, start, side="right") - 1, 0, knots.size - 2)
    last = np.clip(np.searchsorted(knots, end, side="left") - 1, 0, knots.size - 2)
    count = np.maximum(last - first + 1, 0)
    span = np.repeat(np.arange(start.size), count)
    j = np.repeat(first, count) + np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    overlap = np.minimum(end[span], knots[j + 1]) - np.maximum(start[span], knots[j])
    ok = overlap > 0
    return j[ok], span[ok], overlap[ok]


def design(knots: np.ndarray, steps: Steps, lag_ms: float, window_ns: float = 0.0) -> sparse.csr_matrix:
    """Seconds of each step's power a meter read at ``knots`` sees in each of its intervals,
    where it trails the device by a first-order lag of ``lag_ms`` and reads its power averaged
    over ``window_ns``: a knots × steps matrix."""
    which, start, end, share = metered(steps.start, steps.end, lag_ms, window_ns)
    j, part, overlap = _overlaps(knots, start, end)
    duration = (steps.end - steps.start)[which[part]]
    seconds = overlap * share[part] * duration / np.maximum(end - start, 1.0)[part] / NS
    return sparse.csr_matrix((seconds, (j, which[part])), shape=(knots.size - 1, steps.count))
