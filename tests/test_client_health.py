"""The client measures itself in every run: events/s, CPU per event, loop lag, send lateness,
the opening burst's spread, and whether the client rather than the server set the pace."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ipw_async import read_arrow, run_benchmark
from ipw_async.harness.health import HarnessCpu, LoopLag
from ipw_async.rundir.files import ThreadCpu, write_in_thread
from ipw_async.sim import SimulatorProcess
from ipw_async.stats import client_stats

from .conftest import quick_config

SHORT_RUN = Path(__file__).parent / "data" / "short_run"


async def test_every_run_says_how_its_client_did(tmp_path: Path, sim: SimulatorProcess) -> None:
    result = await run_benchmark(quick_config(tmp_path, base_url=sim.base_url, concurrency=6, max_queries=30))
    client = result.summary["client"]
    records = read_arrow(result.run_dir / "records.arrow").filter(~pl.col("warmup"))
    assert client["stamped_at"] == "socket read" and client["event_loop"] in ("uvloop", "asyncio")
    assert client["events"] == records.get_column("chunk_count").sum() > 0
    assert client["events_per_s"] == pytest.approx(client["events"] / result.summary["window_s"])
    harness = result.summary["harness"]
    # the event loop's own thread apart from the whole process (sampler, writer, display)
    assert client["cpu_us_per_event"] == pytest.approx(harness["loop_cpu_s"] / client["events"] * 1e6)
    assert client["process_cpu_us_per_event"] == pytest.approx(harness["cpu_s"] / client["events"] * 1e6)
    assert 0 < client["cpu_us_per_event"] < client["process_cpu_us_per_event"]
    # writing the files is the process's too, off the loop: a part of what its other threads took
    assert 0 <= harness["writer_cpu_s"] <= harness["cpu_s"] - harness["loop_cpu_s"]
    assert client["writer_cpu_us_per_event"] == pytest.approx(
        harness["writer_cpu_s"] / client["events"] * 1e6
    )
    sampler = result.summary["telemetry"]["sampler"]
    assert sampler["cpu_s"] > 0 and 0 < sampler["cpu_share"] < 1  # its own thread, its own figure
    assert client["send_lateness_ms"]["count"] == records.height
    first = records.sort("sent_ns").head(6).get_column("sent_ns")
    assert client["burst_spread_ms"] == pytest.approx((first.max() - first.min()) / 1e6)
    assert client["processes"] == 1
    assert client["loop_lag_p99_ms"] == harness["loop_lag_ms"]["p99"]


def test_a_busy_or_late_loop_is_named_as_the_limit() -> None:
    records = read_arrow(SHORT_RUN / "records.arrow")
    calm = {"cpu_s": 1.0, "cpu_share": 0.3, "loop_cpu_s": 0.9, "loop_share": 0.3, "processes": 1}
    calm |= {"loop_lag_ms": {"p99": 0.8}}
    assert client_stats(records, calm, 8)["client_limited"] is None
    # a process kept busy by its other threads (the sampler's reads) did not limit the client
    assert client_stats(records, calm | {"cpu_share": 0.97}, 8)["client_limited"] is None
    busy = calm | {"loop_share": 0.97}
    assert client_stats(records, busy, 8)["client_limited"] == "its event loop was busy 97% of the window"
    assert client_stats(records, busy | {"processes": 2}, 8)["client_limited"] is None  # 49% each
    late = calm | {"loop_lag_ms": {"p99": 25.0}}
    assert "a timer 25 ms late" in client_stats(records, late, 8)["client_limited"]


async def test_the_loop_lag_sees_a_stall_and_costs_nothing_once_stopped() -> None:
    lag = LoopLag()
    measuring = asyncio.create_task(lag.measure())
    await asyncio.sleep(0.3)
    calm = len(lag.lags_ms)
    time.sleep(0.25)  # the loop stalled: the tick due inside it runs when it ends
    await asyncio.sleep(0.2)
    measuring.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await measuring
    stopped = len(lag.lags_ms)
    await asyncio.sleep(0.15)
    assert 1 <= calm <= 7  # about 0.3 s / 50 ms: a tick per period, none per event
    stall = max(lag.lags_ms)
    assert stall >= 250 - 50 - 5  # a tick fell due in the first period of the stall
    assert max(lag.lags_ms[:calm]) < stall / 4  # an idle loop: only the timer's own slack
    assert len(lag.lags_ms) == stopped  # the timer went with the task
    assert lag.recent_p99() == pytest.approx(np.percentile(lag.lags_ms, 99))


def test_what_was_not_measured_is_null_not_zero() -> None:
    records = read_arrow(SHORT_RUN / "records.arrow")
    stats = client_stats(records, None, None)  # a run that died before it wrote how it ended
    assert stats["cpu_us_per_event"] is None and stats["loop_lag_p99_ms"] is None
    assert stats["process_cpu_us_per_event"] is None and stats["writer_cpu_us_per_event"] is None
    assert stats["burst_spread_ms"] is None and stats["event_loop"] is None


def _burn(seconds: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


def test_the_loops_own_cpu_leaves_the_other_threads_out() -> None:
    cpu = HarnessCpu()
    with cpu.measuring():  # the caller's thread waits while another works
        worker = threading.Thread(target=_burn, args=(0.3,))
        worker.start()
        worker.join()
    figures = cpu.summary()
    assert figures["cpu_s"] is not None and figures["loop_cpu_s"] is not None
    assert figures["cpu_s"] >= 0.3 and figures["loop_cpu_s"] < 0.05
    assert figures["writer_cpu_s"] is None  # no files were open: not measured, not 0


async def test_the_writers_cpu_is_its_threads_own_and_only_while_measuring() -> None:
    cpu, writes = HarnessCpu(), ThreadCpu()
    cpu.writer = writes
    await write_in_thread(_burn, 0.1, cpu=writes)  # before the measured phase: not counted
    with cpu.measuring():
        other = threading.Thread(target=_burn, args=(0.2,))  # another thread's work is not the writer's
        other.start()
        await write_in_thread(_burn, 0.2, cpu=writes)
        other.join()
    figures = cpu.summary()
    assert writes.seconds >= 0.3
    assert 0.2 <= figures["writer_cpu_s"] < 0.3  # type: ignore[operator]
    assert figures["loop_cpu_s"] < 0.05  # type: ignore[operator]
