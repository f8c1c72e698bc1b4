"""Each request's band: the least and the most it could have used, given what the meter saw.

The band spans the estimates the data cannot choose between: the rule's own split, the fitted
power model's, the candidate models that predicted held-out meter intervals about as well, the
chosen model with its uncertain weights moved by their standard errors, and simple work
models (prefill where the inferred steps put it or all in the first token's step, a prompt
token worth 0.1 to 1.5 output tokens, static power as measured, as fitted, or none). It is
widened by each request's share of the energy that work does not explain (per meter interval,
what a linear fit of energy to work misses), and by the chosen model's own error on meter
intervals it was not fitted to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from .model import PowerModel
from .parameters import PARAMETERS
from .prefill import LEAST_PREFILL_WEIGHT, MOST_PREFILL_WEIGHT
from .split import Segments, Timeline

BAND_PREFILL_WEIGHTS = (LEAST_PREFILL_WEIGHT, MOST_PREFILL_WEIGHT)
Z = 1.96  # a parameter moved this many standard errors either way


def perturbed(model: PowerModel) -> list[PowerModel]:
    """The model with each weight that splits a step moved ±Z standard errors (at least its
    lower bound). A weight the fit could not identify (an infinite standard error) is moved to
    each end of what it could be: the prompt weight over the band's range, another weight over
    its bounds. Unidentified is not exact: leaving it out would make the band narrowest where
    the model knows least."""
    out = []
    for row in PARAMETERS:
        error = model.errors.get(row.name)
        if not row.in_work or row.attribute is None or error is None or error <= 0:
            continue
        value = getattr(model, row.attribute)
        if np.isfinite(error):
            ends = (max(value - Z * error, row.lower), value + Z * error)
        elif row.attribute == "prefill_weight":
            ends = BAND_PREFILL_WEIGHTS
        else:
            ends = (row.lower, value if callable(row.upper) else row.upper)
        out.extend(replace(model, **{row.attribute: moved}) for moved in ends)
    return out


def interval_error(held_out: float | None, in_sample: float | None) -> float:
    """The interval error a band widens by: held out where the run could hold intervals out,
    else twice the in-sample error (unmeasured is not small), else all of it."""
    if held_out is not None:
        return held_out
    if in_sample is not None:
        return 2 * in_sample
    return 1.0


def band(
    timeline: Timeline,
    placements: list[Segments],
    estimates: list[np.ndarray],
    baseline: float | None,
    pooled: bool,
    model_error: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """The least and most each request could have used, over ``estimates`` (the rule's first)
    and the simple work models over ``placements`` (the first token's step, then the inferred
    steps), widened by ``model_error``: the power model's error on meter intervals it was not
    fitted to, relative to a typical interval. An interval mis-predicted by that much is split
    among its requests about as far off, and a request's intervals err alike (the same weights
    misjudge it in each), so its estimate is widened by Z times that error, not by less."""
    unexplained, fitted_static = timeline.unexplained(
        placements[-1].weighted(BAND_PREFILL_WEIGHTS[0]), baseline
    )
    estimates = list(estimates)
    for segments in placements:
        for weight in BAND_PREFILL_WEIGHTS:
            for static in {baseline, fitted_static, None}:
                estimates.append(timeline.split(segments.weighted(weight), static, pooled=True)[0])
    spread = timeline.split(placements[-1], baseline, pooled=pooled, d_e=unexplained)[0]
    # residuals of separate intervals are independent: over k intervals they add up as √k
    spread = spread / np.sqrt(np.maximum(timeline.intervals_spanned(), 1.0))
    spread = spread + Z * model_error * estimates[0]
    return np.maximum(np.min(estimates, axis=0) - spread, 0.0), np.max(estimates, axis=0) + spread


def cost_band(
    timeline: Timeline, estimates: list[np.ndarray], window_error: Callable[[np.ndarray], np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The least and most each request could have used under step costs: the splits
    ``estimates`` (the chosen one first), widened by the fit's error over a window as long as
    each request's (``window_error`` of the meter intervals it spans, relative): its share of
    those intervals is off by that share of their error."""
    spread = Z * window_error(timeline.intervals_spanned()) * estimates[0]
    return np.maximum(np.min(estimates, axis=0) - spread, 0.0), np.max(estimates, axis=0) + spread
