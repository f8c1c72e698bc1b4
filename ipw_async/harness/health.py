"""The harness's own health while it measures: event-loop lag and CPU time."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator

import numpy as np
import psutil

from .._clock import now_ns


class LoopLag:
    """How late the event loop runs a 10 ms timer."""

    def __init__(self, period_s: float = 0.01) -> None:
        self.period_s = period_s
        self.lags_ms: list[float] = []

    async def watch(self) -> None:
        """Measure until cancelled."""
        while True:
            start = now_ns()
            await asyncio.sleep(self.period_s)
            self.lags_ms.append(max(0.0, (now_ns() - start) / 1e6 - self.period_s * 1e3))

    def recent_p99(self, n: int = 500) -> float | None:
        recent = self.lags_ms[-n:]
        return float(np.percentile(recent, 99)) if recent else None


class HarnessCpu:
    """CPU time of the harness over the measured phase: this process (all its threads) and
    the worker processes it was told of."""

    def __init__(self) -> None:
        self._start: tuple[float, float] | None = None
        self._stop: tuple[float, float] | None = None
        self._workers: list[psutil.Process] = []

    def track(self, pids: list[int]) -> None:
        self._workers = [psutil.Process(pid) for pid in pids]

    def _cpu(self) -> float:
        total = time.process_time()
        for proc in self._workers:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        self._start = (self._cpu(), time.perf_counter())
        try:
            yield
        finally:
            self._stop = (self._cpu(), time.perf_counter())

    def summary(self) -> dict[str, float | None]:
        if self._start is None or self._stop is None:
            return {"cpu_s": None, "cpu_share": None}
        cpu, wall = self._stop[0] - self._start[0], self._stop[1] - self._start[1]
        return {"cpu_s": cpu, "cpu_share": cpu / wall if wall > 0 else None}


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
