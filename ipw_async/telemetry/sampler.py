"""The deadline-scheduled sampler and the telemetry log it keeps for the whole run."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl

from .._clock import NS, now_ns
from .._realtime import ask_realtime
from ..stats import distribution
from .base import Meter, OpenSource, Reading, read_time, time_column, timed_read
from .cadence import (
    CLEARANCE_STEP_NS,
    PIN_PATIENCE,
    PROBE_EVERY_NS,
    PROBE_PATIENCE,
    SECOND_PROBE_AFTER_NS,
    learn_grid,
    settled,
)
from .grid import PROBE_INTERVAL_NS, CounterGrid
from .process import SamplerProcess, SamplerProcessError, grids_of


class TelemetryLog:
    """Columnar and whole: a query can last minutes, so nothing is dropped.

    Columns: ``t_ns`` (the tick's deadline), ``lateness_ns``, and per source ``<name>.t_ns``
    (the instant its values describe), ``<name>.read_ns`` (read latency) and its value columns.
    All times are ns since the run's start.
    """

    def __init__(self, sources: list[OpenSource]) -> None:
        self.sources = sources
        names = ["t_ns", "lateness_ns"]
        for s in sources:
            names += [time_column(s.source.name), f"{s.source.name}.read_ns", *s.info.columns]
        self.columns: dict[str, list[float | int | None]] = {n: [] for n in names}
        self._lock = threading.Lock()  # the sampler thread appends while the loop reads

    def __len__(self) -> int:
        return len(self.columns["t_ns"])

    def append(self, row: dict[str, float | int | None]) -> None:
        with self._lock:
            for name, values in self.columns.items():
                values.append(row.get(name))

    @property
    def schema(self) -> dict[str, pl.DataType]:
        return {
            n: pl.Int64() if n.endswith(("t_ns", "read_ns", "lateness_ns")) else pl.Float64()
            for n in self.columns
        }

    def frame(self, since: int = 0) -> pl.DataFrame:
        """Rows from ``since`` on (the rows a writer has not yet written)."""
        with self._lock:
            return pl.DataFrame({n: v[since:] for n, v in self.columns.items()}, schema=self.schema)

    def recent(self, column: str, n: int) -> list[float | int]:
        """The last ``n`` readings of a column, failed reads left out."""
        return [v for v in self.columns[column][-n:] if v is not None]

    def stamps(self, time_col: str, column: str) -> np.ndarray:
        """When each reading of ``column`` that came back was taken (failed reads left out)."""
        with self._lock:
            pairs = [
                t
                for t, v in zip(self.columns[time_col], self.columns.get(column, ()), strict=False)
                if v is not None
            ]
        return np.array(pairs, dtype=float)

    def latest(self, column: str) -> float | None:
        for value in reversed(self.columns.get(column, ())):
            if value is not None:
                return float(value)
        return None


@dataclass
class SamplerQuality:
    period_ms: float
    samples: int = 0
    skipped_ticks: int | None = 0  # None: no sampler ran (no telemetry source)
    lateness_ms: dict[str, float | int | None] = field(default_factory=dict)
    read_latency_ms: dict[str, dict[str, float | int | None]] = field(default_factory=dict)
    scheduling: str | None = "normal"  # the sampler thread's: "real-time", or "normal" and why
    runs_in: str | None = "thread"  # of the run's process, or "process" (a process of its own)
    failure: str | None = None  # why it stopped before the run's end, where it did
    # per meter: the longest time between two of its readings (a hung agent, skipped ticks)
    # beside its counter's update period, which a gap longer than blurs
    gaps: dict[str, dict[str, float | None]] = field(default_factory=dict)
    # the sampler thread's own CPU (its reads, probes and rows) and its share of one core over
    # the time it ran: a cost apart from the client's, whatever the load
    cpu_s: float | None = None
    cpu_share: float | None = None


# While the sampler thread waits for the GIL, the loop's thread keeps it for up to this long
# (CPython's default is 5 ms, more than the whole lateness budget).
SWITCH_INTERVAL_S = 0.0005


class _SwitchInterval:
    """The process-wide GIL switch interval, shortened while any sampler runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._saved = 0.0

    def hold(self) -> None:
        with self._lock:
            if self._holders == 0:
                self._saved = sys.getswitchinterval()
                sys.setswitchinterval(min(self._saved, SWITCH_INTERVAL_S))
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                sys.setswitchinterval(self._saved)


_switch_interval = _SwitchInterval()


@dataclass
class _Ticking:
    """The sampler's thread: ticking here, or following its own process."""

    thread: threading.Thread
    stop: threading.Event
    failed: asyncio.Future[None]


class Sampler:
    """Reads every source once per period, at absolute deadlines so it never drifts.

    :meth:`run` is a task on the run's loop, but the ticks are kept by a thread of its own:
    a loop streaming hundreds of responses runs callbacks in batches of several ms, and a
    timer on it fires that late. The thread sleeps to each deadline, reads every source
    (blocking reads, off the loop) and appends the row. When a tick is missed entirely it is
    skipped (and counted), not bunched up. For ``probe_s`` at the start, and again every
    20 s, it also reads about every 2 ms, to learn when each energy counter updates (see
    :mod:`.cadence`); a counter too slow to show its grid in that time is probed up to five
    times longer, and one whose phase its reads have not yet pinned up to twice as long.
    After each probe the ticks move to read the counters clear of their updates. With
    ``realtime`` the thread asks the OS for real-time scheduling: on a machine whose cores
    are all busy (the server beside the harness) an ordinary thread can wait milliseconds to
    be run.
    """

    def __init__(
        self,
        sources: list[OpenSource],
        period_s: float,
        t0_ns: int,
        realtime: bool = True,
        probe_s: float = 1.0,
        on_row: Callable[[dict[str, float | int | None]], None] | None = None,
        process: bool = False,
    ) -> None:
        self.period_ns = int(period_s * NS)
        self.t0_ns = t0_ns
        self.realtime = realtime
        self.probe_ns = int(probe_s * NS)
        self._phases = random.Random(0)  # where between updates each probe read falls
        self._stamp_lags: deque[int] = deque(maxlen=32)  # counter read stamps after their tick, ns
        self.scheduling = "normal"
        self.log = TelemetryLog(sources)
        self.skipped = 0
        self.cpu_s: float | None = None  # the sampler thread's CPU, once it has stopped
        self.cpu_share: float | None = None
        self.grids: dict[str, list[CounterGrid]] = {}  # per counter meter, one per probe that found it
        self._sources = sources
        # sources that learn their own counters' grids (an agent) are not probed from here
        self._has_counter = [
            any(m.kind == "counter" for m in s.info.meters) and s.source.learned_grids() is None
            for s in sources
        ]
        self._on_row = on_row  # called on the sampler's thread with each row logged
        self.distrusted: dict[str, str] = {}  # counter channel -> why its power is used instead
        # the ticks in a process of their own (:mod:`.process`), and what it last said
        self.process = process
        self.pid: int | None = None  # that process's, once started
        self._child: SamplerProcess | None = None
        self._ticking: _Ticking | None = None  # its thread, once sampling (or following the process)
        self.failure: str | None = None  # why it stopped sampling before the run ended
        self._child_events: dict[str, dict[str, int]] = {}

    def distrust(self, channel: str, reason: str) -> None:
        """Integrate this counter meter's power from now on, for ``reason``."""
        self.distrusted[channel] = reason

    def _grids(self, s: OpenSource, channel: str) -> tuple[CounterGrid, ...]:
        own = s.source.learned_grids()
        if own is None:
            return tuple(self.grids.get(channel, ()))
        t0 = self.t0_ns
        return tuple(
            replace(g, phase_ns=g.phase_ns - t0, learned_at_ns=g.learned_at_ns - t0)
            for g in own.get(channel, ())
        )

    @property
    def meters(self) -> list[Meter]:
        """Every source's meters, each counter with the update grids the probes learned."""
        out = []
        for s in self._sources:
            for m in s.info.meters:
                m = replace(m, source=s.source.name, grids=self._grids(s, m.channel))
                if m.channel in self.distrusted and m.kind == "counter":
                    m = replace(m, kind="power", distrusted=self.distrusted[m.channel])
                out.append(m)
        return out

    def counter_events(self) -> dict[str, dict[str, int]]:
        """Resets and wraps of every energy counter so far, by channel (none: not listed)."""
        if self.process:
            return dict(self._child_events)
        return {
            ch: ev for s in self._sources for ch, ev in s.source.counter_events().items() if any(ev.values())
        }

    def clocks(self) -> dict[str, dict[str, Any]]:
        """Per source on another machine's clock, how its stamps were aligned to this one's."""
        return {s.source.name: c for s in self._sources if (c := s.source.clock()) is not None}

    async def processes(self) -> dict[str, list[int] | None]:
        """The processes computing on each device that can tell, by channel (off the loop: an
        NVML query takes milliseconds)."""

        def ask() -> dict[str, list[int] | None]:
            return {ch: pids for s in self._sources for ch, pids in s.source.processes().items()}

        return await asyncio.to_thread(ask)

    def _read_all(self) -> list[tuple[Reading, int, int]]:
        return [timed_read(s.source.read) for s in self._sources]

    def _read_counters(self) -> list[tuple[Reading, int, int] | None]:
        return [
            timed_read(s.source.read_counters) if counter else None
            for s, counter in zip(self._sources, self._has_counter, strict=True)
        ]

    def _row(
        self, deadline: int, woke: int, reads: list[tuple[Reading, int, int]]
    ) -> dict[str, float | int | None]:
        t0 = self.t0_ns
        row: dict[str, float | int | None] = {"t_ns": deadline - t0, "lateness_ns": woke - deadline}
        for s, (reading, start, latency) in zip(self._sources, reads, strict=True):
            name = s.source.name
            row[time_column(name)] = read_time(reading, start, latency) - t0
            row[f"{name}.read_ns"] = latency
            row.update(reading.values)
        return row

    def _append(self, row: dict[str, float | int | None]) -> None:
        self.log.append(row)
        if self._on_row is not None:
            self._on_row(row)

    def reading_now(self) -> dict[str, float | int | None]:
        """Every source read once now, as a row (blocking: off the loop)."""
        t = now_ns()
        return self._row(t, t, self._read_all())

    async def start(self) -> None:
        """Start the sampler's own process, where it has one, and follow it from now: its
        sources open there before the run measures, and what it reads is logged as it comes,
        the run's first tick not waiting for it (raises why it cannot start)."""
        if self.process and self._ticking is None and self._sources:
            # kept before it starts: a run stopped meanwhile still ends it (close)
            self._child = child = SamplerProcess(
                self._sources, self.period_ns / NS, self.t0_ns, self.realtime, self.probe_ns / NS
            )
            await asyncio.to_thread(child.start)
            self.pid = child.pid
            self._ticking = self._begin(functools.partial(self._follow, child))

    def close(self) -> None:
        """Stop sampling, and end the sampler's own process where it is still there (a run
        that never got to sample)."""
        if self._ticking is not None:
            self._ticking.stop.set()
        if self._child is not None:
            self._child.stop()
        if self._ticking is not None:
            self._ticking.thread.join(timeout=5)

    async def sample_once(self) -> None:
        """One reading now: the run's last. A sampler in its own process takes it as it ends
        (ended here where the run never got to end it); one that died has none, rather than
        one read here by counters that never tracked the device's (a RAPL wrap)."""
        if not self._sources:
            return
        if self._child is None:
            self._append(await asyncio.to_thread(self.reading_now))
            return
        ticking = self._ticking
        if ticking is not None and ticking.thread.is_alive():
            ticking.stop.set()
            self._child.end()
            await asyncio.to_thread(ticking.thread.join, 10)
            await asyncio.to_thread(self._child.stop)

    async def run(self) -> None:
        """Sample until cancelled; the caller takes a final sample after the last request."""
        if not self._sources:
            return
        await self.start()
        threaded = self._ticking is None
        if threaded:
            _switch_interval.hold()
            self._ticking = self._begin(self.tick)
        ticking = self._ticking
        assert ticking is not None
        try:
            await ticking.failed
        finally:
            ticking.stop.set()
            if self._child is not None:
                self._child.end()  # its last reading, then its output ends
            try:
                await asyncio.to_thread(ticking.thread.join)
            finally:
                ticking.thread.join()  # cancelled again: wait here, never leave it reading
                if threaded:
                    _switch_interval.release()
                elif self._child is not None:
                    self._child.stop()

    def _begin(self, target: Callable[[threading.Event], None]) -> _Ticking:
        """``target`` on a thread of its own until its stop event; what it raises fails the
        future (run awaits it: on the loop, as an on-loop read would)."""
        loop = asyncio.get_running_loop()
        failed: asyncio.Future[None] = loop.create_future()
        stop = threading.Event()

        def fail(exc: BaseException) -> None:
            if not failed.done():
                failed.set_exception(exc)
                failed.exception()  # retrieved: a sampler closed before it ran awaits nothing

        def ticks() -> None:
            try:
                target(stop)
            except BaseException as exc:
                self.failure = str(exc)
                with contextlib.suppress(RuntimeError):  # the loop has closed: nobody to tell
                    loop.call_soon_threadsafe(fail, exc)

        thread = threading.Thread(target=ticks, name="ipw-async-sampler", daemon=True)
        thread.start()
        return _Ticking(thread, stop, failed)

    def _follow(self, child: SamplerProcess, stop: threading.Event) -> None:
        child.follow(self._take)
        if not stop.is_set():
            raise SamplerProcessError(
                f"the sampler's process ended on its own ({child.ended()}): telemetry stopped there"
            )

    def _take(self, message: dict[str, Any]) -> None:
        """One message of the sampler's process: a row with what changed, or its end."""
        if "error" in message:
            raise SamplerProcessError(message["error"])
        for channel, new in grids_of(message).items():
            self.grids.setdefault(channel, []).extend(new)
        if "events" in message:
            self._child_events = message["events"]
        if "row" in message:
            self.skipped, self.scheduling = message["skipped"], message["scheduling"]
            self._append(message["row"])
        if "end" in message:
            self.cpu_s, self.cpu_share = message["end"]["cpu_s"], message["end"]["cpu_share"]

    def tick(self, stop: threading.Event) -> None:
        """Read every source at each deadline on the calling thread until ``stop``."""
        cpu = time.thread_time()
        start = now_ns()
        try:
            self._tick_until(stop)
        finally:
            self.cpu_s, wall = time.thread_time() - cpu, (now_ns() - start) / NS
            self.cpu_share = self.cpu_s / wall if wall > 0 else None

    def _tick_until(self, stop: threading.Event) -> None:
        self.scheduling = ask_realtime() if self.realtime else "normal (real-time not asked for)"
        start = deadline = probe_start = probe_next = now_ns()
        probe_end = start + self.probe_ns
        probing = self.probe_ns > 0 and any(self._has_counter)
        probe: list[list[tuple[Reading, int, int] | None]] = []
        probes = 0  # probes that learned their grids
        while not stop.is_set():
            wake = min(deadline, probe_next) if probing else deadline
            delay = wake - now_ns()
            if delay > 0 and stop.wait(delay / NS):
                break
            woke = now_ns()
            full = self._read_all() if woke >= deadline else None
            learned = False
            if probing and woke >= probe_next:
                probe.append(self._read_counters() if full is None else list(full))
                learned = woke >= probe_end and self._learn_grids(probe, woke - probe_start)
                if learned:
                    probe = []
                    began, probe_start = probe_start, start + ((woke - start) // PROBE_EVERY_NS + 1) * PROBE_EVERY_NS
                    probes += 1
                    if probes == 1:
                        # one probe times a slow counter's period only to some 100 ppm (13
                        # updates of a 77 ms one: 10 ms adrift by 12 s); the next, soon after
                        # (from when the first began: however long it went on to pin its
                        # phase), pins it from the whole span between them (cadence.chained)
                        probe_start = min(probe_start, max(woke, began + SECOND_PROBE_AFTER_NS))
                    probe_next = probe_start
                    probe_end = probe_start + self.probe_ns
                else:
                    if woke >= probe_end:  # a counter too slow to show its grid yet: go on
                        probe_end = woke + self.probe_ns
                    # 1–3 ms on: on a fixed 2 ms grid every read would meet a 10 ms counter's
                    # updates at the same point, and all the updates would be timed off alike,
                    # by up to a millisecond (then a 50 ms tick near an update saw the one
                    # before). On from the schedule, not from a slow read's end: 4 ms apart
                    # under load, a 10 ms counter looked as fast as its reads.
                    step = int(PROBE_INTERVAL_NS * self._phases.uniform(0.5, 1.5))
                    probe_next = max(probe_next + step, now_ns())
            if full is not None:
                stamps = [read_time(*read) for read, c in zip(full, self._has_counter, strict=True) if c]
                if stamps:
                    self._stamp_lags.append(max(stamps) - deadline)
                self._append(self._row(deadline, woke, full))
                deadline += self.period_ns
                behind = now_ns() - deadline
                if behind > 0:
                    missed = behind // self.period_ns + 1
                    self.skipped += int(missed)
                    deadline += int(missed) * self.period_ns
            if learned:
                deadline += self._clear_of_updates(deadline)
        if probe and now_ns() - probe_start >= self.probe_ns:  # one cut short shows too little
            self._learn_grids(probe, None)

    def _clear_of_updates(self, deadline: int) -> int:
        """How much later to put the ticks so that their counter reads fall between updates.

        A read stamped just before an update, on a grid learned a fraction of a ms off (or
        drifting by a period off by some µs), is timed to the update after the one it saw: a
        whole period of energy in the wrong place. Reads as far from every update as the
        tick period allows stay right however the grid drifts (a 50 ms tick and a 20 ms
        counter: 5 ms either side)."""
        grids = [g[-1] for g in self.grids.values() if g and g[-1].period_ns > 0]
        if not grids or not self._stamp_lags:
            return 0
        lag = float(np.median(self._stamp_lags))
        ticks = deadline - self.t0_ns + lag + np.arange(64) * self.period_ns
        shifts = np.arange(0, self.period_ns, CLEARANCE_STEP_NS)
        reads = shifts[:, None] + ticks[None, :]
        clearance = np.full(shifts.size, np.inf)
        for g in grids:
            since = np.mod(reads - g.phase_ns, g.period_ns)
            clearance = np.minimum(clearance, np.minimum(since, g.period_ns - since).min(axis=1))
        return int(shifts[int(np.argmax(clearance))])

    def _learn_grids(self, probe: list[list[tuple[Reading, int, int] | None]], elapsed_ns: int | None) -> bool:
        """Learn every counter's grid from a probe's reads, ``elapsed_ns`` long (None: it has
        to end now); False (and nothing kept) while the probe may go on: up to
        ``PROBE_PATIENCE`` times its length for a counter that has shown too few updates, up
        to ``PIN_PATIENCE`` times for one whose phase its reads have not pinned yet."""
        patient = elapsed_ns is not None and elapsed_ns < PROBE_PATIENCE * self.probe_ns
        pinning = elapsed_ns is not None and elapsed_ns < PIN_PATIENCE * self.probe_ns
        learned: dict[str, CounterGrid | None] = {}
        pinned = True
        for i, s in enumerate(self._sources):
            source_reads = [reads[i] for reads in probe]
            for meter in s.info.meters:
                if meter.kind != "counter":
                    continue
                points = [
                    (read_time(reading, start, latency), value)
                    for reading, start, latency in filter(None, source_reads)
                    if (value := reading.values.get(meter.energy_column)) is not None
                ]
                t = np.array([p[0] for p in points], dtype=float) - self.t0_ns
                e = np.array([p[1] for p in points], dtype=float)
                grid = learned[meter.channel] = learn_grid(t, e)
                pinned = pinned and (grid is None or settled(t, e, grid))
        if (patient and None in learned.values()) or (pinning and not pinned):
            return False
        for channel, grid in learned.items():
            if grid is not None:
                self.grids.setdefault(channel, []).append(grid)
        return True

    def quality(self) -> SamplerQuality:
        if not self._sources:  # nothing was read: no tick was on time, late or skipped
            return SamplerQuality(
                period_ms=self.period_ns / 1e6,
                samples=0,
                skipped_ticks=None,
                lateness_ms=distribution([]),
                scheduling=None,
                runs_in=None,
            )
        cols = self.log.columns

        def ms(column: str) -> dict[str, float | int | None]:
            return distribution([v / 1e6 for v in cols[column] if v is not None])

        return SamplerQuality(
            period_ms=self.period_ns / 1e6,
            samples=len(self.log),
            skipped_ticks=self.skipped,
            lateness_ms=ms("lateness_ns"),
            read_latency_ms={s.source.name: ms(f"{s.source.name}.read_ns") for s in self._sources},
            scheduling=self.scheduling,
            runs_in="process" if self.process else "thread",
            failure=self.failure,
            gaps={m.channel: self._gap(m) for m in self.meters},
            cpu_s=self.cpu_s,
            cpu_share=self.cpu_share,
        )

    def _gap(self, meter: Meter) -> dict[str, float | None]:
        """A meter's longest time without a reading, and its counter's update period."""
        column = meter.energy_column if meter.energy_column in self.log.columns else meter.power_column
        stamps = self.log.stamps(meter.time_column, column)
        largest = float(np.diff(stamps).max()) / 1e6 if stamps.size >= 2 else None
        periods = [g.period_ns for g in meter.grids if g.period_ns > 0]
        return {
            "largest_ms": largest,
            "counter_period_ms": float(np.median(periods)) / 1e6 if periods else None,
        }
