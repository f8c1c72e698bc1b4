"""Who the recording proxy serves and what it relays: a token beyond loopback, the operator's
API key only on calls that passed it, only the endpoints it measures, bounded bodies and tasks,
and its URL printed where the user sees it."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from aiohttp import web
from rich.console import Console

from ipw_async.dashboard import Dashboard, render
from ipw_async.errors import RunError
from ipw_async.harness import RunConfig
from ipw_async.progress import LinesDisplay
from ipw_async.proxy import MAX_BODY, MAX_TASK_NAME, TASK_HEADER, run_proxy, server
from ipw_async.results import RunResult
from ipw_async.state import RunState

from .test_proxy import COMPLETION, KEY, _config, _serve

TOKEN = "proxy-token-abcdefghijklmnop"
BODY = {"model": "scripted", "messages": [{"role": "user", "content": "Q"}]}


class Echo:
    """An upstream that keeps every request that reached it (method, path, Authorization) and
    answers any path, so a request the proxy should not have forwarded shows here."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        self.anthropic: list[tuple[str | None, str | None]] = []  # x-api-key, anthropic-version

    async def any(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.raw_path, request.headers.get("authorization")))
        self.anthropic.append((request.headers.get("x-api-key"), request.headers.get("anthropic-version")))
        if request.path.endswith("/chat/completions"):
            return web.Response(body=COMPLETION, content_type="application/json")
        return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model"}]})


@pytest.fixture
async def echo() -> AsyncIterator[tuple[Echo, str]]:
    upstream = Echo()
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", upstream.any)
    runner, url = await _serve(app)
    yield upstream, url
    await runner.cleanup()


async def _proxied(
    config: RunConfig,
    upstream: Echo,
    agent: Callable[[str], Awaitable[Any]],
    display: Any = None,
    **options: Any,
) -> tuple[RunResult, Any]:
    """Run the proxy while ``agent`` calls it at its URL (on 127.0.0.1 whatever it is bound
    to); ``upstream`` then keeps only what came through the proxy, not the run's own look at
    its models."""
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    run = asyncio.create_task(run_proxy(config, display, port=0, ready=ready.set_result, **options))
    done, _ = await asyncio.wait({run, ready}, return_when=asyncio.FIRST_COMPLETED)
    if run in done:
        run.result()
    upstream.seen.clear()
    upstream.anthropic.clear()
    try:
        answer = await agent(ready.result().replace("0.0.0.0", "127.0.0.1"))
    finally:
        run.cancel()
    return await run, answer


def _records(tmp_path: Path) -> pl.DataFrame:
    return pl.read_ipc_stream(tmp_path / "run" / "records.arrow")


def test_the_cli_refuses_to_serve_beyond_loopback_without_a_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("IPW_ASYNC_PROXY_TOKEN", "OPENAI_API_KEY")}
    proc = subprocess.run(
        [sys.executable, "-m", "ipw_async", "proxy", "--host", "0.0.0.0", "--port", "0", "-o", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        env=env | {"COLUMNS": "400"},
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: refusing to serve 0.0.0.0 without a token")
    assert "--token-file" in lines[0] and "--insecure" in lines[0]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("options", "api_key", "refused"),
    [
        ({"host": "::"}, None, "without a token"),
        ({"host": "0.0.0.0", "insecure": True}, KEY, "with an API key"),
    ],
)
async def test_an_open_relay_is_refused_before_anything_starts(
    tmp_path: Path, options: dict[str, Any], api_key: str | None, refused: str
) -> None:
    with pytest.raises(RunError, match=refused):
        await run_proxy(_config(tmp_path, "http://127.0.0.1:9/v1", api_key=api_key), port=0, **options)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("api_key", [KEY, None])
async def test_with_a_token_only_callers_that_send_it_are_forwarded_and_recorded(
    tmp_path: Path, echo: tuple[Echo, str], api_key: str | None
) -> None:
    upstream, base = echo

    async def agent(url: str) -> list[int]:
        root = url.removesuffix("/v1")
        async with httpx.AsyncClient(timeout=10) as http:
            refused = [
                await http.post(f"{url}/chat/completions", json=BODY),
                await http.post(f"{url}/chat/completions", json=BODY, headers={"authorization": "Bearer wrong"}),
                await http.post(
                    f"{url}/chat/completions", json=BODY, headers={"authorization": f"Basic {TOKEN}"}
                ),
                await http.get(f"{url}/models"),
                await http.post(f"{root}/ipw/tasks/t/end"),
            ]
            assert all(r.headers["www-authenticate"].startswith("Bearer") for r in refused)
            assert "Authorization: Bearer" in refused[0].json()["error"]["message"]
            good = {"authorization": f"Bearer {TOKEN}", TASK_HEADER: "t"}
            passed = [
                await http.post(f"{url}/chat/completions", json=BODY, headers=good),
                await http.get(f"{url}/models", headers={"authorization": f"bearer {TOKEN}"}),
                await http.post(f"{root}/ipw/tasks/t/end", headers=good),
            ]
        return [r.status_code for r in refused + passed]

    config = _config(tmp_path, base, api_key=api_key)
    _, statuses = await _proxied(config, upstream, agent, host="0.0.0.0", token=TOKEN)
    assert statuses == [401] * 5 + [200] * 3
    # the proxy's token never goes upstream; the operator's key goes only with calls that passed
    authorization = None if api_key is None else f"Bearer {api_key}"
    assert upstream.seen == [
        ("POST", "/v1/chat/completions", authorization),
        ("GET", "/v1/models", authorization),
    ]
    assert _records(tmp_path).height == 1
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


@pytest.mark.parametrize("api_key", [KEY, None])
async def test_an_anthropic_caller_sends_the_token_as_its_key_and_the_operators_key_goes_as_anthropics(
    tmp_path: Path, echo: tuple[Echo, str], api_key: str | None
) -> None:
    upstream, base = echo
    message = {"model": "scripted", "max_tokens": 8, "messages": [{"role": "user", "content": "Q"}]}

    async def agent(url: str) -> list[int]:
        anthropics = {"x-api-key": TOKEN, "anthropic-version": "2023-06-01"}
        async with httpx.AsyncClient(timeout=10) as http:
            answers = [
                await http.post(f"{url}/messages", json=message, headers={"x-api-key": "wrong"}),
                await http.post(f"{url}/messages", json=message, headers={"x-api-key": TOKEN}),
                # no path says /models is Anthropic's: the client's own headers do
                await http.get(f"{url}/models", headers=anthropics),
            ]
        return [a.status_code for a in answers]

    config = _config(tmp_path, base, api_key=api_key)
    _, statuses = await _proxied(config, upstream, agent, host="0.0.0.0", token=TOKEN)
    assert statuses == [401, 200, 200]
    # the token stays here; the operator's key goes where Anthropic reads it, with its API version
    assert upstream.seen == [("POST", "/v1/messages", None), ("GET", "/v1/models", None)]
    assert upstream.anthropic == [(api_key, "2023-06-01")] * 2
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes() and KEY.encode() not in path.read_bytes(), path


async def test_only_the_measured_endpoints_are_forwarded(tmp_path: Path, echo: tuple[Echo, str]) -> None:
    upstream, base = echo

    async def raw(url: str, line: str) -> bytes:
        host, port = url.removeprefix("http://").split("/")[0].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"{line}\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
        answer = await reader.read()
        writer.close()
        return answer

    async def agent(url: str) -> list[Any]:
        async with httpx.AsyncClient(timeout=10) as http:
            refused = [
                await http.post(f"{url}/files", content=b"x"),
                await http.post(f"{url}/embeddings", json={"input": "x"}),
                await http.get(f"{url}/chat/completions"),
                await http.delete(f"{url}/models/scripted"),
                await http.get(f"{url}/models/..%2F..%2Fadmin"),
                await http.get(url.removesuffix("/v1") + "/admin"),
            ]
            dotted = await raw(url, "GET /v1/../admin HTTP/1.1")
            served = await http.get(f"{url}/models/org/a:b")
        return [refused, dotted, served]

    _, (refused, dotted, served) = await _proxied(_config(tmp_path, base), upstream, agent)
    assert [r.status_code for r in refused] == [404] * len(refused)
    message = refused[0].json()["error"]["message"]
    assert message.startswith("POST /v1/files is not served here") and "GET /v1/models" in message
    assert dotted.startswith(b"HTTP/1.1 404")
    assert served.status_code == 200
    assert upstream.seen == [("GET", "/v1/models/org/a:b", None)]  # slashes kept; nothing else reached it


async def test_a_body_over_the_limit_is_refused_with_413(tmp_path: Path, echo: tuple[Echo, str]) -> None:
    upstream, base = echo
    big = b'{"model": "scripted", "prompt": "' + b"x" * MAX_BODY + b'"}'

    async def chunks() -> AsyncIterator[bytes]:  # no content-length: refused once read past the limit
        for i in range(0, len(big), 1 << 20):
            yield big[i : i + (1 << 20)]

    async def agent(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as http:
            return [
                await http.post(f"{url}/completions", content=big),
                await http.post(f"{url}/completions", content=chunks()),
            ]

    _, answers = await _proxied(_config(tmp_path, base), upstream, agent)
    assert [a.status_code for a in answers] == [413, 413]
    assert "32 MiB" in answers[0].json()["error"]["message"]
    assert upstream.seen == [] and _records(tmp_path).height == 0


async def test_task_names_and_open_tasks_are_bounded(
    tmp_path: Path, echo: tuple[Echo, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream, base = echo
    monkeypatch.setattr(server, "MAX_OPEN_TASKS", 2)

    async def agent(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=10) as http:

            async def call(task: str) -> httpx.Response:
                return await http.post(f"{url}/chat/completions", json=BODY, headers={TASK_HEADER: task})

            return [
                await call("x" * (MAX_TASK_NAME + 1)),
                await call("a"),
                await call("b"),
                await call("c"),  # a third open task
                await call("a"),  # an open one goes on
                await http.post(f"{url.removesuffix('/v1')}/ipw/tasks/b/end"),
                await call("c"),  # room again
            ]

    _, answers = await _proxied(_config(tmp_path, base), upstream, agent)
    assert [a.status_code for a in answers] == [400, 200, 200, 429, 200, 200, 200]
    assert f"at most {MAX_TASK_NAME}" in answers[0].json()["error"]["message"]
    assert "2 tasks are open" in answers[3].json()["error"]["message"]
    assert len(upstream.seen) == 4 and _records(tmp_path).height == 4


class _Kept:
    """A display that keeps the state the run gives it."""

    def __init__(self) -> None:
        self.state: RunState | None = None

    async def run(self, state: RunState) -> None:
        self.state = state

    def finish(self, result: RunResult) -> None: ...

    def note(self, message: str) -> None: ...


async def test_the_dashboard_shows_the_proxy_and_its_calls_not_its_connection_limit(
    tmp_path: Path, echo: tuple[Echo, str]
) -> None:
    upstream, base = echo
    display = _Kept()

    async def agent(url: str) -> None:
        async with httpx.AsyncClient(timeout=10) as http:
            (await http.post(f"{url}/chat/completions", json=BODY)).raise_for_status()

    await _proxied(_config(tmp_path, base), upstream, agent, display, max_connections=256)
    assert display.state is not None
    console = Console(file=io.StringIO(), width=120)
    console.print(render(display.state))
    frame = console.file.getvalue()  # type: ignore[attr-defined]
    assert "ipw-async proxy" in frame and "c256" not in frame and "target" not in frame


async def test_the_url_is_printed_above_a_live_dashboard_and_on_stdout_elsewhere(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ipw_async.cli.proxy import announcer

    terminal = io.StringIO()
    dashboard = Dashboard(Console(file=terminal, force_terminal=True, width=120))
    drawing = asyncio.create_task(dashboard.run(RunState("proxy", False, None, None, None)))
    await asyncio.sleep(0.05)
    announcer(dashboard, "upstream")("http://127.0.0.1:4321/v1")
    drawing.cancel()
    await asyncio.gather(drawing, return_exceptions=True)
    assert "proxy listening on http://127.0.0.1:4321/v1 → upstream" in terminal.getvalue()
    # the tests' stdout is no terminal: a script reading it gets the line too
    assert "proxy listening on http://127.0.0.1:4321/v1" in capsys.readouterr().out

    announcer(LinesDisplay(), "upstream")("http://127.0.0.1:4322/v1")
    assert "proxy listening on http://127.0.0.1:4322/v1" in capsys.readouterr().out
