"""Load spread over worker processes: the same run, the same files, from several event loops."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from ipw_async import run_benchmark
from ipw_async.harness.errors import RunError
from ipw_async.harness.workers import auto_workers

from .conftest import quick_config


async def test_two_workers_keep_the_concurrency_and_fill_one_run_directory(tmp_path: Path) -> None:
    config = quick_config(tmp_path, max_queries=64, concurrency=8, workers="2")
    result = await run_benchmark(config)
    frame = result.records
    assert frame.height == 64 and (frame.get_column("status") == "ok").all()
    # ids as one process gives them: one per request, in the order requests started
    assert frame.get_column("request_id").to_list() == list(range(64))
    sent = frame.sort("request_id").get_column("sent_ns").to_list()
    assert sent == sorted(sent)
    # never more in flight than the global concurrency, across both processes
    events = sorted(
        [(s, 1) for s in frame.get_column("sent_ns").to_list()]
        + [(e, -1) for e in frame.get_column("closed_ns").to_list()]
    )
    in_flight = peak = 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    assert peak == 8
    energy = result.summary["energy"]
    assert frame.get_column("energy_j").sum() + energy["idle_j"] == pytest.approx(energy["total_j"], rel=1e-9)
    assert result.summary["config"]["workers"] == "2"


async def test_agentic_tasks_over_workers_keep_their_turns_and_traces(tmp_path: Path) -> None:
    config = quick_config(tmp_path, workload="agentic", concurrency=4, max_queries=12, workers="2")
    result = await run_benchmark(config)
    traces = [json.loads(line) for line in (tmp_path / "run" / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 12
    ids = pl.read_ipc_stream(tmp_path / "run" / "records.arrow").get_column("request_id").to_list()
    turns = [turn for trace in traces for turn in trace["turns"]]
    # every turn found its record: the task logs were renumbered with the records
    assert sorted(turn["request_id"] for turn in turns) == sorted(ids)
    assert all(turn["energy_j"] is not None for turn in turns)
    assert result.summary["tasks"]["count"] == 12


def test_auto_takes_a_worker_per_128_streams_and_leaves_the_coordinator_a_core() -> None:
    assert auto_workers(16, cores=8) == 1
    assert auto_workers(256, cores=8) == 2
    assert auto_workers(4096, cores=8) == 7
    assert auto_workers(4096, cores=2) == 1


async def test_a_bad_worker_count_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="--workers must be"):
        await run_benchmark(quick_config(tmp_path, workers="0"))
    assert not (tmp_path / "run").exists()
