"""Sources on another machine, streamed from its ``ipw-async agent``, on this machine's clock.

The agent keeps the schedule on its own host: it reads its sources every period, probes its
energy counters' update grids itself (a probe over the network would time the network), and
streams each reading stamped on its monotonic clock. A reader thread per agent follows that
stream and keeps the newest reading of each source, and the sampler's tick takes what is there:
it never waits on the network, so a hung agent costs its own meters a gap (imputed and
labelled) and every other meter keeps its ticks. The agent's clock offset from ours is estimated
from round trips to its ``/clock`` (:mod:`ipw_async.clock_sync`), made from the reader thread as
the stream goes, so the estimate follows the clocks' drift.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from .._clock import now_ns
from .._realtime import ask_realtime
from ..clock_sync import OPEN_PINGS, ClockSync
from .base import Meter, Reading, SourceInfo, SourceUnavailable, TelemetrySource
from .grid import CounterGrid
from .http import ERRORS, KeptAlive, Unauthorized, check_status, endpoint

PING_EVERY_S = 0.025  # round trips to the agent's clock, about this often, at random phase
RECONNECT_S = 0.25  # after a stream broke: how long before trying again


class Agent:
    """One agent: its sources, its clock, and the thread that follows its stream."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ca_file: Path | None = None,
        period_s: float = 0.05,
        probe_s: float = 1.0,
        timeout: float = 2.0,
        realtime: bool = True,
    ) -> None:
        self.endpoint = endpoint(url, "an agent URL", "http://gpu-host:9180", token=token, ca_file=ca_file)
        self.url = f"{self.endpoint.scheme}://{self.endpoint.label}"
        self.label = self.endpoint.label  # names its channels: gpu0@gpu-host:9180
        self.clock = ClockSync()
        self.http = KeptAlive(self.endpoint, timeout)
        self.reconnects = 0
        self.realtime = realtime
        self._query = urlencode({"period_ms": period_s * 1000, "probe_s": probe_s})
        # a stream that says nothing for this long is taken for dead and opened again
        self._stream_timeout = max(timeout, 10 * period_s)
        self._lock = threading.Lock()
        self._latest: dict[str, Reading] = {}  # per remote source, the newest reading not yet taken
        self._events: dict[str, dict[str, dict[str, int]]] = {}
        self._grids: dict[str, list[CounterGrid]] = {}  # per local channel, on our clock
        self._stop = threading.Event()
        self._stream: http.client.HTTPConnection | None = None
        self._threads: list[threading.Thread] = []

    def get(self, path: str) -> Any:
        return json.loads(self.http.get(path))

    def ping(self) -> None:
        sent = now_ns()
        remote = int(self.get("/clock")["t_ns"])
        self.clock.add(sent, remote, now_ns())

    def local(self, column: str) -> str:
        """A remote column's name here: ``gpu0.power_w`` → ``gpu0@gpu-host:9180.power_w``."""
        channel, quantity = column.rsplit(".", 1)
        return f"{channel}@{self.label}.{quantity}"

    def sources(self) -> list[RemoteSource]:
        """Every source the agent opened, each ready to read: the clock measured first, then
        the stream followed until :meth:`close`."""
        try:
            info = self.get("/info")
            for _ in range(OPEN_PINGS):
                self.ping()
            sources = [RemoteSource(self, s) for s in info["sources"]]
        except Unauthorized:
            raise SourceUnavailable(
                f"the agent at {self.url} refused this harness; give --telemetry-token-file the "
                "file the agent was started with (its --token-file)"
            ) from None
        except (*ERRORS, ValueError, KeyError, TypeError) as exc:
            raise SourceUnavailable(
                f"no ipw-async agent answers at {self.url} ({exc}); start one there with `ipw-async agent`"
            ) from None
        for target in (self._follow, self._keep_time):
            thread = threading.Thread(target=target, name=f"ipw-async-agent-{self.label}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return sources

    def take(self, source: str) -> Reading | None:
        """The newest reading of ``source`` not yet taken; None when none came since."""
        with self._lock:
            return self._latest.pop(source, None)

    def counter_events(self, source: str) -> dict[str, dict[str, int]]:
        with self._lock:
            return dict(self._events.get(source, {}))

    def grids(self, channels: list[str]) -> dict[str, list[CounterGrid]]:
        with self._lock:
            return {ch: list(self._grids.get(ch, ())) for ch in channels}

    def _keep_time(self) -> None:
        """Round trips to the agent's clock at random phase: pinged as a reading arrives, the
        agent is busy writing the next and the round trip is long (0.4 ms against 0.15 ms on
        loopback), and the offset's bound is half the shortest."""
        if self.realtime:  # a thread woken late lengthens the round trip it times
            ask_realtime()
        phases = random.Random(0)
        while not self._stop.wait(PING_EVERY_S * phases.uniform(0.5, 1.5)):
            with contextlib.suppress(*ERRORS, ValueError, KeyError, TypeError):
                self.ping()

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                self._read_stream()
            except (*ERRORS, ValueError, KeyError, TypeError):
                pass  # the agent went away or hung: its readings stop, as its gap says
            finally:
                self._end_stream()
            if self._stop.wait(RECONNECT_S):
                return
            self.reconnects += 1

    def _read_stream(self) -> None:
        conn = self._stream = self.endpoint.connection(self._stream_timeout)
        conn.request("GET", f"/stream?{self._query}", headers=self.endpoint.headers)
        response = conn.getresponse()
        if response.status != 200:
            check_status(response, response.read())
        while not self._stop.is_set():
            line = response.readline()
            if not line:
                return  # the agent ended the stream
            self._keep(json.loads(line))

    def _keep(self, line: dict[str, Any]) -> None:
        """One streamed reading, its stamp and any new counter grids put on our clock."""
        to_local = self.clock.to_local
        name = line["source"]
        reading = Reading(
            {self.local(c): v for c, v in line["values"].items()}, t_ns=to_local(int(line["t_ns"]))
        )
        grids = {
            f"{channel}@{self.label}": [_on_our_clock(CounterGrid.from_dict(g), to_local) for g in learned]
            for channel, learned in line.get("grids", {}).items()
        }
        events = {f"{ch}@{self.label}": ev for ch, ev in line.get("counter_events", {}).items()}
        with self._lock:
            self._latest[name] = reading
            self._events[name] = events
            for channel, new in grids.items():
                self._grids.setdefault(channel, []).extend(new)

    def _end_stream(self) -> None:
        conn, self._stream = self._stream, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Stop following the stream and close every connection (its sources share them)."""
        self._stop.set()
        stream = self._stream
        if stream is not None and stream.sock is not None:
            with contextlib.suppress(OSError):  # wakes the reader blocked on it
                stream.sock.shutdown(2)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)
        self.http.close()


def _on_our_clock(grid: CounterGrid, to_local: Any) -> CounterGrid:
    return replace(
        grid,
        phase_ns=float(to_local(int(grid.phase_ns))),
        learned_at_ns=float(to_local(int(grid.learned_at_ns))),
    )


class RemoteSource(TelemetrySource):
    """One source of an agent, its channels named ``<channel>@<agent>``."""

    def __init__(self, agent: Agent, info: dict[str, Any]) -> None:
        self.agent = agent
        self.remote_name = info["name"]
        self.name = f"{info['name']}@{agent.label}"
        self._info = info
        self._columns = [agent.local(c) for c in info["columns"]]
        self._counters = [f"{m['channel']}@{agent.label}" for m in info["meters"] if m["kind"] == "counter"]

    def open(self) -> SourceInfo:
        label = self.agent.label
        return SourceInfo(
            columns=self._columns,
            meters=[
                Meter(f"{m['channel']}@{label}", m["kind"], m["accelerator"], m["power_quantity"])
                for m in self._info["meters"]
            ],
            description=f"{self._info['description']} (remote, agent {self.agent.url})",
            simulated=bool(self._info.get("simulated", False)),
        )

    def read(self) -> Reading:
        reading = self.agent.take(self.remote_name)
        if reading is None:
            return Reading(dict.fromkeys(self._columns))
        return Reading({c: reading.values.get(c) for c in self._columns}, reading.t_ns)

    def counter_events(self) -> dict[str, dict[str, int]]:
        return self.agent.counter_events(self.remote_name)

    def learned_grids(self) -> dict[str, list[CounterGrid]]:
        return self.agent.grids(self._counters)

    def close(self) -> None:
        self.agent.close()  # idempotent: the first of its sources to close ends it

    def clock(self) -> dict[str, Any]:
        return self.agent.clock.report() | {"agent": self.agent.url, "reconnects": self.agent.reconnects}
