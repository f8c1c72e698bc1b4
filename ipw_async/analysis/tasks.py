"""Per-task figures of an agentic or multi-turn run, from its traces: success, J/task, time split,
and how a turn's cost grows as the task's history grows."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..rundir import files
from ..rundir.read import RunDir
from ..stats import measured, task_stats, window_s


def task_report(run: RunDir) -> dict[str, Any]:
    """Task statistics and a per-turn-index profile; null with the reason for a single-turn run."""
    if not (run.path / files.TASKS).is_file() or run.traces is None:
        return {
            "tasks": None,
            "reason": "not a multi-turn run (no tasks.jsonl), or not finished (no traces.jsonl)",
        }
    traces = [t for t in run.traces if not t.warmup]
    by_turn: dict[int, list[Any]] = {}
    for trace in traces:
        for turn in trace.turns:
            by_turn.setdefault(turn.turn_index, []).append(turn)
    profile = []
    for index in sorted(by_turn):
        turns = by_turn[index]
        profile.append(
            {
                "turn_index": index,
                "calls": len(turns),
                "input_tokens_mean": _mean([t.input_tokens for t in turns]),
                "cached_fraction_mean": _mean(
                    [
                        t.cached_input_tokens / t.input_tokens
                        for t in turns
                        if t.cached_input_tokens is not None and t.input_tokens
                    ]
                ),
                "energy_j_mean": _mean([t.energy_j for t in turns]),
                "ttft_s_mean": _mean([t.ttft_s for t in turns]),
            }
        )
    return {"tasks": task_stats(traces, window_s(measured(run.records))), "by_turn_index": profile}


def _mean(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None
