"""A finished run's validity, as ``summary.json`` gives it: over-saturation, the steady window
with its own figures, and the precision of the run's means."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl

from .._clock import NS
from ..records import end_ns
from ..stats import distribution, measured
from .precision import Batches, Estimate, batch_length, ratio_interval
from .saturation import Arrivals, assess
from .steady import Window, find_window, window_summary

# the whole device's energy over spans of the run clock (ns), null where the meters miss one
EnergyOver = Callable[[list[tuple[int, int]]], float | None]


def last_session(records: pl.DataFrame) -> pl.DataFrame:
    """A resumed run's sessions are apart in time; its load is judged on the last one."""
    rows = measured(records)
    if "session" in rows.columns and rows.height:
        rows = rows.filter(pl.col("session") == rows.get_column("session").max())
    return rows


def run_validity(
    records: pl.DataFrame,
    ramp_s: float | None,
    energy_over: EnergyOver | None,
    targets: dict[str, float],
    counter_period_s: float | None,
    watched: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``saturation``, ``steady`` and ``precision`` sections of a run's summary. ``ramp_s``:
    the ramp's length, when the load ramped (the load was not yet the run's until it ended);
    ``watched``: what the live watch saw (:meth:`..harness.watch.RunWatch.report`)."""
    ramp_end_s = _ramp_end(records, ramp_s)
    steady_section, window = steady(records, ramp_end_s, energy_over)
    verdict = saturation(records, ramp_end_s)
    live = (watched or {}).get("oversaturation")
    if live and not verdict["oversaturated"]:
        # the watch saw it as requests were sent; the records alone, cut short by a stop,
        # may be too few to show it again
        verdict |= {"oversaturated": True, "reason": live["reason"], "detected_s": live["detected_s"]}
    if verdict["oversaturated"] and steady_section["steady"]:
        steady_section |= {"steady": False, "reason": "over-saturated: the load never settled"}
    out = {
        "saturation": verdict,
        "steady": steady_section,
        "precision": precision(records, window, targets, counter_period_s),
    }
    if watched is not None:
        verdict["live"] = live
        out["precision"]["live"] = watched.get("precision")
    return out


def _ramp_end(records: pl.DataFrame, ramp_s: float | None) -> float | None:
    rows = last_session(records)
    if not ramp_s or rows.is_empty():
        return None
    return float(rows.get_column("scheduled_ns").min()) / NS + ramp_s  # type: ignore[arg-type]


def saturation(records: pl.DataFrame, ramp_end_s: float | None) -> dict[str, Any]:
    rows = last_session(records).filter(pl.col("scheduled_ns").is_not_null())
    if rows.is_empty():
        return assess(Arrivals(*(np.array([]),) * 4), 0.0, 0.0)
    arrived = rows.get_column("scheduled_ns").to_numpy() / NS
    ended = rows.select(end_ns()).to_series().to_numpy().astype(float) / NS
    first = rows.filter(pl.col("first_token_ns").is_not_null())
    arrivals = Arrivals(
        arrived,
        ended,
        first.get_column("first_token_ns").to_numpy() / NS,
        (first.get_column("first_token_ns") - first.get_column("scheduled_ns")).to_numpy() / NS,
    )
    start = max(float(arrived.min()), ramp_end_s or 0.0)
    return assess(arrivals, start, float(arrived.max()))


def steady(
    records: pl.DataFrame, ramp_end_s: float | None, energy_over: EnergyOver | None
) -> tuple[dict[str, Any], Window | None]:
    window = find_window(last_session(records), ramp_end_s or 0.0)
    if isinstance(window, str):
        return window_summary(window, {}), None
    return window_summary(window, _figures(records, window, energy_over)), window


def _in_window(records: pl.DataFrame, window: Window) -> pl.DataFrame:
    sent = pl.col("sent_ns")
    return last_session(records).filter((sent >= int(window.start_s * NS)) & (sent <= int(window.end_s * NS)))


def _figures(records: pl.DataFrame, window: Window, energy_over: EnergyOver | None) -> dict[str, Any]:
    rows = _in_window(records, window)
    ok = rows.filter(pl.col("status") == "ok")
    span = window.end_s - window.start_s
    tokens = ok.get_column("output_tokens").drop_nulls()
    out: dict[str, Any] = {
        "requests": rows.height,
        "ok": ok.height,
        "requests_per_s": ok.height / span if span > 0 else None,
        "output_tokens_per_s": float(tokens.sum()) / span if span > 0 and tokens.len() else None,
        "latency_s": {
            name: distribution(ok.get_column(column).drop_nulls().to_numpy())
            for name, column in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2e", "e2e_latency_s"))
        },
        "energy_j": None,
        "idle_j": None,
        "j_per_query": None,
        "j_per_output_token": None,
    }
    if "energy_j" not in ok.columns or energy_over is None or ok.get_column("energy_j").null_count():
        return out
    attributed = float(ok.get_column("energy_j").sum())
    idle = energy_over(_idle_spans(records, int(window.start_s * NS), int(window.end_s * NS)))
    if idle is None:
        return out
    total = attributed + idle
    return out | {
        "energy_j": total,
        "idle_j": idle,
        "j_per_query": total / ok.height if ok.height else None,
        "j_per_output_token": total / float(tokens.sum()) if tokens.len() and tokens.sum() else None,
    }


def _idle_spans(records: pl.DataFrame, start: int, end: int) -> list[tuple[int, int]]:
    """Where no request was on the server within ``[start, end]``: the window's idle time."""
    busy = (
        records.filter(pl.col("sent_ns").is_not_null())
        .select(pl.col("sent_ns").alias("a"), end_ns().alias("b"))
        .drop_nulls()
        .sort("a")
    )
    spans: list[tuple[int, int]] = []
    cursor = start
    for a, b in busy.iter_rows():
        if a > cursor and cursor < end:
            spans.append((cursor, min(a, end)))
        cursor = max(cursor, b)
    if cursor < end:
        spans.append((cursor, end))
    return spans


def precision(
    records: pl.DataFrame,
    window: Window | None,
    targets: dict[str, float],
    counter_period_s: float | None,
) -> dict[str, Any]:
    """Each mean's 95% interval from batch means by issue time, over the steady window (else
    the measured requests), with the targets a ``--until-precision`` asked for."""
    rows = (_in_window(records, window) if window else last_session(records)).filter(
        (pl.col("status") == "ok") & pl.col("sent_ns").is_not_null()
    )
    estimates: dict[str, Estimate | None] = {}
    batch_s = None
    if rows.height:
        sent = rows.get_column("sent_ns").to_numpy() / NS
        start, span = float(sent.min()), float(np.ptp(sent))
        e2e = rows.get_column("e2e_latency_s").drop_nulls()
        typical = float(e2e.median()) if e2e.len() else None  # type: ignore[arg-type]
        batch_s = batch_length(span, typical, counter_period_s)
        k = int(span // batch_s)
        estimates = per_query_estimates(rows, sent, start, batch_s, k)
    return {
        "confidence": 0.95,
        "method": "batch means by issue time, ratio estimator",
        "batch_s": batch_s,
        "over": "steady window" if window else "measured requests",
        "metrics": {
            metric: None if e is None else e.as_dict() | _target(targets.get(metric), e)
            for metric, e in estimates.items()
        },
        "targets": targets or None,
    }


def _target(target: float | None, estimate: Estimate) -> dict[str, Any]:
    return {} if target is None else {"target": target, "met": estimate.relative <= target}


def per_query_estimates(
    rows: pl.DataFrame, times_s: np.ndarray, start_s: float, batch_s: float, k: int
) -> dict[str, Estimate | None]:
    """The precision metrics' estimates from requests binned at ``times_s``."""

    def column(name: str) -> np.ndarray:
        return rows.get_column(name).cast(pl.Float64).fill_null(np.nan).to_numpy()

    batches = Batches(times_s, start_s, batch_s, k)
    out = {
        name: batches.mean(column(c))
        for name, c in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2e", "e2e_latency_s"))
    }
    if "energy_j" in rows.columns and not rows.get_column("energy_j").null_count():
        energy = batches.sum(column("energy_j"))
        out["j_per_query"] = ratio_interval(energy, batches.sum(np.ones(rows.height)), batch_s)
        out["j_per_token"] = ratio_interval(energy, batches.sum(column("output_tokens")), batch_s)
    else:
        out["j_per_query"] = out["j_per_token"] = None
    return out
