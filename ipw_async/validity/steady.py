"""The steady-state window: the part of a run, by issue time, whose requests saw one load.

A run starts cold (caches, compiled kernels, the batch filling up) and ends with a drain (the
requests still in flight when the last one was sent finish as the load falls); neither is the
server's steady state. The window is found on TPOT, the figure that load moves most directly,
in issue order:

- **warmup crop**: MSER-5 (White, 1997): batch means of 5 requests, and the truncation ``d``
  (at most half the batches) that minimises the remaining batches' variance over ``(k − d)²``;
  a crop whose mean is within :data:`WARMUP` of the rest's is no warm-up (on a tight series
  MSER crops a drift of 1% as readily as a real one), and nothing is cropped; the crop then ends
  where the batch means first come within :data:`WARMUP` of the rest's level: MSER's least
  variance also crops a later burst (another process taking the CPU for a second), and that is
  not warm-up but what the shift and trend checks judge;
- **drain**: the requests in flight at the last send, reported apart;
- **level shift**: the split of the remaining batches (each side ≥ 20% of them) with the
  largest Welch t; a shift when |t| ≥ :data:`SHIFT_T` and the means differ by ≥ :data:`SHIFT`.
  The window keeps the longer side;
- **trend**: TPOT's least-squares slope over the window's batches; steady unless it is
  significant (p < 0.01) and moves TPOT by ≥ :data:`TREND` across the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from scipy import stats

from .._clock import NS
from ..records import end_ns

BATCH = 5
MIN_BATCHES = 8
WARMUP = 0.03
SHIFT_T = 5.0
SHIFT = 0.10
TREND = 0.10
TREND_P = 0.01


@dataclass
class Window:
    """Bounds by issue time (s since run start) and what was found on the way."""

    start_s: float
    end_s: float
    crop_requests: int
    drain_requests: int
    shift: dict[str, float] | None
    trend_change: float | None  # TPOT's fitted change across the window, over its mean
    trend_p: float | None

    @property
    def steady(self) -> bool:
        trending = (
            self.trend_p is not None and self.trend_p < TREND_P and abs(self.trend_change or 0) >= TREND
        )
        return self.shift is None and not trending

    def reason(self) -> str | None:
        if self.shift is not None:
            return (
                f"TPOT shifts by {self.shift['change']:+.0%} at {self.shift['at_s']:.1f} s: "
                "the window keeps the longer side"
            )
        if not self.steady:
            return f"TPOT drifts {self.trend_change:+.0%} across the window (p = {self.trend_p:.2g})"
        return None


def mser(values: np.ndarray) -> int:
    """The warm-up crop, in values (a multiple of :data:`BATCH`): MSER's, ended at the first
    batch that reaches the level of the rest."""
    k = values.size // BATCH
    batches = values[: k * BATCH].reshape(k, BATCH).mean(axis=1)
    # every truncation's score at once, from suffix sums (a loop over them was quadratic:
    # seconds of finalizing 100,000 requests)
    centred = batches - batches.mean()
    n = k - np.arange(k // 2 + 1)
    total = np.cumsum(centred[::-1])[::-1][: n.size]
    squares = np.cumsum((centred**2)[::-1])[::-1][: n.size]
    scores = (squares - total**2 / n) / n.astype(float) ** 2
    cut = int(np.argmin(scores)) if scores.size else 0
    if not cut:
        return 0
    head, rest = batches[:cut].mean(), batches[cut:].mean()
    if rest > 0 and abs(head - rest) / rest < WARMUP:
        return 0
    # a warm-up approaches the steady level from one side: slow at first, or a batch filling up
    side = 1.0 if head > rest else -1.0
    reached = side * (batches[:cut] - rest) <= WARMUP * rest
    return (int(np.argmax(reached)) if reached.any() else cut) * BATCH


def level_shift(times_s: np.ndarray, values: np.ndarray) -> dict[str, float] | None:
    """The strongest split of the batch means, if it is a shift; its time and the change."""
    k = values.size // BATCH
    if k < MIN_BATCHES:
        return None
    batches = values[: k * BATCH].reshape(k, BATCH).mean(axis=1)
    starts = times_s[: k * BATCH : BATCH]
    edge = max(2, int(np.ceil(0.2 * k)))
    splits = np.arange(edge, k - edge + 1)
    if not splits.size:
        return None
    # Welch's t of every split at once, from prefix sums (scipy's, split by split, was quadratic)
    centred = batches - batches.mean()
    sums, squares = np.cumsum(centred), np.cumsum(centred**2)
    n1, n2 = splits.astype(float), (k - splits).astype(float)
    s1, q1 = sums[splits - 1], squares[splits - 1]
    s2, q2 = sums[-1] - s1, squares[-1] - q1
    m1, m2 = s1 / n1, s2 / n2
    v1 = np.maximum(q1 - n1 * m1**2, 0.0) / (n1 - 1)
    v2 = np.maximum(q2 - n2 * m2**2, 0.0) / (n2 - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ts = (m1 - m2) / np.sqrt(v1 / n1 + v2 / n2)
    finite = np.isfinite(ts)
    if not finite.any():
        return None
    i = int(np.argmax(np.where(finite, np.abs(ts), -1.0)))
    t, split = float(ts[i]), int(splits[i])
    if t == 0:
        return None
    before, after = float(batches[:split].mean()), float(batches[split:].mean())
    change = (after - before) / before if before > 0 else 0.0
    if abs(t) < SHIFT_T or abs(change) < SHIFT:
        return None
    return {"at_s": float(starts[split]), "before": before, "after": after, "change": change, "t": abs(t)}


def find_window(records: pl.DataFrame, not_before_s: float = 0.0) -> Window | str:
    """The steady window of a run's measured requests, or why there is none.

    ``not_before_s`` bounds it below (the end of a ramp: the load was still changing).
    """
    m = records.filter(~pl.col("warmup") & pl.col("sent_ns").is_not_null())
    if m.is_empty():
        return "no measured request was sent"
    last_send = int(m.get_column("sent_ns").max())  # type: ignore[arg-type]
    # in flight when the last request went out: they finish as the load falls
    drain = m.filter((pl.col("sent_ns") <= last_send) & (end_ns() > last_send))
    body = m.join(drain.select("request_id"), on="request_id", how="anti")
    body = body.filter(
        (pl.col("status") == "ok") & pl.col("tpot_s").is_not_null() & (pl.col("sent_ns") >= not_before_s * NS)
    ).sort("sent_ns")
    tpot = body.get_column("tpot_s").to_numpy().astype(float)
    sent_s = body.get_column("sent_ns").to_numpy() / NS
    if tpot.size < MIN_BATCHES * BATCH:
        return f"too few requests with a TPOT before the drain to judge (under {MIN_BATCHES * BATCH})"
    cut = mser(tpot)
    tpot, sent_s = tpot[cut:], sent_s[cut:]
    shift = level_shift(sent_s, tpot)
    if shift is not None:
        # keep the longer side of the shift
        before = sent_s < shift["at_s"]
        keep = before if before.sum() > (~before).sum() else ~before
        tpot, sent_s = tpot[keep], sent_s[keep]
    change, p = _trend(sent_s, tpot)
    drain_start = float(drain.get_column("sent_ns").min()) / NS if drain.height else last_send / NS  # type: ignore[arg-type]
    end = min(float(sent_s[-1]), drain_start)
    if end <= sent_s[0]:
        return f"the drain ({drain.height} requests in flight at the last send) covers the run"
    return Window(
        start_s=float(sent_s[0]),
        end_s=end,
        crop_requests=cut,
        drain_requests=drain.height,
        shift=shift,
        trend_change=change,
        trend_p=p,
    )


def _trend(sent_s: np.ndarray, tpot: np.ndarray) -> tuple[float | None, float | None]:
    k = tpot.size // BATCH
    if k < 3:
        return None, None
    batches = tpot[: k * BATCH].reshape(k, BATCH).mean(axis=1)
    centers = sent_s[: k * BATCH].reshape(k, BATCH).mean(axis=1)
    if np.ptp(centers) == 0:
        return None, None
    fit = stats.linregress(centers, batches)
    mean = float(batches.mean())
    change = float(fit.slope * np.ptp(centers) / mean) if mean > 0 else None
    return change, float(fit.pvalue)


def window_summary(window: Window | str, figures: dict[str, Any]) -> dict[str, Any]:
    """``summary.json``'s ``steady`` section: bounds, verdict and the window's own figures."""
    if isinstance(window, str):
        return {"steady": None, "reason": window, "headline": "whole run"}
    return {
        "steady": window.steady,
        "reason": window.reason(),
        "start_s": window.start_s,
        "end_s": window.end_s,
        "warmup_cropped_requests": window.crop_requests,
        "drain_requests": window.drain_requests,
        "level_shift": window.shift,
        "tpot_trend": {"change": window.trend_change, "p_value": window.trend_p},
        "method": "MSER-5 warmup crop on TPOT by issue time; drain = in flight at the last send",
        "headline": "whole run",  # the window's figures are beside it, never instead
        **figures,
    }
