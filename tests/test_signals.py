"""Every long-running command stops on SIGINT, SIGTERM and SIGHUP whatever it inherited: real
processes started as a script's background job starts them (SIGINT ignored), real signals,
files read back."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import psutil
import pytest

from ipw_async import _loop, read_arrow, run_benchmark
from ipw_async.errors import Stopped
from ipw_async.rundir import files

from .conftest import quick_config
from .test_judge import ScriptedJudge

TIMEOUT_S = 60.0  # a loaded 2-core host: starts and unwinds take seconds, not minutes


def _as_background_job() -> None:
    # what `cmd &` in a non-interactive shell (CI, nohup, a supervisor's script) inherits
    signal.signal(signal.SIGINT, signal.SIG_IGN)


Start = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture
def start() -> Iterator[Start]:
    """``start(log, *ARGS)``: ``ipw-async ARGS`` as a background job, stdout piped (for a ready
    line), stderr to ``log``; whatever a failed test left running is killed after it."""
    procs: list[subprocess.Popen[str]] = []

    def launch(log: Path, *args: str | Path) -> subprocess.Popen[str]:
        with log.open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ipw_async", *map(str, args)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                preexec_fn=_as_background_job,
                env=os.environ | {"PYTHONUNBUFFERED": "1", "COLUMNS": "200", "OPENAI_API_KEY": ""},
            )
        procs.append(proc)
        return proc

    yield launch
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _line_with(proc: subprocess.Popen[str], marker: str) -> str:
    """The first stdout line holding ``marker`` (the process is listening once it is printed)."""
    assert proc.stdout is not None
    stdout = proc.stdout
    found: list[str] = []

    def read() -> None:
        for line in stdout:
            if marker in line:
                found.append(line)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(TIMEOUT_S)
    assert found, f"no line with {marker!r} (exit code {proc.poll()})"
    return found[0]


def _wait_for(ready: Callable[[], bool], proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not ready():
        assert proc.poll() is None, f"it ended before {what}"
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.1)


def _has_records(path: Path) -> bool:
    # a live file may end inside the batch being written at this instant
    return path.exists() and read_arrow(path, partial_ok=True).height > 0


def _stop(proc: subprocess.Popen[str], sig: signal.Signals) -> int:
    proc.send_signal(sig)
    proc.communicate(timeout=TIMEOUT_S)  # reads stdout to its end: a full pipe never blocks it
    return proc.returncode


@pytest.fixture(params=["uvloop", "asyncio"])
def loop_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "asyncio":
        monkeypatch.setattr(_loop, "_factory", lambda: None)
    return str(request.param)


def _dispositions() -> dict[signal.Signals, Any]:
    return {sig: signal.getsignal(sig) for sig in _loop.STOP_SIGNALS}


def test_a_signal_cancels_main_and_raises_stopped_naming_it(loop_kind: str) -> None:
    assert threading.current_thread() is threading.main_thread(), "signals reach only the main thread"
    before = _dispositions()
    unwound: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
        try:
            await asyncio.sleep(TIMEOUT_S)
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # the unwinding may await: the run directory is finished so
            unwound.append(_loop.loop_name())
            raise

    with pytest.raises(Stopped) as stopped:
        _loop.run(main())
    assert stopped.value.signal == signal.SIGTERM and str(stopped.value) == "stopped by SIGTERM"
    assert isinstance(stopped.value, KeyboardInterrupt)  # what unwinds on Ctrl-C unwinds on it
    assert unwound == [loop_kind]
    assert _dispositions() == before


def test_a_main_that_ends_normally_on_the_cancellation_returns_its_result() -> None:
    async def main() -> str:  # as a proxy's run does: the signal is its normal end
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGHUP)
        try:
            await asyncio.sleep(TIMEOUT_S)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
        return "finished"

    assert _loop.run(main()) == "finished"


def test_workers_and_other_threads_keep_their_dispositions() -> None:
    seen: list[dict[signal.Signals, Any]] = []

    async def main() -> None:
        seen.append(_dispositions())

    thread = threading.Thread(target=_loop.run, args=(main(),))
    thread.start()
    thread.join()
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _loop.STOP_SIGNALS}  # as a worker
    try:
        _loop.run(main(), stop_signals=False)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert seen == [previous, dict.fromkeys(_loop.STOP_SIGNALS, signal.SIG_IGN)]


def test_a_second_signal_while_unwinding_kills_at_once(tmp_path: Path) -> None:
    script = tmp_path / "slow_unwind.py"
    script.write_text(
        "import asyncio\nfrom ipw_async._loop import run\n\n"
        "async def main():\n"
        "    try:\n"
        "        print('ready', flush=True)\n"
        "        await asyncio.sleep(60)\n"
        "    except asyncio.CancelledError:\n"
        "        print('unwinding', flush=True)\n"
        "        await asyncio.sleep(60)\n\n"
        "run(main())\n"
    )
    with subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, preexec_fn=_as_background_job
    ) as proc:
        _line_with(proc, "ready")
        proc.send_signal(signal.SIGTERM)
        _line_with(proc, "unwinding")
        t0 = time.monotonic()
        assert _stop(proc, signal.SIGHUP) == -signal.SIGHUP  # killed by the second signal itself
        assert time.monotonic() - t0 < 10


@pytest.mark.parametrize(
    ("sig", "workers", "sampler"),
    [
        pytest.param(signal.SIGINT, "1", "thread", id="SIGINT"),
        pytest.param(signal.SIGTERM, "1", "thread", id="SIGTERM"),
        pytest.param(signal.SIGHUP, "2", "thread", id="SIGHUP-2-workers"),  # workers ignore it: the run stops them
        pytest.param(signal.SIGINT, "1", "process", id="SIGINT-sampler-process"),  # its own session: the run ends it
    ],
)
def test_a_background_run_stops_and_finishes_its_directory(
    tmp_path: Path, start: Start, sig: signal.Signals, workers: str, sampler: str
) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "stderr.log"
    proc = start(
        log, "run", "-c", "4", "--duration", "300", "--baseline-s", "0", "--workers", workers,
        "--sampler", sampler, "--no-dashboard", "-o", run_dir,
    )  # fmt: skip
    _wait_for(lambda: _has_records(run_dir / files.MEASURED), proc, "measuring")
    # the simulator, the workers, the sampler's process
    children = psutil.Process(proc.pid).children(recursive=True)
    sampling = [c for c in children if "ipw_async.telemetry.sampler_child" in c.cmdline()]
    assert len(sampling) == (sampler == "process")
    assert _stop(proc, sig) == 128 + sig, log.read_text()
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive
    stderr = log.read_text()
    assert ("interrupted" if sig == signal.SIGINT else f"stopped by {sig.name}") in stderr
    assert "Traceback" not in stderr
    summary = json.loads((run_dir / files.SUMMARY).read_text())
    assert summary["complete"] is False and summary["interrupted"] is True
    records = pl.read_ipc_stream(run_dir / files.RECORDS)
    assert records.height == summary["requests"]["total"] > 0
    assert summary["loss"]["requests_not_recorded"] == 0  # an orderly stop loses nothing
    assert len((run_dir / files.TRACES).read_text().splitlines()) == records.height


def test_a_background_proxy_ends_normally_on_sigterm(tmp_path: Path, start: Start) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "stderr.log"
    proc = start(log, "proxy", "--port", "0", "--baseline-s", "0", "--no-dashboard", "-o", run_dir)
    url = _line_with(proc, "proxy listening on").split("proxy listening on", 1)[1].split()[0]
    with httpx.Client(timeout=TIMEOUT_S) as http:
        model = http.get(f"{url}/models").json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "What is 2 + 2?"}]}
        http.post(f"{url}/chat/completions", json=body).raise_for_status()
    # a signal is how a proxy's run ends, as Ctrl-C is: the run is whole
    assert _stop(proc, signal.SIGTERM) == 0, log.read_text()
    summary = json.loads((run_dir / files.SUMMARY).read_text())
    assert summary["complete"] is True
    assert pl.read_ipc_stream(run_dir / files.RECORDS)["status"].to_list() == ["ok"]


@pytest.mark.slow  # each command's own stop path is the run's (above); the whole suite's 15 min are tight
def test_a_background_sweep_stops_on_sigterm_and_writes_what_it_has(tmp_path: Path, start: Start) -> None:
    out, log = tmp_path / "sweep", tmp_path / "stderr.log"
    proc = start(log, "sweep", "-c", "1,2", "-n", "5000", "--baseline-s", "0", "-o", out, "-q")
    _wait_for(lambda: _has_records(out / "c1_r0" / files.MEASURED), proc, "measuring")
    assert _stop(proc, signal.SIGTERM) == 143, log.read_text()
    (row,) = pl.read_csv(out / "sweep" / "raw_runs.csv").to_dicts()
    assert row["status"] == "interrupted" and row["error"] == "stopped by SIGTERM"
    assert files.read_json(out / "sweep" / "summary.json")["interrupted"] is True
    assert json.loads((out / "c1_r0" / files.SUMMARY).read_text())["complete"] is False


@pytest.mark.slow  # each command's own stop path is the run's (above); the whole suite's 15 min are tight
def test_a_background_search_stops_on_sighup_and_writes_what_it_has(tmp_path: Path, start: Start) -> None:
    out, log = tmp_path / "search", tmp_path / "stderr.log"
    proc = start(log, "search", "--slo", "ttft_p99=10s", "-o", out, "-n", "5000", "--baseline-s", "0")
    probe = out / "c1_r0"
    _wait_for(lambda: _has_records(probe / files.MEASURED), proc, "measuring")
    assert _stop(proc, signal.SIGHUP) == 129, log.read_text()
    search = files.read_json(out / "search" / "search.json")
    assert search["stop"] == "stopped by SIGHUP"
    assert [p["status"] for p in search["probes"]] == ["interrupted"]
    assert json.loads((probe / files.SUMMARY).read_text())["complete"] is False


@pytest.mark.parametrize(
    "command",
    [["agent", "--host", "127.0.0.1", "--port", "0", "--telemetry", "psutil"], ["sim", "--port", "0"]],
    ids=["agent", "sim"],
)
def test_a_background_server_ends_normally_on_sigterm(
    tmp_path: Path, start: Start, command: list[str]
) -> None:
    log = tmp_path / "stderr.log"
    proc = start(log, *command)
    _line_with(proc, "127.0.0.1")  # its ready line: host and bound port
    assert _stop(proc, signal.SIGTERM) == 0, log.read_text()
    assert "Traceback" not in log.read_text()


@pytest.fixture
def judge() -> Iterator[ScriptedJudge]:
    server = ScriptedJudge()
    yield server
    server.reset()  # a call it still holds would keep its shutdown waiting
    server.close()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_background_judge_stops_on_a_signal_and_keeps_its_verdicts(
    tmp_path: Path, start: Start, judge: ScriptedJudge, sig: signal.Signals, code: int
) -> None:
    config = quick_config(tmp_path, max_queries=8, warmup=0, baseline_s=0, tail_s=0)
    run_dir = asyncio.run(run_benchmark(config)).run_dir
    judge.hang_after = 2
    log = tmp_path / "stderr.log"
    proc = start(log, "judge", run_dir, "--judge", judge.url, "--concurrency", "1")
    _wait_for(lambda: judge.calls > 2, proc, "judging")
    assert _stop(proc, sig) == code, log.read_text()
    header, *lines = [json.loads(line) for line in (run_dir / files.JUDGE).read_text().splitlines()]
    assert header["judge"]["interrupted"] is True
    assert [line["verdict"] is not None for line in lines] == [True] * 2 + [False] * 6
    assert lines[-1]["error"] == f"the judge was stopped ({sig.name}) before this answer"


def test_a_signal_between_two_runs_stops_the_command_at_its_next_check() -> None:
    """A sweep or a search between two runs: the signal waits for the next run's start, where
    the command records it (not in the middle of what it writes between runs), and each run's
    own handlers give these back when it ends."""
    before = signal.getsignal(signal.SIGTERM)
    with _loop.BetweenRuns() as stops:
        stops.check()  # nothing received: the next run starts
        _loop.run(asyncio.sleep(0))  # a run in between installs its own handlers, then gives ours back
        os.kill(os.getpid(), signal.SIGTERM)  # not the default: the process lives on
        time.sleep(0.05)
        with pytest.raises(Stopped) as caught:
            stops.check()
        assert caught.value.signal == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before
