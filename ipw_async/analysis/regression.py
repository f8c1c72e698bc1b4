"""Least-squares lines through per-query figures: what a token costs in joules and seconds."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
from scipy import stats

from ..rundir.read import RunDir
from .columns import column

# name: (x column, y column); energy and power are the headline meter's, as attributed (not imputed)
PAIRS: dict[str, tuple[str, str]] = {
    "energy_vs_input_tokens": ("prompt_tokens", "energy_j"),
    "energy_vs_output_tokens": ("output_tokens", "energy_j"),
    "power_vs_input_tokens": ("prompt_tokens", "power_w"),
    "latency_vs_output_tokens": ("output_tokens", "e2e_latency_s"),
    "ttft_vs_input_tokens": ("prompt_tokens", "ttft_s"),
}


def fit(x: np.ndarray, y: np.ndarray, confidence: float = 0.95) -> dict[str, Any]:
    """``scipy.stats.linregress`` with t-distribution confidence intervals (n − 2 dof).

    Returns null figures and a reason for fewer than 3 points or a constant x or y.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = int(x.size)
    reason = None
    if n < 3:
        reason = f"{n} point{'s' if n != 1 else ''}: a line and its interval need at least 3"
    elif np.ptp(x) == 0:
        reason = "x does not vary"
    elif np.ptp(y) == 0:
        reason = "y does not vary"
    if reason is not None:
        return {"n": n, "slope": None, "intercept": None, "r2": None, "p_value": None} | {
            "slope_ci": None,
            "intercept_ci": None,
            "reason": reason,
        }
    res = stats.linregress(x, y)
    t = float(stats.t.ppf(0.5 + confidence / 2, n - 2))
    return {
        "n": n,
        "slope": float(res.slope),
        "intercept": float(res.intercept),
        "r2": float(res.rvalue**2),
        "p_value": float(res.pvalue),
        "slope_stderr": float(res.stderr),
        "slope_ci": [float(res.slope - t * res.stderr), float(res.slope + t * res.stderr)],
        "intercept_ci": [
            float(res.intercept - t * res.intercept_stderr),
            float(res.intercept + t * res.intercept_stderr),
        ],
        "confidence": confidence,
        "reason": None,
    }


def points(records: pl.DataFrame, x_col: str, y_col: str) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """The (x, y) pairs a fit uses, and how many rows were left out for each reason."""
    warmup = records.get_column("warmup")
    failed = ~warmup & (records.get_column("status") != "ok")
    use = ~warmup & ~failed
    x = column(records, x_col).to_numpy()
    y = column(records, y_col).to_numpy()
    finite = np.isfinite(x) & np.isfinite(y)
    keep = use.to_numpy() & finite
    excluded = {
        "warmup": int(warmup.sum()),
        "failed": int(failed.sum()),
        f"null_{x_col}_or_{y_col}": int((use.to_numpy() & ~finite).sum()),
    }
    return x[keep], y[keep], excluded


def regression_report(run: RunDir) -> dict[str, Any]:
    """The contents of ``analysis/regression.json``."""
    out: dict[str, Any] = {}
    for name, (x_col, y_col) in PAIRS.items():
        x, y, excluded = points(run.records, x_col, y_col)
        out[name] = {"x": x_col, "y": y_col, **fit(x, y), "excluded": excluded}
    return {
        "fits": out,
        "notes": "measured requests that succeeded; energy and power are the headline meter's "
        "attributed figures (rows without one are excluded, not imputed)",
    }
