"""A real agent framework we did not write, measured through the recording proxy.

The OpenAI Agents SDK (``openai-agents``) drives tool-using tasks against the built-in simulator
through ``ipw-async proxy``: it installs from the package index with the ``mcp`` SDK it already
needs, talks to any OpenAI-compatible URL over /chat/completions or the Responses API
(/responses, its default model), runs offline once its tracing export is off, and runs both
streamed and whole completions.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import agents
import httpx
import polars as pl
import pytest
from openai import AsyncOpenAI

from ipw_async.harness import RunConfig
from ipw_async.proxy import TASK_HEADER, run_proxy
from ipw_async.workload.tools import ToolError, lookup

QUESTIONS = {
    "france": ("What is the capital of France? Use the lookup tool.", "Paris"),
    "japan": ("What is the capital of Japan? Use the lookup tool.", "Tokyo"),
    "iron": ("Look up the atomic number of iron.", "26"),
}


@agents.function_tool
def knowledge(key: str) -> str:
    """Look a fact up, e.g. 'capital of France' or 'atomic number of iron'."""
    try:
        return lookup(key)
    except ToolError as exc:
        return f"error: {exc}"


MODELS = {"chat": agents.OpenAIChatCompletionsModel, "responses": agents.OpenAIResponsesModel}


async def _solve(url: str, api: str, name: str, question: str, streamed: bool) -> str:
    client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    agent = agents.Agent(
        name="solver",
        instructions="Answer with the tools you are given.",
        tools=[knowledge],
        model=MODELS[api](model="sim-small", openai_client=client),
        model_settings=agents.ModelSettings(max_tokens=64, extra_headers={TASK_HEADER: name}),
    )
    if streamed:
        run = agents.Runner.run_streamed(agent, question, max_turns=6)
        async for _ in run.stream_events():
            pass
        return str(run.final_output)
    return str((await agents.Runner.run(agent, question, max_turns=6)).final_output)


@pytest.mark.parametrize("api", list(MODELS))
async def test_an_agent_framework_through_the_proxy_gets_joules_per_task(tmp_path: Path, api: str) -> None:
    agents.set_tracing_disabled(True)
    config = RunConfig(output_dir=tmp_path / "run", baseline_s=0.5, tail_s=0.2, duration=120, seed=3)
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    run = asyncio.create_task(run_proxy(config, port=0, ready=ready.set_result))
    await asyncio.wait({run, ready}, return_when=asyncio.FIRST_COMPLETED)
    url = ready.result()
    answers = await asyncio.gather(
        *(
            _solve(url, api, name, q, streamed=i % 2 == 0)
            for i, (name, (q, _)) in enumerate(QUESTIONS.items())
        )
    )
    async with httpx.AsyncClient(timeout=10) as http:
        for (name, (_, reference)), answer in zip(QUESTIONS.items(), answers, strict=True):
            ended = await http.post(
                f"{url.removesuffix('/v1')}/ipw/tasks/{name}/end",
                json={"answer": answer, "reference": reference},
            )
            assert ended.status_code == 200, ended.text
    run.cancel()
    result = await run

    run_dir = tmp_path / "run"
    records = pl.read_ipc_stream(run_dir / "records.arrow")
    tasks = [json.loads(line) for line in (run_dir / "tasks.jsonl").read_text().splitlines()]
    assert sorted(t["query_id"] for t in tasks) == sorted(QUESTIONS)
    assert result.summary["simulated"] is True and result.summary["complete"] is True
    assert (records["status"] == "ok").all()
    # every call was read as its API words it: the finish, and the tokens from the server's usage
    finishes = {"chat": {"stop", "tool_calls"}, "responses": {"completed"}}[api]
    assert set(records["finish_reason"]) <= finishes, set(records["finish_reason"])
    assert records["prompt_tokens"].null_count() == 0 and (records["output_tokens_source"] == "usage").all()
    assert (records["prompt"] != "").all()  # what each call added: the question, or a tool's result
    # the framework called its tool between LLM calls: every task took more than one call
    assert all(len(t["turns"]) >= 2 for t in tasks), [len(t["turns"]) for t in tasks]
    assert records.filter(pl.col("tool_calls").list.len() > 0).height >= len(QUESTIONS)
    # streamed calls have a time to first token; whole ones do not (null, never 0)
    assert records["ttft_s"].drop_nulls().len() > 0 and records["ttft_s"].null_count() > 0
    traces = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]
    per_task = {t["query_id"]: t for t in traces if t.get("task_id") is not None}
    assert set(per_task) == set(QUESTIONS)
    assert all((t.get("energy_j") or 0) > 0 for t in per_task.values())
    energy = result.summary["energy"]
    assert energy["attributed_j"] == pytest.approx(sum(records["energy_j"]), rel=1e-6)
