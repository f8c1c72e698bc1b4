"""Sources on another machine, read through its ``ipw-async agent``, on this machine's clock.

The agent stamps each read on its own monotonic clock. Its offset from ours is estimated from
round trips to its ``/clock``: a stamp taken during a round trip lies within half the round
trip of the midpoint, so the sample with the shortest round trip bounds the offset best
(the midpoint method, best of many). Pings go with the regular reads (at most one per agent
every 20 ms), so the estimate follows the clocks' drift; every reading is put on our clock with
the estimate of its time.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._clock import NS, now_ns
from .base import Meter, Reading, SourceInfo, SourceUnavailable, TelemetrySource
from .http import ERRORS, KeptAlive, http_url

OPEN_PINGS = 32  # round trips before the first reading: the first estimate is already tight
RECENT_PINGS = 256  # the best of the latest so many: at a ping per 50 ms tick, about 13 s
EARLY_PINGS = 256  # the best of the first so many anchors the drift estimate
PING_EVERY_NS = 20_000_000  # an agent's sources read in one tick share a ping
RTT_KEPT = 4096  # recent round trips kept for the median


@dataclass(frozen=True)
class Ping:
    local_ns: int  # our clock at the round trip's midpoint
    offset_ns: int  # remote − local at that instant, by the midpoint
    rtt_ns: int


class ClockSync:
    """The offset of a remote clock from ours (``remote = local + offset``), in constant memory:
    the recent round trips, the best of all and the best of the first few (for the drift)."""

    def __init__(self) -> None:
        self.count = 0
        self.last_ns = 0  # our clock at the last ping
        self._recent: deque[Ping] = deque(maxlen=RECENT_PINGS)
        self._rtts: deque[int] = deque(maxlen=RTT_KEPT)
        self._best: Ping | None = None
        self._early: Ping | None = None
        self._lock = threading.Lock()

    def add(self, sent_ns: int, remote_ns: int, received_ns: int) -> None:
        mid = (sent_ns + received_ns) // 2
        ping = Ping(mid, remote_ns - mid, received_ns - sent_ns)
        with self._lock:
            self.count += 1
            self.last_ns = received_ns
            self._recent.append(ping)
            self._rtts.append(ping.rtt_ns)
            if self._best is None or ping.rtt_ns < self._best.rtt_ns:
                self._best = ping
            if self.count <= EARLY_PINGS and (self._early is None or ping.rtt_ns < self._early.rtt_ns):
                self._early = ping

    def best(self) -> Ping:
        """The recent round trip that bounds the offset best: the shortest."""
        with self._lock:
            if not self._recent:
                raise RuntimeError("no round trip to the agent yet")
            return min(self._recent, key=lambda p: p.rtt_ns)

    def to_local(self, remote_ns: int) -> int:
        return remote_ns - self.best().offset_ns

    def report(self) -> dict[str, Any]:
        """What ``summary.json`` says of the alignment: the offset, its bound and the drift."""
        with self._lock:
            if self._best is None:
                return {"pings": 0}
            best, early, count = self._best, self._early, self.count
            late = min(self._recent, key=lambda p: p.rtt_ns)
            rtt = np.array(self._rtts, dtype=float)
        out: dict[str, Any] = {
            "pings": count,
            # the offset applied at the end (the recent best), and the run's best round trip's:
            # the true offset lies within half a round trip of its midpoint estimate
            "offset_ms": late.offset_ns / 1e6,
            "uncertainty_ms": late.rtt_ns / 2e6,
            "best_offset_ms": best.offset_ns / 1e6,
            "best_uncertainty_ms": best.rtt_ns / 2e6,
            "rtt_ms": {"min": float(rtt.min()) / 1e6, "p50": float(np.median(rtt)) / 1e6},
            "method": "midpoint of the shortest round trip",
        }
        if early is not None and late.local_ns - early.local_ns > NS:
            out["drift_ppm"] = (late.offset_ns - early.offset_ns) / (late.local_ns - early.local_ns) * 1e6
        return out


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
