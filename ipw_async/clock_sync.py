"""Another clock's offset from ours, from round trips: an agent's, a Ray actor's.

A stamp taken during a round trip lies within half the round trip of its midpoint, so the
sample with the shortest round trip bounds the offset best (the midpoint method, best of many).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._clock import NS

OPEN_PINGS = 32  # round trips before the first reading: the first estimate is already tight
RECENT_PINGS = 256  # the best of the latest so many: at a ping per 50 ms tick, about 13 s
EARLY_PINGS = 256  # the best of the first so many anchors the drift estimate
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
