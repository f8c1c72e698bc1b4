"""The sampler keeps its deadlines, off-loop reads, and a whole log."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from ipw_async._clock import now_ns
from ipw_async.telemetry import OpenSource, Sampler
from ipw_async.telemetry.base import Meter, Reading, SourceInfo, TelemetrySource


class SlowCounter(TelemetrySource):
    """A source whose read blocks for 3 ms, as a driver call might."""

    name = "slow"

    def __init__(self) -> None:
        self.reads = 0

    def open(self) -> SourceInfo:
        return SourceInfo(columns=["slow.energy_j"], meters=[Meter("slow", "counter")])

    def read(self) -> Reading:
        time.sleep(0.003)
        self.reads += 1
        return Reading({"slow.energy_j": float(self.reads)})


async def test_sampler_keeps_deadlines_while_the_loop_is_busy() -> None:
    source = SlowCounter()
    t0 = now_ns()
    sampler = Sampler([OpenSource(source, source.open())], period_s=0.02, t0_ns=t0)
    task = asyncio.create_task(sampler.run())
    end = time.monotonic() + 1.0
    while time.monotonic() < end:  # other work holds the loop in 2 ms slices, ~80% of the time
        busy_until = time.monotonic() + 0.002
        while time.monotonic() < busy_until:
            pass
        # a real loop waits on sockets between callbacks; sleep(0) alone would only ever poll
        await asyncio.sleep(0.0005)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    frame = sampler.log.frame()
    deadlines = frame.get_column("t_ns").to_numpy()
    # deadlines sit on the 20 ms grid: no drift however late a tick woke
    steps = np.diff(deadlines) / 20e6
    assert np.allclose(steps, np.round(steps))
    # every tick up to the last one sampled was either sampled or counted as skipped
    ticks = int((deadlines[-1] - deadlines[0]) // 20_000_000) + 1
    assert frame.height + sampler.skipped >= ticks
    assert frame.height >= 2
    assert (frame.get_column("lateness_ns") >= 0).all()
    # the read took 3 ms but ran in a worker thread, recorded as the read latency
    assert frame.get_column("slow.read_ns").median() >= 3e6
    assert frame.get_column("slow.energy_j").is_sorted()


async def test_sampler_records_a_failed_read_as_null() -> None:
    class Flaky(SlowCounter):
        def read(self) -> Reading:
            self.reads += 1
            return Reading({"slow.energy_j": None if self.reads % 2 else float(self.reads)})

    source = Flaky()
    sampler = Sampler([OpenSource(source, source.open())], period_s=0.01, t0_ns=now_ns())
    for _ in range(6):
        await sampler.sample_once()
    values = sampler.log.frame().get_column("slow.energy_j").to_list()
    assert values[0] is None and values[1] == 2.0
    assert sampler.quality().samples == 6
