"""The knee of a load curve: the load beyond which a metric stops answering to more load.

The method is Kneedle (Satopää et al., 2011, "Finding a 'Kneedle' in a Haystack") on the
points alone, without its smoothing or interpolation: a sweep has a handful of levels, each
already a mean over repeats, and the knee should be a load that was run.

1. Sort by load; x = log2(load) and y = log2(metric), each where all its values are positive
   (else that axis stays linear). On log-log axes growth in proportion to load (throughput
   = k·load) and a constant per-token cost spread over the load (J/token = k/load) are both
   straight lines, so a knee is where the metric stops answering to load *in proportion*:
   where the local elasticity d log y / d log load drops. On linear axes J/token = k/load
   would show a knee that is only the hyperbola's bend, and on a log load axis alone
   throughput in proportion to load is a convex exponential that hides its saturation.
2. Scale x and y to [0, 1] by their min and max. A falling metric (J/token) is flipped,
   y → 1 − y, so both kinds of curve rise; a curve that rises fast and then flattens lies
   above the diagonal, which is the chord from the first point to the last of a monotone curve.
3. The difference curve is y − x; the knee is the load where it is largest (the lowest such
   load on a tie).
4. There is no knee when that largest difference is under ``threshold`` (0.1 of the scaled
   range): a straight line has 0, and a curve bending the other way (growing faster than in
   proportion) lies below its chord. Nor is there one when the metric varies by less than
   ``flat`` (2%) of its size across the loads: scaling would blow noise up into a curve.

Throughput rising with load and flattening (saturation) and J/token falling and flattening
(the fixed cost per step spread over a full batch) are both this shape, so one function
serves both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

THRESHOLD = 0.1  # least height above the chord, in scaled units, that counts as a knee
FLAT = 0.02  # a metric varying by less than this share of its size is flat
MIN_POINTS = 3  # two points make a line and nothing else


@dataclass(frozen=True)
class KneeResult:
    """A knee, or None in ``load`` and why in ``reason``."""

    load: float | None  # the load at the knee, one of the given loads
    value: float | None  # the metric there
    distance: float | None  # the difference curve's largest value (None before it is computed)
    log_x: bool  # whether x was log2(load)
    log_y: bool  # whether y was log2(metric)
    reason: str | None  # why there is no knee; None when there is one

    @property
    def found(self) -> bool:
        return self.load is not None


def find_knee(
    loads: ArrayLike,
    values: ArrayLike,
    *,
    decreasing: bool = False,
    threshold: float = THRESHOLD,
    flat: float = FLAT,
) -> KneeResult:
    """The knee of ``values`` against ``loads`` (see the module's docstring for the method).

    ``decreasing``: the metric falls with load and flattens (J/token); otherwise it rises and
    flattens (throughput). Points with a non-finite load or value are left out; values at a
    repeated load are averaged.
    """
    x = np.asarray(loads, dtype=float)
    y = np.asarray(values, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"loads and values must be 1-d and the same length, not {x.shape} and {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, inverse = np.unique(x[keep], return_inverse=True)  # sorted, each load once
    y = np.bincount(inverse, weights=y[keep]) / np.bincount(inverse)
    log_x = bool(x.size and x[0] > 0)  # sorted: the first is the least
    log_y = bool(y.size and y.min() > 0)

    def none(reason: str, distance: float | None = None) -> KneeResult:
        return KneeResult(None, None, distance, log_x, log_y, reason)

    if x.size < MIN_POINTS:
        return none(f"{x.size} load(s) with the metric; a knee needs at least {MIN_POINTS}")
    span = float(y.max() - y.min())
    if span <= flat * float(np.abs(y).max()):
        return none(f"flat: varies by under {flat:.0%} across the loads, no knee inside their range")
    xs = np.log2(x) if log_x else x
    ys = np.log2(y) if log_y else y
    xn = (xs - xs[0]) / (xs[-1] - xs[0])
    yn = (ys - ys.min()) / (ys.max() - ys.min())
    if decreasing:
        yn = 1.0 - yn
    diff = yn - xn
    i = int(np.argmax(diff))  # the first of equal maxima: the lowest load
    distance = float(diff[i])
    if distance < threshold:
        return none(
            f"no knee: the scaled curve is at most {distance:.2f} above its chord, under {threshold:g} "
            "(a straight line, or one bending the other way)",
            distance,
        )
    return KneeResult(float(x[i]), float(y[i]), distance, log_x, log_y, None)
