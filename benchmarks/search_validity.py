"""Does ``search`` find the limit, and does every run say when it was invalid? Against the
simulator, whose capacity a fine sweep can measure:

- search accuracy: a fine sweep (every concurrency from 1 to ``--max-c``, ``--sweep-n``
  requests each) puts the ttft_p90 SLO's boundary where the isotonic fit of its margins crosses
  zero; then ``--searches`` seeded searches: their boundary's error against the sweep's (target:
  within 10%), their probes against the sweep's runs (target: at most half), and how often their
  95% interval holds the sweep's boundary (target: ≥ 90%);
- over-saturation: ``--quiet-runs`` seeded runs at 70% of the small server's capacity (target:
  never flagged), and runs at 3× capacity with ``--on-oversaturation stop`` (target: flagged and
  stopped within 30 s).

    python benchmarks/search_validity.py [--searches 20] [--repeats 2] [--quiet-runs 20]

``--repeats N`` runs each probe N times, so the interval sees run-to-run spread as well as the
spread of one run's requests; ``--only accuracy|oversaturation`` runs one half; ``--keep DIR``
keeps every run and search directory (to fit them again with ``ipw-async analyze``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ipw_async import run_benchmark
from ipw_async.analysis.search import Slo, boundary, margins
from ipw_async.harness import RunConfig
from ipw_async.harness.search import run_search
from ipw_async.sim import EngineConfig, SimConfig

SLO = Slo.parse("ttft_p90=60ms")
# TTFT grows with the batch: 8 ms steps plus 0.8 ms per sequence, prompts of 512 tokens
ENGINE = EngineConfig(step_base_ms=8.0, step_per_seq_ms=0.8, step_per_prefill_token_ms=0.02)
# 4 sequences a step, 10 ms steps: about 21 requests/s (measured: 21.5 at 60/s offered)
SMALL = EngineConfig(max_batch=4, step_base_ms=10.0, step_per_seq_ms=0.05)
CAPACITY_RPS = 21.5


def base(out: Path, seed: int, n: int, engine: EngineConfig = ENGINE) -> RunConfig:
    return RunConfig(
        output_dir=out,
        dataset="synthetic",
        max_queries=n,
        output_tokens=16,
        seed=seed,
        baseline_s=0,
        tail_s=0,
        telemetry="none",
        overwrite=True,
        sim=SimConfig(engine=engine, output_median=16),
    )


def fine_sweep(root: Path, max_c: int, n: int, seeds: int) -> tuple[float | None, list[float]]:
    """Every concurrency, run once per seed and pooled: the boundary a search's repeats estimate,
    with less of one run's noise in it than any search has."""
    loads, tightest = [], []
    for c in range(1, max_c + 1):
        runs = []
        for seed in range(seeds):
            config = base(root / f"sweep_c{c}_s{seed}", 1000 + seed, n)
            config.concurrency = c
            runs.append(asyncio.run(run_benchmark(config)).records)
        point, _ = margins([SLO], runs, seed=c)
        loads.append(float(c))
        tightest.append(float(point[0]))
    found = boundary(np.array(loads), np.array(tightest))
    return found.estimate, tightest


def searches(
    root: Path, count: int, n: int, repeats: int, truth: float
) -> list[tuple[float | None, tuple[float, float] | None, int]]:
    out = []
    for seed in range(count):
        result = run_search(
            base(root / f"s{seed}", seed, n),
            [SLO],
            start=2,
            max_probes=12,
            precision=0.1,
            repeats=repeats,
            out_dir=root / f"s{seed}",
        )
        estimate = result.boundary.estimate
        out.append((estimate, result.interval, len(result.probes)))
        error = None if estimate is None else (estimate - truth) / truth
        print(
            f"  search {seed:2d}: boundary {estimate if estimate is None else round(estimate, 2)} "
            f"({'—' if error is None else f'{error:+.1%}'}), interval {result.interval}, "
            f"{len(result.probes)} probes; stop: {result.stop}",
            flush=True,
        )
    return out


def oversaturation(root: Path, quiet_runs: int) -> None:
    flagged = 0
    for seed in range(quiet_runs):
        config = base(root / f"quiet{seed}", seed, 100_000, SMALL)
        config.rate, config.duration, config.dataset = 0.7 * CAPACITY_RPS, 30.0, "qa"
        summary = asyncio.run(run_benchmark(config)).summary
        flagged += bool(summary["saturation"]["oversaturated"])
    print(f"at 70% of capacity: flagged in {flagged} of {quiet_runs} seeded 30 s runs (target 0)")
    for seed in range(3):
        config = base(root / f"storm{seed}", seed, 100_000, SMALL)
        config.rate, config.duration, config.dataset = 3 * CAPACITY_RPS, 60.0, "qa"
        config.on_oversaturation = "stop"
        summary = asyncio.run(run_benchmark(config)).summary
        live = summary["saturation"].get("live") or {}
        print(
            f"at 3× capacity (seed {seed}): flagged {summary['saturation']['oversaturated']}, "
            f"detected after {live.get('detected_s', float('nan')):.1f} s of the run clock, "
            f"window {summary['window_s']:.1f} s of 60, stopped: {summary['stopped'] is not None}"
        )


def accuracy(root: Path, args: argparse.Namespace) -> None:
    t = time.perf_counter()
    truth, tightest = fine_sweep(root, args.max_c, args.sweep_n, args.sweep_seeds)
    print(
        f"fine sweep: c = 1..{args.max_c}, {args.sweep_seeds} × {args.sweep_n} requests each, "
        f"{time.perf_counter() - t:.0f} s"
    )
    print("  margins: " + ", ".join(f"{m:+.2f}" for m in tightest))
    if truth is None:
        raise SystemExit("the fine sweep found no boundary: widen --max-c")
    print(f"  the sweep's boundary: c = {truth:.2f} ({args.max_c} loads)")
    if not args.searches:
        return
    t = time.perf_counter()
    found = searches(root, args.searches, args.search_n, args.repeats, truth)
    errors = [abs(e - truth) / truth for e, _, _ in found if e is not None]
    within = sum(err <= 0.10 for err in errors)
    covered = sum(i is not None and i[0] <= truth <= i[1] for _, i, _ in found)
    probes = [p for _, _, p in found]
    print(
        f"searches: {len(found)} in {time.perf_counter() - t:.0f} s; within 10% of the sweep: "
        f"{within}/{len(found)}; median |error| {statistics.median(errors) if errors else float('nan'):.1%}; "
        f"probes median {statistics.median(probes):.0f}, max {max(probes)} "
        f"× {args.repeats} run(s) each (the sweep: {args.max_c} loads); interval holds the sweep's boundary: {covered}/{len(found)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-c", type=int, default=32)
    parser.add_argument("--sweep-n", type=int, default=160)
    parser.add_argument("--sweep-seeds", type=int, default=3, help="runs pooled per load in the sweep")
    parser.add_argument("--search-n", type=int, default=80)
    parser.add_argument("--searches", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1, help="runs per probe")
    parser.add_argument("--quiet-runs", type=int, default=20)
    parser.add_argument("--only", choices=["accuracy", "oversaturation"])
    parser.add_argument("--keep", type=Path, help="keep every run directory here (default: deleted)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        root = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if args.only != "oversaturation":
            accuracy(root / "accuracy", args)
        if args.only != "accuracy":
            oversaturation(root / "oversaturation", args.quiet_runs)


if __name__ == "__main__":
    main()
