"""The built-in tools (:data:`~.tools.BUILTIN_TOOLS`: calculator, lookup) as an MCP server.

``python -m ipw_async.workload.builtin_mcp`` serves them on stdio (what ``--mcp builtin``
starts); ``--http PORT`` serves them over streamable HTTP at ``http://127.0.0.1:PORT/mcp``.
Each tool is listed with the schema the in-process toolbox offers, so a run sends the model
the same request either way, and a :class:`~.tools.ToolError` is an ``isError`` result with
its message. Needs the ``mcp`` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from .tools import BUILTIN_TOOLS, ToolError

NAME = "ipw-async-builtin"


async def _list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    specs = [tool.spec() for tool in BUILTIN_TOOLS.values()]
    return types.ListToolsResult(
        tools=[types.Tool(name=s.name, description=s.description, input_schema=s.schema) for s in specs]
    )


async def _call_tool(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    tool = BUILTIN_TOOLS.get(params.name)
    try:
        if tool is None:
            raise ToolError(f"unknown tool {params.name!r}; tools: {', '.join(BUILTIN_TOOLS)}")
        text, failed = tool.call(params.arguments or {}), False
    except ToolError as exc:
        text, failed = str(exc), True
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=failed)


def server() -> Server[Any]:
    """The server, built with the SDK's low-level API (its handlers are the tools above)."""
    return Server(NAME, on_list_tools=_list_tools, on_call_tool=_call_tool)


async def serve_stdio() -> None:
    app = server()
    async with stdio_server() as (read, write):
        await app.run(read, write, app.create_initialization_options())


async def serve_http(port: int, host: str = "127.0.0.1") -> None:
    import uvicorn  # the SDK's own dependency, for its HTTP transport

    app = server().streamable_http_app(host=host)
    await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).serve()


@contextlib.contextmanager
def served_over_http(timeout_s: float = 30.0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """This server over streamable HTTP in a process of its own, on a free loopback port: its
    URL and process, once it accepts connections (for trying ``--mcp URL``; tests and
    benchmarks use it). RuntimeError when it does not start."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", __name__, "--http", str(port)])
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the built-in MCP server did not start over HTTP") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ipw_async.workload.builtin_mcp",
        description="Serve ipw-async's built-in tools (calculator, lookup) over MCP: stdio by default.",
    )
    parser.add_argument(
        "--http", type=int, metavar="PORT", help="serve streamable HTTP at http://127.0.0.1:PORT/mcp instead"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)  # a line per call on stderr would drown a run's output
    anyio.run(serve_stdio if args.http is None else lambda: serve_http(args.http))


if __name__ == "__main__":
    main()
