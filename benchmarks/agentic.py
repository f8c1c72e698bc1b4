"""Agentic runs under load: tasks/s, J/task with its CI, and per-task energy against the truth.

Against the simulator (the default): the built-in tool tasks (2–8 turns each) at 1, 8, 32 and
128 concurrent agents, each level repeated (seed + r), with an emulated tool latency. Printed
per level: tasks/s and J/task (mean ± 95% CI over repeats), task success, the per-task energy
error of the run's attribution against the energy the simulated device knows each task's calls
used (p50/p95, measured tasks), the worst conservation error of tasks + idle against the
measured total, and the harness's CPU per LLM call.

Against a real server (``--base-url``): the same tasks at ``--agents`` (default 1 and 4), with
the host's own meters, e.g. the ReAct protocol for a base model on /completions:

    python benchmarks/agentic.py [--quick] [--repeats 3] [--tool-latency exp:0.1]
    python benchmarks/agentic.py --base-url http://127.0.0.1:8000/v1 --endpoint completions --agents 1,4
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ipw_async import QueryTrace, RunConfig, run_benchmark
from ipw_async.analysis import mean_ci
from ipw_async.sim import EngineConfig, SimConfig, SimulatorProcess


def tasks_for(agents: int) -> int:
    return max(24, 2 * agents)


async def simulated_run(agents: int, seed: int, tool_latency: str, run_dir: Path) -> dict[str, Any]:
    """One run against a fresh simulator (prefix caching on, as agent servers run)."""
    with SimulatorProcess(SimConfig(engine=EngineConfig(prefix_cache=True), seed=seed)) as sim:
        config = RunConfig(
            base_url=sim.base_url,
            workload="agentic",
            concurrency=agents,
            max_queries=tasks_for(agents),
            warmup=agents,
            tool_latency=tool_latency,
            telemetry="sim",
            seed=seed,
            output_dir=run_dir,
        )
        result = await run_benchmark(config)
        truth = httpx.get(f"{sim.root_url}/sim/truth", timeout=10).json()
    return figures(result, truth)


def figures(result: Any, truth: dict[str, Any] | None) -> dict[str, Any]:
    summary = result.summary
    tasks = summary["tasks"]
    traces = QueryTrace.load_jsonl(result.run_dir / "traces.jsonl")
    energy = summary["energy"]
    out: dict[str, Any] = {
        "tasks_per_s": tasks["tasks_per_s"],
        "j_per_task": tasks["j_per_task"],
        "success": tasks["success_rate"],
        "turns": tasks["turns"]["mean"],
        "wall_p50_s": tasks["wall_s"]["p50"],
        "cpu_ms_per_call": None,
        "errors": None,
        "conservation": None,
    }
    cpu = (summary.get("harness") or {}).get("cpu_s")
    calls = summary["requests"]["measured"]
    if cpu is not None and calls:
        out["cpu_ms_per_call"] = 1000 * cpu / calls
    if energy.get("total_j") and all(t.energy_j is not None for t in traces):
        out["conservation"] = (sum(t.energy_j for t in traces) + energy["idle_j"]) / energy["total_j"] - 1  # type: ignore[misc]
    if truth is not None:
        measured = [t for t in traces if not t.warmup and t.energy_j is not None]
        true = np.array([sum(truth["requests"][str(u.request_id)] for u in t.turns) for t in measured])
        est = np.array([t.energy_j for t in measured])
        rel = np.abs(est - true) / true
        out["errors"] = (float(np.percentile(rel, 50)), float(np.percentile(rel, 95)))
    return out


def fmt_ci(values: list[float | None], spec: str) -> str:
    ci = mean_ci(values)
    if ci["mean"] is None:
        return "—"
    return f"{ci['mean']:{spec}} ± {ci['ci95'] or 0:{spec}}"


def print_level(agents: int, runs: list[dict[str, Any]]) -> None:
    errs = [r["errors"] for r in runs if r["errors"]]
    p50 = np.median([e[0] for e in errs]) if errs else None
    p95 = max(e[1] for e in errs) if errs else None
    cons = [abs(r["conservation"]) for r in runs if r["conservation"] is not None]
    cpu = [r["cpu_ms_per_call"] for r in runs if r["cpu_ms_per_call"] is not None]
    print(
        f"| {agents} | {len(runs)} | {fmt_ci([r['tasks_per_s'] for r in runs], '.2f')} "
        f"| {fmt_ci([r['j_per_task'] for r in runs], ',.1f')} "
        f"| {np.mean([r['success'] for r in runs if r['success'] is not None]):.0%} "
        f"| {np.mean([r['turns'] for r in runs]):.1f} "
        f"| {'—' if p50 is None else f'{p50:.1%}'} / {'—' if p95 is None else f'{p95:.1%}'} "
        f"| {'—' if not cons else f'{max(cons):.1e}'} "
        f"| {'—' if not cpu else f'{np.mean(cpu):.2f}'} |",
        flush=True,
    )


HEADER = (
    "| agents | runs | tasks/s | J/task (±95% CI) | success | turns/task | per-task error p50 / p95 "
    "| conservation (worst) | harness CPU ms/call |\n|---|---|---|---|---|---|---|---|---|"
)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 and 8 agents, one repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--agents", default=None, help="comma-separated agent counts")
    parser.add_argument("--tool-latency", default="exp:0.1", help="emulated tool latency (see run --help)")
    parser.add_argument("--base-url", default=None, help="a real server instead of the simulator")
    parser.add_argument("--endpoint", default="chat")
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    default = "1,4" if args.base_url else ("1,8" if args.quick else "1,8,32,128")
    levels = [int(a) for a in (args.agents or default).split(",")]
    repeats = 1 if args.quick else args.repeats
    print(HEADER)
    with tempfile.TemporaryDirectory() as tmp:
        for agents in levels:
            runs = []
            for r in range(repeats):
                run_dir = Path(tmp) / f"c{agents}_r{r}"
                if args.base_url:
                    config = RunConfig(
                        base_url=args.base_url,
                        endpoint=args.endpoint,
                        workload="agentic",
                        concurrency=agents,
                        max_queries=4 * agents,
                        max_turns=args.max_turns,
                        max_tokens=args.max_tokens,
                        tool_latency=args.tool_latency,
                        seed=r,
                        output_dir=run_dir,
                    )
                    runs.append(figures(await run_benchmark(config), None))
                else:
                    runs.append(await simulated_run(agents, r, args.tool_latency, run_dir))
            print_level(agents, runs)


if __name__ == "__main__":
    asyncio.run(main())
