"""Telemetry from another host: what a hung agent costs, and counter grids learned on the agent.

1. A hung agent. c=8 for ``--duration`` s on the simulator, its device read through an
   ``ipw-async agent`` and this machine's meters (psutil, the CPU model) read locally; once with
   the agent stopped (SIGSTOP) for ``--hang-s`` s mid-run and once without. Per run: this
   machine's meter's largest gap, the sampler's skipped ticks and p99 lateness, and the agent's
   meter's largest gap with the energy imputed over it. The agent's reads are off the sampler's
   thread, so the local figures should match with and without the hang.
2. Counter grids through an agent. The simulated device's counter updates every 100 ms at
   known instants (no jitter); the grids the run learned, read locally and through an agent
   whose clock reads ``--shift-s`` ahead, against those instants.
3. Probes slowed by a busy host. A probe reads every 2 ms, but a loaded host (or a read that
   costs ms, as NVML's does on some) spaces its reads further. Counters of 10–100 ms read at
   jittered intervals averaging 2–10 ms for two seconds (no run: the grid fit alone, 20 phases
   each); per case, how the grid came out and how far a read in the next second is timed from
   the update it saw.

    python benchmarks/fleet_telemetry.py [--duration 20] [--hang-s 5] [--shift-s 37.5]
                                         [--repeats 3] [--only hang|grids|slow-probe]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from scale import device_run

from ipw_async import RunConfig, run_benchmark
from ipw_async.sim import EngineConfig, SimConfig, SimulatorProcess
from ipw_async.telemetry.cadence import learn_grid
from ipw_async.telemetry_agent import AgentProcess

PERIOD_MS = 100.0


async def hung(duration: float, hang_s: float | None, tmp: Path) -> dict[str, Any]:
    """A run with the device read through an agent, hung for ``hang_s`` mid-run (None: not)."""
    with (
        SimulatorProcess(SimConfig()) as sim,
        AgentProcess(["--telemetry", "sim", "--sim-url", sim.root_url]) as agent,
    ):
        config = RunConfig(
            base_url=sim.base_url,
            output_dir=tmp / f"hung_{hang_s}",
            overwrite=True,
            concurrency=8,
            duration=duration,
            dataset="synthetic",
            telemetry="psutil,cpu-model",
            telemetry_url=[agent.root_url],
        )
        run = asyncio.create_task(run_benchmark(config))
        if hang_s is not None:
            await asyncio.sleep(duration / 2)
            os.kill(agent.pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(hang_s)
            finally:
                os.kill(agent.pid, signal.SIGCONT)
        result = await run
    remote = f"sim@127.0.0.1:{agent.port}"
    sampler = result.summary["telemetry"]["sampler"]
    meter = result.summary["energy"]["meters"][remote]
    provenance = result.records.get_column(f"{remote}.provenance").to_list()
    return {
        "local_gap_ms": sampler["gaps"]["cpu-model"]["largest_ms"],
        "skipped": sampler["skipped_ticks"],
        "late_p99_ms": sampler["lateness_ms"]["p99"],
        "remote_gap_ms": sampler["gaps"][remote]["largest_ms"],
        "imputed_j": meter.get("imputed_j") or 0.0,
        "imputed_queries": sum(p == "imputed" for p in provenance),
        "queries": len(provenance),
    }


async def grid_errors(how: str, shift_s: float, tmp: Path) -> dict[str, Any]:
    """Each learned grid's distance from the device's true update instants, in ms."""
    sim_config = SimConfig(engine=EngineConfig(counter_jitter_ms=0.0, counter_period_ms=PERIOD_MS))
    options: dict[str, Any] = {
        "output_dir": tmp / f"grid_{how}",
        "overwrite": True,
        "concurrency": 8,
        "duration": 45.0,  # three probes: at the start, 4 s on and 20 s on
        "dataset": "synthetic",
    }
    result, truth = await device_run(how, shift_s, options, sim_config)
    t0 = json.loads((options["output_dir"] / "run.json").read_text())["clock"]["t0_monotonic_ns"]
    meter = result.summary["energy"]["headline_meters"][0]
    grids = result.summary["energy"]["meters"][meter]["counter_grids"]
    period_ns = PERIOD_MS * 1e6
    off = [((g["phase_ns"] + t0 - truth["counter_t0_ns"]) / period_ns + 0.5) % 1 - 0.5 for g in grids]
    errors = np.abs(np.array(off)) * PERIOD_MS
    clocks = list(result.summary["telemetry"]["clocks"].values())
    offset_error_ms = clocks[0]["offset_ms"] - shift_s * 1000 if clocks else None
    return {
        "grids": len(grids),
        "max_ms": float(errors.max()),
        "median_ms": float(np.median(errors)),
        "offset_error_ms": offset_error_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--hang-s", type=float, default=5.0)
    parser.add_argument("--shift-s", type=float, default=37.5, help="how far ahead the agent's clock reads")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each grid row (each learns 4 grids)")
    parser.add_argument("--only", choices=("hang", "grids", "slow-probe"), help="one part alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        if args.only in (None, "hang"):
            hang_rows(args, tmp)
        if args.only in (None, "grids"):
            grid_rows(args, tmp)
        if args.only in (None, "slow-probe"):
            slow_probe_rows()


def hang_rows(args: argparse.Namespace, tmp: Path) -> None:
    print(
        f"1. a hung agent: c=8, {args.duration:g} s, the device through an agent, this machine's meters local"
    )
    print(
        f"   {'agent':<18} {'local gap':>10} {'skipped':>8} {'late p99':>9} {'agent gap':>10} "
        f"{'imputed':>9} {'queries imputed':>16}"
    )
    for label, hang in (("answering", None), (f"hung {args.hang_s:g} s", args.hang_s)):
        r = asyncio.run(hung(args.duration, hang, tmp))
        print(
            f"   {label:<18} {r['local_gap_ms']:>8.0f} ms {r['skipped']:>8} {r['late_p99_ms']:>6.2f} ms "
            f"{r['remote_gap_ms']:>7.0f} ms {r['imputed_j']:>7.1f} J {r['imputed_queries']:>7} of {r['queries']}"
        )


def grid_rows(args: argparse.Namespace, tmp: Path) -> None:
    print("\n2. counter grids (100 ms counter, no jitter) against the device's true update instants")
    for how, label in (("local", "read locally"), ("agent", f"through an agent, clock +{args.shift_s:g} s")):
        runs = [asyncio.run(grid_errors(how, args.shift_s, tmp)) for _ in range(args.repeats)]
        grids = sum(r["grids"] for r in runs)
        worst = ", ".join(f"{r['max_ms']:.3f}" for r in runs)
        medians = ", ".join(f"{r['median_ms']:.3f}" for r in runs)
        print(
            f"   {label:<34} {grids} grids in {len(runs)} runs, phase error max {worst} ms, median {medians} ms"
        )
        if how == "agent":  # a grid through an agent is as good as the clock offset it is moved by
            offsets = ", ".join(f"{r['offset_error_ms'] * 1000:+.0f}" for r in runs)
            print(f"   {'':<34} the agent's clock offset found off the injected one by {offsets} µs")


def slow_probe(period_ms: float, read_ms: float, rng: np.random.Generator) -> tuple[str, float]:
    """One probe of a counter updating every ``period_ms`` read about every ``read_ms`` for 2 s:
    what it learned ("grid", "fast": as fast as its reads, "none") and the mean error, in ms,
    of the update a read in the next second is timed to (reads at any phase: the run's ticks,
    moved clear of the updates, fare better)."""
    ms = 1e6
    phase = rng.uniform(0, period_ms) * ms
    t = np.cumsum(rng.uniform(0.5, 1.5, int(2000 / read_ms)) * read_ms * ms)
    seen = np.floor((t - phase) / (period_ms * ms))  # the counter's value: its updates so far
    grid = learn_grid(t, seen)
    if grid is None:
        return "none", float("nan")  # the run times such reads to the midpoint between ticks
    reads = t[-1] + rng.uniform(0, 1000 * ms, 200)  # at any phase: the sampler moves its ticks clear
    truth = phase + np.floor((reads - phase) / (period_ms * ms)) * period_ms * ms
    return ("fast" if grid.period_ns == 0 else "grid"), float(
        np.mean(np.abs(grid.last_update(reads) - truth)) / ms
    )


def slow_probe_rows() -> None:
    print("\n3. probes slowed by a busy host: the grid fit alone, 20 phases a case")
    print(f"   {'counter':>8} {'reads every':>12} {'learned':>22} {'read timing error, mean (worst)':>33}")
    rng = np.random.default_rng(0)
    for period in (10.0, 20.0, 33.3, 100.0):
        for read in (2.0, 4.0, 6.0, 10.0):
            probes = [slow_probe(period, read, rng) for _ in range(20)]
            kinds = ", ".join(
                f"{k} {sum(p[0] == k for p in probes)}"
                for k in ("grid", "fast", "none")
                if any(p[0] == k for p in probes)
            )
            errors = np.array([e for _, e in probes if not np.isnan(e)])
            timing = f"{np.mean(errors):.2f} ({np.max(errors):.2f}) ms" if errors.size else "-"
            print(f"   {period:>5.1f} ms {read:>9.0f} ms {kinds:>22} {timing:>33}")


if __name__ == "__main__":
    main()
