"""Task files (``--tasks FILE.jsonl``): every malformed line named with its file and line before
a run starts; real runs read back from tasks.jsonl, against a scripted OpenAI-compatible server
that calls the tools each task is offered, and against the simulator."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from ipw_async import RunError, run_benchmark
from ipw_async.workload.datasets import DatasetError
from ipw_async.workload.taskfile import load_tasks

from .conftest import quick_config

GOOD = {"problem": "What is 2 + 2?", "answer": "4"}


def write(path: Path, *lines: object) -> Path:
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"problem": "x",', r"not JSON \(Expecting"),
        ("[1, 2]", "expected a JSON object, got a list"),
        ('"What is 2 + 2?"', "expected a JSON object, got the string 'What is 2 \\+ 2\\?'"),
        ({"answer": "4"}, r"no problem \(or question\)"),
        ({"problem": 42}, "problem must be a non-empty string, got a number"),
        ({"problem": "  "}, "problem must be a non-empty string"),
        ({"problem": "x", "question": "y"}, "give problem or question, not both"),
        ({"problem": "x", "answer": ["4"]}, "answer must be a string or a number, got a list"),
        ({"problem": "x", "answer": True}, "answer must be a string or a number, got true/false"),
        ({"problem": "x", "id": {"a": 1}}, "id must be a string or a whole number, got an object"),
        ({"problem": "x", "tools": "calculator"}, "tools must be a list of tool names, got the string"),
        ({"problem": "x", "tools": ["calculator", 3]}, "tools must be a list of tool names, got a list"),
        ({"problem": "x", "max_turns": 0}, "max_turns must be a whole number of at least 1, got 0"),
        ({"problem": "x", "max_turns": "3"}, "max_turns must be a whole number of at least 1, got '3'"),
        ({"problem": "x", "max_turns": True}, "max_turns must be a whole number of at least 1, got True"),
        (
            {"problem": "x", "scorer": "fuzzy"},
            "scorer must be one of exact, contains, numeric, choice, got 'fuzzy'",
        ),
        ({"problem": "x", "scorer": ["exact"]}, "scorer must be one of"),
        ({"problem": "x", "subject": 3}, "subject must be a string, got a number"),
        ({"problem": "x", "metadata": [1]}, "metadata must be a JSON object, got a list"),
        (
            {"problem": "x", "max_turn": 3},
            r"unknown field 'max_turn'; fields: id, problem, .* \(put anything else in metadata\)",
        ),
    ],
)
def test_each_malformed_line_is_named_with_its_file_and_line(
    tmp_path: Path, line: object, message: str
) -> None:
    path = write(tmp_path / "tasks.jsonl", GOOD, "", "   ", line, GOOD)  # blank lines count as lines
    with pytest.raises(DatasetError, match=rf"^{path} line 4: {message}") as caught:
        load_tasks(path)
    assert "\n" not in str(caught.value)


def test_ids_are_unique_and_a_file_needs_a_task(tmp_path: Path) -> None:
    path = write(tmp_path / "dup.jsonl", {"id": "a", **GOOD}, GOOD, {"id": "a", **GOOD})
    with pytest.raises(DatasetError, match=rf"^{path} line 3: id 'a' is already line 1's$"):
        load_tasks(path)
    # a line's default id is its line: an explicit id may not take it
    path = write(tmp_path / "taken.jsonl", GOOD, {"id": "line-1", **GOOD})
    with pytest.raises(DatasetError, match="line 2: id 'line-1' is already line 1's"):
        load_tasks(path)
    for text in ("", "\n  \n\n"):
        (tmp_path / "empty.jsonl").write_text(text)
        with pytest.raises(DatasetError, match=r"empty.jsonl has no tasks: give one per line"):
            load_tasks(tmp_path / "empty.jsonl")
    with pytest.raises(DatasetError, match=r"task file .*missing.jsonl does not exist"):
        load_tasks(tmp_path / "missing.jsonl")


def test_a_line_becomes_a_task_with_its_options(tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.jsonl",
        {"question": "Capital of France?", "answer": 3.5, "subject": "geo", "metadata": {"k": [1]}},
        {"id": 7, "problem": "Say hi.", "tools": [], "max_turns": 2, "scorer": "contains"},
    )
    first, second = load_tasks(path)
    assert (first.id, first.question, first.answer, first.scorer, first.tools, first.max_turns) == (
        "line-1",
        "Capital of France?",
        "3.5",
        "exact",
        None,
        None,
    )
    assert (first.subject, first.metadata, first.source, first.plan) == (
        "geo",
        {"k": [1]},
        f"{path} line 1",
        (),
    )
    assert (second.id, second.answer, second.tools, second.max_turns, second.scorer) == (
        "7",
        None,
        (),
        2,
        "contains",
    )


async def test_a_bad_file_or_tool_stops_the_run_before_it_starts(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.jsonl", GOOD, {"problem": "x", "answer": None, "metadata": "m"})
    unknown = write(tmp_path / "unknown.jsonl", GOOD, {"problem": "x", "tools": ["calculator", "browser"]})
    cases = [
        ({"tasks": bad}, rf"^{bad} line 2: metadata must be a JSON object"),
        ({"tasks": unknown}, rf"^{unknown} line 2: unknown tool 'browser'; tools: calculator, lookup$"),
        (
            {"tasks": unknown, "workload": "single"},
            "^--tasks and --mcp are for agentic runs: add --workload agentic$",
        ),
        ({"mcp": ["builtin"], "workload": "single"}, "^--tasks and --mcp are for agentic runs"),
        ({"tool_timeout": 0}, "^--tool-timeout must be a positive number of seconds$"),
        ({"mcp": ["python 'unclosed"]}, r"^--mcp \"python 'unclosed\": No closing quotation$"),
    ]
    for overrides, message in cases:
        with pytest.raises(RunError, match=message):
            await run_benchmark(quick_config(tmp_path, **{"workload": "agentic", **overrides}))
        assert not (tmp_path / "run").exists()
    # with MCP tools, known once the servers answer: the run stops before anything is sent
    with pytest.raises(
        RunError, match=rf"^{unknown} line 2: unknown tool 'browser'; tools: calculator, lookup$"
    ):
        await run_benchmark(quick_config(tmp_path, workload="agentic", tasks=unknown, mcp=["builtin"]))


# The scripted model: for each question, the tool and arguments it calls (each turn while
# ``again``, else once), then "The answer is <the last tool result, or hello>."
SCRIPT: dict[str, tuple[str, dict[str, str], bool] | None] = {
    "Compute 6 * 7 with the calculator.": ("calculator", {"expression": "6 * 7"}, False),
    "What is the capital of France?": ("lookup", {"key": "capital of France"}, False),
    "Keep computing.": ("calculator", {"expression": "1 + 1"}, True),
    "Say hello.": None,
    "Answer without tools.": None,
}
TASKS = [
    {
        "id": "mul",
        "problem": "Compute 6 * 7 with the calculator.",
        "answer": 42,
        "scorer": "numeric",
        "tools": ["calculator"],
        "subject": "arithmetic",
        "metadata": {"source": "unit test", "level": 2},
    },
    {"question": "What is the capital of France?", "answer": "Lyon", "tools": ["lookup"]},
    "",
    {"id": 7, "problem": "Say hello."},
    {"id": "loop", "problem": "Keep computing.", "tools": ["calculator"], "max_turns": 2},
    {"id": "bare", "problem": "Answer without tools.", "answer": "hello", "tools": []},
]


def _sse(delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(chunk)}\n\n".encode()


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A chat server playing :data:`SCRIPT`: its base URL, and every request body it got."""
    bodies: list[dict[str, Any]] = []

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.append(body)
        messages = body["messages"]
        question = next(m["content"] for m in messages if m["role"] == "user")
        results = [m["content"] for m in messages if m["role"] == "tool"]
        step = SCRIPT[question]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if step is not None and body.get("tools") and (step[2] or not results):
            name, arguments, _ = step
            call = {"index": 0, "id": f"call_{len(results)}", "type": "function"}
            await response.write(_sse({"tool_calls": [call | {"function": {"name": name, "arguments": ""}}]}))
            await response.write(
                _sse({"tool_calls": [{"index": 0, "function": {"arguments": json.dumps(arguments)}}]})
            )
            await response.write(_sse({}, "tool_calls"))
        else:
            await response.write(
                _sse({"content": f"The answer is {results[-1] if results else 'hello'}."}, "stop")
            )
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}/v1", bodies
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("mcp", [[], ["builtin"]], ids=["in-process", "mcp-builtin"])
async def test_file_tasks_are_offered_their_tools_scored_and_logged_as_given(
    tmp_path: Path, scripted: tuple[str, list[dict[str, Any]]], mcp: list[str]
) -> None:
    base_url, bodies = scripted
    path = write(tmp_path / "tasks.jsonl", *TASKS)
    config = quick_config(
        tmp_path,
        base_url=base_url,
        workload="agentic",
        tasks=path,
        mcp=mcp,
        max_queries=5,
        concurrency=2,
        baseline_s=0,
        tail_s=0,
        telemetry="none",
    )
    result = await run_benchmark(config)
    # each task was offered its own tools, and a task offered none was sent no tools field
    offered = {
        next(m["content"] for m in b["messages"] if m["role"] == "user"): [
            t["function"]["name"] for t in b["tools"]
        ]
        if "tools" in b
        else None
        for b in bodies
    }
    assert offered == {
        "Compute 6 * 7 with the calculator.": ["calculator"],
        "What is the capital of France?": ["lookup"],
        "Say hello.": ["calculator", "lookup"],
        "Keep computing.": ["calculator"],
        "Answer without tools.": None,
    }
    tasks = {
        t["query_id"]: t
        for t in (json.loads(line) for line in (result.run_dir / "tasks.jsonl").read_text().splitlines())
    }
    assert set(tasks) == {"mul", "line-2", "7", "loop", "bare"}
    got = {k: (t["outcome"], t["reference"], t["correct"], len(t["turns"])) for k, t in tasks.items()}
    assert got == {
        "mul": ("answered", "42", True, 2),  # numeric: "The answer is 42." against 42
        "line-2": ("answered", "Lyon", False, 2),  # exact, by default: Paris is not Lyon
        "7": ("answered", None, None, 1),  # no answer: not scored
        "loop": ("max_turns", None, None, 2),  # its own max_turns, not the run's 10
        "bare": ("answered", "hello", True, 1),
    }
    assert (tasks["mul"]["subject"], tasks["mul"]["metadata"]) == (
        "arithmetic",
        {"source": "unit test", "level": 2},
    )
    assert tasks["7"]["subject"] is None and tasks["7"]["metadata"] is None
    calls = [c for t in tasks.values() for turn in t["turns"] for c in turn["tools"]]
    assert [c["output"] for c in tasks["mul"]["turns"][0]["tools"]] == ["42"]
    assert [c["output"] for c in tasks["line-2"]["turns"][0]["tools"]] == ["Paris"]
    assert {c["server"] for c in calls} == {"builtin" if mcp else None} and all(c["ok"] for c in calls)
    assert result.summary["tasks"]["count"] == 5


async def test_file_tasks_run_on_the_simulator(tmp_path: Path) -> None:
    path = write(tmp_path / "tasks.jsonl", *TASKS)
    config = quick_config(
        tmp_path, workload="agentic", tasks=path, max_queries=5, baseline_s=0, tail_s=0, telemetry="none"
    )
    result = await run_benchmark(config)
    tasks = {
        t["query_id"]: t
        for t in (json.loads(line) for line in (result.run_dir / "tasks.jsonl").read_text().splitlines())
    }
    assert set(tasks) == {"mul", "line-2", "7", "loop", "bare"}
    assert all(t["outcome"] in ("answered", "max_turns") for t in tasks.values())
    assert len(tasks["loop"]["turns"]) <= 2 and tasks["7"]["correct"] is None
    assert tasks["mul"]["metadata"] == {"source": "unit test", "level": 2}


def test_the_command_line_takes_a_task_file_and_mcp_servers(tmp_path: Path) -> None:
    path = write(tmp_path / "tasks.jsonl", *TASKS)
    command = [sys.executable, "-m", "ipw_async", "run", "--workload", "agentic", "--tasks", str(path)]
    options = ["-n", "5", "--telemetry", "none", "--baseline-s", "0", "--no-dashboard", "-o"]
    ok = subprocess.run(
        [*command, "--mcp", "builtin", "--tool-timeout", "5", *options, str(tmp_path / "ok")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    lines = (tmp_path / "ok" / "tasks.jsonl").read_text().splitlines()
    assert len(lines) == 5
    written = json.loads((tmp_path / "ok" / "run.json").read_text())["config"]
    assert (written["mcp"], written["tool_timeout"], written["tasks"]) == (["builtin"], 5.0, str(path))
    bad = write(tmp_path / "bad.jsonl", GOOD, "{oops")
    failed = subprocess.run(
        [*command[:-1], str(bad), *options, str(tmp_path / "bad")], capture_output=True, text=True, timeout=60
    )
    assert failed.returncode == 2
    assert f"{bad} line 2: not JSON" in failed.stderr and "Traceback" not in failed.stderr
