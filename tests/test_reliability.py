"""A run survives what users' machines do to it: real processes, real signals, files read back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import psutil
import pyarrow.ipc as ipc
import pytest

from ipw_async import RunConfig, read_arrow, run_benchmark
from ipw_async.client import ClientConfig, StreamingClient
from ipw_async.records import ErrorType, RequestRecord, Status
from ipw_async.rundir import RunDirError
from ipw_async.sim import FAULT_OUTCOMES, Faults, SimConfig, SimulatorProcess
from ipw_async.workload.body import BodyDefaults, prompt_fields

from .conftest import fast_engine, quick_config


def _run(*args: str) -> list[str]:
    return [sys.executable, "-m", "ipw_async", "run", "--no-dashboard", *args]


def _finish(command: list[str], timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a command to its end, its output kept as text."""
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)


def _wait_for_records(run_dir: Path, rows: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until ``measured.arrow`` holds ``rows`` rows (a flush has happened with work in it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be stopped"
        path = run_dir / "measured.arrow"
        # read_arrow: a live file may end inside the batch being written at this instant
        if path.exists() and read_arrow(path, partial_ok=True).height >= rows:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{run_dir} never held {rows} records")


def _wait_for_counter_check(run_dir: Path, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Until ``run.json`` holds the energy counters' check (about 3 s into the run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be stopped"
        with contextlib.suppress(OSError, json.JSONDecodeError):
            if json.loads((run_dir / "run.json").read_text())["telemetry"]["counter_checks"]:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{run_dir}/run.json never held its counter check")


def test_kill_9_leaves_readable_files_no_orphan_and_a_recoverable_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(_run("-c", "8", "--duration", "60", "-o", str(run_dir)))
    _wait_for_records(run_dir, 8, proc)
    _wait_for_counter_check(run_dir, proc)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "the run should have started its simulator"
    proc.kill()
    proc.wait()
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, "the simulator outlived its harness"
    # every file readable by plain pyarrow and polars, as the run left it
    for name in ("measured.arrow", "telemetry.arrow"):
        rows = ipc.open_stream(str(run_dir / name)).read_all().num_rows
        assert rows > 0 and pl.read_ipc_stream(run_dir / name).height == rows
    assert not (run_dir / "summary.json").exists()
    recovered = _finish([sys.executable, "-m", "ipw_async", "recover", str(run_dir)])
    assert recovered.returncode == 0, recovered.stderr
    assert "did not finish" in recovered.stdout and "dispatched but not on disk" in recovered.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["complete"] is False and "killed or crashed" in summary["aborted"]
    loss = summary["loss"]
    assert loss["requests_on_disk"] == pl.read_ipc_stream(run_dir / "records.arrow").height
    assert loss["requests_not_recorded"] >= 1  # 8 were in flight when it died
    assert abs(summary["energy"]["meters"]["sim"]["conservation_error"]) < 1e-9
    # the counter check it made before it died is kept, not lost with the run's end
    assert summary["telemetry"]["counter_checks"]["sim"]["status"] == "ok"


def _limited(kind: int, soft: int, hard: int) -> Callable[[], None]:
    return lambda: resource.setrlimit(kind, (soft, hard))


def test_a_full_disk_stops_the_run_with_one_line_and_keeps_the_records(tmp_path: Path) -> None:
    # a file-size limit refuses writes as a full disk does (EFBIG rather than ENOSPC)
    run_dir = tmp_path / "full"
    proc = _finish(
        _run("-c", "16", "-n", "5000", "-o", str(run_dir)),
        timeout=120,
        preexec_fn=_limited(resource.RLIMIT_FSIZE, 150_000, 150_000),
    )
    assert proc.returncode == 1
    assert (
        "error: cannot write" in proc.stderr
        and "measured.arrow" in proc.stderr
        and "Traceback" not in proc.stderr
    )
    kept = ipc.open_stream(str(run_dir / "measured.arrow")).read_all().num_rows
    assert 0 < kept < 5000 and pl.read_ipc_stream(run_dir / "measured.arrow").height == kept


def test_open_file_limit_is_raised_or_explained(tmp_path: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 400:
        pytest.skip("this machine's hard open-file limit is below what the test raises to")
    raised = _finish(
        _run("-c", "200", "-n", "200", "--telemetry", "none", "-o", str(tmp_path / "raised")),
        timeout=120,
        preexec_fn=_limited(resource.RLIMIT_NOFILE, 128, hard),
    )
    assert raised.returncode == 0, raised.stderr
    assert "raised the open-file limit from 128 to 264" in raised.stderr
    refused = _finish(
        _run("-c", "200", "-n", "200", "-o", str(tmp_path / "refused")),
        preexec_fn=_limited(resource.RLIMIT_NOFILE, 128, 128),
    )
    assert refused.returncode == 2
    assert "may open only 128" in refused.stderr and "ulimit -n 264" in refused.stderr
    assert not (tmp_path / "refused").exists()


def test_removing_the_run_directory_mid_run_is_reported(tmp_path: Path) -> None:
    run_dir = tmp_path / "doomed"
    proc = subprocess.Popen(_run("-c", "8", "--duration", "60", "-o", str(run_dir)), stderr=subprocess.PIPE)
    _wait_for_records(run_dir, 4, proc)
    # the run may be writing a file (run.json's temporary twin) as it goes: remove until gone
    for _ in range(100):
        shutil.rmtree(run_dir, ignore_errors=True)
        if not run_dir.exists():
            break
    assert not run_dir.exists()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "was removed while the run was writing to it" in stderr.decode()


async def test_every_injected_fault_is_recorded_as_what_it_was(tmp_path: Path) -> None:
    faults = Faults(**dict.fromkeys(FAULT_OUTCOMES, 0.05), stall_s=2.0)
    with SimulatorProcess(SimConfig(engine=fast_engine(), faults=faults, output_median=16)) as sim:
        config = RunConfig(
            base_url=sim.base_url,
            concurrency=16,
            max_queries=200,
            dataset="synthetic",
            output_tokens=16,
            read_timeout=0.5,
            telemetry="none",
            output_dir=tmp_path / "faults",
        )
        result = await run_benchmark(config)
        stats = httpx.get(f"{sim.root_url}/sim/stats").json()
    assert stats["requests"] == result.records.height == 200
    assert set(stats["injected"]) == set(FAULT_OUTCOMES)
    for rid, status, kind, code in result.records.select(
        "request_id", "status", "error_type", "http_status"
    ).iter_rows():
        injected = stats["by_request"].get(str(rid))
        assert (status == "ok") if injected is None else ((kind, code) == FAULT_OUTCOMES[injected]), (
            rid,
            injected,
        )


@pytest.fixture
async def odd_server() -> AsyncIterator[Callable[[bytes, float], str]]:
    """A raw TCP server that answers every request with the given bytes, then waits ``hold`` s."""
    servers: list[asyncio.Server] = []

    async def start(reply: bytes, hold: float) -> str:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            await writer.drain()
            await asyncio.sleep(hold)
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"

    yield start  # type: ignore[misc]
    for server in servers:
        server.close()


async def _send(base_url: str, read_timeout: float = 5.0) -> RequestRecord:
    client = StreamingClient(ClientConfig(base_url=base_url, read_timeout=read_timeout), 0)
    record = RequestRecord(request_id=0, query_id="q", dataset="t", prompt="p")
    try:
        await client.send(record, BodyDefaults("m").encode(prompt_fields("p", chat=True)))
    finally:
        await client.aclose()
    return record


EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}\n\n'


@pytest.mark.timing
async def test_odd_servers_get_a_clear_outcome(odd_server: Callable[..., object]) -> None:
    # HTTP/1.0, no length, the stream ends when the connection closes: a whole answer
    http10 = await odd_server(
        b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + EVENT + b"data: [DONE]\n\n", 0
    )  # type: ignore[operator]
    record = await _send(http10)
    assert record.status is Status.OK and record.answer == "hi"
    # stream=true ignored: one JSON body
    body = b'{"choices": [{"message": {"content": "hi"}}]}'
    plain = await odd_server(  # type: ignore[operator]
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (len(body), body),
        0,
    )
    record = await _send(plain)
    assert record.error_type is ErrorType.NOT_STREAMING and "ignored stream=true" in (
        record.error_message or ""
    )
    # headers, then nothing: the read timeout ends it
    silent = await odd_server(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n", 5)  # type: ignore[operator]
    started = time.monotonic()
    record = await _send(silent, read_timeout=0.5)
    assert record.error_type is ErrorType.TIMEOUT and time.monotonic() - started < 3
    # a 200 event stream that closes with no event at all
    empty = await odd_server(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n", 0)  # type: ignore[operator]
    record = await _send(empty)
    assert record.error_type is ErrorType.DISCONNECT and "sent no event" in (record.error_message or "")


async def test_analyze_finishes_a_run_that_died_first(tmp_path: Path) -> None:
    from ipw_async.analysis import analyze

    result = await run_benchmark(quick_config(tmp_path, max_queries=12))
    for name in ("summary.json", "traces.jsonl", "records.arrow"):  # as a kill -9 leaves it
        (result.run_dir / name).unlink()
    with pytest.raises(RunDirError, match=r"cut short.*ipw-async recover"):
        analyze(result.run_dir, "accuracy", write=False)  # the library never finishes a run itself
    cli = await asyncio.to_thread(
        _finish, [sys.executable, "-m", "ipw_async", "analyze", str(result.run_dir)]
    )
    assert cli.returncode == 0, cli.stderr
    assert "it was cut short" in cli.stderr  # the command finishes it first, and says so
    assert json.loads((result.run_dir / "summary.json").read_text())["requests"]["total"] == 12
    assert json.loads((result.run_dir / "analysis" / "accuracy.json").read_text())["scored"] == 12


@pytest.mark.parametrize("workload", ["single", "agentic"])
def test_resume_finishes_a_killed_run_on_the_same_clock(tmp_path: Path, workload: str) -> None:
    run_dir = tmp_path / workload
    proc = subprocess.Popen(
        _run("-c", "8", "-n", "120", "--warmup", "4", "--workload", workload, "-o", str(run_dir))
    )
    _wait_for_records(run_dir, 20, proc)
    proc.kill()
    proc.wait()
    before = read_arrow(run_dir / "measured.arrow", partial_ok=True)
    resumed = _finish(
        _run("--resume", str(run_dir), "--concurrency", "99"), timeout=180
    )  # its own settings win
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr and "as session 1" in resumed.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["complete"] is True and summary["config"]["concurrency"] == 8
    records = pl.read_ipc_stream(run_dir / "records.arrow")
    assert set(records.get_column("session").unique()) == {0, 1}
    assert records.get_column("request_id").is_unique().all()
    first = records.filter(pl.col("session") == 0)
    second = records.filter(pl.col("session") == 1)
    assert second.get_column("sent_ns").min() > first.get_column("sent_ns").max()  # one clock, later
    if workload == "single":
        measured = records.filter(~pl.col("warmup"))
        assert sorted(measured.get_column("unit_id").to_list()) == list(range(4, 124))
        assert (measured.get_column("status") == "ok").all()
        assert summary["requests"]["measured"] == 120
    else:
        tasks = [json.loads(line) for line in (run_dir / "tasks.jsonl").read_text().splitlines()]
        measured_ids = sorted(t["task_id"] for t in tasks if not t["warmup"])
        assert measured_ids == list(range(4, 124)) and summary["tasks"]["count"] == 120
    # what session 0 finished is kept as it was measured
    kept = before.filter(pl.col("status") == "ok").get_column("request_id").to_list()
    assert set(kept) <= set(first.get_column("request_id").to_list()) or workload == "agentic"
    assert abs(summary["energy"]["meters"]["sim"]["conservation_error"]) < 1e-9
    again = _finish(_run("--resume", str(run_dir)))
    assert again.returncode == 2 and "nothing to resume" in again.stderr


async def test_a_flush_cancelled_mid_write_still_lands_before_the_end_of_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the end of a run cancels the periodic flush while its thread may be writing; the file's
    # close must wait for that write, or its rows land after the end-of-stream marker, unread
    from ipw_async.rundir.files import RecordWriter

    writer = RecordWriter(tmp_path / "measured.arrow")
    slow = writer._write

    def slow_write(records: list[RequestRecord]) -> None:
        time.sleep(0.3)
        slow(records)

    monkeypatch.setattr(writer, "_write", slow_write)
    for i in range(33):
        writer.add(RequestRecord(request_id=i, query_id=str(i), dataset="d", prompt="p"))
    flushing = asyncio.ensure_future(writer.flush())
    await asyncio.sleep(0.05)  # the thread is writing now
    flushing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    await writer.close()
    assert pl.read_ipc_stream(tmp_path / "measured.arrow").height == 33


def test_a_frame_whose_write_fails_leaves_no_file_and_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that fills mid-frame: the write raises, neither the file nor its temporary stays,
    and the bytes the writer still buffered never reach the descriptor number once it is
    another file's."""
    import errno
    import gc
    import os

    from ipw_async.rundir import files

    frame = pl.DataFrame({"x": list(range(300_000)), "y": [float(i) for i in range(300_000)]})
    real_write = os.write
    calls = 0

    def fills(fd: int, data: Any) -> int:
        nonlocal calls
        calls += 1
        if calls > 1:  # the first write goes out, the rest do not
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(files.os, "write", fills)
    with pytest.raises(OSError, match="No space") as failed:
        files.write_frame(frame, tmp_path / "records.arrow")
    monkeypatch.setattr(files.os, "write", real_write)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    other = tmp_path / "other"
    fd = os.open(other, os.O_WRONLY | os.O_CREAT, 0o644)  # the lowest free number: the one let go
    try:
        del failed  # a kept traceback held the writer: only now is it collected
        gc.collect()
    finally:
        os.close(fd)
    assert other.stat().st_size == 0
    files.write_frame(frame, tmp_path / "records.arrow")  # and the next write is whole
    assert read_arrow(tmp_path / "records.arrow").equals(frame)
