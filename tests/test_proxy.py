"""The recording proxy: calls forwarded byte for byte, each kept as a record of a finished run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from aiohttp import web

from ipw_async.errors import RunError
from ipw_async.harness import RunConfig
from ipw_async.proxy import TASK_HEADER, run_proxy
from ipw_async.results import RunResult

EVENTS = [
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Par"}}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"is"},"finish_reason":"stop"}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}\n\n',
    b"data: [DONE]\n\n",
]
COMPLETION = (
    b'{"id":"c2","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
    b'"content":null,"tool_calls":[{"id":"call_0","type":"function","function":{"name":"lookup",'
    b'"arguments":"{\\"key\\": \\"capital of France\\"}"}}]},"finish_reason":"tool_calls"}],'
    b'"usage":{"prompt_tokens":30,"completion_tokens":7,"total_tokens":37,'
    b'"prompt_tokens_details":{"cached_tokens":16}}}'
)
KEY = "sk-proxy-secret-0123456789"


class Upstream:
    """A scripted OpenAI-compatible server: fixed bytes, so what the caller gets can be compared
    with what was sent; ``x-script: cut`` ends a stream mid-way, ``x-script: hang`` stops
    after its first event."""

    def __init__(self) -> None:
        self.authorizations: list[str | None] = []
        self.request_ids: list[str | None] = []
        self.bodies: list[dict[str, Any]] = []
        self.released = False  # a hanging stream goes on (the server is stopping)
        self.seen: list[tuple[str, str | None, str | None]] = []  # query, accept-encoding, x-note

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.authorizations.append(request.headers.get("authorization"))
        self.request_ids.append(request.headers.get("x-ipw-request-id"))
        body = await request.json()
        self.bodies.append(body)
        self.seen.append(
            (request.query_string, request.headers.get("accept-encoding"), request.headers.get("x-note"))
        )
        if not body.get("stream"):
            return web.Response(body=COMPLETION, content_type="application/json")
        response = web.StreamResponse(headers={"content-type": "text/event-stream", "x-upstream": "yes"})
        await response.prepare(request)
        for i, event in enumerate(EVENTS):
            if i == 2 and request.headers.get("x-script") == "cut":
                assert request.transport is not None
                request.transport.close()
                return response
            await response.write(event)
            while request.headers.get("x-script") == "hang" and not self.released:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.005)
        await response.write_eof()
        return response

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model"}]})


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/v1"


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Upstream, str]]:
    script = Upstream()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", script.chat)
    app.router.add_get("/v1/models", script.models)
    runner, url = await _serve(app)
    yield script, url
    script.released = True
    await runner.cleanup()


def _config(tmp_path: Path, base_url: str | None, **extra: Any) -> RunConfig:
    return RunConfig(
        base_url=base_url,
        output_dir=tmp_path / "run",
        telemetry="none" if base_url else "auto",
        **({"baseline_s": 0, "tail_s": 0, "duration": 60} | extra),
    )


async def _through_proxy(
    config: RunConfig, agent: Callable[[str], Awaitable[Any]], **options: Any
) -> tuple[RunResult, Any]:
    """Run the proxy while ``agent`` calls it; the run ends when the agent is done."""
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    run = asyncio.create_task(run_proxy(config, port=0, ready=ready.set_result, **options))
    done, _ = await asyncio.wait({run, ready}, return_when=asyncio.FIRST_COMPLETED)
    if run in done:
        run.result()  # the run failed before it listened: raise its error
    try:
        answer = await agent(ready.result())
    finally:
        run.cancel()  # as Ctrl-C does: the proxy's normal end
    return await run, answer


async def test_streaming_and_whole_responses_pass_through_unchanged_and_are_recorded(
    tmp_path: Path, upstream: tuple[Upstream, str]
) -> None:
    script, base = upstream

    async def agent(url: str) -> tuple[bytes, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=10) as http:
            body = {"model": "scripted", "messages": [{"role": "user", "content": "Capital of France?"}]}
            async with http.stream("POST", f"{url}/chat/completions", json=body | {"stream": True}) as r:
                streamed = b"".join([piece async for piece in r.aiter_raw()])
                assert r.headers["content-type"] == "text/event-stream"
                assert r.headers["x-upstream"] == "yes"
            whole = await http.post(f"{url}/chat/completions", json=body)
            models = await http.get(f"{url}/models")
        return streamed, whole, models

    result, (streamed, whole, models) = await _through_proxy(_config(tmp_path, base), agent)
    # every event as the upstream sent it, less the usage event the proxy asked for itself
    assert streamed == b"".join(EVENTS[:3] + EVENTS[4:])
    assert whole.content == COMPLETION and whole.status_code == 200
    assert models.json()["data"][0]["id"] == "scripted"  # forwarded, not recorded
    records = pl.read_ipc_stream(tmp_path / "run" / "records.arrow")
    assert records.height == 2 and result.summary["complete"] is True
    stream, json_call = records.sort("request_id").to_dicts()
    assert stream["status"] == "ok" and stream["answer"] == "Paris"
    assert stream["ttft_s"] is not None and 0 < stream["ttft_s"] < stream["stream_time_s"]
    assert stream["output_tokens"] == 2 and stream["prompt_tokens"] == 9
    assert stream["prompt"] == "Capital of France?"
    # a whole completion: its tokens and tool call, and no time to first token (never 0)
    assert json_call["status"] == "ok" and json_call["ttft_s"] is None
    assert json_call["output_tokens"] == 7 and json_call["finish_reason"] == "tool_calls"
    assert json_call["prompt_tokens"] == 30 and json_call["cached_prompt_tokens"] == 16
    assert json_call["stream_time_s"] > 0
    assert script.request_ids == [str(stream["request_id"]), str(json_call["request_id"])]
    # the streamed call asked the upstream for its token counts; the whole one went as sent
    assert script.bodies[0]["stream_options"] == {"include_usage": True}
    assert "stream_options" not in script.bodies[1]


@pytest.mark.parametrize(
    ("sent_options", "stream_usage", "upstream_got"),
    [
        ({"include_usage": False}, True, {"include_usage": False}),  # the caller said: kept
        ({"continuous_usage_stats": True}, True, {"continuous_usage_stats": True, "include_usage": True}),
        (None, False, None),  # --no-stream-usage: the body as sent
    ],
)
async def test_a_streamed_call_asks_for_usage_only_where_its_caller_left_it_open(
    tmp_path: Path,
    upstream: tuple[Upstream, str],
    sent_options: dict[str, bool] | None,
    stream_usage: bool,
    upstream_got: dict[str, bool] | None,
) -> None:
    script, base = upstream
    body: dict[str, Any] = {
        "model": "scripted",
        "messages": [{"role": "user", "content": "Q"}],
        "stream": True,
    }
    if sent_options is not None:
        body["stream_options"] = sent_options

    async def agent(url: str) -> bytes:
        async with (
            httpx.AsyncClient(timeout=10) as http,
            http.stream("POST", f"{url}/chat/completions", json=body) as r,
        ):
            return b"".join([piece async for piece in r.aiter_raw()])

    _, streamed = await _through_proxy(_config(tmp_path, base), agent, stream_usage=stream_usage)
    assert script.bodies[0].get("stream_options") == upstream_got
    # where the proxy asked, its usage event is kept from the caller; else it passes as sent
    asked = upstream_got != sent_options
    assert streamed == b"".join(EVENTS[:3] + EVENTS[4:] if asked else EVENTS)


async def test_a_task_header_groups_calls_and_the_end_call_scores_the_answer(
    tmp_path: Path, upstream: tuple[Upstream, str]
) -> None:
    _, base = upstream
    body = {"model": "scripted", "messages": [{"role": "user", "content": "Q"}], "stream": True}

    async def agent(url: str) -> list[httpx.Response]:
        root = url.removesuffix("/v1")
        async with httpx.AsyncClient(timeout=10) as http:
            for task in ("alpha", "alpha", "beta", "alpha"):
                (
                    await http.post(f"{url}/chat/completions", json=body, headers={TASK_HEADER: task})
                ).raise_for_status()
            await http.post(f"{url}/chat/completions", json=body)  # no header: no task
            return [
                await http.post(
                    f"{root}/ipw/tasks/alpha/end", json={"answer": "Paris", "reference": "paris"}
                ),
                await http.post(f"{root}/ipw/tasks/nope/end"),
                await http.post(f"{root}/ipw/tasks/beta/end", json={"answer": "x", "scorer": "bogus"}),
            ]

    _, (ended, unknown, bad_scorer) = await _through_proxy(_config(tmp_path, base), agent)
    assert ended.json() == {"task": "alpha", "turns": 3, "correct": True}
    assert unknown.status_code == 404 and "no open task" in unknown.json()["error"]["message"]
    assert bad_scorer.status_code == 400
    tasks = {
        t["query_id"]: t for t in map(json.loads, (tmp_path / "run" / "tasks.jsonl").read_text().splitlines())
    }
    assert tasks["alpha"]["outcome"] == "answered" and tasks["alpha"]["correct"] is True
    assert [t["turn_index"] for t in tasks["alpha"]["turns"]] == [0, 1, 2]
    assert tasks["beta"]["outcome"] == "completed"  # still open when the proxy stopped
    records = pl.read_ipc_stream(tmp_path / "run" / "records.arrow").sort("request_id")
    assert records["task_id"].to_list()[:4] == [1, 1, 2, 1] and records["task_id"][4] is None
    traces = [json.loads(line) for line in (tmp_path / "run" / "traces.jsonl").read_text().splitlines()]
    assert sorted(len(t.get("turns") or t.get("requests") or []) for t in traces if t.get("task_id"))[-1] == 3


async def test_queries_and_any_header_bytes_pass_and_responses_come_uncompressed(
    tmp_path: Path, upstream: tuple[Upstream, str]
) -> None:
    script, base = upstream
    body = {"model": "scripted", "messages": [{"role": "user", "content": "Q"}]}

    async def agent(url: str) -> httpx.Response:
        async with httpx.AsyncClient(timeout=10) as http:  # it accepts gzip, as clients do
            return await http.post(
                f"{url}/chat/completions?api-version=2024-10-21",
                json=body,
                headers={"x-note": "東京".encode()},  # not Latin-1: passed as the bytes it is
            )

    _, answer = await _through_proxy(_config(tmp_path, base), agent)
    assert answer.status_code == 200 and answer.content == COMPLETION
    assert script.seen == [("api-version=2024-10-21", "identity", "東京")]  # aiohttp reads UTF-8
    record = pl.read_ipc_stream(tmp_path / "run" / "records.arrow").row(0, named=True)
    assert record["status"] == "ok" and record["output_tokens"] == 7


async def test_stopping_with_a_call_in_flight_cancels_the_call_and_its_task(
    tmp_path: Path, upstream: tuple[Upstream, str]
) -> None:
    _, base = upstream
    body = {"model": "scripted", "messages": [{"role": "user", "content": "Q"}], "stream": True}
    headers = {"x-script": "hang", TASK_HEADER: "long"}

    async def agent(url: str) -> None:
        async with httpx.AsyncClient(timeout=10) as http:
            await http.post(f"{url}/chat/completions", json=body, headers={TASK_HEADER: "short"})
            async with http.stream("POST", f"{url}/chat/completions", json=body, headers=headers) as r:
                async for _ in r.aiter_raw():
                    return  # the first event is here: the call is in flight when the proxy stops

    await _through_proxy(_config(tmp_path, base), agent)
    tasks = {
        t["query_id"]: t for t in map(json.loads, (tmp_path / "run" / "tasks.jsonl").read_text().splitlines())
    }
    assert tasks["long"]["outcome"] == "cancelled" and tasks["short"]["outcome"] == "completed"
    records = pl.read_ipc_stream(tmp_path / "run" / "records.arrow").sort("request_id")
    assert records["status"].to_list() == ["ok", "cancelled"]


async def test_an_upstream_that_fails_is_the_callers_error_and_the_runs_record(
    tmp_path: Path, upstream: tuple[Upstream, str]
) -> None:
    _, base = upstream
    body = {"model": "scripted", "messages": [{"role": "user", "content": "Q"}], "stream": True}

    async def agent(url: str) -> bytes:
        async with httpx.AsyncClient(timeout=10) as http:
            try:
                async with http.stream(
                    "POST", f"{url}/chat/completions", json=body, headers={"x-script": "cut"}
                ) as r:
                    return b"".join([piece async for piece in r.aiter_raw()])
            except httpx.RemoteProtocolError:
                return b"cut"

    _, got = await _through_proxy(_config(tmp_path, base), agent)
    assert b"[DONE]" not in got  # the caller sees the stream end early, as the upstream ended it
    record = pl.read_ipc_stream(tmp_path / "run" / "records.arrow").row(0, named=True)
    assert record["status"] == "error" and record["error_type"] == "disconnected"


async def test_a_port_in_use_stops_the_proxy_before_its_baseline_and_leaves_no_directory(
    tmp_path: Path, upstream: tuple[Upstream, str]
) -> None:
    _, base = upstream
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(
            RunError, match=rf"^the proxy cannot listen on 127.0.0.1:{port} .*choose another --port"
        ):
            await run_proxy(_config(tmp_path, base, baseline_s=5), port=port)
    assert time.monotonic() - started < 5  # refused before the 5 s baseline, not after it
    assert not (tmp_path / "run").exists()  # nothing measured: the same command runs once fixed


async def test_an_upstream_that_went_away_answers_502_with_the_reason(tmp_path: Path) -> None:
    script = Upstream()
    app = web.Application()
    app.router.add_get("/v1/models", script.models)
    runner, base = await _serve(app)

    async def agent(url: str) -> httpx.Response:
        await runner.cleanup()  # the server the run started against is gone
        async with httpx.AsyncClient(timeout=10) as http:
            return await http.post(f"{url}/chat/completions", json={"model": "scripted", "messages": []})

    _, answer = await _through_proxy(_config(tmp_path, base, connect_timeout=2), agent)
    assert answer.status_code == 502 and "connect" in answer.json()["error"]["message"].lower()
    record = pl.read_ipc_stream(tmp_path / "run" / "records.arrow").row(0, named=True)
    assert record["status"] == "error" and record["error_type"] == "connect_error"


async def test_the_proxys_own_api_key_replaces_the_callers_and_reaches_no_file(
    tmp_path: Path, upstream: tuple[Upstream, str]
) -> None:
    script, base = upstream

    async def agent(url: str) -> None:
        async with httpx.AsyncClient(timeout=10) as http:
            await http.post(
                f"{url}/chat/completions",
                json={"model": "scripted", "messages": [{"role": "user", "content": "Q"}]},
                headers={"authorization": "Bearer caller-key"},
            )

    await _through_proxy(_config(tmp_path, base, api_key=KEY), agent)
    assert script.authorizations == [f"Bearer {KEY}"]
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_ctrl_c_ends_a_proxy_run_with_its_directory_finished(tmp_path: Path) -> None:
    """The CLI against the built-in simulator: calls through it, then SIGINT."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ipw_async",
            "proxy",
            "--port",
            "0",
            "-o",
            str(out),
            "--baseline-s",
            "0",
            "--no-dashboard",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=os.environ | {"COLUMNS": "200"},
    )
    assert proc.stdout is not None
    url = None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "proxy listening on" in line:
            url = line.split("proxy listening on", 1)[1].split()[0]
            break
    assert url, "".join(seen)
    with httpx.Client(timeout=30) as http:
        model = http.get(f"{url}/models").json()["data"][0]["id"]
        for _ in range(3):
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
            }
            http.post(
                f"{url}/chat/completions", json=body | {"stream": True}, headers={TASK_HEADER: "t"}
            ).raise_for_status()
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, "".join(seen) + rest
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is True and summary["simulated"] is True
    records = pl.read_ipc_stream(out / "records.arrow")
    assert records.height == 3 and records["status"].to_list() == ["ok"] * 3
    assert records["energy_j"].null_count() == 0
    assert summary["tasks"]["count"] == 1
