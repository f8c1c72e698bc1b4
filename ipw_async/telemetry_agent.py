"""``ipw-async agent``: this machine's telemetry, served to a harness running elsewhere.

The GPU server is often another machine than the harness. The agent runs beside it, opens the
same sources a run would (NVML, amdsmi, RAPL, psutil) and keeps the schedule on its own host:
``/stream`` runs the run's own sampler here, counter probes included (probed over a network they
would time the network), and streams each reading stamped on this machine's monotonic clock with
the counters' learned update grids; the harness (``run --telemetry-url``) puts the stamps on its
clock from round trips to ``/clock``.

Endpoints: ``/clock`` (the agent's clock, now), ``/info`` (host and sources), ``/read?source=N``
(one read of a source; ``&counters=1`` reads only its energy counters) and
``/stream?period_ms=P&probe_s=S`` (every source each P ms, one JSON line per source read, until
the client goes). Given a token, every endpoint wants it as a bearer header. No client can make
the agent read its GPUs without pause: streams are bounded in period and in number, and a source
is read for ``/read`` at most every 20 ms (``READ_INTERVAL_S``), whoever asks and however many
connections they open; a ``/read`` within that time of the last is answered with that same
reading, its stamp saying when it was taken. A sampler asking at the run's default cadence
(``--sample-ms 50``) gets a fresh reading each time; a faster one wants ``/stream``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import ssl
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from ._child import ChildServer
from ._clock import now_ns
from .telemetry import OpenSource, Sampler, TelemetrySetup
from .telemetry.base import Reading, SourceInfo, TelemetrySource, read_time, time_column, timed_read
from .telemetry.http import MAX_STREAMS, is_loopback

READY_PREFIX = "IPW_ASYNC_AGENT_READY"
MIN_STREAM_PERIOD_MS = 5.0  # a faster stream would keep the GPU's driver busy answering us
MAX_PROBE_S = 10.0
STREAM_BACKLOG = 256  # rows a slow client may fall behind by before rows are dropped
# /read reads a source (and mode) at most this often: an NVML read takes about 3 ms under the
# source's lock, which the streams' samplers wait on too
READ_INTERVAL_S = 0.02


class _Serialised(TelemetrySource):
    """A source read by one thread at a time: ``/read`` and every stream's sampler share it,
    and a counter's tracker that saw two reads out of order would take the later for a reset.
    The read is timed inside the lock, so waiting for it never moves a stamp."""

    def __init__(self, source: TelemetrySource) -> None:
        self.inner = source
        self.name = source.name
        self._lock = threading.Lock()

    def open(self) -> SourceInfo:
        return self.inner.open()

    def _locked(self, read: Callable[[], Reading]) -> Reading:
        with self._lock:
            reading, start, latency = timed_read(read)
        return Reading(reading.values, read_time(reading, start, latency))

    def read(self) -> Reading:
        return self._locked(self.inner.read)

    def read_counters(self) -> Reading:
        return self._locked(self.inner.read_counters)

    def counter_events(self) -> dict[str, dict[str, int]]:
        return self.inner.counter_events()


class AgentServer:
    """The HTTP face of a set of opened sources. With a ``token`` every request must carry it
    as a bearer header. ``shift_ns`` is added to every stamp: a test's stand-in for a machine
    whose clock reads differently."""

    def __init__(
        self,
        sources: list[OpenSource],
        shift_ns: int = 0,
        token: str | None = None,
        max_streams: int = MAX_STREAMS,
    ) -> None:
        self.opened = [OpenSource(_Serialised(s.source), s.info) for s in sources]
        self.sources = {s.source.name: s for s in self.opened}
        self.shift_ns = shift_ns
        self.max_streams = max_streams
        self.streams = 0
        # per (source, counters only): when /read last read it, and that read (shared by the
        # requests that come within READ_INTERVAL_S of it, in flight or done)
        self._recent: dict[tuple[str, bool], tuple[int, asyncio.Future[dict[str, Any]]]] = {}
        self._expected = f"Bearer {token}".encode() if token else None
        self.app = web.Application(middlewares=[self._auth])
        self.app.router.add_get("/clock", self._clock)
        self.app.router.add_get("/info", self._info)
        self.app.router.add_get("/read", self._read)
        self.app.router.add_get("/stream", self._stream)

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self._expected is not None:
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, self._expected):
                raise web.HTTPUnauthorized(
                    text="this agent wants its token: give the harness --telemetry-token-file "
                    "with the file the agent was started with",
                    headers={"WWW-Authenticate": 'Bearer realm="ipw-async agent"'},
                )
        return await handler(request)

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
                        "simulated": s.info.simulated,
                    }
                    for name, s in self.sources.items()
                ],
            }
        )

    async def _reading(self, name: str, counters: bool = False) -> dict[str, Any]:
        """One read of a source, stamped on this machine's clock (shifted)."""
        source = self.sources[name].source
        read = source.read_counters if counters else source.read
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
        key = (name, request.query.get("counters") == "1")
        now = now_ns()
        last = self._recent.get(key)
        if last is None or now - last[0] >= READ_INTERVAL_S * 1e9:
            last = self._recent[key] = (now, asyncio.ensure_future(self._reading(*key)))
        # shielded: a client that goes does not cancel the read the others wait on
        return web.json_response(await asyncio.shield(last[1]))

    def _query_number(
        self, request: web.Request, name: str, default: float, low: float, high: float
    ) -> float:
        try:
            value = float(request.query.get(name, default))
        except ValueError:
            raise web.HTTPBadRequest(text=f"{name} must be a number") from None
        if not low <= value <= high:
            raise web.HTTPBadRequest(text=f"{name} must be between {low:g} and {high:g}")
        return value

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        period_ms = self._query_number(request, "period_ms", 50.0, MIN_STREAM_PERIOD_MS, 60_000.0)
        probe_s = self._query_number(request, "probe_s", 1.0, 0.0, MAX_PROBE_S)
        if self.streams >= self.max_streams:
            raise web.HTTPServiceUnavailable(
                text=f"this agent serves at most {self.max_streams} streams at once",
                headers={"Retry-After": "1"},
            )
        self.streams += 1
        try:
            return await self._follow(request, period_ms / 1000, probe_s)
        finally:
            self.streams -= 1

    async def _follow(self, request: web.Request, period_s: float, probe_s: float) -> web.StreamResponse:
        """Run a sampler here for this client and write each of its rows as lines."""
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        rows: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=STREAM_BACKLOG)
        loop = asyncio.get_running_loop()

        def put(row: dict[str, Any]) -> None:
            if not rows.full():  # a client that stopped reading loses rows, not the agent's memory
                rows.put_nowait(row)

        # t0 = 0: the rows' stamps are this machine's monotonic clock, as /clock's are
        sampler = Sampler(
            self.opened, period_s, 0, probe_s=probe_s, on_row=lambda row: loop.call_soon_threadsafe(put, row)
        )
        sampling = asyncio.create_task(sampler.run())
        sent: dict[str, int] = {}  # grids already sent, per channel
        try:
            while True:
                next_row = asyncio.ensure_future(rows.get())
                await asyncio.wait({next_row, sampling}, return_when=asyncio.FIRST_COMPLETED)
                if not next_row.done():
                    next_row.cancel()
                    sampling.result()  # the sampler failed: say why
                    return response
                await response.write(self._lines(next_row.result(), sampler, sent))
        except ConnectionError:  # the client went
            return response
        finally:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)

    def _lines(self, row: dict[str, Any], sampler: Sampler, sent: dict[str, int]) -> bytes:
        shift = self.shift_ns
        out = []
        for s in self.opened:
            name = s.source.name
            line: dict[str, Any] = {
                "source": name,
                "t_ns": int(row[time_column(name)]) + shift,
                "read_ns": row[f"{name}.read_ns"],
                "values": {c: row.get(c) for c in s.info.columns},
                "counter_events": s.source.counter_events(),
            }
            grids = {}
            for meter in s.info.meters:
                learned = sampler.grids.get(meter.channel, [])
                if len(learned) > sent.get(meter.channel, 0):
                    grids[meter.channel] = [
                        g.as_dict()
                        | {"phase_ns": g.phase_ns + shift, "learned_at_ns": g.learned_at_ns + shift}
                        for g in learned[sent.get(meter.channel, 0) :]
                    ]
                    sent[meter.channel] = len(learned)
            if grids:
                line["grids"] = grids
            out.append(json.dumps(line))
        return ("\n".join(out) + "\n").encode()


async def serve_agent(
    setup: TelemetrySetup,
    host: str,
    port: int,
    *,
    token: str | None = None,
    tls: ssl.SSLContext | None = None,
    max_streams: int = MAX_STREAMS,
    shift_ns: int = 0,
) -> None:
    """Serve until cancelled; print the ready line (host and bound port) on stdout."""
    server = AgentServer(setup.opened, shift_ns, token, max_streams)
    runner = web.AppRunner(server.app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"{READY_PREFIX} {host} {bound}", flush=True)
    scheme = "https" if tls else "http"
    print(f"ipw-async agent listening on {scheme}://{host}:{bound}", file=sys.stderr, flush=True)
    if token and tls is None and not is_loopback(host):
        print(
            "the token travels unencrypted over plain http: give --tls-cert and --tls-key to serve https",
            file=sys.stderr,
            flush=True,
        )
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        setup.close()


def describe(setup: TelemetrySetup, host: str) -> list[str]:
    """What an agent serves, a line per source, for its start-up message."""
    lines = [f"  {s.source.name}: {s.info.description or ', '.join(s.info.columns)}" for s in setup.opened]
    lines += [f"  {name} skipped: {why}" for name, why in setup.skipped.items()]
    if is_loopback(host):
        lines.append("  (listening on loopback only: give --host 0.0.0.0 to serve another machine)")
    return lines


class AgentProcess(ChildServer):
    """``with AgentProcess(["--telemetry", "sim", "--sim-url", url]) as agent: agent.root_url``:
    an agent in a child process on loopback (tests and benchmarks; a user runs ``ipw-async agent``)."""

    what = "the telemetry agent"
    ready_prefix = READY_PREFIX

    def __init__(
        self,
        args: Sequence[str] = (),
        host: str = "127.0.0.1",
        start_timeout: float = 30.0,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(host, start_timeout, env)
        self.args = list(args)

    @property
    def root_url(self) -> str:
        scheme = "https" if "--tls-cert" in self.args else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "ipw_async", "agent", "--host", self.host, "--port", "0", *self.args]
