"""A task's wall time split into model, tool, think and queue: what is unmeasured stays null."""

from __future__ import annotations

from typing import Any

import pytest

from ipw_async.traces import traces_from_tasks


def _row(request_id: int, stream_s: float | None) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "prompt_tokens": 100,
        "cached_prompt_tokens": 0,
        "output_tokens": 20,
        "ttft_s": 0.05,
        "e2e_latency_s": stream_s,
        "stream_time_s": stream_s,
        "status": "ok",
        "error_type": None,
    }


def _task(tool_latency_s: float | None) -> dict[str, Any]:
    shared = dict.fromkeys(("query_id", "dataset", "prompt", "reference", "answer", "correct"), None)
    return {
        **shared,
        "warmup": False,
        "task_id": 0,
        "outcome": "answered",
        "scheduled_ns": 0,
        "ended_ns": 5_000_000_000,  # 5 s of wall time
        "turns": [
            {
                "request_id": 1,
                "turn_index": 0,
                "think_s": None,
                "tools": [{"name": "calculator", "latency_s": tool_latency_s, "ok": True}],
            },
            {"request_id": 2, "turn_index": 1, "think_s": 1.5, "tools": []},
        ],
    }


def test_queue_is_the_rest_of_the_wall_time() -> None:
    (trace,) = traces_from_tasks([_task(0.5)], {1: _row(1, 1.0), 2: _row(2, 1.25)})
    assert (trace.model_s, trace.tool_s, trace.think_s) == (2.25, 0.5, 1.5)
    assert trace.queue_s == pytest.approx(5.0 - 2.25 - 0.5 - 1.5)


def test_an_unmeasured_tool_wait_is_not_counted_as_queue() -> None:
    (trace,) = traces_from_tasks([_task(None)], {1: _row(1, 1.0), 2: _row(2, 1.25)})
    assert trace.turns[0].tool_latency_s is None
    assert trace.tool_s is None and trace.queue_s is None
    assert trace.model_s == 2.25  # what was measured is still given


def test_a_lost_call_leaves_model_and_queue_time_unknown() -> None:
    (trace,) = traces_from_tasks([_task(0.5)], {2: _row(2, 1.25)})  # call 1's record was lost
    assert len(trace.turns) == 1
    assert trace.model_s is None and trace.tool_s is None and trace.queue_s is None
    assert trace.total_wall_clock_s == 5.0
