"""Whole runs against the simulator: files on disk, failures that lose nothing, secrets kept out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import polars as pl
import pyarrow.ipc as ipc
import pytest

from ipw_async import QueryTrace, RunError, read_arrow, run_benchmark
from ipw_async.records import RequestRecord
from ipw_async.rundir.files import PartialFileError, RecordWriter
from ipw_async.sim import SimConfig, SimulatorProcess

from .conftest import fast_engine, quick_config


async def test_embedded_run_writes_a_complete_run_directory(tmp_path: Path) -> None:
    config = quick_config(tmp_path, max_queries=30, warmup=4)
    result = await run_benchmark(config)
    run_dir = tmp_path / "run"
    assert result.complete
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["complete"] is True and summary["simulated"] is True
    assert summary["requests"]["measured"] == 30 and summary["requests"]["warmup"] == 4
    # an Arrow IPC stream, read back by both libraries, one row per request, as measured
    by_polars = pl.read_ipc_stream(run_dir / "records.arrow")
    by_pyarrow = ipc.open_stream(str(run_dir / "records.arrow")).read_all()
    assert by_polars.height == by_pyarrow.num_rows == 34
    assert by_polars.equals(result.records)
    assert by_polars.get_column("request_id").to_list() == list(range(34))
    ok = by_polars.filter(pl.col("status") == "ok")
    assert ok.height == 34
    assert ok.get_column("ttft_s").min() > 0
    assert (ok.get_column("e2e_latency_s") >= ok.get_column("ttft_s")).all()
    assert ok.get_column("warmup").sum() == 4
    # the summary's figures are the records' figures
    measured = ok.filter(~pl.col("warmup"))
    assert summary["latency_s"]["ttft"]["p50"] == pytest.approx(measured.get_column("ttft_s").median())
    assert summary["latency_s"]["ttft"]["count"] == 30
    traces = QueryTrace.load_jsonl(run_dir / "traces.jsonl")
    assert len(traces) == 34 and all(len(t.turns) == 1 for t in traces)
    assert traces[5].turns[0].request_id == 5
    assert (run_dir / "telemetry.arrow").exists()


async def test_a_device_that_averages_its_power_is_read_a_window_past_the_last_request(
    tmp_path: Path,
) -> None:
    # its readings show the last step's energy only a second after it: the run reads on that
    # long (its tail is 0.2 s), and the summary says how the power was averaged
    engine = fast_engine(telemetry="avg-power")
    result = await run_benchmark(
        quick_config(tmp_path, max_queries=12, sim=SimConfig(engine=engine, output_median=16))
    )
    last_closed = result.records.get_column("closed_ns").max()
    read_until = pl.read_ipc_stream(tmp_path / "run" / "telemetry.arrow").get_column("sim.t_ns").max()
    assert read_until - last_closed >= 1.0e9
    meter = result.summary["energy"]["meters"]["sim"]
    assert meter["kind"] == "power" and meter["power_averaged_over_s"] == 1.0


@pytest.mark.timing
async def test_closed_loop_holds_exactly_n_in_flight(tmp_path: Path) -> None:
    result = await run_benchmark(quick_config(tmp_path, concurrency=6, max_queries=60, telemetry="none"))
    frame = result.records
    starts = frame.get_column("dispatched_ns").to_numpy()
    ends = frame.get_column("closed_ns").to_numpy()
    # at the moment each request was dispatched, count what was in flight (itself included)
    in_flight = [int(((starts <= s) & (ends > s)).sum()) for s in starts]
    assert max(in_flight) == 6
    # after the ramp and before the drain, the count never drops below N
    steady = sorted(starts)[6:-6]
    assert min(int(((starts <= s) & (ends > s)).sum()) for s in steady) == 6


@pytest.mark.timing
async def test_rate_mode_spaces_arrivals(tmp_path: Path) -> None:
    config = quick_config(
        tmp_path, concurrency=None, rate=40.0, arrival="poisson", max_queries=80, telemetry="none"
    )
    result = await run_benchmark(config)
    frame = result.records.sort("request_id")
    scheduled = frame.get_column("scheduled_ns").to_numpy()
    gaps = (scheduled[1:] - scheduled[:-1]) / 1e9
    assert gaps.mean() == pytest.approx(1 / 40, rel=0.35)
    # requests went out on schedule: no cap, so none waited for a slot beyond loop latency
    late_ms = (frame.get_column("dispatched_ns").to_numpy() - scheduled) / 1e6
    assert float(np.percentile(late_ms, 90)) < 20


async def test_max_concurrency_caps_open_loop(tmp_path: Path) -> None:
    config = quick_config(
        tmp_path, concurrency=None, rate=400.0, max_concurrency=3, max_queries=30, telemetry="none"
    )
    frame = (await run_benchmark(config)).records
    starts, ends = frame.get_column("dispatched_ns").to_numpy(), frame.get_column("closed_ns").to_numpy()
    assert max(int(((starts <= s) & (ends > s)).sum()) for s in starts) <= 3
    # requests waited for a slot: queueing is reported, not hidden in latency
    assert frame.get_column("queue_s").max() > 0.01


async def test_duration_stops_sending(tmp_path: Path) -> None:
    config = quick_config(tmp_path, max_queries=None, duration=1.0, telemetry="none", dataset="synthetic")
    result = await run_benchmark(config)
    assert result.complete
    assert result.summary["window_s"] < 3.0


async def test_existing_run_directory_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "records.arrow").write_bytes(b"precious")
    with pytest.raises(RunError, match=r"already holds a run.*--overwrite"):
        await run_benchmark(quick_config(tmp_path))
    assert (tmp_path / "run" / "records.arrow").read_bytes() == b"precious"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"base_url": "localhost:8000/v1"}, "invalid --base-url"),
        ({"base_url": "http://127.0.0.1:9/v1"}, "cannot connect"),
        ({"rate": 5.0}, "exactly one of --concurrency and --rate"),
        ({"concurrency": 0}, "at least 1"),
        ({"dataset": "nope.jsonl"}, "neither 'qa', 'synthetic' nor an existing file"),
        ({"telemetry": "nvml,bogus"}, "unknown telemetry source bogus"),
        ({"attribution": "magic"}, "unknown attribution rule"),
        ({"model": "gpt-9"}, "not served"),
    ],
)
async def test_bad_input_gives_a_clear_error(
    tmp_path: Path, overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(RunError, match=message):
        await run_benchmark(quick_config(tmp_path, **overrides))
    assert not (tmp_path / "run" / "summary.json").exists()


async def test_malformed_dataset_row_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": oops}\n')
    with pytest.raises(RunError, match=r"bad.jsonl row 3: not valid JSON"):
        await run_benchmark(quick_config(tmp_path, dataset=str(bad)))


async def test_server_errors_are_outcomes_not_crashes(tmp_path: Path, faulty_sim: SimulatorProcess) -> None:
    config = quick_config(tmp_path, base_url=faulty_sim.base_url, max_queries=40, telemetry="none")
    result = await run_benchmark(config)
    assert result.complete
    errors = result.summary["requests"]["errors_by_type"]
    assert sum(errors.values()) == result.summary["requests"]["failed"] > 0
    assert result.records.height == 40
    failed = result.records.filter(pl.col("status") == "error")
    assert failed.get_column("error_message").null_count() == 0


async def test_dead_server_mid_run_stops_with_records_kept(tmp_path: Path) -> None:
    from ipw_async.sim import SimConfig

    from .conftest import fast_engine

    process = SimulatorProcess(SimConfig(engine=fast_engine(step_base_ms=30.0))).start()
    config = quick_config(
        tmp_path, base_url=process.base_url, max_queries=400, telemetry="none", abort_after_connect_errors=4
    )
    import asyncio

    async def kill_soon() -> None:
        # once a few requests have finished, however slow the machine
        while len(httpx.get(f"{process.root_url}/sim/truth", timeout=10).json()["requests"]) < 8:
            await asyncio.sleep(0.1)
        process.stop()

    killer = asyncio.create_task(kill_soon())
    with pytest.raises(RunError, match=r"stopped accepting connections.*records kept"):
        await run_benchmark(config)
    await killer
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["complete"] is False and summary["aborted"]
    frame = pl.read_ipc_stream(tmp_path / "run" / "records.arrow")
    assert frame.filter(pl.col("status") == "ok").height > 0
    assert frame.height < 400


async def test_api_key_never_reaches_a_file(tmp_path: Path, sim: SimulatorProcess) -> None:
    secret = "sk-test-DO-NOT-LEAK-4242"
    config = quick_config(tmp_path, base_url=sim.base_url, api_key=secret, max_queries=8, telemetry="none")
    await run_benchmark(config)
    written = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any(p.parent.name == "dataset" for p in written)  # the exports are looked in too
    for path in written:
        assert secret.encode() not in path.read_bytes(), path.name
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["config"]["api_key_set"] is True


async def test_a_standalone_simulator_read_as_the_device_is_a_simulated_run(
    tmp_path: Path, sim: SimulatorProcess
) -> None:
    # a run given --base-url is simulated all the same when its energy comes from a simulated
    # device (here, the simulator's own source; likewise through an agent or its /metrics)
    result = await run_benchmark(
        quick_config(tmp_path, base_url=sim.base_url, max_queries=8, telemetry="sim")
    )
    assert result.summary["simulated"] is True
    assert json.loads((tmp_path / "run" / "run.json").read_text())["simulated"] is True
    real = await run_benchmark(
        quick_config(
            tmp_path, base_url=sim.base_url, max_queries=8, telemetry="psutil", output_dir=tmp_path / "r"
        )
    )
    assert real.summary["simulated"] is False  # nothing simulated was measured


def _has_records(path: Path) -> bool:
    """Whether a run's records file, still being written, holds a record yet."""
    try:
        return path.exists() and read_arrow(path, partial_ok=True).height > 0
    except (OSError, ValueError):
        return False


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_keeps_every_record_measured(tmp_path: Path, workers: str) -> None:
    run_dir = tmp_path / "interrupted"
    env = {**os.environ, "OPENAI_API_KEY": ""}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ipw_async",
            "run",
            "-c",
            "4",
            "-n",
            "5000",
            "-o",
            str(run_dir),
            "--no-dashboard",
            "--baseline-s",
            "0",
            "--workers",
            workers,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    # interrupted once some records are on disk, however slow the machine (a fixed 3 s after
    # the file appeared found it still empty on a loaded 2-core host, with two workers starting)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _has_records(run_dir / "measured.arrow"):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["complete"] is False and summary["interrupted"] is True
    frame = read_arrow(run_dir / "records.arrow")
    assert 0 < frame.height < 5000
    assert frame.filter(pl.col("status") == "ok").height > 0
    assert set(frame.get_column("status").unique().to_list()) <= {"ok", "cancelled"}
    # every request sent has its record, the in-flight ones cancelled (worker processes too)
    assert summary["loss"]["requests_not_recorded"] == 0
    assert frame.get_column("request_id").sort().to_list() == list(range(frame.height))


def test_crashed_writer_leaves_a_readable_file(tmp_path: Path) -> None:
    import anyio

    path = tmp_path / "measured.arrow"
    writer = RecordWriter(path, batch_size=2)
    assert pl.read_ipc_stream(path).height == 0  # readable before any record

    async def write_without_closing() -> None:
        for i in range(5):
            record = RequestRecord(request_id=i, query_id=f"q{i}", dataset="d", prompt="p", sent_ns=i)
            if writer.add(record):
                await writer.flush()

    anyio.run(write_without_closing)
    # the writer never closed (as after a crash): no end-of-stream marker, yet plain readers
    # see every flushed batch
    assert pl.read_ipc_stream(path).get_column("request_id").to_list() == [0, 1, 2, 3]
    assert ipc.open_stream(str(path)).read_all().num_rows == 4
    # a process killed inside a write leaves part of a batch: named, or salvaged on request
    (tmp_path / "cut.arrow").write_bytes(path.read_bytes()[:-40])
    with pytest.raises(PartialFileError, match="ends inside a batch"):
        read_arrow(tmp_path / "cut.arrow")
    assert read_arrow(tmp_path / "cut.arrow", partial_ok=True).get_column("request_id").to_list() == [0, 1]


def test_the_writer_converts_records_a_slice_of_their_size_at_a_time(tmp_path: Path) -> None:
    import anyio

    def record(i: int, tokens: int, prompt: str = "p") -> RequestRecord:
        stamps = [i * 1000 + k for k in range(tokens)]
        return RequestRecord(
            request_id=i,
            query_id=f"q{i}",
            dataset="d",
            prompt=prompt,
            sent_ns=i,
            chunk_ns=stamps,
            chunk_tokens=[1] * tokens,
            chunk_server_ns=[None] * tokens,
        )

    def sizes(records: list[RequestRecord]) -> list[int]:
        return [len(part) for part in RecordWriter._slices(records)]

    # short records go many to a conversion (each column's call costs the same whatever its
    # rows), long ones a few, a long prompt weighs as its characters do
    assert sizes([record(i, 2) for i in range(256)]) == [256]
    assert sizes([record(i, 128) for i in range(256)]) == [32] * 8
    long_prompt = "x" * (RecordWriter.SLICE_STAMPS * RecordWriter.SLICE_CHARS)
    assert sizes([record(0, 2), record(1, 2, long_prompt), record(2, 2)]) == [2, 1]

    path = tmp_path / "measured.arrow"
    writer = RecordWriter(path, batch_size=100)
    records = [record(i, 2 if i % 2 else 128) for i in range(100)]

    async def write() -> None:
        for r in records:
            if writer.add(r):
                await writer.flush()

    anyio.run(write)
    reader = ipc.open_stream(str(path))
    batches = [batch for batch in reader if batch.num_rows]
    assert [batch.num_rows for batch in batches] == sizes(records) == [63, 37]  # a batch a slice
    frame = pl.read_ipc_stream(path)
    assert frame.get_column("request_id").to_list() == list(range(100))
    assert frame.get_column("chunk_ns").to_list() == [r.chunk_ns for r in records]
    assert frame.get_column("itl_s").to_list() == [r.itl_s for r in records]


async def test_cached_prompt_tokens_are_recorded(tmp_path: Path) -> None:
    from ipw_async.sim import SimConfig

    from .conftest import fast_engine

    # the built-in QA prompts share a few-shot preamble: a prefix-caching server skips it
    config = quick_config(
        tmp_path, max_queries=24, concurrency=2, sim=SimConfig(engine=fast_engine(prefix_cache=True))
    )
    result = await run_benchmark(config)
    frame = result.records.sort("request_id")
    cached = frame.get_column("cached_prompt_tokens").to_list()
    prompts = frame.get_column("prompt_tokens").to_list()
    assert cached[0] == 0 and all(0 < c < p for c, p in zip(cached[4:], prompts[4:], strict=True))
    assert abs(result.summary["energy"]["meters"]["sim"]["conservation_error"]) < 1e-9


def test_a_trace_line_keeps_numbers_numbers_and_unknown_null(tmp_path: Path) -> None:
    """traces.jsonl is read by other tools: a value NumPy computed is written as the number it
    is (not its text), a value never measured as null (not NaN, which JSON has no word for)."""
    from ipw_async.traces import ToolCall, TurnTrace, write_traces

    turn = TurnTrace(0, 7, np.int64(120), 16, np.float64(0.25), 1.5, energy_j=float("nan"), power_w=np.float64(310.5))
    trace = QueryTrace("q0", "synthetic", "p", None, "a", None, "ok", True, False, [turn])
    write_traces(tmp_path / "traces.jsonl", [trace])
    line = json.loads((tmp_path / "traces.jsonl").read_text(encoding="utf-8"))
    written = line["turns"][0]
    assert written["input_tokens"] == 120 and written["ttft_s"] == 0.25 and written["power_w"] == 310.5
    assert written["energy_j"] is None and line["energy_j"] is None
    assert QueryTrace.load_jsonl(tmp_path / "traces.jsonl")[0].turns[0].ttft_s == 0.25
    # a tool's output that is no valid text (a file name read with surrogateescape) is escaped
    turn.tools_called = [ToolCall("ls", 0.1, True, "{}", "bad\udcffname")]
    write_traces(tmp_path / "traces.jsonl", [trace])
    assert QueryTrace.load_jsonl(tmp_path / "traces.jsonl")[0].turns[0].tools_called[0].output == "bad\udcffname"
