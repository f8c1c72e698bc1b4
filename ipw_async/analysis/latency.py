"""Latency distributions and goodput: requests meeting every service-level objective per second."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from ..rundir.read import RunDir
from ..stats import distribution, measured, window_s
from .columns import column

# SLO name -> the record column it bounds (seconds); limits are given in milliseconds
SLO_COLUMNS: dict[str, str] = {"ttft_ms": "ttft_s", "tpot_ms": "tpot_s", "e2e_ms": "e2e_latency_s"}


def parse_slo(text: str | None) -> dict[str, float]:
    """``ttft_ms=200,tpot_ms=50`` -> {"ttft_ms": 200.0, "tpot_ms": 50.0}; raises ValueError."""
    slo: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in SLO_COLUMNS:
            raise ValueError(f"SLO {item.strip()!r} is not one of {', '.join(k + '=…' for k in SLO_COLUMNS)}")
        try:
            limit = float(value)
        except ValueError:
            raise ValueError(f"SLO {key} needs a number of milliseconds, got {value.strip()!r}") from None
        if not limit > 0:
            raise ValueError(f"SLO {key} must be positive")
        slo[key] = limit
    return slo


def goodput(records: pl.DataFrame, slo: dict[str, float]) -> dict[str, Any]:
    """Requests meeting every SLO, per second of the measured window, and as a fraction.

    A failed request meets none. A request without the figure an SLO bounds (no token, or a
    one-token answer for TPOT) does not meet it either: it is counted as unverifiable.
    """
    m = measured(records)
    ok = (m.get_column("status") == "ok").to_numpy()
    meets_all = ok.copy()
    per_slo: dict[str, Any] = {}
    for key, limit in slo.items():
        values = column(m, SLO_COLUMNS[key]).to_numpy()
        known = np.isfinite(values)
        meets = ok & known & (values * 1000 <= limit)
        meets_all &= meets
        per_slo[key] = {"limit_ms": limit, "met": int(meets.sum()), "unverifiable": int((ok & ~known).sum())}
    window = window_s(m)
    met = int(meets_all.sum())
    return {
        "slo": slo,
        "measured": m.height,
        "met": met,
        "fraction": met / m.height if m.height else None,
        "window_s": window,
        "goodput_rps": met / window if window else None,
        "per_slo": per_slo,
    }


def latency_report(run: RunDir, slo: dict[str, float] | None = None) -> dict[str, Any]:
    """The contents of ``analysis/latency.json`` (seconds throughout)."""
    ok = run.ok
    itl = ok.get_column("itl_s").explode().drop_nulls().to_numpy() if ok.height else np.array([])
    return {
        "requests": ok.height,
        "latency_s": {
            "ttft": distribution(column(ok, "ttft_s").drop_nulls().to_numpy()),
            "tpot": distribution(column(ok, "tpot_s").drop_nulls().to_numpy()),
            "itl": distribution(itl),
            "e2e": distribution(column(ok, "e2e_latency_s").drop_nulls().to_numpy()),
        },
        "goodput": goodput(run.records, slo) if slo else None,
        "goodput_reason": None if slo else "no --slo given",
    }
