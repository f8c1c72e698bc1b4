"""Running an opened run: the idle baseline, the warm-up, the measured load (the load driver's,
or a call source's callers) and the tail, and how the run ended."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .._clock import NS, now_ns
from ..client import ClientConfig
from ..load import LoadSpec, drive
from ..rundir.writer import RunWriter
from ..state import Phase, RunState
from ..telemetry import Meter, Sampler
from ..workload import Workload, WorkUnit
from .config import RunConfig
from .counters import CounterChecks
from .dispatch import Dispatch
from .health import HarnessCpu
from .ledger import Abort, RunLedger
from .resume import Resume
from .watch import RunWatch

# Telemetry kept past a meter's averaging window after the last request, at least: two of the
# sampler's periods, so a reading past the window is in the log
TAIL_PAST_WINDOW_S = 0.2


class CallSource(Protocol):
    """Load that comes from outside the run (a recording proxy's callers) instead of the load
    driver: it serves until its deadline or until cancelled, keeping each call in the ledger."""

    label: str  # the run directory's load label

    def reserve(self) -> None:
        """Take what serving needs and may be refused (a port), before the run measures:
        RunError when it cannot."""

    def release(self) -> None:
        """Give back what :meth:`reserve` took (the run is over, served or not)."""

    async def serve(
        self, ledger: RunLedger, upstream: ClientConfig, t0_ns: int, deadline_ns: int | None
    ) -> None: ...


class Tasks:
    """Background tasks of a run, all cancelled (and awaited) when the run unwinds."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[Any]] = []

    def start(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    async def cancel_all(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@dataclass
class Ending:
    """How the run ended, filled in as it goes: what ``run.json`` says of it."""

    abort: Abort = field(default_factory=Abort)  # the first reason the run stopped early for
    interrupted: BaseException | None = None  # Ctrl-C or a cancellation while it ran
    complete: bool = False  # the measured load ran to its end, unaborted
    stopped: str | None = None  # why the run ended before its plan, by its own rule
    # over-saturation and the precision targets, looked at while the run measures
    validity: RunWatch | None = None

    def counters_distrusted(self, meters: list[Meter]) -> None:
        """A counter found faulty: the validity checks count its energy from its power too."""
        if self.validity is not None:
            self.validity.meters = [m for m in meters if m.accelerator]


def planned(config: RunConfig, workload: Workload) -> int | None:
    """Measured units the run asks for; None when its duration bounds it. A trace's entries are
    each sent once, so its warm-up units come out of the trace's size."""
    if config.max_queries is not None:
        return config.max_queries
    if config.duration is not None:
        return None
    return max(workload.size() - config.warmup, 0) if config.trace is not None else workload.size()


@dataclass
class LiveRun:
    """A run opened whole (:class:`.opening.RunOpening`): its directory, telemetry, files, ledger
    and dispatch open and its background tasks started; :meth:`measure` runs its phases."""

    config: RunConfig
    spec: LoadSpec
    workload: Workload
    resume: Resume | None  # the earlier sessions a resumed run continues
    source: CallSource | None  # where the calls come from, when not from the load driver
    note: Callable[[str], None]
    run_dir: Path
    state: RunState
    sampler: Sampler
    checks: CounterChecks
    writer: RunWriter
    ledger: RunLedger
    dispatch: Dispatch
    upstream: ClientConfig  # the server, as a source's calls reach it
    tasks: Tasks
    cpu: HarnessCpu
    ending: Ending

    async def measure(self) -> None:
        """Baseline, warm-up, the measured load and the tail; Ctrl-C or a cancellation ends the
        run as interrupted, with what it measured so far."""
        try:
            await self._phases()
        except (asyncio.CancelledError, KeyboardInterrupt) as exc:
            self.ending.interrupted = exc

    async def _phases(self) -> None:
        config = self.config
        t0 = self.writer.manifest.anchor.monotonic_ns
        has_telemetry = bool(self.sampler.meters)
        rng = np.random.default_rng(config.seed)
        baseline = (
            self.resume is None and has_telemetry and config.baseline_w is None and config.baseline_s > 0
        )
        if check := self.checks.begin(t0, config.baseline_s if baseline else 0.0):
            self.tasks.start(check)
        if self.resume is not None:  # the baseline and warm-up belong to the first session
            list(self.workload.units(config.warmup, True))  # their unit ids stay theirs
        else:
            if baseline:
                self.state.phase = Phase.BASELINE
                start = now_ns() - t0
                await asyncio.sleep(config.baseline_s)
                self.writer.update(baseline_window_ns=(start, now_ns() - t0))
            if config.warmup:
                self.state.phase = Phase.WARMUP
                steady = dataclasses.replace(self.spec, ramp=None)  # the ramp belongs to the measured load
                units = self.ledger.units(self.workload, config.warmup, True)
                await drive(steady, units, self._execute, rng)
        await self._measured(t0, rng)
        self.state.phase = Phase.FINISHING
        # a meter that averages power shows the last step's energy only a window later (a
        # counter too, should its check on the way out find it faulty and integrate its power)
        meters = self.sampler.meters
        window_s = max((dataclasses.replace(m, kind="power").window_ns / NS for m in meters), default=0.0)
        tail_s = config.tail_s if has_telemetry else 0.0
        if window_s:
            tail_s = max(tail_s, window_s + max(TAIL_PAST_WINDOW_S, 2 * config.sample_ms / 1e3))
        await asyncio.sleep(tail_s)

    async def _execute(self, unit: WorkUnit, scheduled_ns: int) -> None:
        """Perform a unit unless the run stopped sending since it was drawn: a timed unit is
        drawn ahead of its time (``load.LEAD_NS``), a sparse trace's long before it."""
        if self.ledger.sending:
            await self.dispatch.execute(unit, scheduled_ns)

    async def _measured(self, t0: int, rng: np.random.Generator) -> None:
        """The measured load, until its plan, its deadline, an abort or the run's own rule."""
        config, spec, ledger, ending = self.config, self.spec, self.ledger, self.ending
        self.state.phase = Phase.MEASURING
        self.state.started_ns = now_ns()
        deadline = now_ns() + int(config.duration * NS) if config.duration else None
        cut = asyncio.Event()  # the run ends now: in-flight requests are cancelled

        def stop_now(reason: str) -> None:
            ledger.end_early(reason)
            cut.set()

        # the ledger tells it of every measured request from here on
        ending.validity = ledger.watch = RunWatch(
            t0,
            config.on_oversaturation,
            config.until_precision,
            self.sampler.meters,
            self.sampler.log,
            ledger.end_early,
            stop_now,
            self.note,
            spec.ramp_duration if spec.ramp else None,
        )
        self.tasks.start(ending.validity.run())
        before = await self.sampler.processes()  # a device shared with other work is charged for it
        with self.cpu.measuring():
            if self.source is None:
                units = ledger.units(self.workload, planned(config, self.workload), False)
                on_target = self.state.set_target
                load = drive(spec, units, self._execute, rng, deadline, on_target=on_target)
            else:
                load = self.source.serve(ledger, self.upstream, t0, deadline)
            await self._until_done(self.tasks.start(load), cut)
            ending.complete = not ending.abort.event.is_set()
        after = await self.sampler.processes()
        self.writer.update(gpu_processes={ch: {"before": pids, "after": after.get(ch)} for ch, pids in before.items()})
        ending.stopped = ledger.stopped
        if ending.stopped:
            self.note(f"stopped: {ending.stopped}")

    async def _until_done(self, load: asyncio.Task[None], cut: asyncio.Event) -> None:
        """The load to its end; cancelled when the run aborts or is cut short."""
        abort = self.ending.abort
        ends = {load, self.tasks.start(abort.event.wait()), self.tasks.start(cut.wait())}
        try:
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            if self.source is None:
                raise
            # Ctrl-C is how a source's run ends: what it recorded is the whole run
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            self.note("stopping: the calls in flight are recorded as cancelled")
            cut.set()
        if abort.event.is_set() or cut.is_set():
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
        else:
            await load
