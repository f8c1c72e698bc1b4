"""``ipw-async agent``: this machine's telemetry, served to a harness running elsewhere.

The GPU server is often another machine than the harness. The agent runs beside it, opens the
same sources a run would (NVML, RAPL, psutil) and answers reads over HTTP, each stamped on its
own monotonic clock; the harness (``run --telemetry-url``) aligns those stamps to its clock
from round trips to ``/clock``. The harness keeps the schedule, so its sampler, counter probes
and attribution work on a remote source exactly as on a local one.

Endpoints: ``/clock`` (the agent's clock, now), ``/info`` (host and sources), ``/read?source=N``
(one read of a source; ``&counters=1`` reads only its energy counters, for the probes), and
``/stream?period_ms=P`` (every source read each P ms, one JSON line per read, until the
client goes: for dashboards and anyone who wants the agent to keep the schedule).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from ._child import ChildServer
from ._clock import now_ns
from .telemetry import OpenSource, TelemetrySetup
from .telemetry.base import read_time, timed_read

READY_PREFIX = "IPW_ASYNC_AGENT_READY"


class AgentServer:
    """The HTTP face of a set of opened sources. ``shift_ns`` is added to every stamp: a test's
    stand-in for a machine whose clock reads differently."""

    def __init__(self, sources: list[OpenSource], shift_ns: int = 0) -> None:
        self.sources = {s.source.name: s for s in sources}
        self.shift_ns = shift_ns
        self._locks = {name: asyncio.Lock() for name in self.sources}  # a source reads one at a time
        self.app = web.Application()
        self.app.router.add_get("/clock", self._clock)
        self.app.router.add_get("/info", self._info)
        self.app.router.add_get("/read", self._read)
        self.app.router.add_get("/stream", self._stream)

    async def _clock(self, request: web.Request) -> web.Response:
        return web.json_response({"t_ns": now_ns() + self.shift_ns})

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "host": socket.gethostname(),
                "t_ns": now_ns() + self.shift_ns,
                "sources": [
                    {
                        "name": name,
                        "columns": s.info.columns,
                        "meters": [m.as_dict() for m in s.info.meters],
                        "description": s.info.description,
                    }
                    for name, s in self.sources.items()
                ],
            }
        )

    async def _reading(self, name: str, counters: bool = False) -> dict[str, Any]:
        """One read of a source, stamped on this machine's clock (shifted)."""
        source = self.sources[name].source
        read = source.read_counters if counters else source.read
        async with self._locks[name]:
            reading, start, latency = await asyncio.to_thread(timed_read, read)
        stamp = read_time(reading, start, latency)
        return {
            "source": name,
            "t_ns": stamp + self.shift_ns,
            "read_ns": latency,
            "values": reading.values,
            "counter_events": source.counter_events(),
        }

    async def _read(self, request: web.Request) -> web.Response:
        name = request.query.get("source", "")
        if name not in self.sources:
            raise web.HTTPNotFound(text=f"no source {name!r}; this agent has {', '.join(self.sources)}")
        return web.json_response(await self._reading(name, request.query.get("counters") == "1"))

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        try:
            period_ns = int(float(request.query.get("period_ms", "50")) * 1e6)
        except ValueError:
            raise web.HTTPBadRequest(text="period_ms must be a number of milliseconds") from None
        if period_ns < 1_000_000:
            raise web.HTTPBadRequest(text="period_ms must be at least 1")
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        deadline = now_ns()
        while True:  # absolute deadlines: the schedule never drifts; ends when the client goes
            for name in self.sources:
                line = json.dumps(await self._reading(name)) + "\n"
                await response.write(line.encode())
            deadline += period_ns
            await asyncio.sleep(max(0, deadline - now_ns()) / 1e9)


async def serve_agent(setup: TelemetrySetup, host: str, port: int, shift_ns: int = 0) -> None:
    """Serve until cancelled; print the ready line (host and bound port) on stdout."""
    server = AgentServer(setup.opened, shift_ns)
    runner = web.AppRunner(server.app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"{READY_PREFIX} {host} {bound}", flush=True)
    print(f"ipw-async agent listening on http://{host}:{bound}", file=sys.stderr, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        setup.close()


def describe(setup: TelemetrySetup, host: str) -> list[str]:
    """What an agent serves, a line per source, for its start-up message."""
    lines = [f"  {s.source.name}: {s.info.description or ', '.join(s.info.columns)}" for s in setup.opened]
    lines += [f"  {name} skipped: {why}" for name, why in setup.skipped.items()]
    if host in ("127.0.0.1", "localhost", "::1"):
        lines.append("  (listening on loopback only: give --host 0.0.0.0 to serve another machine)")
    return lines


class AgentProcess(ChildServer):
    """``with AgentProcess(["--telemetry", "sim", "--sim-url", url]) as agent: agent.root_url``:
    an agent in a child process on loopback (tests and benchmarks; a user runs ``ipw-async agent``)."""

    what = "the telemetry agent"
    ready_prefix = READY_PREFIX

    def __init__(
        self, args: Sequence[str] = (), host: str = "127.0.0.1", start_timeout: float = 30.0
    ) -> None:
        super().__init__(host, start_timeout)
        self.args = list(args)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "ipw_async", "agent", "--host", self.host, "--port", "0", *self.args]
