"""The harness's own health while it measures: event-loop lag and CPU time."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import psutil

from .._clock import now_ns
from ..rundir.files import ThreadCpu

# A timer's lateness samples the loop's stalls whatever its period (a timer falls inside a
# stall with the stall's share of time), so the period sets only how many samples a run gets.
# Each tick of an idle loop is a wakeup, about 100 µs of CPU on a slow VM: 20 a second rather
# than 100 keeps a run paced at a few requests per second from paying 2% of a core for them.
LAG_PERIOD_S = 0.05
RECENT_S = 5.0  # the dashboard's loop lag: the p99 of this last stretch


class LoopLag:
    """How late the event loop runs a timer, one every :data:`LAG_PERIOD_S`, in ms."""

    def __init__(self, period_s: float = LAG_PERIOD_S) -> None:
        self.period_s = period_s
        self.lags_ms: list[float] = []

    async def measure(self) -> None:
        """Measure until cancelled. A plain timer callback, not a sleeping task: a tick costs
        no task step or future."""
        loop = asyncio.get_running_loop()
        period_ns = int(self.period_s * 1e9)

        def tick(due_ns: int) -> None:
            now = now_ns()
            # libuv's millisecond clock can fire a timer a fraction of a ms early: not a lag
            self.lags_ms.append(max(0.0, (now - due_ns) / 1e6))
            nonlocal handle
            handle = loop.call_later(self.period_s, tick, now + period_ns)

        handle = loop.call_later(self.period_s, tick, now_ns() + period_ns)
        try:
            await loop.create_future()
        finally:
            handle.cancel()

    def recent_p99(self) -> float | None:
        recent = self.lags_ms[-max(1, round(RECENT_S / self.period_s)) :]
        return float(np.percentile(recent, 99)) if recent else None


@dataclass(frozen=True)
class _CpuTimes:
    process_s: float  # this process, every thread, and the worker processes
    loop_s: float  # the event loops' own threads: this process's and each worker's main thread
    wall_s: float
    writer_s: float | None  # the run's file writes, on the threads they ran on


class HarnessCpu:
    """CPU time of the harness over the measured phase: the whole of this process and the
    worker and helper processes it was told of, and apart from it the event loops' own threads,
    where the client runs, and the writes of the run's files (``writer``, once they are open).
    Entered and left on the loop's thread (``time.thread_time`` is the caller's)."""

    def __init__(self) -> None:
        self._start: _CpuTimes | None = None
        self._stop: _CpuTimes | None = None
        self._workers: list[psutil.Process] = []
        self._helpers: list[psutil.Process] = []  # the run's, with no client loop: the sampler's
        self.writer: ThreadCpu | None = None

    def track(self, pids: list[int]) -> None:
        self._workers = [psutil.Process(pid) for pid in pids]

    def helper(self, pid: int) -> None:
        """Count a process of the run that runs no client (the sampler's own) in its whole."""
        self._helpers.append(psutil.Process(pid))

    def _now(self) -> _CpuTimes:
        process, loop = time.process_time(), time.thread_time()
        for proc in self._helpers:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                process += times.user + times.system
        for proc in self._workers:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                process += times.user + times.system
                # a worker's loop is its main thread, whose id on Linux is the process's
                main = [t for t in proc.threads() if t.id == proc.pid]
                loop += sum(t.user_time + t.system_time for t in main)
        writer = self.writer.seconds if self.writer is not None else None
        return _CpuTimes(process, loop, time.perf_counter(), writer)

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        self._start = self._now()
        try:
            yield
        finally:
            self._stop = self._now()

    def summary(self) -> dict[str, float | None]:
        start, stop = self._start, self._stop
        if start is None or stop is None:
            return dict.fromkeys(("cpu_s", "cpu_share", "loop_cpu_s", "loop_share", "writer_cpu_s"))
        wall = stop.wall_s - start.wall_s
        cpu = stop.process_s - start.process_s
        loop = stop.loop_s - start.loop_s
        return {
            "cpu_s": cpu,
            "cpu_share": cpu / wall if wall > 0 else None,
            "loop_cpu_s": loop,
            "loop_share": loop / wall if wall > 0 else None,
            "writer_cpu_s": None
            if start.writer_s is None or stop.writer_s is None
            else stop.writer_s - start.writer_s,
        }


@contextlib.contextmanager
def gc_frozen() -> Iterator[None]:
    """No full garbage collection walks the import-time objects meanwhile.

    A full collection walks every object the imports made (polars, pyarrow, numpy): tens of
    ms with the GIL held, which would show up as lateness of the loop and the sampler's ticks.
    Entered once, before the sampler starts: this collection is the last full one.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
