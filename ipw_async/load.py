"""Load generation: closed loop at a fixed concurrency, open loop at an arrival rate, or a replay
of a trace's own arrival times.

The driver schedules units of work and knows nothing of what a unit does: ``execute(unit,
scheduled_ns)`` does it, ``scheduled_ns`` being when the schedule wanted it to start. A replay's
units carry their time (:class:`Timed`): each is due at start + (its offset − the first unit's)
/ ``speedup``.

A ``--ramp`` takes the load from ``ramp_from`` to its target over ``ramp_duration`` seconds
of the driver's run, then holds the target: see ``LoadSpec.target_at``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np

from ._alarm import sleep_until
from ._clock import NS, now_ns

U = TypeVar("U")
Execute = Callable[[U, int], Awaitable[None]]
OnTarget = Callable[[float], None]

ARRIVALS = ("poisson", "gamma", "constant")
RAMPS = ("linear", "exponential", "steps")
LEAD_NS = 20_000_000  # a timed unit's task is made this long before its time (see _timed_loop)
REPORT_S = 0.25  # how often a smoothly ramping rate is reported: a dashboard frame's interval


@runtime_checkable
class Timed(Protocol):
    """A unit that says when it is due: ``at_ns`` after its trace's first entry (None: untimed)."""

    @property
    def at_ns(self) -> int | None: ...


@dataclass(frozen=True)
class LoadSpec:
    """``concurrency`` (closed loop), ``rate`` in requests/s (open loop), or ``replay`` (the
    units' own times, ``speedup`` times faster): exactly one."""

    concurrency: int | None = None
    rate: float | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0  # gamma shape: < 1 burstier than Poisson, > 1 more regular
    max_concurrency: int | None = None
    ramp: str | None = None  # how the load reaches its target: linear, exponential or steps
    ramp_duration: float = 30.0
    ramp_start: float | None = None  # default: 1 in flight, or a tenth of the rate
    ramp_steps: int = 4
    replay: bool = False  # a trace's arrival times (units that are Timed)
    speedup: float = 1.0  # a replay's trace time runs this many times faster

    def __post_init__(self) -> None:
        if self.replay:
            if self.concurrency is not None or self.rate is not None:
                raise ValueError("--trace replays the trace's own arrival times: leave out --concurrency and --rate")
            if self.ramp is not None:
                raise ValueError("--ramp does not apply to --trace: the trace's times set the load")
        elif (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of --concurrency and --rate")
        if not self.speedup > 0:
            raise ValueError("--speedup must be a positive factor, e.g. 2 to replay twice as fast")
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
        if self.replay:
            return f"trace-x{self.speedup:g}"
        return f"r{self.rate:g}"

    @property
    def target(self) -> float:
        """The load held once any ramp is over: the concurrency, or the rate in requests/s."""
        if self.concurrency is not None:
            return float(self.concurrency)
        assert self.rate is not None
        return self.rate

    @property
    def ramp_from(self) -> float:
        """Where a ramp starts: ``ramp_start``, by default 1 in flight or a tenth of the rate.

        Never above the target: a ramp only rises.
        """
        default = 1.0 if self.concurrency is not None else self.target / 10
        return min(self.ramp_start if self.ramp_start is not None else default, self.target)

    def target_at(self, elapsed_s: float) -> float:
        """The target load ``elapsed_s`` seconds into the driver's run (unrounded).

        linear: ramp_from + (target - ramp_from)·t/D. exponential: ramp_from·(target/ramp_from)^(t/D).
        steps: ``ramp_steps`` stages of D/N seconds each, whose levels are evenly spaced from
        ramp_from (the first stage) to the target (the last, from t = D·(N-1)/N); one step is
        the target throughout. The target from t = D on, and always without a ramp.
        """
        target, duration = self.target, self.ramp_duration
        if self.ramp is None or elapsed_s >= duration:
            return target
        start, frac = self.ramp_from, max(elapsed_s, 0.0) / duration
        if self.ramp == "linear":
            return start + (target - start) * frac
        if self.ramp == "exponential":
            return start * (target / start) ** frac
        n = self.ramp_steps
        # the epsilon: a stage's boundary, k·D/N, computed back to k must not land in stage k-1
        return self._stage_level(min(int(frac * n + 1e-9), n - 1))

    def in_flight_at(self, elapsed_s: float) -> int:
        """The closed loop's level: ``target_at`` rounded half up to whole requests, at least 1."""
        return max(1, math.floor(self.target_at(elapsed_s) + 0.5))

    def _stage_level(self, k: int) -> float:
        n = self.ramp_steps
        if n == 1:
            return self.target
        return self.ramp_from + (self.target - self.ramp_from) * k / (n - 1)

    def time_to_reach(self, load: float) -> float:
        """The earliest time (s) at which ``target_at`` is at least ``load``; inf if never."""
        start, target, duration = self.ramp_from, self.target, self.ramp_duration
        if load > target:
            return math.inf
        if self.ramp is None or load <= start:
            return 0.0
        if self.ramp == "linear":
            return duration * (load - start) / (target - start)
        if self.ramp == "exponential":
            return duration * math.log(load / start) / math.log(target / start)
        n = self.ramp_steps
        if n == 1:
            return 0.0
        return math.ceil((load - start) / (target - start) * (n - 1) - 1e-9) * duration / n

    def cumulative(self, elapsed_s: float) -> float:
        """Λ(t): the integral of ``target_at`` from 0 to ``elapsed_s`` (expected arrivals at a rate)."""
        target, duration, t = self.target, self.ramp_duration, max(elapsed_s, 0.0)
        if self.ramp is None:
            return target * t
        start, within = self.ramp_from, min(t, duration)
        after = target * (t - within)
        if self.ramp == "linear":
            return start * within + (target - start) * within * within / (2 * duration) + after
        if self.ramp == "exponential":
            if start == target:
                return target * t
            growth = math.log(target / start)
            return start * duration / growth * math.expm1(growth * within / duration) + after
        stage = duration / self.ramp_steps
        full = min(int(within / stage), self.ramp_steps)
        done = sum(self._stage_level(k) for k in range(full)) * stage
        if full < self.ramp_steps:
            done += self._stage_level(full) * (within - full * stage)
        return done + after

    def cumulative_inverse(self, load: float) -> float:
        """Λ⁻¹: the time (s) at which ``cumulative`` reaches ``load``."""
        target, duration, u = self.target, self.ramp_duration, max(load, 0.0)
        if self.ramp is None:
            return u / target
        ramped = self.cumulative(duration)
        if u >= ramped:
            return duration + (u - ramped) / target
        start = self.ramp_from
        if self.ramp == "linear":
            half_slope = (target - start) / (2 * duration)
            # the root of half_slope·t² + start·t - u, in a form without cancellation when start ≫ slope
            return 2 * u / (start + math.sqrt(start * start + 4 * half_slope * u))
        if self.ramp == "exponential":
            if start == target:
                return u / target
            growth = math.log(target / start)
            return duration / growth * math.log1p(u * growth / (start * duration))
        stage = duration / self.ramp_steps
        for k in range(self.ramp_steps):
            level = self._stage_level(k)
            if u <= level * stage:
                return k * stage + u / level
            u -= level * stage
        return duration  # reached only through rounding: u < ramped above

    def target_changes(self) -> Iterator[tuple[float, float]]:
        """(time s, target) each time the reported target changes, from (0, its first value).

        For a concurrency, each change of the whole-request level; for a rate, each stage of
        steps, or every ``REPORT_S`` of a smooth ramp and then the target at its end.
        """
        if self.ramp is None:
            yield 0.0, self.target
        elif self.concurrency is not None:
            times = _slot_times(self)
            for t, group in itertools.groupby(range(len(times)), key=times.__getitem__):
                yield t, float(list(group)[-1] + 1)
        elif self.ramp == "steps":
            for k in range(self.ramp_steps):
                yield k * self.ramp_duration / self.ramp_steps, self._stage_level(k)
        else:
            ticks = math.ceil(self.ramp_duration / REPORT_S)
            for k in range(ticks):
                yield k * REPORT_S, self.target_at(k * REPORT_S)
            yield self.ramp_duration, self.target


def _slot_times(spec: LoadSpec) -> list[float]:
    """When each closed-loop worker may start (s): worker i once the level reaches i + 1.

    Half-up rounding puts the level at i + 1 once ``target_at`` reaches i + 0.5; worker 0 runs
    from the start (the level is at least 1). Non-decreasing, since a ramp only rises.
    """
    assert spec.concurrency is not None
    return [0.0] + [spec.time_to_reach(i + 0.5) for i in range(1, spec.concurrency)]


def unit_gaps(spec: LoadSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """Gaps between successive arrivals at a rate of 1 (mean 1): divide by a rate for seconds."""
    if spec.arrival == "constant":
        return np.ones(n)
    if spec.arrival == "poisson":
        return rng.exponential(1.0, n)
    return rng.gamma(spec.burstiness, 1.0 / spec.burstiness, n)


async def drive(
    spec: LoadSpec,
    units: Iterator[U],
    execute: Execute[U],
    rng: np.random.Generator,
    deadline_ns: int | None = None,
    on_target: OnTarget | None = None,
) -> None:
    """Execute every unit under the load spec, each with its scheduled time (ns, run clock).

    Stops drawing units at ``deadline_ns``; units already started finish. A ramp runs from this
    call's start. ``on_target`` gets the target load at the start and whenever it changes.
    """
    start_ns = now_ns()
    reporter: asyncio.Task[None] | None = None
    if on_target is not None and not spec.replay:  # a trace's load has no target to report
        changes = spec.target_changes()
        on_target(next(changes)[1])
        if spec.ramp is not None:
            reporter = asyncio.get_running_loop().create_task(_report(changes, on_target, start_ns))
    try:
        if spec.concurrency is not None:
            await _closed_loop(spec, units, execute, start_ns, deadline_ns)
        elif spec.replay:
            await _timed_loop(spec, replay_times(units, spec.speedup, start_ns), execute, deadline_ns)
        else:
            await _timed_loop(spec, _arrivals(spec, units, rng, start_ns), execute, deadline_ns)
    finally:
        if reporter is not None:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)


async def _report(changes: Iterator[tuple[float, float]], on_target: OnTarget, start_ns: int) -> None:
    for t, value in changes:
        delay = (start_ns + int(t * NS) - now_ns()) / NS
        if delay > 0:
            await asyncio.sleep(delay)
        on_target(value)


async def _closed_loop(
    spec: LoadSpec, units: Iterator[U], execute: Execute[U], start_ns: int, deadline_ns: int | None
) -> None:
    # One worker per unit of the target, each started once the ramp's level reaches it: the
    # level only rises, so the started workers are the level, each with one unit in flight.
    stopped = asyncio.Event()  # a worker found no next unit: none left for the sleepers

    async def worker(begin_ns: int) -> None:
        if begin_ns > start_ns:
            if deadline_ns is not None and begin_ns >= deadline_ns:
                return
            if await _sleep_unless(stopped, (begin_ns - now_ns()) / NS):
                return
        try:
            for unit in units:  # a shared iterator: each worker takes the next one when free
                now = now_ns()
                if deadline_ns is not None and now >= deadline_ns:
                    return
                await execute(unit, now)
        finally:
            stopped.set()

    begins = [start_ns + int(t * NS) for t in _slot_times(spec)]
    await asyncio.gather(*(worker(begin) for begin in begins))


async def _sleep_unless(event: asyncio.Event, delay: float) -> bool:
    """Sleep ``delay`` seconds or until ``event`` is set: True if the event cut it short."""
    try:
        async with asyncio.timeout(max(delay, 0.0)):
            await event.wait()
    except TimeoutError:
        return False
    return True


def _arrivals(
    spec: LoadSpec, units: Iterator[U], rng: np.random.Generator, start_ns: int
) -> Iterator[tuple[U, int]]:
    """Each unit with its arrival time (ns, run clock) at the spec's rate, through any ramp."""
    # Time rescaling: arrivals of the base process at rate 1 ("operational time" u) land at
    # Λ⁻¹(u), so the rate at t is target_at(t); without a ramp Λ⁻¹(u) is u / rate.
    operational = 0.0
    gaps: Iterator[float] = iter(())
    for n, unit in enumerate(units):
        if n:
            gap = next(gaps, None)
            if gap is None:  # draw arrivals in blocks: the unit count may be unbounded
                gaps = iter(unit_gaps(spec, 1024, rng).tolist())
                gap = next(gaps)
            operational += gap
        yield unit, start_ns + int(spec.cumulative_inverse(operational) * NS)


def replay_times(units: Iterator[U], speedup: float, start_ns: int) -> Iterator[tuple[U, int]]:
    """Each unit with when a replay wants it (ns, run clock): ``start_ns`` + (its ``at_ns`` −
    the first unit's) / ``speedup``. Offsets count from the first unit drawn, so a replay whose
    warm-up took the trace's first entries starts its measured part at once."""
    first: int | None = None
    for unit in units:
        if not isinstance(unit, Timed) or unit.at_ns is None:
            raise TypeError(f"a replay needs units that carry their arrival time (at_ns), not {unit!r}")
        if first is None:
            first = unit.at_ns
        yield unit, start_ns + round((unit.at_ns - first) / speedup)


async def _timed_loop(
    spec: LoadSpec, timed: Iterator[tuple[U, int]], execute: Execute[U], deadline_ns: int | None
) -> None:
    """Start each unit at its time, whatever is in flight (up to ``max_concurrency``).

    Each unit's task is made ``LEAD_NS`` ahead and sleeps to its time itself, so at that time
    only its own timer has to fire. Woken there, the driver would make the task, and the task
    would run on the loop's next turn: two turns, each queued behind whatever the loop had (a
    batch of stream events). ``benchmarks/trace_replay.py`` measures the lateness.
    """
    gate = asyncio.Semaphore(spec.max_concurrency) if spec.max_concurrency else None
    in_flight: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()

    async def gated(unit: U, scheduled: int) -> None:
        await sleep_until(scheduled)
        if gate is None:
            await execute(unit, scheduled)
            return
        async with gate:
            await execute(unit, scheduled)

    try:
        for unit, scheduled in timed:
            if deadline_ns is not None and scheduled >= deadline_ns:
                break
            if (ahead := scheduled - LEAD_NS - now_ns()) > 0:  # a loop timer: a ms late is early enough
                await asyncio.sleep(ahead / NS)
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
