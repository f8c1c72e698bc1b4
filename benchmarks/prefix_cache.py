"""What a cached and an uncached input token cost, against the simulator's truth.

Each case runs ``--workload prefix`` (1,024-token prefixes, 80% of requests sharing one of 4,
the rest with a prefix of their own; synthetic questions of median 256 tokens, length sigma
0.8, so a token's cost can be told from the request's) against the built-in simulator with
its prefix cache on (a cached prompt token is never prefilled; it is still read as context).
Then ``analyze --analysis cache`` fits the run's attributed per-request energy, and the same
fit runs through the simulator's true per-request energy. Printed per case: hits and misses
with their TTFT p50; then per figure (J per uncached token, per cached token, saved per
cached token) the run's estimate with its band, the truth's, the error relative to the truth,
and whether the band holds the truth. A cached token's cost is small beside an uncached one's,
so its error is also given as a share of the uncached token's true cost (``of uncached``).

    python benchmarks/prefix_cache.py [--requests 600] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

import httpx
import polars as pl

from ipw_async import RunConfig, run_benchmark
from ipw_async.analysis import cache_report, token_costs
from ipw_async.rundir import RunDir
from ipw_async.sim import SimConfig, SimulatorProcess
from ipw_async.sim.physics import EngineConfig

CASES: dict[str, dict[str, Any]] = {
    "c8": {"concurrency": 8},
    "c32": {"concurrency": 32},
    "poisson 12/s": {"rate": 12.0, "max_concurrency": 64},
}
FIGURES = ("j_per_uncached_token", "j_per_cached_token", "j_saved_per_cached_token")


async def case(load: dict[str, Any], requests: int, seed: int, out: Path) -> dict[str, Any]:
    with SimulatorProcess(SimConfig(engine=EngineConfig(prefix_cache=True), seed=seed)) as sim:
        config = RunConfig(
            base_url=sim.base_url,
            output_dir=out,
            telemetry="sim",
            workload="prefix",
            prefix_tokens=1024,
            prefix_share=0.8,
            dataset="synthetic",
            prompt_tokens=256,
            length_sigma=0.8,
            output_tokens=64,
            max_queries=requests,
            seed=seed,
            baseline_s=1.0,
            **load,
        )
        await run_benchmark(config)
        truth = httpx.get(f"{sim.root_url}/sim/truth", timeout=10).json()["requests"]
    run = RunDir.open_finished(out)
    report = cache_report(run)
    ok = run.ok.filter(pl.col("cached_prompt_tokens").is_not_null())
    true = pl.Series("energy_j", [truth.get(str(i)) for i in ok.get_column("request_id").to_list()])
    known = token_costs(ok.select("prompt_tokens", "cached_prompt_tokens", "output_tokens").with_columns(true))
    return {"groups": report["groups"], "estimate": report["per_token"]["headline"], "truth": known}


def show(name: str, result: dict[str, Any]) -> None:
    hit, miss = result["groups"]["hit"], result["groups"]["miss"]
    print(
        f"{name}: {hit['requests']} hits (TTFT p50 {hit['ttft_p50_s'] * 1e3:.1f} ms), "
        f"{miss['requests']} misses (TTFT p50 {miss['ttft_p50_s'] * 1e3:.1f} ms)"
    )
    truth_uncached = (result["truth"]["j_per_uncached_token"] or {}).get("estimate")
    for figure in FIGURES:
        est, true = result["estimate"][figure], result["truth"][figure]
        if est is None or true is None:
            print(f"  {figure:26s} unresolved: {result['estimate']['reason'] or result['truth']['reason']}")
            continue
        error = est["estimate"] / true["estimate"] - 1
        share = (est["estimate"] - true["estimate"]) / truth_uncached if truth_uncached else None
        holds = est["low"] <= true["estimate"] <= est["high"]
        print(
            f"  {figure:26s} {est['estimate']:.5f} J [{est['low']:.5f}, {est['high']:.5f}]  "
            f"truth {true['estimate']:.5f}  error {error:+.1%}"
            + (f" ({share:+.1%} of uncached)" if share is not None else "")
            + f"  band holds: {'yes' if holds else 'no'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, load in CASES.items():
            show(name, asyncio.run(case(load, args.requests, args.seed, Path(tmp) / name.replace(" ", "_"))))


if __name__ == "__main__":
    main()
