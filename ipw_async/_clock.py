"""The one clock every timestamp in a run comes from."""

from __future__ import annotations

import time
from dataclasses import dataclass

# perf_counter_ns is CLOCK_MONOTONIC on Linux: system-wide, so a simulator process on the same
# host stamps on the same clock as the harness (a process on another host does not: its
# stamps need an offset estimated from round trips).
now_ns = time.perf_counter_ns

NS = 1_000_000_000  # nanoseconds per second


@dataclass(frozen=True)
class ClockAnchor:
    """One (monotonic, wall) pair taken at run start, to convert monotonic stamps for output."""

    monotonic_ns: int
    unix_ns: int

    @classmethod
    def take(cls) -> ClockAnchor:
        before = now_ns()
        unix = time.time_ns()
        after = now_ns()
        return cls(monotonic_ns=(before + after) // 2, unix_ns=unix)

    def to_unix_ns(self, monotonic_ns: int) -> int:
        return self.unix_ns + (monotonic_ns - self.monotonic_ns)
