"""Does a run survive faults, kills and load? Every case against the simulator, whose own count
of what it injected and what it finished (``GET /sim/stats``) is the reference.

- faults: 5,000 requests at c=64 with 10% mixed faults (HTTP 500, 429 with Retry-After, error
  events, disconnects, malformed events, stalls past the read timeout): requests with a
  recorded outcome, outcomes matching what was injected, wall time against a fault-free run;
- kill -9 of ``ipw-async run`` at 5 random moments: finished requests not on disk (against the
  simulator's count of streams it finished) and the time from the last record on disk to the
  kill, on the run's clock (the target: at most 1 s of work lost), the recovered run's energy
  conservation, and the time ``recover`` takes;
- the embedded simulator after a kill -9 of its harness: how long it outlives it;
- 1,000 streams in one process against the zero-delay simulator: errors (target 0), peak RSS;
- SIGTERM mid-run: exit code, and whether the files are complete and readable.

    python benchmarks/reliability.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import psutil
import pyarrow.ipc as ipc

from ipw_async import RunConfig, finalize, run_benchmark
from ipw_async._clock import now_ns
from ipw_async.sim import FAULT_OUTCOMES, EngineConfig, Faults, SimConfig, SimulatorProcess

FAST = EngineConfig(step_base_ms=4.0, step_per_seq_ms=0.05)
READ_TIMEOUT_S = 1.5  # the stalls are longer: each must be recorded as a timeout


def harness(*args: str) -> list[str]:
    return [sys.executable, "-m", "ipw_async", "run", "--no-dashboard", *args]


async def faults_case(requests: int) -> dict[str, Any]:
    share = 0.10 / len(FAULT_OUTCOMES)
    faulty = Faults(**dict.fromkeys(FAULT_OUTCOMES, share), stall_s=READ_TIMEOUT_S + 1.5)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, faults in (("clean", Faults()), ("faulty", faulty)):
            with SimulatorProcess(SimConfig(engine=FAST, faults=faults, output_median=32)) as sim:
                config = RunConfig(
                    base_url=sim.base_url,
                    concurrency=64,
                    max_queries=requests,
                    dataset="synthetic",
                    output_tokens=32,
                    read_timeout=READ_TIMEOUT_S,
                    telemetry="none",
                    abort_after_connect_errors=10**6,
                    output_dir=Path(tmp) / name,
                )
                start = time.perf_counter()
                result = await run_benchmark(config)
                out[f"{name}_wall_s"] = time.perf_counter() - start
                stats = httpx.get(f"{sim.root_url}/sim/stats", timeout=10).json()
            if name == "faulty":
                records = result.records
                injected = stats["by_request"]
                match = 0
                for rid, status, kind, code in records.select(
                    "request_id", "status", "error_type", "http_status"
                ).iter_rows():
                    want = injected.get(str(rid))
                    if want is None:
                        match += status == "ok"
                    else:
                        match += (kind, code) == FAULT_OUTCOMES[want]
                out |= {
                    "complete": result.summary["complete"],
                    "aborted": result.summary["aborted"],
                    "loss": result.summary["loss"],
                    "reconnects": int(records.get_column("reconnects").sum()),
                    "server_requests": stats["requests"],
                    "recorded": records.height,
                    "with_outcome": records.filter(pl.col("status").is_not_null()).height,
                    "matching": match,
                    "injected": stats["injected"],
                }
    return out


def kill_case(seed: int, tmp: Path) -> dict[str, Any]:
    """kill -9 of a harness at a random moment; what the simulator finished that the disk lacks."""
    rng = random.Random(seed)
    run_dir = tmp / f"kill{seed}"
    with SimulatorProcess(SimConfig(engine=FAST, output_median=64, seed=seed)) as sim:
        proc = _started(
            run_dir, "--base-url", sim.base_url, "-c", "32", "--telemetry", "sim", "--dataset", "synthetic"
        )
        time.sleep(rng.uniform(3.0, 8.0))
        killed_ns = now_ns()
        proc.kill()
        proc.wait()
        finished = httpx.get(f"{sim.root_url}/sim/stats", timeout=10).json()["completed"]
    on_disk = pl.read_ipc_stream(run_dir / "measured.arrow")
    ok = on_disk.filter(pl.col("status") == "ok").height
    start = time.perf_counter()
    result = finalize(run_dir)
    recover_s = time.perf_counter() - start
    meter = result.summary["energy"]["meters"].get("sim", {})
    t0 = json.loads((run_dir / "run.json").read_text())["clock"]["t0_monotonic_ns"]
    return {
        "finished_by_server": finished,
        "ok_on_disk": ok,
        "lost": finished - ok,
        # the work not on disk: from the last record's end to the kill, on the run's own clock
        "lost_s": (killed_ns - t0) / 1e9 - result.summary["loss"]["last_record_end_s"],
        "conservation": meter.get("conservation_error"),
        "recover_s": recover_s,
        "complete": result.summary["complete"],
    }


def _started(run_dir: Path, *args: str, timeout: float = 60.0) -> subprocess.Popen[bytes]:
    """A run of up to 60 s in its own process, once its records file exists."""
    proc = subprocess.Popen(
        harness(*args, "--duration", "60", "-o", str(run_dir)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout
    while not (run_dir / "measured.arrow").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{run_dir} never got its records file")
        time.sleep(0.05)
    return proc


def orphan_case(tmp: Path) -> dict[str, Any]:
    """kill -9 of a run with the embedded simulator: how long its simulator outlives it."""
    run_dir = tmp / "orphan"
    proc = _started(run_dir, "-c", "8")
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    proc.wait()
    start = time.perf_counter()
    deadline = start + 10
    alive = list(children)
    while alive and time.perf_counter() < deadline:  # exited: gone, or a zombie awaiting its reaper
        alive = [c for c in alive if _running(c)]
        time.sleep(0.005)
    return {
        "children": len(children),
        "alive_after_10s": len(alive),
        "outlived_s": time.perf_counter() - start,
    }


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def streams_case(streams: int, tmp: Path) -> dict[str, Any]:
    """One harness process with ``streams`` concurrent streams against the zero-delay simulator."""
    engine = EngineConfig(zero_delay=True, max_batch=streams)
    with SimulatorProcess(SimConfig(engine=engine, output_median=64)) as sim:
        run_dir = tmp / "streams"
        proc = subprocess.Popen(
            harness(
                "--base-url",
                sim.base_url,
                "-c",
                str(streams),
                "-n",
                str(3 * streams),
                "--telemetry",
                "none",
                "--dataset",
                "synthetic",
                "--output-tokens",
                "64",
                "-o",
                str(run_dir),
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        peak = 0
        watched = psutil.Process(proc.pid)
        while proc.poll() is None:  # the harness's own peak, sampled every 20 ms
            with contextlib.suppress(psutil.Error):
                peak = max(peak, watched.memory_info().rss)
            time.sleep(0.02)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "rc": proc.returncode,
        "requests": summary["requests"]["measured"],
        "errors": summary["requests"]["failed"],
        "errors_by_type": summary["requests"]["errors_by_type"],
        "peak_rss_mib": peak / 2**20,
    }


def sigterm_case(tmp: Path) -> dict[str, Any]:
    run_dir = tmp / "sigterm"
    proc = _started(run_dir, "-c", "16")
    time.sleep(3.0)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = ipc.open_stream(str(run_dir / "records.arrow")).read_all().num_rows
    return {
        "rc": rc,
        "summary": True,
        "complete": summary["complete"],
        "interrupted": summary["interrupted"],
        "records_pyarrow": rows,
        "records_polars": pl.read_ipc_stream(run_dir / "records.arrow").height,
        "telemetry_rows": pl.read_ipc_stream(run_dir / "telemetry.arrow").height,
        "traces": len((run_dir / "traces.jsonl").read_text().splitlines()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1,000 faulty requests, 2 kills, 300 streams")
    args = parser.parse_args()
    requests, kills, streams = (1000, 2, 300) if args.quick else (5000, 5, 1000)
    rows: list[tuple[str, str, str]] = []

    def report(case: str, figures: dict[str, Any], result: str, target: str) -> None:
        print(json.dumps(figures), flush=True)
        rows.append((case, result, target))

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        f = asyncio.run(faults_case(requests))
        injected = ", ".join(f"{k} {v}" for k, v in sorted(f["injected"].items()))
        report(
            f"{requests} requests, c=64, 10% mixed faults",
            f,
            f"{f['with_outcome']}/{f['server_requests']} with an outcome; {f['matching']}/{f['recorded']} "
            f"match what was injected ({injected}); wall {f['faulty_wall_s']:.1f} s vs "
            f"{f['clean_wall_s']:.1f} s fault-free",
            "every request an outcome, each as injected",
        )
        for seed in range(kills):
            k = kill_case(seed, tmp)
            report(
                f"kill -9 #{seed + 1}",
                k,
                f"{k['lost']} of {k['finished_by_server']} finished requests not on disk "
                f"({k['lost_s']:.2f} s of work); recovered conservation {k['conservation']:.1e}; "
                f"recover {k['recover_s']:.2f} s",
                "≤ 1 s of work lost",
            )
        o = orphan_case(tmp)
        report(
            "kill -9 with the embedded simulator",
            o,
            f"{o['children']} child process(es); {o['alive_after_10s']} alive after 10 s; "
            f"gone {o['outlived_s']:.2f} s after the harness",
            "no child survives",
        )
        s = streams_case(streams, tmp)
        report(
            f"{streams} streams, zero-delay simulator",
            s,
            f"{s['requests']} requests, {s['errors']} errors; peak RSS {s['peak_rss_mib']:.0f} MiB",
            "0 errors",
        )
        t = sigterm_case(tmp)
        report(
            "SIGTERM mid-run",
            t,
            f"exit {t['rc']}; summary written (complete {t['complete']}, interrupted {t['interrupted']}); "
            f"{t['records_pyarrow']} records read by pyarrow and polars, {t['traces']} traces",
            "files complete",
        )
    print("\n| case | result | target |\n|---|---|---|")
    for row in rows:
        print(f"| {' | '.join(row)} |")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
