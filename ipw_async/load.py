"""Load generation: closed loop at a fixed concurrency, or open loop at an arrival rate.

The driver schedules units of work and knows nothing of what a unit does: ``execute(unit,
scheduled_ns)`` does it, ``scheduled_ns`` being when the schedule wanted it to start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from ._clock import NS, now_ns

U = TypeVar("U")
Execute = Callable[[U, int], Awaitable[None]]

ARRIVALS = ("poisson", "gamma", "constant")
RAMPS = ("linear", "exponential", "steps")


@dataclass(frozen=True)
class LoadSpec:
    """``concurrency`` (closed loop) or ``rate`` in requests/s (open loop), not both."""

    concurrency: int | None = None
    rate: float | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0  # gamma shape: < 1 burstier than Poisson, > 1 more regular
    max_concurrency: int | None = None
    ramp: str | None = None  # how the load reaches its target: linear, exponential or steps
    ramp_duration: float = 30.0
    ramp_start: float | None = None  # default: 1 in flight, or a tenth of the rate
    ramp_steps: int = 4

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of --concurrency and --rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("--concurrency must be at least 1")
        if self.rate is not None and not self.rate > 0:
            raise ValueError("--rate must be a positive number of requests per second")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"--arrival must be one of {', '.join(ARRIVALS)}")
        if not self.burstiness > 0:
            raise ValueError("--burstiness must be positive")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("--max-concurrency must be at least 1")
        if self.ramp is not None and self.ramp not in RAMPS:
            raise ValueError(f"--ramp must be one of {', '.join(RAMPS)}")
        if not self.ramp_duration > 0:
            raise ValueError("--ramp-duration must be a positive number of seconds")
        if self.ramp_start is not None and not self.ramp_start > 0:
            raise ValueError("--ramp-start must be positive")
        if self.ramp_steps < 1:
            raise ValueError("--ramp-steps must be at least 1")

    @property
    def pool_size(self) -> int:
        """Connections the client needs: the most requests that can be in flight at once."""
        if self.concurrency is not None:
            return self.concurrency
        return self.max_concurrency or 1024

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"c{self.concurrency}"
        return f"r{self.rate:g}"


def inter_arrivals(spec: LoadSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """Seconds between successive arrivals, mean 1/rate."""
    assert spec.rate is not None
    mean = 1.0 / spec.rate
    if spec.arrival == "constant":
        return np.full(n, mean)
    if spec.arrival == "poisson":
        return rng.exponential(mean, n)
    return rng.gamma(spec.burstiness, mean / spec.burstiness, n)


async def drive(
    spec: LoadSpec,
    units: Iterator[U],
    execute: Execute[U],
    rng: np.random.Generator,
    deadline_ns: int | None = None,
) -> None:
    """Execute every unit under the load spec, each with its scheduled time (ns, run clock).

    Stops drawing units at ``deadline_ns``; units already started finish.
    """
    if spec.concurrency is not None:
        await _closed_loop(spec.concurrency, units, execute, deadline_ns)
    else:
        await _open_loop(spec, units, execute, rng, deadline_ns)


async def _closed_loop(
    concurrency: int, units: Iterator[U], execute: Execute[U], deadline_ns: int | None
) -> None:
    async def worker() -> None:
        for unit in units:  # a shared iterator: each worker takes the next one when free
            now = now_ns()
            if deadline_ns is not None and now >= deadline_ns:
                return
            await execute(unit, now)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _open_loop(
    spec: LoadSpec,
    units: Iterator[U],
    execute: Execute[U],
    rng: np.random.Generator,
    deadline_ns: int | None,
) -> None:
    gate = asyncio.Semaphore(spec.max_concurrency) if spec.max_concurrency else None
    in_flight: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()

    async def gated(unit: U, scheduled: int) -> None:
        if gate is None:
            await execute(unit, scheduled)
            return
        async with gate:
            await execute(unit, scheduled)

    try:
        scheduled = now_ns()
        gaps: Iterator[float] = iter(())
        for n, unit in enumerate(units):
            if n:
                gap = next(gaps, None)
                if gap is None:  # draw arrivals in blocks: the unit count may be unbounded
                    gaps = iter(inter_arrivals(spec, 1024, rng).tolist())
                    gap = next(gaps)
                scheduled += int(gap * NS)
            if deadline_ns is not None and scheduled >= deadline_ns:
                break
            # Sleep to an absolute time: lateness never accumulates into the arrival process.
            delay = (scheduled - now_ns()) / NS
            if delay > 0:
                await asyncio.sleep(delay)
            task = loop.create_task(gated(unit, scheduled))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.gather(*in_flight)
    except BaseException:
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        raise
