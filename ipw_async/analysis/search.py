"""SLO-bounded load search, the statistics: SLOs, their margins per probe, and the boundary.

An SLO is a limit on a latency percentile (TTFT, TPOT, end-to-end) or on the error rate. A
probe's margin on it is ``(limit − value) / limit``: positive where it is met, −0.5 where the
value is 1.5 times the limit. Margins fall as load rises, so the boundary is fitted over the
probes as a monotone curve in log-load: the tightest margin per probe, made non-increasing by
isotonic regression, through a monotone (PCHIP) interpolant, and where that crosses zero. Its
confidence interval comes from the bootstrap: each probe's requests resampled, the boundary
fitted again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy.interpolate import PchipInterpolator
from scipy.optimize import brentq, isotonic_regression

from ..stats import measured

BOOTSTRAP = 200
# The binding margin falls this many times faster across the boundary than below it (per unit
# of log-load): the server does not degrade, it falls off a cliff
CLIFF_SLOPE = 4.0
LATENCY = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_latency_s"}
_SPEC = re.compile(
    r"^(?P<metric>[a-z0-9_]+?)(?:_p(?P<pct>\d+(?:\.\d+)?))?=(?P<value>[\d.]+)(?P<unit>ms|s|%)?$"
)


@dataclass(frozen=True)
class Slo:
    """A limit on one figure of a run: a latency percentile (s) or the error rate (a fraction)."""

    metric: str  # ttft, tpot, e2e or error_rate
    percentile: float | None
    limit: float
    text: str

    @classmethod
    def parse(cls, text: str) -> Slo:
        """``ttft_p99=500ms``, ``tpot_p50=0.06s``, ``e2e_p95=10s`` or ``error_rate=1%``."""
        hint = "give e.g. ttft_p99=500ms, tpot_p99=60ms, e2e_p95=10s or error_rate=1%"
        found = _SPEC.match(text.strip().lower().replace(" ", ""))
        if found is None:
            raise ValueError(f"cannot read the SLO {text!r}: {hint}")
        metric, pct, unit = found["metric"], found["pct"], found["unit"]
        value = float(found["value"])
        if metric == "error_rate":
            if pct is not None or unit not in ("%", None):
                raise ValueError(f"the error rate's SLO is a share, e.g. error_rate=1%, not {text!r}")
            limit = value / 100 if unit == "%" else value
        elif metric in LATENCY:
            if pct is None or not 0 < float(pct) < 100 or unit not in ("ms", "s"):
                raise ValueError(
                    f"a latency SLO needs a percentile and a unit (ms or s): {hint}, not {text!r}"
                )
            limit = value / 1000 if unit == "ms" else value
        else:
            raise ValueError(f"unknown SLO metric {metric!r} in {text!r}: {hint}")
        if limit <= 0:
            raise ValueError(f"an SLO's limit must be positive: {text!r}")
        return cls(metric, None if pct is None else float(pct), limit, text.strip())

    @property
    def name(self) -> str:
        return self.metric if self.percentile is None else f"{self.metric}_p{self.percentile:g}"

    def samples(self, records: pl.DataFrame) -> np.ndarray:
        """Per measured request, what the SLO looks at: its latency (NaN where it has none, as a
        failed request), or 1 for a failed request and 0 for a served one."""
        rows = measured(records)
        ok = (rows.get_column("status") == "ok").to_numpy()
        if self.metric == "error_rate":
            return (~ok).astype(float)
        values = rows.get_column(LATENCY[self.metric]).fill_null(np.nan).to_numpy().astype(float)
        return np.where(ok, values, np.nan)

    def margin(self, samples: np.ndarray) -> float:
        """``(limit − value) / limit`` over these samples; −inf where nothing could be measured."""
        if self.metric == "error_rate":
            return (self.limit - float(samples.mean())) / self.limit if samples.size else -np.inf
        served = samples[np.isfinite(samples)]
        if not served.size:
            return -np.inf
        assert self.percentile is not None
        return (self.limit - float(np.percentile(served, self.percentile))) / self.limit


def margins(
    slos: list[Slo], records: pl.DataFrame | Sequence[pl.DataFrame], seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """A probe's margin on each SLO over its requests (its repeats' pooled), and ``BOOTSTRAP``
    replicates of them.

    One run: its requests resampled. Several repeats of the probe: a hierarchical bootstrap, the
    repeats resampled first and then each drawn repeat's requests, so the interval holds the
    difference between runs of one load (another seed, another warm-up) as well as between
    requests; requests alone would call the runs' spread certainty.
    """
    runs = [records] if isinstance(records, pl.DataFrame) else list(records)
    samples = [[slo.samples(r) for slo in slos] for r in runs]  # run × SLO
    pooled = [np.concatenate([run[j] for run in samples]) for j in range(len(slos))]
    point = np.array([slo.margin(s) for slo, s in zip(slos, pooled, strict=True)])
    rng = np.random.default_rng(seed)
    boot = np.empty((BOOTSTRAP, len(slos)))
    for b in range(BOOTSTRAP):
        picked = [samples[i] for i in rng.integers(0, len(runs), len(runs))] if len(runs) > 1 else samples
        draws = [rng.integers(0, max(run[0].size, 1), size=run[0].size) for run in picked]
        for j, slo in enumerate(slos):
            boot[b, j] = slo.margin(np.concatenate([run[j][d] for run, d in zip(picked, draws, strict=True)]))
    return point, boot


@dataclass(frozen=True)
class Boundary:
    """Where the tightest margin crosses zero, as far as the probes say."""

    estimate: float | None  # None: every probe passed, or every probe failed
    feasible_max: float | None  # the most load a probe met every SLO at
    infeasible_min: float | None  # the least load a probe broke one at, above feasible_max
    cliff: bool


def boundary(loads: np.ndarray, tightest: np.ndarray) -> Boundary:
    """The load where ``tightest`` (each probe's least margin) crosses zero, fitted monotone."""
    order = np.argsort(loads)
    at = loads[order].astype(float)
    x, m = np.log(at), np.where(np.isfinite(tightest[order]), tightest[order], -1e6)
    fitted = isotonic_regression(m, increasing=False).x
    passed = fitted >= 0
    feasible = np.flatnonzero(passed)
    infeasible = np.flatnonzero(~passed)
    if not feasible.size or not infeasible.size:
        return Boundary(
            None,
            float(at[feasible[-1]]) if feasible.size else None,
            float(at[infeasible[0]]) if infeasible.size else None,
            False,
        )
    lo, hi = int(feasible[-1]), int(infeasible[0])
    unique_x, first = np.unique(x, return_index=True)
    curve = PchipInterpolator(unique_x, fitted[first]) if unique_x.size > 1 else None
    if curve is None or x[hi] <= x[lo]:
        estimate = float(at[lo])
    else:
        estimate = float(np.exp(brentq(lambda v: float(curve(v)), x[lo], x[hi])))
    # the fall across the boundary against the fall below it, per unit of log-load
    across = (fitted[lo] - fitted[hi]) / max(x[hi] - x[lo], 1e-9)
    below = (fitted[0] - fitted[lo]) / (x[lo] - x[0]) if x[lo] > x[0] else None
    cliff = bool(
        fitted[lo] - fitted[hi] > 0.25 and below is not None and across > CLIFF_SLOPE * max(below, 1e-9)
    )
    return Boundary(estimate, float(at[lo]), float(at[hi]), cliff)


def boundary_interval(
    loads: np.ndarray, replicates: list[np.ndarray], level: float = 0.95
) -> tuple[float, float] | None:
    """The boundary's bootstrap interval: ``replicates`` holds per probe its replicates' tightest
    margins (one row each). A replicate whose probes all pass (or all fail) puts the boundary
    beyond what was probed: where its two outermost probes' margins, continued, cross zero, at
    most a doubling (or halving) out, since no probe says more."""
    if not replicates:
        return None
    boot = np.column_stack(replicates)  # replicate × probe
    estimates = []
    for row in boot:
        b = boundary(loads, row)
        estimates.append(b.estimate if b.estimate is not None else _beyond(loads, row, b))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(estimates, [tail, 100 - tail])
    return float(low), float(high)


def _beyond(loads: np.ndarray, tightest: np.ndarray, found: Boundary) -> float:
    """A boundary past the probes: the outermost two probes' fitted margins continued in
    log-load to zero, within a factor of 2 of the outermost probe."""
    order = np.argsort(loads)
    x = np.log(loads[order].astype(float))
    above = found.infeasible_min is None  # every probe passed: the boundary is above them
    edge = x[-1] if above else x[0]
    if x.size < 2 or x[-1] == x[0]:
        return float(np.exp(edge))
    m = isotonic_regression(np.where(np.isfinite(tightest[order]), tightest[order], -1e6), increasing=False).x
    # the margin's fall per unit of log-load between the two outermost probes (≥ 0: monotone)
    inner, outer = (-2, -1) if above else (1, 0)
    fall = (m[inner] - m[outer]) / abs(x[outer] - x[inner])
    # from the edge, out (above) or in (below) to where that fall brings the margin to zero
    reach = abs(m[outer]) / fall if fall > 0 else np.inf
    step = min(reach, np.log(2))
    return float(np.exp(edge + step if above else edge - step))
