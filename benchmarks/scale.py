"""Beyond one process and one host: worker processes, a remote agent's clock, remote energy.

1. Workers: 128-token streams from the zero-delay simulator (it sends as fast as it can, so
   the client is saturated) at 1, 2 and ``auto`` workers: events/s, the harness's CPU µs per
   SSE event (coordinator and workers together) and the stamp delay (client arrival − server
   send, one monotonic clock). On a machine with few cores the simulator, the coordinator and
   the workers share them, so rates are given as ratios to one worker measured in the same run.
2. Clock alignment: an ``ipw-async agent`` process whose clock reads ``--shift-s`` ahead serves
   the simulated device; the run's estimate of the offset against the injected one.
3. Remote energy: the same load with the device read locally, through that agent, and as
   DCGM exporter fields scraped from the simulator's /metrics; each query's error against the
   simulator's true energy.

With Ray installed (``pip install 'ipw-async[ray]'``), a row for 2 Ray actors on a local
cluster of two nodes (head and worker on loopback).

    python benchmarks/scale.py [--requests 1500] [--streams 128] [--repeats 2] [--shift-s 37.5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import polars as pl
from client_overhead import ZERO_DELAY, bare_loop, body, stream_config, stream_figures

from ipw_async import RunConfig, RunResult, run_benchmark
from ipw_async._loop import run as run_loop
from ipw_async.harness.ray_pool import local_cluster
from ipw_async.harness.workers import auto_workers
from ipw_async.sim import SimConfig, SimulatorProcess
from ipw_async.telemetry_agent import AgentProcess


def throughput(
    workers: str, streams: int, requests: int, tmp: Path, base_url: str, ray: str | None = None
) -> dict[str, Any]:
    config = stream_config(
        base_url=base_url,
        ray=ray,
        output_dir=tmp / f"w{workers}",
        overwrite=True,
        concurrency=streams,
        workers=workers,
        max_queries=requests,
        telemetry="none",
    )
    result = asyncio.run(run_benchmark(config))
    ok, events, delay_ms = stream_figures(result)
    harness = result.summary["harness"]
    wall_s = result.summary["window_s"]
    return {
        "events_per_s": events / wall_s,
        "cpu_us_per_event": harness["cpu_s"] / events * 1e6,
        "stamp_p50_ms": float(np.percentile(delay_ms, 50)),
        "stamp_p99_ms": float(np.percentile(delay_ms, 99)),
        "ok": ok.height,
    }


async def device_run(
    how: str, shift_s: float, options: dict[str, Any], sim_config: SimConfig | None = None
) -> tuple[RunResult, dict[str, Any]]:
    """A run on the simulator with its device read ``how`` (local, agent: through an agent whose
    clock reads ``shift_s`` ahead, or dcgm), and the simulator's truth after it."""
    with SimulatorProcess(sim_config or SimConfig()) as sim:
        agent = None
        if how == "local":
            options |= {"telemetry": "sim"}
        elif how == "dcgm":
            options |= {"telemetry": "none", "prometheus_url": [f"{sim.root_url}/metrics"]}
        else:
            args = ["--telemetry", "sim", "--sim-url", sim.root_url, "--clock-shift-s", str(shift_s)]
            agent = AgentProcess(args).start()
            options |= {"telemetry": "none", "telemetry_url": [agent.root_url]}
        try:
            result = await run_benchmark(RunConfig(base_url=sim.base_url, **options))
        finally:
            if agent is not None:
                agent.stop()
        truth = httpx.get(f"{sim.root_url}/sim/truth", timeout=10).json()
    return result, truth


async def energy_errors(how: str, shift_s: float, tmp: Path) -> dict[str, Any]:
    """Per-query energy error against the truth with the device read ``how``: local, agent, dcgm."""
    options: dict[str, Any] = {
        "output_dir": tmp / f"energy_{how}",
        "overwrite": True,
        "concurrency": 16,
        "max_queries": 160,
        "dataset": "synthetic",
        "output_tokens": 128,
    }
    result, truth = await device_run(how, shift_s, options)
    frame = result.records.filter(pl.col("status") == "ok")
    true = np.array([truth["requests"][str(i)] for i in frame.get_column("request_id").to_list()])
    err = np.abs(frame.get_column("energy_j").to_numpy() - true) / true
    meter = result.summary["energy"]["headline_meters"][0]
    clocks = result.summary["telemetry"]["clocks"]
    return {
        "p50": float(np.percentile(err, 50)),
        "p95": float(np.percentile(err, 95)),
        "conservation": result.summary["energy"]["meters"][meter]["conservation_error"],
        "timing": result.summary["energy"]["meters"][meter].get("counter_timing", "—"),
        "clock": next(iter(clocks.values()), None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="alternating rounds of every worker setting")
    parser.add_argument("--shift-s", type=float, default=37.5, help="how far ahead the agent's clock reads")
    args = parser.parse_args()
    settings = ["1", "2", "auto"]
    print(
        f"1. workers: {args.streams} streams × 128 tokens, zero-delay simulator, {args.requests} requests, "
        f"{args.repeats} alternating rounds (auto = {auto_workers(args.streams)} here)"
    )
    ray = importlib.util.find_spec("ray") is not None
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in [*settings, *(["Ray ×2"] if ray else [])]}
    bare: list[float] = []
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        sim = stack.enter_context(SimulatorProcess(ZERO_DELAY))
        cluster = stack.enter_context(local_cluster(nodes=2)) if ray else None
        for _ in range(args.repeats):
            bare.append(run_loop(bare_loop(sim.base_url, args.streams, args.requests, body(128))))
            for setting in settings:
                rows[setting].append(
                    throughput(setting, args.streams, args.requests, Path(tmp), sim.base_url)
                )
            if cluster is not None:
                rows["Ray ×2"].append(
                    throughput("2", args.streams, args.requests, Path(tmp), sim.base_url, cluster)
                )
        base_rate = np.mean([r["events_per_s"] for r in rows["1"]])
        base_cpu = np.mean([r["cpu_us_per_event"] for r in rows["1"]])
        print(
            f"{'workers':<8} {'events/s':>10} {'× 1 worker':>10} {'CPU µs/event':>13} {'× 1 worker':>10} "
            f"{'stamp p50 ms':>13} {'stamp p99 ms':>13}"
        )
        for setting, runs in rows.items():
            rate = np.mean([r["events_per_s"] for r in runs])
            cpu = np.mean([r["cpu_us_per_event"] for r in runs])
            print(
                f"{setting:<8} {rate:>10,.0f} {rate / base_rate:>10.2f} {cpu:>13.1f} {cpu / base_cpu:>10.2f} "
                f"{np.mean([r['stamp_p50_ms'] for r in runs]):>13.2f} {np.mean([r['stamp_p99_ms'] for r in runs]):>13.2f}"
            )
        print(
            f"per-event cost, one worker: {base_cpu:.1f} µs against {np.mean(bare):.1f} µs for a bare aiohttp loop "
            f"on the same server ({base_cpu / np.mean(bare):.2f}×; the whole run's, sampler, writer and finishing included)"
        )

        print(
            f"\n2. and 3. device energy read three ways (c=16, 160 requests); agent clock shifted +{args.shift_s} s"
        )
        print(
            f"{'device read':<34} {'p50 error':>9} {'p95 error':>9} {'conservation':>12}  clock offset found"
        )
        for how, label in (
            ("local", "locally (sim source)"),
            ("agent", "through ipw-async agent"),
            ("dcgm", "DCGM fields via --prometheus-url"),
        ):
            r = asyncio.run(energy_errors(how, args.shift_s, Path(tmp)))
            clock = r["clock"]
            found = (
                "—"
                if clock is None
                else f"{clock['offset_ms']:+,.3f} ms (error {clock['offset_ms'] - args.shift_s * 1000:+.3f} ms, "
                f"bound ±{clock['uncertainty_ms']:.3f} ms, {clock['pings']} round trips)"
            )
            print(f"{label:<34} {r['p50']:>9.1%} {r['p95']:>9.1%} {r['conservation']:>12.1e}  {found}")


if __name__ == "__main__":
    main()
