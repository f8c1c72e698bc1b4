"""Tools served by MCP servers (``--mcp``), called through the official SDK's ``ClientSession``.

A server is a command started as a subprocess that speaks MCP on stdio, an ``http(s)://`` URL
that speaks streamable HTTP, or ``builtin``: :mod:`.builtin_mcp`, the built-in tools on stdio.
When the workload opens, each server is started and asked for its tools; a server that cannot
be is a one-line RunError, before anything is measured.

An MCP session is an anyio context that must be entered and left in one task, and a transport
that fails cancels whatever runs inside it. So each server's session lives in an owner task of
its own, and calls reach it through a memory stream, each answered on a future: a task that
calls a tool is never inside the session, a timed-out call is cancelled there, and a server
that dies fails the calls in flight and every later one (``MCP server X exited: …``) instead
of hanging them or ending the run.

The ``mcp`` SDK is an extra (``pip install 'ipw-async[mcp]'``): it is imported here only when a
server is opened, so the core install never loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import math
import os
import re
import shlex
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..errors import RunError
from ..telemetry.http import REDACTED, redact_url
from .tools import ToolError, ToolSpec, one_line

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.types import CallToolResult

BUILTIN = "builtin"  # --mcp builtin: the built-in tools as an MCP server on stdio
BUILTIN_COMMAND = (sys.executable, "-m", "ipw_async.workload.builtin_mcp")
START_TIMEOUT_S = 60.0  # to start, initialize and list the tools (a first `npx` may download)
CLOSE_TIMEOUT_S = 10.0  # the SDK bounds a stdio server's shutdown at about 6 s
MAX_LIST_PAGES = 100  # a tools/list that pages without end cannot hang the start


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


@dataclass(frozen=True)
class McpServer:
    """One ``--mcp`` value: ``builtin``, a command line, or an http(s) URL."""

    spec: str

    def command(self) -> list[str]:
        """The program and arguments that start a stdio server."""
        return list(BUILTIN_COMMAND) if self.spec == BUILTIN else shlex.split(self.spec)

    def label(self) -> str:
        """A short name for logs and tasks.jsonl that carries no secret: a URL without its
        password and query; a command's program and what it runs (``python srv.py``,
        ``python -m pkg`` as ``python pkg``), never an option or its value.

        Stricter than :func:`redact_url`, which keeps the parameters not named as credentials:
        MCP servers take their whole configuration in the query, API keys inside it under any
        name (Smithery's ``?config=`` holds base64 JSON), so none of it is kept."""
        if self.spec == BUILTIN:
            return BUILTIN
        if is_url(self.spec):
            return redact_url(urlunsplit(urlsplit(self.spec)._replace(query="", fragment="")))
        program, *args = self.command()
        if args[:1] == ["-m"]:
            args = args[1:]
        runs = (
            args[:1] if args and not args[0].startswith("-") and not any(c.isspace() for c in args[0]) else []
        )
        return " ".join(Path(w).name for w in (program, *runs))

    def hint(self) -> str:
        if is_url(self.spec):
            return "check the URL and that the server is up and speaks MCP over streamable HTTP"
        return "check that the command runs and serves MCP on stdio (run it yourself to see)"


# an option or environment assignment whose value is a secret: --api-key X, --token=X, API_KEY=X
_SECRET = re.compile(r"(?i)^(-{0,2}[\w-]*(?:token|key|secret|password|passwd|auth)[\w-]*)(=.*)?$")


def written(spec: str) -> str:
    """An ``--mcp`` value as run.json keeps it: a URL without its password and query, a command
    without the values of its secret-looking options and assignments (each ``***``). A resumed
    run needs such a server given again (:func:`redacted`)."""
    if is_url(spec):
        query = urlsplit(spec).query
        return McpServer(spec).label() + (f"?{REDACTED}" if query else "")
    words, hide_next = [], False
    for word in shlex.split(spec):
        secret = _SECRET.match(word)
        if hide_next:
            word, hide_next = REDACTED, False
        elif secret and secret.group(2):
            word = f"{secret.group(1)}={REDACTED}"
        elif secret and word.startswith("-"):
            hide_next = True  # --token VALUE: the next word is the value
        words.append(word)
    return shlex.join(words)


def redacted(specs: Sequence[str]) -> bool:
    """Whether run.json's ``--mcp`` values lost a secret (:func:`written`)."""
    return any(REDACTED in spec for spec in specs)


def parse_servers(specs: Sequence[str]) -> tuple[McpServer, ...]:
    """The ``--mcp`` values as servers; ValueError for one that is none."""
    servers = []
    for spec in specs:
        try:
            words = shlex.split(spec)
        except ValueError as exc:
            raise ValueError(f"--mcp {spec!r}: {exc}") from None
        if not words:
            raise ValueError("--mcp needs a command, an http(s):// URL or builtin")
        if is_url(spec) and not urlsplit(spec).hostname:
            raise ValueError(f"--mcp {redact_url(spec)!r}: the URL has no host")
        servers.append(McpServer(spec.strip()))
    return tuple(servers)


def _reason(exc: BaseException) -> str:
    """The innermost cause of a failure, on one line (task groups wrap what failed in them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or ("timed out" if isinstance(exc, TimeoutError) else "no details")
    return one_line(text if isinstance(exc, ToolError) else f"{type(exc).__name__}: {text}")


def _text(result: CallToolResult) -> str:
    """What a tool returned, as the text the model is sent: its text blocks, else its
    structured content as JSON, with other blocks named."""
    parts = []
    for block in result.content:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{block.type} content]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


@dataclass(eq=False)
class _Call:
    name: str
    arguments: dict[str, Any]
    future: asyncio.Future[CallToolResult]


class _Session:
    """One server's session, owned by one task; calls come to it through a stream."""

    def __init__(self, server: McpServer, label: str, timeout_s: float) -> None:
        self.server = server
        self.label = label
        self.timeout_s = timeout_s
        self.tools: list[ToolSpec] = []
        self.exited: str | None = None  # why the server is gone, once it is
        self._send: MemoryObjectSendStream[_Call] | None = None
        self._pending: set[_Call] = set()  # sent, not yet answered
        self._owner: asyncio.Task[None] | None = None
        self._stderr: IO[str] | None = None

    async def start(self) -> None:
        """Start the owner task and wait for the tool list; RunError when it does not come."""
        send, receive = anyio.create_memory_object_stream[_Call](math.inf)
        self._send = send
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._owner = loop.create_task(self._own(receive, ready), name=f"mcp {self.label}")
        try:
            await ready
        except RuntimeError as exc:
            raise RunError(f"MCP server {self.label} did not start ({exc}); {self.server.hint()}") from None

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The text the tool returned; ToolError for an error result, a timeout or a server gone."""
        if self.exited is not None or self._send is None:
            raise ToolError(self._gone())
        call = _Call(name, arguments, asyncio.get_running_loop().create_future())
        self._pending.add(call)
        try:
            self._send.send_nowait(call)
            result = await call.future
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):  # closing as it was called
            raise ToolError(self._gone()) from None
        finally:
            self._pending.discard(call)
        if result.is_error:
            raise ToolError(_text(result) or "the tool reported an error")
        return _text(result)

    async def stop(self) -> None:
        """Close the session and stop the server (cancelled if it does not stop in time)."""
        if self._send is not None:
            self._send.close()
        if self._owner is not None:
            done, _ = await asyncio.wait({self._owner}, timeout=CLOSE_TIMEOUT_S)
            if not done:
                self._owner.cancel()
                await asyncio.gather(self._owner, return_exceptions=True)

    def _gone(self) -> str:
        return f"MCP server {self.label} exited: {self.exited or 'closed'}"

    def _last_words(self) -> str:
        """The last line the server wrote to stderr, if any: often what went wrong."""
        if self._stderr is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0)
            lines = [line for line in self._stderr.read().splitlines() if line.strip()]
            if lines:
                return f"; its stderr ends: {one_line(lines[-1], 200)}"
        return ""

    @contextlib.asynccontextmanager
    async def _connect(self, stderr: IO[str]) -> AsyncIterator[ClientSession]:
        from mcp import ClientSession

        async with contextlib.AsyncExitStack() as stack:
            if is_url(self.server.spec):
                from mcp.client.streamable_http import streamable_http_client

                read, write = await stack.enter_async_context(streamable_http_client(self.server.spec))
            else:
                from mcp import StdioServerParameters, stdio_client

                program, *args = self.server.command()
                # the whole environment (a server's keys live there), and its stderr kept for errors
                params = StdioServerParameters(command=program, args=args, env=dict(os.environ))
                read, write = await stack.enter_async_context(stdio_client(params, errlog=stderr))
            yield await stack.enter_async_context(ClientSession(read, write))

    async def _own(self, calls: MemoryObjectReceiveStream[_Call], ready: asyncio.Future[None]) -> None:
        """The owner task: the session from start to close, and every call's request."""
        with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as self._stderr:
            try:
                async with self._connect(self._stderr) as session, calls:
                    with anyio.fail_after(START_TIMEOUT_S):
                        await session.initialize()
                        self.tools = await self._list(session)
                    if not ready.done():  # else its starter was cancelled
                        ready.set_result(None)
                    async with anyio.create_task_group() as group:
                        async for call in calls:
                            group.start_soon(self._serve, session, call)
                        group.cancel_scope.cancel()  # closing: calls still out are abandoned
            except BaseException as exc:  # the owner ends here, whatever ended it
                self.exited = self.exited or _reason(exc) + self._last_words()
                if not ready.done():
                    ready.set_exception(RuntimeError(self.exited))
                if not isinstance(exc, Exception):
                    raise
            finally:
                self.exited = self.exited or "closed"
                calls.close()
                for call in list(self._pending):  # in flight or queued: none is left waiting
                    if not call.future.done():
                        call.future.set_exception(ToolError(self._gone()))

    async def _list(self, session: ClientSession) -> list[ToolSpec]:
        from mcp.types import PaginatedRequestParams

        tools, cursor = [], None
        for _ in range(MAX_LIST_PAGES):
            page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools += [ToolSpec(t.name, t.description or "", t.input_schema, self.label) for t in page.tools]
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    async def _serve(self, session: ClientSession, call: _Call) -> None:
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED

        outcome: CallToolResult | ToolError
        try:
            with anyio.fail_after(self.timeout_s):
                outcome = await session.call_tool(call.name, call.arguments)
        except TimeoutError:
            outcome = ToolError(f"timed out after {self.timeout_s:g} s")
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:  # the server is gone: later calls fail at once
                self.exited = self.exited or "connection closed" + self._last_words()
                outcome = ToolError(self._gone())
            else:
                outcome = ToolError(f"MCP error {exc.code}: {exc.message}")
        except Exception as exc:  # the SDK's or the transport's: this call fails, not the run
            outcome = ToolError(_reason(exc))
        if call.future.done():  # its caller was cancelled
            return
        if isinstance(outcome, ToolError):
            call.future.set_exception(outcome)
        else:
            call.future.set_result(outcome)


class McpTools:
    """The tools of the ``--mcp`` servers (a :class:`~.tools.ToolSource`). Tool names must be
    unique across the servers: a name two servers offer stops the run, naming both."""

    def __init__(self, specs: Sequence[str], timeout_s: float) -> None:
        if importlib.util.find_spec("mcp") is None:
            raise RunError("--mcp needs the MCP SDK: pip install 'ipw-async[mcp]'")
        try:
            self.servers = parse_servers(specs)
        except ValueError as exc:
            raise RunError(str(exc)) from None
        self.timeout_s = timeout_s
        self.tools: dict[str, ToolSpec] | None = None  # known once opened
        self._by_tool: dict[str, _Session] = {}

    def labels(self) -> list[str]:
        """Each server's label, made unique (``#2`` on a repeat)."""
        seen: dict[str, int] = {}
        out = []
        for server in self.servers:
            label = server.label()
            seen[label] = seen.get(label, 0) + 1
            out.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
        return out

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[None]:
        """Every server started and listed (at once), then closed however the run ends."""
        sessions = [
            _Session(s, label, self.timeout_s) for s, label in zip(self.servers, self.labels(), strict=True)
        ]
        try:
            results = await asyncio.gather(*(s.start() for s in sessions), return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            self.tools, self._by_tool = _merge(sessions)
            yield
        finally:
            self.tools, self._by_tool = None, {}
            await asyncio.gather(*(s.stop() for s in sessions))

    async def run(self, name: str, arguments: dict[str, Any]) -> str:
        return await self._by_tool[name].call(name, arguments)


def _merge(sessions: list[_Session]) -> tuple[dict[str, ToolSpec], dict[str, _Session]]:
    """The servers' tools by name; RunError for a name two of them offer."""
    tools: dict[str, ToolSpec] = {}
    owner: dict[str, _Session] = {}
    for session in sessions:
        for tool in session.tools:
            if tool.name in owner:
                raise RunError(
                    f"tool {tool.name!r} is offered by two MCP servers, {owner[tool.name].label} and "
                    f"{session.label}; give only one of them"
                )
            tools[tool.name], owner[tool.name] = tool, session
    return tools, owner


__all__ = ["BUILTIN", "McpServer", "McpTools", "parse_servers", "written"]
