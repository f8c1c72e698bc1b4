"""How precisely a run knows its means, from batch means over time.

Requests that overlap share the server and the meter, so they are not independent samples: a
confidence interval from their spread is too narrow. Batch means cut the window into ``k``
batches of equal time, each longer than a request and than a meter's counter period, and treat
the batches' figures as the samples. A per-query figure over a batch is a ratio (joules or
seconds summed over the batch's queries, over their count); its interval is the ratio
estimator's, by the delta method.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

MIN_BATCHES = 5
TARGET_BATCHES = 20
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    """A ratio's value over all batches and its confidence interval's half-width."""

    mean: float
    half_width: float
    batches: int
    batch_s: float

    @property
    def relative(self) -> float:
        return self.half_width / abs(self.mean) if self.mean else math.inf

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self) | {"relative": self.relative}


def ratio_interval(numerator: np.ndarray, denominator: np.ndarray, batch_s: float) -> Estimate | None:
    """Σnumerator / Σdenominator over batches, with the ratio estimator's interval (delta
    method, Student t over the batches); None under :data:`MIN_BATCHES` batches."""
    k = numerator.size
    total = float(denominator.sum())
    if k < MIN_BATCHES or total <= 0:
        return None
    ratio = float(numerator.sum()) / total
    residual = numerator - ratio * denominator
    se = float(np.std(residual, ddof=1)) / (total / k) / math.sqrt(k)
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, k - 1)) * se
    return Estimate(ratio, half, k, batch_s)


def batch_length(span_s: float, typical_latency_s: float | None, counter_period_s: float | None) -> float:
    """Long enough that batches are nearly independent: twice a typical request and twice the
    meter's counter period, and no more than needed for :data:`TARGET_BATCHES` over the span."""
    floor = max(2 * (typical_latency_s or 0.0), 2 * (counter_period_s or 0.0), 1.0)
    return max(span_s / TARGET_BATCHES, floor)


class Batches:
    """Batches of ``batch_s`` from ``start_s``, ``k`` of them (anything after is left out):
    where each item falls is found once, for every figure summed over them."""

    def __init__(self, times_s: np.ndarray, start_s: float, batch_s: float, k: int) -> None:
        slot = np.floor((times_s - start_s) / batch_s).astype(int)
        self._inside = (slot >= 0) & (slot < k)
        self._slot = slot[self._inside]
        self.batch_s, self.k = batch_s, k

    def sum(self, values: np.ndarray) -> np.ndarray:
        """``values`` summed per batch, NaNs left out."""
        return self._sums(values)[0]

    def mean(self, values: np.ndarray) -> Estimate | None:
        """The mean of the finite ``values``, with its interval."""
        total, count = self._sums(values)
        return ratio_interval(total, count, self.batch_s)

    def _sums(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inside = values[self._inside]
        have = np.isfinite(inside)
        slot = self._slot[have]
        total = np.bincount(slot, weights=inside[have], minlength=self.k)[: self.k]
        return total, np.bincount(slot, minlength=self.k)[: self.k].astype(float)


def met(estimates: dict[str, Estimate | None], targets: dict[str, float]) -> bool:
    """Every target reached."""
    return bool(targets) and all(
        (e := estimates.get(metric)) is not None and e.relative <= target
        for metric, target in targets.items()
    )
