"""Agentic and multi-turn runs: real runs against the simulator process, files read back."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from ipw_async import QueryTrace, RunError, run_benchmark
from ipw_async.records import RequestRecord
from ipw_async.workload.agentic import INVALID_FORMAT, Agentic, ReAct, ToolCalling
from ipw_async.workload.conversations import load_conversations
from ipw_async.workload.datasets import DatasetError
from ipw_async.workload.tasks import builtin_tasks
from ipw_async.workload.tools import (
    BUILTIN_TOOLS,
    Tool,
    Toolbox,
    ToolError,
    ToolLatency,
    ToolResult,
    calculator,
    lookup,
)

from .conftest import quick_config, stream_record


def _sse(delta: dict[str, object], finish: str | None = None) -> bytes:
    return (
        b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode()
    )


async def test_streamed_tool_calls_are_assembled_exactly() -> None:
    events = [
        _sse({"role": "assistant", "content": ""}),
        _sse(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "calc", "arguments": ""},
                    }
                ]
            }
        ),
        _sse({"tool_calls": [{"index": 0, "function": {"name": "ulator", "arguments": '{"expr'}}]}),
        _sse({"tool_calls": [{"index": 0, "function": {"arguments": 'ession": "2 + 3"}'}}]}),
        _sse(
            {
                "tool_calls": [
                    {"index": 1, "id": "call_b", "function": {"name": "lookup", "arguments": '{"key": "x"}'}}
                ]
            }
        ),
        _sse({}, finish="tool_calls"),
        b"data: [DONE]",
    ]
    record = await stream_record([(i * 1000, e) for i, e in enumerate(events)])
    assert record.tool_calls == [
        {"id": "call_a", "name": "calculator", "arguments": '{"expression": "2 + 3"}'},
        {"id": "call_b", "name": "lookup", "arguments": '{"key": "x"}'},
    ]
    assert record.finish_reason == "tool_calls" and record.status == "ok"
    assert record.first_token_ns == 1000  # the call's first piece is the first generated token
    step = ToolCalling("q", []).read(record)
    assert step.calls == [
        ("calculator", '{"expression": "2 + 3"}', "call_a"),
        ("lookup", '{"key": "x"}', "call_b"),
    ]
    assert not step.final


def _result(output: str, call_id: str | None = None) -> ToolResult:
    return ToolResult("calculator", "a", output, True, 0.0, 0, call_id)


def test_tool_calling_history_grows_turn_by_turn() -> None:
    history = ToolCalling("What is 2 + 3?", [BUILTIN_TOOLS["calculator"].spec().openai()])
    record = RequestRecord(
        0, "q", "d", "p", tool_calls=[{"id": "c1", "name": "calculator", "arguments": "{}"}]
    )
    history.extend(record, history.read(record), [_result("5", "c1")])
    roles = [m["role"] for m in history.messages]
    assert roles == ["system", "user", "assistant", "tool"]
    assert history.messages[2]["tool_calls"][0]["id"] == "c1"
    assert history.messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "5"}
    assert history.fields()["tools"][0]["function"]["name"] == "calculator"
    final = RequestRecord(1, "q", "d", "p", answer=" The answer is 5. ")
    assert history.read(final).answer == "The answer is 5."


def test_react_parses_actions_answers_and_bad_format() -> None:
    react = ReAct("What is 2 + 3?", chat=False, tools=[t.spec() for t in BUILTIN_TOOLS.values()])
    start = react.fields()["prompt"]
    assert start.endswith("Question: What is 2 + 3?\nThought:") and react.fields()["stop"] == [
        "\nObservation:"
    ]
    act = RequestRecord(
        0, "q", "d", "p", answer=" I add.\nAction: calculator[2 + 3]\nObservation: 7 (invented)"
    )
    step = react.read(act)
    assert step.calls == [("calculator", "2 + 3", None)]
    react.extend(act, step, [_result("5")])
    assert react.fields()["prompt"] == start + " I add.\nAction: calculator[2 + 3]\nObservation: 5\nThought:"
    nonsense = RequestRecord(1, "q", "d", "p", answer=" hmm")
    assert react.read(nonsense).calls == [] and not react.read(nonsense).final
    react.extend(nonsense, react.read(nonsense), [])
    assert react.fields()["prompt"].endswith(f"Observation: {INVALID_FORMAT}\nThought:")
    assert react.read(RequestRecord(2, "q", "d", "p", answer=" done.\nFinal Answer: 5\n")).answer == "5"


def test_tools_compute_and_refuse_clearly() -> None:
    assert calculator("(17 * 23) + 41") == "432" and calculator("7 / 2") == "3.5"
    for bad in ("__import__('os')", "x + 1", "2 ** 1000", "1 / 0", ""):
        with pytest.raises(ToolError):
            calculator(bad)
    assert lookup("Capital of France?") == "Paris" and lookup("atomic number of iron") == "26"
    with pytest.raises(ToolError, match="no entry"):
        lookup("capital of Atlantis")
    with pytest.raises(ValueError, match="tool-latency"):
        ToolLatency.parse("soon")
    assert ToolLatency.parse("lognormal:0.2,0.5").draw(random.Random(1)) > 0


def test_builtin_tasks_are_solvable_by_their_plans() -> None:
    tasks = builtin_tasks()
    assert len(tasks) == 48 and {t.turns for t in tasks} == set(range(2, 9))
    for task in tasks:
        results: list[str] = []
        for step in task.plan:
            results.append(BUILTIN_TOOLS[step.tool].run(step.argument(results)))
        assert results[-1] == task.answer


async def test_agentic_run_writes_turns_tasks_and_conserves_energy(tmp_path: Path) -> None:
    config = quick_config(tmp_path, workload="agentic", max_queries=16, warmup=2, concurrency=4, price="1/2")
    result = await run_benchmark(config)
    run_dir = result.run_dir
    records = pl.read_ipc_stream(run_dir / "records.arrow")
    traces = QueryTrace.load_jsonl(run_dir / "traces.jsonl")
    assert len(traces) == 18 and sum(not t.warmup for t in traces) == 16
    assert records.height == sum(len(t.turns) for t in traces)
    # every call of a task is a record of that task, numbered in order
    for trace in traces:
        rows = records.filter(pl.col("task_id") == trace.task_id).sort("turn_index")
        assert rows.get_column("turn_index").to_list() == list(range(len(trace.turns)))
        assert rows.get_column("request_id").to_list() == [t.request_id for t in trace.turns]
        assert sum(len(t.tools_called) for t in trace.turns) == len(trace.turns) - 1
        assert trace.status == "answered" and trace.turns[-1].tools_called == []
        assert trace.total_wall_clock_s is not None and trace.model_s is not None
        assert trace.total_wall_clock_s >= trace.model_s + trace.tool_s - 1e-6
        assert trace.cost_usd == pytest.approx(
            sum(t.input_tokens * 1e-6 + t.output_tokens * 2e-6 for t in trace.turns)  # type: ignore[operator]
        )
    # the history grows and the simulator's prefix cache serves what an earlier turn sent
    longest = max(traces, key=lambda t: len(t.turns))
    inputs = [t.input_tokens for t in longest.turns]
    cached = [t.cached_input_tokens for t in longest.turns]
    assert inputs == sorted(inputs) and len(set(inputs)) == len(inputs)
    for k in range(1, len(inputs)):
        # the simulator caches text in 16-token blocks; its 4 template tokens per message are not cached
        messages_before = 2 + 2 * (k - 1)
        assert inputs[k - 1] - 4 * messages_before - 16 <= cached[k] < inputs[k]  # type: ignore[operator]
    # per-task energy plus idle is the measured total, warm-up tasks included
    energy = result.summary["energy"]
    task_j = sum(t.energy_j for t in traces)  # type: ignore[misc]
    assert task_j + energy["idle_j"] == pytest.approx(energy["total_j"], rel=1e-9)
    tasks = result.summary["tasks"]
    assert tasks["count"] == 16 and tasks["outcomes"] == {"answered": 16}
    assert tasks["correct"] == sum(bool(t.correct) for t in traces if not t.warmup)
    measured_j = sum(t.energy_j for t in traces if not t.warmup)  # type: ignore[misc]
    assert tasks["j_per_task"] == pytest.approx(measured_j / 16)
    # round trip: what is read back writes the same line
    line = (run_dir / "traces.jsonl").read_text().splitlines()[3]
    assert json.loads(QueryTrace.from_dict(json.loads(line)).to_json()) == json.loads(line)


async def test_out_of_turns_and_tool_errors_are_outcomes(tmp_path: Path) -> None:
    def broken(_: str) -> str:
        raise RuntimeError("calculator backend down")

    tools = {**BUILTIN_TOOLS, "calculator": Tool("calculator", "broken", "expression", broken)}
    config = quick_config(tmp_path, workload="agentic", max_queries=8, max_turns=3)
    workload = Agentic(
        Toolbox(tools), protocol="tools", endpoint="chat", max_turns=3, task_timeout_s=None, seed=0
    )
    result = await run_benchmark(config, workload=workload)
    traces = {t.query_id: t for t in QueryTrace.load_jsonl(result.run_dir / "traces.jsonl")}
    by_turns = {t.id: t.turns for t in builtin_tasks()[:8]}
    for task_id, trace in traces.items():
        if by_turns[task_id] > 3:
            assert trace.status == "max_turns" and len(trace.turns) == 3 and trace.correct is None
        else:
            assert trace.status == "answered" and trace.correct is False  # it answered from the error
        calls = [c for t in trace.turns for c in t.tools_called]
        assert calls and all(not c.ok and "calculator backend down" in (c.output or "") for c in calls)
    assert result.summary["tasks"]["success_rate"] == 0.0


async def test_react_on_completions_and_task_timeout(tmp_path: Path) -> None:
    config = quick_config(
        tmp_path,
        workload="agentic",
        endpoint="completions",
        max_queries=6,
        tool_latency="0.3",
        task_timeout=0.5,
    )
    result = await run_benchmark(config)
    traces = QueryTrace.load_jsonl(result.run_dir / "traces.jsonl")
    records = pl.read_ipc_stream(result.run_dir / "records.arrow")
    assert records.get_column("prompt").str.contains("Thought:").all()
    for trace in traces:
        tool_s = trace.tool_s or 0.0
        assert all(
            c.arguments and not c.arguments.startswith("{") for t in trace.turns for c in t.tools_called
        )
        if trace.status == "timeout":  # no new turn began after the deadline
            assert tool_s >= 0.3 and len(trace.turns) >= 2
        else:
            assert trace.status == "answered" and trace.answer
    assert {t.status for t in traces} == {"answered", "timeout"}


async def test_conversation_replay_from_file(tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    rows = [
        {"id": "a", "turns": ["Hello there.", {"content": "Tell me more.", "think_s": 0.2}, "Thanks."]},
        {
            "id": "b",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "old"},
                {"role": "user", "content": "Bye"},
            ],
        },
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = await run_benchmark(
        quick_config(tmp_path, workload="conversation", dataset=str(path), max_queries=2)
    )
    traces = {t.query_id: t for t in QueryTrace.load_jsonl(result.run_dir / "traces.jsonl")}
    assert [len(traces["a"].turns), len(traces["b"].turns)] == [3, 2]
    assert traces["a"].turns[1].think_s == 0.2 and traces["a"].think_s == pytest.approx(0.2)
    inputs = [t.input_tokens for t in traces["a"].turns]
    assert inputs == sorted(inputs) and inputs[0] < inputs[-1]  # each turn carries the history
    assert all(t.status == "completed" and t.correct is None for t in traces.values())
    assert result.summary["tasks"]["success_rate"] is None  # nothing to score against: not 0


def test_bad_conversation_rows_are_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"turns": ["ok"]}\n{"turns": []}\n')
    with pytest.raises(DatasetError, match="row 2: no user turns"):
        load_conversations(path)
    path.write_text('{"turns": ["ok", {"content": "x", "think_s": -1}]}\n')
    with pytest.raises(DatasetError, match="row 1 turn 2: think_s"):
        load_conversations(path)


async def test_agentic_options_are_checked_before_the_run(tmp_path: Path) -> None:
    for overrides, message in (
        ({"workload": "agentic", "dataset": "synthetic"}, "built-in tool tasks"),
        ({"workload": "agentic", "max_turns": 0}, "--max-turns"),
        ({"workload": "agentic", "tool_latency": "fast"}, "tool-latency"),
        ({"workload": "swarm"}, "--workload"),
        ({"price": "cheap"}, "--price"),
    ):
        with pytest.raises(RunError, match=message):
            await run_benchmark(quick_config(tmp_path, **overrides))
    assert not (tmp_path / "run").exists()


def test_documented_agentic_command(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ipw_async",
            "run",
            "--workload",
            "agentic",
            "-c",
            "8",
            "-n",
            "16",
            "--no-dashboard",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "task success" in proc.stderr + proc.stdout and "J/task" in proc.stderr + proc.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert len((run_dir / "tasks.jsonl").read_text().splitlines()) == 16


async def test_analyze_and_headline_figures_are_per_task(tmp_path: Path) -> None:
    from ipw_async.analysis import analyze, headline_figures
    from ipw_async.rundir import RunDir

    result = await run_benchmark(quick_config(tmp_path, workload="agentic", max_queries=12))
    report = analyze(result.run_dir, "tasks")["tasks"]
    assert report["tasks"] == result.summary["tasks"]
    profile = report["by_turn_index"]
    assert [p["turn_index"] for p in profile] == list(range(len(profile)))
    assert profile[0]["calls"] == 12 and profile[-1]["calls"] < 12  # fewer tasks reach the later turns
    assert profile[-1]["input_tokens_mean"] > profile[0]["input_tokens_mean"]
    figures = headline_figures(RunDir.open(result.run_dir))
    assert figures["j_per_task"] == pytest.approx(result.summary["tasks"]["j_per_task"])
    assert figures["task_success"] == result.summary["tasks"]["success_rate"]
    single = await run_benchmark(quick_config(tmp_path / "single", max_queries=4))
    assert analyze(single.run_dir, "tasks")["tasks"]["tasks"] is None
    assert headline_figures(RunDir.open(single.run_dir))["j_per_task"] is None
