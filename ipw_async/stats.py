"""Latency and throughput statistics over the measured (non-warmup) requests of a run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from ._clock import NS
from .records import end_ns

if TYPE_CHECKING:
    from .traces import QueryTrace

PERCENTILES = (50, 90, 95, 99, 99.9)


def distribution(values: np.ndarray | list[float]) -> dict[str, float | int | None]:
    """count, mean, min, max and the standard percentiles; nulls when there are no values."""
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    out: dict[str, float | int | None] = {"count": int(arr.size)}
    if arr.size == 0:
        out |= {"mean": None, "min": None, "max": None} | {f"p{p:g}": None for p in PERCENTILES}
        return out
    pcts = np.percentile(arr, PERCENTILES)
    out |= {"mean": float(arr.mean()), "min": float(arr.min()), "max": float(arr.max())}
    out |= {f"p{p:g}": float(v) for p, v in zip(PERCENTILES, pcts, strict=True)}
    return out


def measured(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.filter(~pl.col("warmup"))


def window_s(frame: pl.DataFrame) -> float | None:
    """The measured window: first request sent to the last one's end, in seconds; for a resumed
    run, the sum of its sessions' windows (the time between sessions is not the run's)."""
    if frame.is_empty():
        return None
    spans = (
        frame.group_by("session" if "session" in frame.columns else pl.lit(0))
        .agg(pl.col("sent_ns").min().alias("start"), end_ns().max().alias("end"))
        .filter(
            pl.col("start").is_not_null() & pl.col("end").is_not_null() & (pl.col("end") > pl.col("start"))
        )
    )
    if spans.is_empty():
        return None
    return float((spans.get_column("end") - spans.get_column("start")).sum()) / NS


def latency_stats(frame: pl.DataFrame) -> dict[str, Any]:
    """Request counts, throughput and latency distributions, as ``summary.json`` reports them."""
    m = measured(frame)
    ok = m.filter(pl.col("status") == "ok")
    window = window_s(m)
    out_tokens = ok.get_column("output_tokens").drop_nulls()
    errors = (
        m.filter(pl.col("status") != "ok").group_by("error_type").len().sort("error_type").iter_rows()
        if m.height
        else []
    )
    scored = ok.filter(pl.col("correct").is_not_null())
    correct = int(scored.get_column("correct").sum()) if scored.height else 0
    itl = ok.get_column("itl_s").explode().drop_nulls().to_numpy() if ok.height else np.array([])
    return {
        "requests": {
            "total": frame.height,
            "warmup": frame.height - m.height,
            "measured": m.height,
            "ok": ok.height,
            "failed": m.height - ok.height,
            "errors_by_type": {str(k): int(v) for k, v in errors},
        },
        "window_s": window,
        "throughput": {
            "requests_per_s": ok.height / window if window else None,
            "output_tokens_per_s": float(out_tokens.sum()) / window if window and out_tokens.len() else None,
            "output_tokens_total": int(out_tokens.sum()) if out_tokens.len() else None,
            "output_tokens_source": _token_source(ok),
        },
        "accuracy": {
            "scored": scored.height,
            "correct": correct,
            "accuracy": correct / scored.height if scored.height else None,
        },
        "latency_s": {
            "ttft": distribution(ok.get_column("ttft_s").drop_nulls().to_numpy()),
            "tpot": distribution(ok.get_column("tpot_s").drop_nulls().to_numpy()),
            "itl": distribution(itl),
            "e2e": distribution(ok.get_column("e2e_latency_s").drop_nulls().to_numpy()),
            "queue": distribution(m.get_column("queue_s").drop_nulls().to_numpy()),
        },
    }


def _token_source(ok: pl.DataFrame) -> str | None:
    sources = set(ok.get_column("output_tokens_source").drop_nulls().unique().to_list())
    if not sources:
        return None
    return sources.pop() if len(sources) == 1 else "mixed"


def task_stats(traces: list[QueryTrace], window: float | None) -> dict[str, Any]:
    """Per-task figures of a multi-turn run, over its measured tasks.

    ``success_rate`` is correct / tasks with a reference answer (a task that ran out of
    turns counts as a failure; replayed conversations have none, so null; a task the judge
    could not score is left out and counted as ``unscored``, never as wrong);
    ``j_per_successful_task`` is the energy of all measured tasks over the number that
    succeeded: what one success costs, failures included.
    """
    tasks = [t for t in traces if not t.warmup]
    outcomes: dict[str, int] = {}
    for t in tasks:
        outcomes[t.status] = outcomes.get(t.status, 0) + 1
    unscored = sum(1 for t in tasks if t.judge_error is not None)
    scored = [t for t in tasks if t.reference is not None and t.judge_error is None]
    correct = sum(1 for t in scored if t.correct)
    energies = [t.energy_j for t in tasks]
    known = [e for e in energies if e is not None]
    all_known = bool(tasks) and len(known) == len(tasks)
    total_j = sum(known) if all_known else None
    success = correct / len(scored) if scored else None
    mean_j = total_j / len(tasks) if total_j is not None and tasks else None

    def dist(values: list[float | None]) -> dict[str, float | int | None]:
        return distribution([v for v in values if v is not None])

    return {
        "count": len(tasks),
        "outcomes": outcomes,
        "correct": correct,
        "unscored": unscored,
        "success_rate": success,
        "tasks_per_s": len(tasks) / window if window else None,
        "turns": dist([len(t.turns) for t in tasks]),
        "input_tokens": dist([_sum(u.input_tokens for u in t.turns) for t in tasks]),
        "cached_input_tokens": dist([_sum(u.cached_input_tokens for u in t.turns) for t in tasks]),
        "output_tokens": dist([_sum(u.output_tokens for u in t.turns) for t in tasks]),
        "tool_calls": dist([sum(len(u.tools_called) for u in t.turns) for t in tasks]),
        "wall_s": dist([t.total_wall_clock_s for t in tasks]),
        "model_s": dist([t.model_s for t in tasks]),
        "tool_s": dist([t.tool_s for t in tasks]),
        "think_s": dist([t.think_s for t in tasks]),
        "queue_s": dist([t.queue_s for t in tasks]),
        "energy_j": dist(list(energies)),
        "j_per_task": mean_j,
        "j_per_successful_task": total_j / correct if total_j is not None and correct else None,
        "ipj": success / mean_j if success is not None and mean_j else None,
        "tool_wait_device_j": dist([t.tool_wait_device_j for t in tasks]),
        "cost_usd_per_task": dist([t.cost_usd for t in tasks]),
    }


def _sum(values: Any) -> float | None:
    items = [v for v in values if v is not None]
    return float(sum(items)) if items else None


# the event loop was the limit when it was this busy, or ran a timer this late (p99)
CLIENT_BUSY_SHARE = 0.9
CLIENT_LAG_MS = 10.0


def client_stats(
    frame: pl.DataFrame, harness: dict[str, Any] | None, concurrency: int | None
) -> dict[str, Any]:
    """How the client itself did: SSE events/s, its CPU per event (its event loops' own threads,
    and apart the whole process tree with the sampler, the writer and the display), loop lag,
    how late requests went out against their schedule, how spread the opening burst was, and
    whether the client rather than the server set the pace (judged on the loops' own CPU)."""
    harness = harness or {}
    rows = measured(frame)
    window = window_s(rows)
    events = int(rows.get_column("chunk_count").sum()) if rows.height else 0
    loop_s, cpu_s, writer_s = harness.get("loop_cpu_s"), harness.get("cpu_s"), harness.get("writer_cpu_s")
    share = harness.get("loop_share")
    processes = harness.get("processes") or 1
    lag_p99 = (harness.get("loop_lag_ms") or {}).get("p99")
    sent = rows.filter(pl.col("sent_ns").is_not_null()).sort("sent_ns")
    late_ms = (sent.get_column("sent_ns") - sent.get_column("scheduled_ns")).to_numpy() / 1e6
    burst = sent.head(concurrency or 0).get_column("sent_ns")
    limited = []
    if share is not None and share / processes >= CLIENT_BUSY_SHARE:
        limited.append(f"its event loop was busy {share / processes:.0%} of the window")
    if lag_p99 is not None and lag_p99 >= CLIENT_LAG_MS:
        limited.append(f"it ran a timer {lag_p99:.0f} ms late (p99)")
    return {
        "stamped_at": "socket read",  # the transport stamps bytes in data_received
        "event_loop": harness.get("event_loop"),
        "processes": processes,
        "events": events,
        "events_per_s": events / window if window and events else None,
        "cpu_us_per_event": loop_s / events * 1e6 if loop_s is not None and events else None,
        "process_cpu_us_per_event": cpu_s / events * 1e6 if cpu_s is not None and events else None,
        # of that, writing the run's files (off the loop; where the run said)
        "writer_cpu_us_per_event": writer_s / events * 1e6 if writer_s is not None and events else None,
        "loop_lag_p99_ms": lag_p99,
        "send_lateness_ms": distribution(late_ms),
        "burst_spread_ms": (burst.max() - burst.min()) / 1e6 if concurrency and burst.len() > 1 else None,  # type: ignore[operator]
        "client_limited": "; ".join(limited) or None,
    }
