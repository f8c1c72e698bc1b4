"""Agentic tools on MCP servers (``--mcp``): real servers over stdio (subprocesses: the built-in
one and a test server written here) and over streamable HTTP, driven through real runs
against the simulator, with tasks.jsonl read back."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ipw_async import RunError, run_benchmark
from ipw_async.traces import QueryTrace
from ipw_async.workload.agentic import react_preamble
from ipw_async.workload.builtin_mcp import served_over_http
from ipw_async.workload.mcp_tools import McpServer, McpTools, redacted, written
from ipw_async.workload.tasks import builtin_tasks
from ipw_async.workload.tools import BUILTIN_TOOLS, ToolError, ToolSpec

from .conftest import quick_config

pytest.importorskip("mcp")

# A test server. argv[1]: how its calculator behaves (ok, fail, slow, die) or - for none;
# --lookup and --echo add those tools; exit-at-start fails before it serves.
SERVER = '''
import os, sys, anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from ipw_async.workload import tools

mode = sys.argv[1]
if mode == "exit-at-start":
    print("missing configuration: set TEST_KEY", file=sys.stderr)
    sys.exit(2)
app = MCPServer("test-tools", log_level="WARNING")

if mode != "-":
    @app.tool()
    async def calculator(expression: str) -> str:
        """Evaluate arithmetic."""
        if mode == "fail":
            raise ToolError("calculator backend down\\nretry later")
        if mode == "slow":
            await anyio.sleep(30)
        if mode == "die":
            print("dying on purpose", file=sys.stderr, flush=True)
            os._exit(3)
        try:
            return tools.calculator(expression)
        except tools.ToolError as exc:
            raise ToolError(str(exc)) from None

if "--lookup" in sys.argv:
    @app.tool()
    def lookup(key: str) -> str:
        """Look a fact up."""
        return tools.lookup(key)

if "--echo" in sys.argv:
    @app.tool()
    def echo(text: str) -> str:
        """Echo the text."""
        return text

app.run()
'''


@pytest.fixture
def server(tmp_path: Path) -> str:
    """The command that starts the test server (its arguments to be added)."""
    path = tmp_path / "srv.py"
    path.write_text(SERVER)
    return f"{sys.executable} {path}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def http_builtin() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The built-in server over streamable HTTP on a free loopback port: its URL and process."""
    with served_over_http() as served:
        yield served


def agentic(tmp_path: Path, **overrides: object) -> Any:
    """A small agentic run's config: no telemetry, no baseline or tail."""
    small: dict[str, object] = {
        "max_queries": 8,
        "concurrency": 4,
        "baseline_s": 0,
        "tail_s": 0,
        "telemetry": "none",
    }
    return quick_config(tmp_path, workload="agentic", **(small | overrides))


def task_lines(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "tasks.jsonl").read_text().splitlines()]


def tool_calls(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(
        (call for task in tasks for turn in task["turns"] for call in turn["tools"]),
        key=lambda c: c["started_ns"],
    )


def test_arguments_labels_and_react_lines_follow_the_tool_list() -> None:
    one = ToolSpec("calc", "Adds.", {"type": "object", "properties": {"x": {"type": "string"}}})
    count = ToolSpec("count", "Counts.", {"properties": {"n": {"type": "integer"}}})
    two = ToolSpec("pair", "Pairs.", {"properties": {"a": {}, "b": {}}})
    assert one.arguments("2 + 3 ", json_arguments=False) == {"x": "2 + 3"}
    assert one.arguments('{"x": "2"}', json_arguments=True) == {"x": "2"}
    assert count.arguments("12", json_arguments=False) == {"n": 12}  # a number, as its schema says
    assert two.arguments('{"a": 1, "b": [2]}', json_arguments=False) == {"a": 1, "b": [2]}
    for spec, text, as_json in ((two, "1, 2", False), (one, "[1]", True), (one, "{oops", True)):
        with pytest.raises(ToolError, match="must be a JSON object"):
            spec.arguments(text, as_json)
    assert [one.react_line(), two.react_line()] == ["calc[x]: Adds.", "pair[JSON object of a, b]: Pairs."]
    # the few-shot examples only where their tools are offered, the format in words otherwise
    builtin = [t.spec() for t in BUILTIN_TOOLS.values()]
    assert "calculator[12 * 7]" in react_preamble(builtin) and "lookup[atomic number" in react_preamble(
        builtin
    )
    only_lookup = react_preamble(builtin[1:])
    assert "calculator" not in only_lookup and "lookup[atomic number" in only_lookup
    assert "Use this format" in react_preamble([one]) and "calc[x]: Adds." in react_preamble([one])
    # labels carry no secret
    assert (
        McpServer("https://me:hunter2@tools.example/mcp?key=s3cret").label()
        == "https://me:***@tools.example/mcp"
    )
    assert McpServer("/opt/venv/bin/python -m my.server --token s3cret").label() == "python my.server"
    assert McpServer("mcp-tool --token s3cret serve").label() == "mcp-tool"
    assert McpServer("builtin").label() == "builtin"


def test_an_mcp_urls_whole_query_stays_out_of_run_json() -> None:
    # stricter than redact_url: a server's configuration, keys inside it, rides in the query
    # under any name (Smithery's config= is base64 JSON)
    config = "eyJhcGlLZXkiOiJzM2NyZXQifQ"
    for spec in (
        f"https://server.smithery.ai/exa/mcp?config={config}&profile=p",
        "https://tools.example/mcp?exaApiKey=s3cret",
        "https://tools.example/mcp?k=s3cret#x",
    ):
        kept = written(spec)
        assert kept == spec.split("?")[0] + "?***"
        assert redacted([kept])  # a resumed run asks for the server again
    assert written("https://me:hunter2@tools.example/mcp") == "https://me:***@tools.example/mcp"
    assert not redacted([written("https://tools.example/mcp")])


async def test_builtin_over_stdio_gives_the_in_process_answers(tmp_path: Path) -> None:
    here = await run_benchmark(agentic(tmp_path / "here"))
    there = await run_benchmark(agentic(tmp_path / "mcp", mcp=["builtin"]))
    local, remote = task_lines(here.run_dir), task_lines(there.run_dir)
    assert len(remote) == 8 and {t["outcome"] for t in remote} == {"answered"}

    def by_task(tasks: list[dict[str, Any]]) -> dict[str, tuple[object, ...]]:
        return {
            t["query_id"]: (t["answer"], t["correct"], [(c["name"], c["output"]) for c in tool_calls([t])])
            for t in tasks
        }

    assert by_task(remote) == by_task(local)
    calls = tool_calls(remote)
    assert calls and all(c["ok"] and c["server"] == "builtin" and c["error"] is None for c in calls)
    assert all(c["result_bytes"] == len(c["output"].encode()) > 0 for c in calls)
    assert {c["server"] for c in tool_calls(local)} == {None}  # in-process: no server
    assert there.summary["tasks"]["correct"] == here.summary["tasks"]["correct"]


async def test_builtin_over_http_with_react_and_no_secret_written(
    tmp_path: Path, http_builtin: tuple[str, subprocess.Popen[bytes]]
) -> None:
    url, _ = http_builtin
    secret_url = url.replace("http://", "http://agent:hunter2@") + "?key=s3cret"
    result = await run_benchmark(agentic(tmp_path, endpoint="completions", mcp=[secret_url]))
    tasks = task_lines(result.run_dir)
    calls = tool_calls(tasks)
    assert len(tasks) == 8 and calls
    for call in calls:  # ReAct's bare input became the tool's one argument, answered as here
        assert call["ok"] and call["output"] == BUILTIN_TOOLS[call["name"]].run(call["arguments"])
        assert call["server"] == url.replace("http://", "http://agent:***@")
    assert {t["outcome"] for t in tasks} == {"answered"}
    for name in ("hunter2", "s3cret"):
        for file in ("tasks.jsonl", "run.json", "summary.json", "traces.jsonl"):
            assert name not in (result.run_dir / file).read_text(), (name, file)


async def test_a_tool_error_is_a_result_the_model_sees_and_the_task_goes_on(
    tmp_path: Path, server: str
) -> None:
    result = await run_benchmark(agentic(tmp_path, mcp=[f"{server} fail --lookup"], max_turns=3))
    tasks = task_lines(result.run_dir)
    calls = tool_calls(tasks)
    assert len(tasks) == 8 and len(calls) >= 8
    for call in calls:
        assert not call["ok"] and call["server"] == "python srv.py"
        assert call["error"] == "Error executing tool calculator: calculator backend down retry later"
        assert call["output"].startswith("error: ") and "down\nretry later" in call["output"]
    # the model was told and went on: it answered (wrongly) or ran out of turns
    assert {t["outcome"] for t in tasks} <= {"answered", "max_turns"} and not any(t["correct"] for t in tasks)
    assert result.complete
    # the traces carry each call's server, size and reason
    traced = [
        c
        for t in QueryTrace.load_jsonl(result.run_dir / "traces.jsonl")
        for u in t.turns
        for c in u.tools_called
    ]
    assert len(traced) == len(calls) and {c.server for c in traced} == {"python srv.py"}
    assert all(c.error == calls[0]["error"] and c.result_bytes == len(c.output.encode()) for c in traced)


async def test_a_call_past_the_tool_timeout_is_an_error_and_the_run_goes_on(
    tmp_path: Path, server: str
) -> None:
    result = await run_benchmark(
        agentic(tmp_path, mcp=[f"{server} slow --lookup"], tool_timeout=0.3, max_queries=4, max_turns=2)
    )
    tasks = {t["query_id"]: t for t in task_lines(result.run_dir)}
    calls = tool_calls(list(tasks.values()))
    plans = {t.id: len(t.plan) for t in builtin_tasks()[:4]}
    assert len(calls) == sum(min(n, 2) for n in plans.values())  # a call a turn while its plan lasts
    for call in calls:
        assert not call["ok"] and call["error"] == "timed out after 0.3 s"
        assert 0.3 <= call["latency_s"] < 1.5
    assert result.complete
    assert {k: t["outcome"] for k, t in tasks.items()} == {
        k: "answered" if n < 2 else "max_turns" for k, n in plans.items()
    }


async def test_a_server_that_dies_mid_run_fails_its_calls_at_once_and_the_rest_go_on(
    tmp_path: Path, server: str
) -> None:
    # the calculator's server dies on its first call; lookups come from another server
    config = agentic(tmp_path, mcp=[f"{server} die", f"{server} - --lookup"], max_queries=48, max_turns=4)
    result = await asyncio.wait_for(run_benchmark(config), 120)
    assert result.complete and len(task_lines(result.run_dir)) == 48
    calls = tool_calls(task_lines(result.run_dir))
    calc = [c for c in calls if c["name"] == "calculator"]
    assert len(calc) > 20 and not any(c["ok"] for c in calc)
    assert {c["server"] for c in calc} == {"python srv.py"}
    assert all(c["error"].startswith("MCP server python srv.py exited: connection closed") for c in calc)
    assert "its stderr ends: dying on purpose" in calc[0]["error"]
    assert all(c["latency_s"] < 1 for c in calc[4:])  # once it is known gone: no 30 s wait, no hang
    died = calc[0]["started_ns"]
    later = [c for c in calls if c["name"] == "lookup" and c["started_ns"] > died]
    assert later and all(c["ok"] and c["server"] == "python srv.py#2" for c in later)


async def test_a_server_that_cannot_start_stops_the_run_before_it_measures(
    tmp_path: Path, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_simulator(config: object) -> None:
        raise AssertionError("the simulator started before the tools were checked")

    # the tools open first: a bad --mcp fails before the simulator (and all after it) starts
    monkeypatch.setattr("ipw_async.harness.opening.simulator", no_simulator)
    cases = [
        (
            ["no-such-mcp-server --port 1"],
            r"^MCP server no-such-mcp-server did not start \(FileNotFoundError",
        ),
        (
            [f"{server} exit-at-start"],
            r"its stderr ends: missing configuration: set TEST_KEY\); check that the command",
        ),
        ([f"http://127.0.0.1:{free_port()}/mcp"], r"did not start \(ConnectError: .*\); check the URL"),
        (
            ["builtin", f"{server} ok"],
            r"^tool 'calculator' is offered by two MCP servers, builtin and python srv.py",
        ),
        (
            [f"{server} - --echo"],
            r"^built-in task arith-00: unknown tool 'calculator'; tools: echo \(--mcp builtin serves",
        ),
    ]
    for k, (mcp, message) in enumerate(cases):
        with pytest.raises(RunError, match=message) as caught:
            await run_benchmark(agentic(tmp_path / str(k), mcp=mcp))
        assert "\n" not in str(caught.value)
        # nothing was measured: the directory the run made is gone, so the same command runs
        # again once fixed (not "already holds a run")
        assert not (tmp_path / str(k) / "run").exists()
    mine = tmp_path / "mine" / "run"  # a directory the user made is kept, emptied of the run's files
    mine.mkdir(parents=True)
    with pytest.raises(RunError):
        await run_benchmark(agentic(tmp_path / "mine", mcp=[cases[0][0][0]]))
    assert mine.is_dir() and not any(mine.iterdir())


async def test_without_the_sdk_the_run_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mcp" else find_spec(name, *a)
    )
    with pytest.raises(RunError, match=r"^--mcp needs the MCP SDK: pip install 'ipw-async\[mcp\]'$"):
        await run_benchmark(agentic(tmp_path, mcp=["builtin"]))
    assert not (tmp_path / "run").exists()


async def test_each_worker_process_opens_its_own_servers(tmp_path: Path, server: str) -> None:
    result = await run_benchmark(agentic(tmp_path / "ok", mcp=["builtin"], workers="2", max_queries=12))
    tasks = task_lines(result.run_dir)
    assert len(tasks) == 12 and {t["outcome"] for t in tasks} == {"answered"}
    assert {c["server"] for c in tool_calls(tasks)} == {"builtin"}
    assert all(c["ok"] for c in tool_calls(tasks))
    with pytest.raises(RunError, match=r"^MCP server python srv.py did not start \(.*stderr ends: missing"):
        await run_benchmark(agentic(tmp_path / "bad", mcp=[f"{server} exit-at-start"], workers="2"))


async def test_an_http_server_gone_mid_session_fails_every_later_call(
    http_builtin: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = http_builtin
    tools = McpTools([url], timeout_s=5)
    async with tools.opened():
        assert tools.tools is not None and set(tools.tools) == {"calculator", "lookup"}
        assert await tools.run("calculator", {"expression": "6 * 7"}) == "42"
        with pytest.raises(ToolError, match="division by zero"):
            await tools.run("calculator", {"expression": "1 / 0"})
        proc.kill()
        proc.wait()
        with pytest.raises(ToolError, match=rf"^MCP server {url} exited: ConnectError"):
            await tools.run("calculator", {"expression": "1 + 1"})
        start = time.perf_counter()
        with pytest.raises(ToolError, match=rf"^MCP server {url} exited: ConnectError"):
            await tools.run("lookup", {"key": "capital of France"})
        assert time.perf_counter() - start < 1  # at once: not after the 5 s timeout


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A one-node Ray cluster on loopback (one CPU: room for one actor)."""
    pytest.importorskip("ray")
    from ipw_async.harness.ray_pool import local_cluster

    with local_cluster(nodes=1) as address:
        yield address


async def test_a_ray_actor_opens_its_own_servers(tmp_path: Path, server: str, ray_cluster: str) -> None:
    config = agentic(tmp_path / "ok", mcp=["builtin"], ray=ray_cluster, workers="1", max_queries=12)
    tasks = task_lines((await asyncio.wait_for(run_benchmark(config), 120)).run_dir)
    assert len(tasks) == 12 and {t["outcome"] for t in tasks} == {"answered"}
    assert {(c["server"], c["ok"]) for c in tool_calls(tasks)} == {("builtin", True)}
    bad = agentic(tmp_path / "bad", mcp=[f"{server} exit-at-start"], ray=ray_cluster, workers="1")
    with pytest.raises(RunError, match=r"^MCP server python srv.py did not start \(.*stderr ends: missing"):
        await asyncio.wait_for(run_benchmark(bad), 120)
