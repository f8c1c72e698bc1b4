"""Load spread over worker processes: the same run, the same files, from several event loops."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import psutil
import pytest

from ipw_async import run, run_benchmark
from ipw_async._clock import now_ns
from ipw_async.client import ClientConfig
from ipw_async.errors import RunAborted, RunError
from ipw_async.harness.ray_pool import local_cluster
from ipw_async.harness.worker_protocol import Kept, Renumbering, Started, TaskDone, WorkerSetup
from ipw_async.harness.workers import WorkerPool, auto_workers
from ipw_async.records import RequestRecord
from ipw_async.sim import SimConfig
from ipw_async.workload import Query, Requests, TaskLog, WorkUnit
from ipw_async.workload.body import BodyDefaults, prompt_fields

from .conftest import fast_engine, quick_config


async def test_two_workers_keep_the_concurrency_and_fill_one_run_directory(tmp_path: Path) -> None:
    config = quick_config(tmp_path, max_queries=64, concurrency=8, workers="2")
    result = await run_benchmark(config)
    frame = result.records
    assert frame.height == 64 and (frame.get_column("status") == "ok").all()
    # ids as one process gives them: one per request, in the order the coordinator heard of
    # them starting (the two workers' messages may cross by a moment)
    assert frame.get_column("request_id").to_list() == list(range(64))
    sent = np.array(frame.sort("request_id").get_column("sent_ns").to_list())
    assert (sent >= np.maximum.accumulate(sent) - 50_000_000).all()
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
    assert result.summary["harness"]["workers"] == {"processes": 2}


async def check_agentic_traces(tmp_path: Path, **pool: str) -> None:
    config = quick_config(tmp_path, workload="agentic", concurrency=4, max_queries=12, **pool)
    result = await run_benchmark(config)
    traces = [json.loads(line) for line in (tmp_path / "run" / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 12
    ids = pl.read_ipc_stream(tmp_path / "run" / "records.arrow").get_column("request_id").to_list()
    turns = [turn for trace in traces for turn in trace["turns"]]
    # every turn found its record: the task logs were renumbered with the records
    assert sorted(turn["request_id"] for turn in turns) == sorted(ids)
    assert all(turn["energy_j"] is not None for turn in turns)
    assert result.summary["tasks"]["count"] == 12


async def test_agentic_tasks_over_workers_keep_their_turns_and_traces(tmp_path: Path) -> None:
    await check_agentic_traces(tmp_path, workers="2")


def test_auto_takes_a_worker_per_128_streams_and_leaves_the_coordinator_a_core() -> None:
    assert auto_workers(16, cores=8) == 1
    assert auto_workers(256, cores=8) == 2
    assert auto_workers(4096, cores=8) == 7
    assert auto_workers(4096, cores=2) == 1


async def test_a_bad_worker_count_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="--workers must be"):
        await run_benchmark(quick_config(tmp_path, workers="0"))
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A Ray cluster on loopback: a head node and a worker node, one CPU each."""
    pytest.importorskip("ray")
    with local_cluster(nodes=2) as address:
        yield address


async def test_ray_actors_on_two_nodes_fill_one_run_directory(tmp_path: Path, ray_cluster: str) -> None:
    config = quick_config(tmp_path, max_queries=48, concurrency=8, ray=ray_cluster, workers="auto")
    result = await run_benchmark(config)
    frame = result.records
    assert frame.height == 48 and (frame.get_column("status") == "ok").all()
    assert sorted(frame.get_column("request_id").to_list()) == list(range(48))
    # auto: an actor per node, placed by Ray on both, each with its clock's offset measured
    actors = result.summary["harness"]["workers"]["actors"]
    assert len({a["node"] for a in actors}) == 2
    assert all(abs(a["offset_ms"]) <= a["uncertainty_ms"] + 0.05 for a in actors)  # one clock here
    # stamped on the coordinator's timeline: every request inside the measured window
    assert (frame.get_column("sent_ns") >= 0).all()
    assert (frame.get_column("closed_ns") > frame.get_column("sent_ns")).all()
    energy = result.summary["energy"]
    assert frame.get_column("energy_j").sum() + energy["idle_j"] == pytest.approx(energy["total_j"], rel=1e-9)


async def test_a_ray_address_with_no_cluster_says_so(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with pytest.raises(RunError, match=r"cannot join the Ray cluster at 127\.0\.0\.1:9 "):
        await run_benchmark(quick_config(tmp_path, ray="127.0.0.1:9"))


async def test_a_worker_killed_mid_run_stops_the_run_with_the_reason_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    config = quick_config(tmp_path, concurrency=8, max_queries=None, duration=30.0, workers="2")
    run = asyncio.create_task(run_benchmark(config))
    records = tmp_path / "run" / "measured.arrow"
    for _ in range(300):  # the first records are on disk: the workers are streaming
        await asyncio.sleep(0.05)
        if records.exists() and pl.read_ipc_stream(records).height > 8:
            break
    workers = [c for c in psutil.Process().children(recursive=True) if "spawn_main" in " ".join(c.cmdline())]
    assert len(workers) == 2
    workers[0].kill()
    with pytest.raises(RunAborted, match=r"worker process \d ended unexpectedly \(exit code -9\)"):
        await asyncio.wait_for(run, 60)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["complete"] is False
    # the other worker's records are all there; the dead one's in-flight requests are the loss
    assert summary["loss"]["requests_on_disk"] > 8
    assert 0 < summary["loss"]["requests_not_recorded"] <= 8


async def test_agentic_tasks_over_ray_actors_keep_their_turns_and_traces(
    tmp_path: Path, ray_cluster: str
) -> None:
    # tasks interleave on each actor: their calls must not take each other's ids
    await check_agentic_traces(tmp_path, ray=ray_cluster, workers="2")


class Heard:
    """A coordinator that keeps what it hears, numbering requests 0, 1, 2, ..."""

    def __init__(self, refuse_records: bool = False) -> None:
        self.ids = iter(range(100))
        self.records: list[RequestRecord] = []
        self.logs: list[TaskLog] = []
        self.stopped: list[str] = []
        self.refuse_records = refuse_records

    def number(self) -> int:
        return next(self.ids)

    def started(self, unit_id: int | None, number: int) -> None:
        pass

    async def kept(self, record: RequestRecord) -> None:
        if self.refuse_records:
            raise RuntimeError("the ledger failed")
        self.records.append(record)

    def task_started(self) -> None:
        pass

    def task_done(self, log: TaskLog) -> None:
        self.logs.append(log)

    def stop(self, reason: str) -> None:
        self.stopped.append(reason)


async def test_renumbering_keeps_interleaved_tasks_apart() -> None:
    # two tasks on one worker whose calls carry the same numbers, their messages interleaved:
    # each call gets its own id, and each task log the ids of its own calls
    run = Heard()
    renumbering = Renumbering(run)

    def call(task: int) -> RequestRecord:
        return RequestRecord(request_id=0, query_id="q", dataset="d", prompt="p", unit_id=task, task_id=task)

    def log(task: int) -> TaskLog:
        return TaskLog(task, "q", "d", False, "p", None, 0, turns=[{"request_id": 0}])

    for message in [
        Started(1, 0),
        Started(2, 0),
        Kept(call(2)),
        Kept(call(1)),
        TaskDone(log(1)),
        TaskDone(log(2)),
    ]:
        await renumbering.apply(0, message)
    assert [(r.unit_id, r.request_id) for r in run.records] == [(2, 1), (1, 0)]
    assert [(t.task_id, t.turns[0]["request_id"]) for t in run.logs] == [(1, 0), (2, 1)]


class OneRequest:
    """A workload of one request per unit (a worker process imports it from here)."""

    name = "one"
    scorer = None

    def size(self) -> int:
        return 1

    def units(self, count: int | None, warmup: bool) -> Iterator[WorkUnit]:
        yield WorkUnit(0, Query("q", "hello"), warmup)

    async def perform(self, unit: WorkUnit, requests: Requests, scheduled_ns: int) -> None:
        record = requests.new_record(unit, scheduled_ns, unit.query.prompt)
        await requests.request(record, requests.payload(prompt_fields(unit.query.prompt, chat=True)))


async def test_a_report_the_coordinator_cannot_apply_stops_the_run_instead_of_hanging_it() -> None:
    # a real worker process whose record the run cannot take: the pool's consumer used to die
    # silently, leaving every unit waiting and close() spinning
    run = Heard(refuse_records=True)
    client = ClientConfig(base_url="http://127.0.0.1:1/v1", connect_timeout=2.0)  # nothing listens
    pool = WorkerPool(run, WorkerSetup(OneRequest(), client, now_ns(), BodyDefaults("m"), None, 0), count=1)
    await pool.start()
    try:
        unit = next(OneRequest().units(1, False))
        with pytest.raises(RuntimeError, match="worker pool stopped"):
            await asyncio.wait_for(pool.execute(unit, now_ns()), 30)
    finally:
        await asyncio.wait_for(pool.close(), 30)
    assert len(run.stopped) == 1 and "could not be applied" in run.stopped[0]


def test_records_larger_than_a_pipe_cross_between_processes_on_uvloop(tmp_path: Path) -> None:
    # Each request carries a prompt of some 300 KB, more than a pipe holds, both ways: a
    # command to a worker and its record back. On the loop the CLI runs (uvloop where it is
    # installed) a blocking write on a descriptor the loop watches must not fail half-way.
    config = quick_config(
        tmp_path, workers="2", concurrency=4, max_queries=8, dataset="synthetic", prompt_tokens=60_000
    )
    config.output_tokens = 8
    # the server's time for such prompts is not what is tested here: it answers at once
    config.sim = SimConfig(
        engine=fast_engine(step_per_prefill_token_ms=0, step_per_context_ms=0), output_median=16
    )
    result = run(config)
    assert result.records.height == 8 and (result.records.get_column("status") == "ok").all()
    assert len(result.records.get_column("prompt")[0]) > 200_000
