"""Agentic runs under load: tasks/s, J/task with its CI, and per-task energy against the truth.

Against the simulator (the default): the built-in tool tasks (2–8 turns each), each level
repeated (seed + r), with an emulated tool latency, along four paths:

- ``in-process``: the run's own agent and tools, at 1, 8, 32 and 128 agents;
- ``mcp-stdio``: the same agent calling the tools on ``--mcp builtin`` (a subprocess on stdio);
- ``mcp-http``: the same over streamable HTTP (``python -m ipw_async.workload.builtin_mcp --http``);
- ``proxy``: the OpenAI Agents SDK (``openai-agents``, the test extra) solving the same tasks
  in another process, streamed, through ``ipw-async proxy``, which records the run; each task
  ends with the proxy's end call, so it is scored as the run scores its own;
- ``proxy-whole``: the same with whole (non-streaming) completions, whose tokens' times the
  proxy cannot see: the energy model has only each call's window and token counts.

the others at 8 and 32 agents. Printed per path and level: tasks/s and J/task (mean ± 95%
CI over repeats), task success, the per-task energy error of the run's attribution against the
energy the simulated device knows each task's calls used (p50/p95, measured tasks), the worst
conservation error of tasks + idle against the measured total, and the harness's CPU per LLM
call (the process that records: the run, or the proxy). What the proxy adds to each call's
latency is ``benchmarks/proxy_overhead.py``'s figure.

Against a real server (``--base-url``): the same tasks at ``--agents`` (default 1 and 4), with
the host's own meters, e.g. the ReAct protocol for a base model on /completions:

    python benchmarks/agentic.py [--quick] [--repeats 3] [--tool-latency exp:0.1] [--paths proxy]
    python benchmarks/agentic.py --base-url http://127.0.0.1:8000/v1 --endpoint completions --agents 1,4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ipw_async import QueryTrace, RunConfig, run_benchmark
from ipw_async.analysis import mean_ci
from ipw_async.sim import EngineConfig, SimConfig, SimulatorProcess
from ipw_async.workload.builtin_mcp import served_over_http

PATHS = ("in-process", "mcp-stdio", "mcp-http", "proxy", "proxy-whole")


def tasks_for(agents: int) -> int:
    return max(24, 2 * agents)


async def simulated_run(
    agents: int, seed: int, tool_latency: str, run_dir: Path, path: str
) -> dict[str, Any]:
    """One run against a fresh simulator (prefix caching on, as agent servers run)."""
    sim_config = SimConfig(engine=EngineConfig(prefix_cache=True), seed=seed)
    with SimulatorProcess(sim_config) as sim, contextlib.ExitStack() as stack:
        mcp = ["builtin"] if path == "mcp-stdio" else []
        if path == "mcp-http":
            mcp = [stack.enter_context(served_over_http())[0]]
        config = RunConfig(
            base_url=sim.base_url,
            workload="agentic",
            concurrency=agents,
            max_queries=tasks_for(agents),
            warmup=0 if path.startswith("proxy") else agents,  # the proxy cannot tell an agent's warmup
            tool_latency=tool_latency,
            telemetry="sim",
            seed=seed,
            output_dir=run_dir,
            mcp=mcp,
        )
        result = await (
            proxied_run(config, agents, path == "proxy")
            if path.startswith("proxy")
            else run_benchmark(config)
        )
        truth = httpx.get(f"{sim.root_url}/sim/truth", timeout=10).json()
    return figures(result, truth)


async def proxied_run(config: RunConfig, agents: int, stream: bool) -> Any:
    """The proxy records while the OpenAI Agents SDK, in its own process, solves the tasks."""
    from ipw_async.proxy import run_proxy

    config.baseline_s, config.tail_s = 1.0, 0.5
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    run = asyncio.create_task(run_proxy(config, port=0, ready=ready.set_result))
    await asyncio.wait({run, ready}, return_when=asyncio.FIRST_COMPLETED)
    if run.done():
        return run.result()  # it could not start: its error
    spec = [ready.result(), str(agents), str(config.max_queries), str(config.seed), config.tool_latency]
    spec.append("stream" if stream else "whole")
    driver = await asyncio.create_subprocess_exec(sys.executable, __file__, "--drive-proxy", *spec)
    if await driver.wait() != 0:
        run.cancel()
        raise SystemExit("the OpenAI Agents SDK driver failed (is the test extra installed?)")
    run.cancel()
    return await run


async def drive_proxy(url: str, agents: int, count: int, seed: int, tool_latency: str, stream: bool) -> None:
    """The agent framework's side: ``count`` built-in tasks, ``agents`` at a time, each ending
    with the proxy's end call carrying its answer and reference."""
    import agents as sdk
    from openai import AsyncOpenAI

    from ipw_async.proxy import TASK_HEADER
    from ipw_async.workload.tasks import builtin_tasks
    from ipw_async.workload.tools import BUILTIN_TOOLS, ToolError, ToolLatency

    sdk.set_tracing_disabled(True)
    latency, rng = ToolLatency.parse(tool_latency), random.Random(seed)

    async def use(name: str, argument: str) -> str:
        await asyncio.sleep(latency.draw(rng))
        try:
            return BUILTIN_TOOLS[name].run(argument)
        except ToolError as exc:
            return f"error: {exc}"

    @sdk.function_tool
    async def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression, e.g. 3 * (4 + 5)."""
        return await use("calculator", expression)

    @sdk.function_tool
    async def lookup(key: str) -> str:
        """Look a fact up, e.g. 'capital of France' or 'atomic number of iron'."""
        return await use("lookup", key)

    client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    tasks = builtin_tasks()
    slots = asyncio.Semaphore(agents)

    async def solve(i: int, http: httpx.AsyncClient) -> None:
        task, name = tasks[i % len(tasks)], f"task-{i}"
        agent = sdk.Agent(
            name="solver",
            instructions="Answer with the tools you are given.",
            tools=[calculator, lookup],
            model=sdk.OpenAIChatCompletionsModel(model="sim-small", openai_client=client),
            model_settings=sdk.ModelSettings(max_tokens=128, extra_headers={TASK_HEADER: name}),
        )
        async with slots:
            if stream:
                run = sdk.Runner.run_streamed(agent, task.question, max_turns=10)
                async for _ in run.stream_events():
                    pass
                answer = run.final_output
            else:
                answer = (await sdk.Runner.run(agent, task.question, max_turns=10)).final_output
            end = {"answer": str(answer), "reference": task.answer, "scorer": task.scorer}
            await http.post(f"{url.removesuffix('/v1')}/ipw/tasks/{name}/end", json=end)

    async with httpx.AsyncClient(timeout=30) as http:
        await asyncio.gather(*(solve(i, http) for i in range(count)))


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


def print_level(path: str, agents: int, runs: list[dict[str, Any]]) -> None:
    errs = [r["errors"] for r in runs if r["errors"]]
    p50 = np.median([e[0] for e in errs]) if errs else None
    p95 = max(e[1] for e in errs) if errs else None
    cons = [abs(r["conservation"]) for r in runs if r["conservation"] is not None]
    cpu = [r["cpu_ms_per_call"] for r in runs if r["cpu_ms_per_call"] is not None]
    print(
        f"| {path} | {agents} | {len(runs)} | {fmt_ci([r['tasks_per_s'] for r in runs], '.2f')} "
        f"| {fmt_ci([r['j_per_task'] for r in runs], ',.1f')} "
        f"| {np.mean([r['success'] for r in runs if r['success'] is not None]):.0%} "
        f"| {np.mean([r['turns'] for r in runs]):.1f} "
        f"| {'—' if p50 is None else f'{p50:.1%}'} / {'—' if p95 is None else f'{p95:.1%}'} "
        f"| {'—' if not cons else f'{max(cons):.1e}'} "
        f"| {'—' if not cpu else f'{np.mean(cpu):.2f}'} |",
        flush=True,
    )


HEADER = (
    "| tools | agents | runs | tasks/s | J/task (±95% CI) | success | turns/task | per-task error p50 / p95 "
    "| conservation (worst) | harness CPU ms/call |\n|---|---|---|---|---|---|---|---|---|---|"
)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 and 8 agents, one repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--agents", default=None, help="comma-separated agent counts, for every path")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--tool-latency", default="exp:0.1", help="emulated tool latency (see run --help)")
    parser.add_argument("--base-url", default=None, help="a real server instead of the simulator")
    parser.add_argument("--endpoint", default="chat")
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    paths = ["in-process"] if args.base_url else args.paths.split(",")
    if unknown := set(paths) - set(PATHS):
        parser.error(f"unknown path {', '.join(sorted(unknown))}: choose from {', '.join(PATHS)}")
    repeats = 1 if args.quick else args.repeats
    print(HEADER)
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            for agents in levels(args, path):
                runs = []
                for r in range(repeats):
                    run_dir = Path(tmp) / f"{path}_c{agents}_r{r}"
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
                        runs.append(await simulated_run(agents, r, args.tool_latency, run_dir, path))
                print_level(path, agents, runs)


def levels(args: argparse.Namespace, path: str) -> list[int]:
    if args.agents:
        return [int(a) for a in args.agents.split(",")]
    if args.base_url:
        return [1, 4]
    if args.quick:
        return [1, 8] if path == "in-process" else [8]
    return [1, 8, 32, 128] if path == "in-process" else [8, 32]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--drive-proxy"]:
        url, agents, count, seed, latency, stream = sys.argv[2:8]
        asyncio.run(drive_proxy(url, int(agents), int(count), int(seed), latency, stream == "stream"))
    else:
        asyncio.run(main())
