"""Sources on another machine, read through its ``ipw-async agent``, on this machine's clock.

The agent stamps each read on its own monotonic clock. Its offset from ours is estimated from
round trips to its ``/clock`` (:mod:`ipw_async.clock_sync`). Pings go with the regular reads
(at most one per agent every 20 ms), so the estimate follows the clocks' drift; every reading
is put on our clock with the estimate of its time.
"""

from __future__ import annotations

import json
from typing import Any

from .._clock import now_ns
from ..clock_sync import OPEN_PINGS, ClockSync
from .base import Meter, Reading, SourceInfo, SourceUnavailable, TelemetrySource
from .http import ERRORS, KeptAlive, http_url

PING_EVERY_NS = 20_000_000  # an agent's sources read in one tick share a ping


class Agent:
    """One agent over kept-alive HTTP connections: its sources, its clock."""

    def __init__(self, url: str, timeout: float = 2.0) -> None:
        parts = http_url(url, "an agent URL", "http://gpu-host:9180")
        self.url = f"http://{parts.netloc}"
        self.label = parts.netloc  # names its channels: gpu0@gpu-host:9180
        self.clock = ClockSync()
        self.http = KeptAlive(str(parts.hostname), parts.port or 80, timeout)

    def get(self, path: str) -> Any:
        return json.loads(self.http.get(path))

    def ping(self) -> None:
        sent = now_ns()
        remote = int(self.get("/clock")["t_ns"])
        self.clock.add(sent, remote, now_ns())

    def sources(self) -> list[RemoteSource]:
        """Every source the agent opened, each ready to read; the clock measured first."""
        try:
            info = self.get("/info")
            for _ in range(OPEN_PINGS):
                self.ping()
            sources = [RemoteSource(self, s) for s in info["sources"]]
        except (*ERRORS, ValueError, KeyError, TypeError) as exc:
            raise SourceUnavailable(
                f"no ipw-async agent answers at {self.url} ({exc}); start one there with `ipw-async agent`"
            ) from None
        return sources


class RemoteSource(TelemetrySource):
    """One source of an agent, its channels named ``<channel>@<agent>``."""

    def __init__(self, agent: Agent, info: dict[str, Any]) -> None:
        self.agent = agent
        self.remote_name = info["name"]
        self.name = f"{info['name']}@{agent.label}"
        self._info = info
        self._events: dict[str, dict[str, int]] = {}

    def _local(self, column: str) -> str:
        channel, quantity = column.rsplit(".", 1)
        return f"{channel}@{self.agent.label}.{quantity}"

    def open(self) -> SourceInfo:
        label = self.agent.label
        return SourceInfo(
            columns=[self._local(c) for c in self._info["columns"]],
            meters=[
                Meter(f"{m['channel']}@{label}", m["kind"], m["accelerator"], m["power_quantity"])
                for m in self._info["meters"]
            ],
            description=f"{self._info['description']} (remote, agent {self.agent.url})",
        )

    def _read(self, counters: bool) -> Reading:
        columns = [self._local(c) for c in self._info["columns"]]
        try:
            if not counters and now_ns() - self.agent.clock.last_ns >= PING_EVERY_NS:
                self.agent.ping()
            raw = self.agent.get(f"/read?source={self.remote_name}&counters={int(counters)}")
            values = {self._local(c): v for c, v in raw["values"].items()}
            stamp = int(raw["t_ns"])
        except (*ERRORS, ValueError, KeyError, TypeError):
            return Reading(dict.fromkeys(columns))
        self._events = {f"{ch}@{self.agent.label}": ev for ch, ev in raw.get("counter_events", {}).items()}
        return Reading({c: values.get(c) for c in columns}, t_ns=self.agent.clock.to_local(stamp))

    def read(self) -> Reading:
        return self._read(counters=False)

    def read_counters(self) -> Reading:
        return self._read(counters=True)

    def counter_events(self) -> dict[str, dict[str, int]]:
        return self._events

    def close(self) -> None:
        # the agent's connections are shared by its sources: the first to close ends them, and
        # a read after that opens a fresh one
        self.agent.http.close()

    def clock(self) -> dict[str, Any]:
        return self.agent.clock.report() | {"agent": self.agent.url}
