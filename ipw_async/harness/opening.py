"""Opening a run: what it measures with, opened in order into the caller's exit stack, and the
run built whole from it (:class:`~.measuring.LiveRun`).

The stack unwinds in reverse, the same way whatever ended the run (its end, an error, Ctrl-C, a
dead server): the background tasks stop, the call source lets go of its port, the workers close
(they keep the last records), the sampler takes its last reading, the records file closes and
``run.json`` says how the run ended, the client and the telemetry sources close, the
simulator stops, and the tools of a workload performed in this loop close (MCP servers: they
opened first, so that a bad one fails before anything else starts). A fresh run that fails
before it measures (RunError) discards the directory it made once all opened in it is closed.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from .._clock import ClockAnchor, now_ns
from ..client import ClientConfig, StreamingClient
from ..errors import RunError
from ..load import LoadSpec
from ..rundir.lifecycle import default_run_dir, discard, prepare
from ..rundir.manifest import Manifest
from ..rundir.writer import RunWriter
from ..sim import SimulatorProcess
from ..state import Phase, RunState
from ..telemetry import Sampler, TelemetrySetup
from ..telemetry.http import redact_url
from ..telemetry.process import SamplerProcessError, sampler_place
from ..workload import Workload, opened
from ..workload.body import BodyDefaults
from ..workload.replay import trace_of
from . import reports
from .config import RunConfig
from .counters import CounterChecks
from .dispatch import LocalDispatch, Pool
from .display import Display, mirror, notes_to
from .health import HarnessCpu, LoopLag, gc_frozen
from .ledger import RunLedger
from .limits import ensure_open_files
from .measuring import CallSource, Ending, LiveRun, Tasks, planned
from .ray_pool import RayPool
from .resume import Resume, continue_manifest
from .setup import client_config, open_telemetry, serving_model, simulator
from .worker_protocol import WorkerSetup
from .workers import WorkerPool, auto_workers


@dataclass
class _Server:
    sim: SimulatorProcess | None  # the built-in simulator, when the run serves itself
    base_url: str
    model: str


class _FreshDirectory:
    """A fresh run's directory, made now; as an exit callback, discarded when the run fails
    before it measures (RunError), once all opened after it is closed: no half-made directory
    stands in the way of the same command once fixed."""

    def __init__(self, run_dir: Path, overwrite: bool) -> None:
        self.run_dir = run_dir
        self.created = not run_dir.exists()
        prepare(run_dir, overwrite)
        self.kept = False

    def keep(self) -> None:
        """The run measures from here on: its directory stays, whatever ends it."""
        self.kept = True

    def __call__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, RunError) and not self.kept:
            discard(self.run_dir, self.created)


@dataclass
class RunOpening:
    """One run's opening: what it was asked for, and a step for each part it opens (each
    entered into ``stack`` as it is opened). ``await RunOpening(...).open()`` builds the run;
    RunError when it cannot start."""

    stack: contextlib.AsyncExitStack
    config: RunConfig
    spec: LoadSpec
    workload: Workload
    display: Display | None
    resume: Resume | None
    source: CallSource | None

    def __post_init__(self) -> None:
        self.note = notes_to(self.display)
        self.label = self.spec.label if self.source is None else self.source.label

    async def open(self) -> LiveRun:
        """Each part in turn, in the order the stack closes them in reverse."""
        config, spec, resume, stack = self.config, self.spec, self.resume, self.stack
        trace = trace_of(self.workload)
        if trace is not None and (skipped := trace.skipped_note()):
            self.note(f"note: {skipped}")
        workers = self._worker_count()
        local = config.ray is None and workers <= 1
        if local:
            # its tools first (MCP servers started and listed): a bad --mcp fails in a second,
            # before the simulator, the telemetry and the sampler start, and no directory is made
            await stack.enter_async_context(opened(self.workload))
        server = await self._server()
        run_dir, fresh = self._directory(server)
        telemetry = await open_telemetry(config, server.sim, server.base_url, self.note)
        stack.callback(telemetry.close)
        anchor = ClockAnchor.take() if resume is None else resume.manifest.anchor
        t0 = anchor.monotonic_ns
        upstream = client_config(config, server.base_url, spec.pool_size)
        client = StreamingClient(upstream, t0_ns=t0)
        stack.push_async_callback(client.aclose)
        state = self._state(telemetry, run_dir)
        ending = Ending()
        sampler, checks = self._meters(telemetry, t0, ending)
        stack.callback(sampler.close)
        try:
            await sampler.start()
        except SamplerProcessError as exc:
            raise RunError(str(exc)) from None
        manifest = reports.manifest(
            config, spec, self.workload, anchor, server.model, server.base_url, telemetry, sampler
        )
        if resume is not None:
            continue_manifest(manifest, resume, now_ns() - t0)
        stack.callback(setattr, state, "phase", Phase.DONE)
        harness = reports.Harness(LoopLag(), HarnessCpu(), 1 + (workers if workers > 1 else 0))
        if sampler.pid is not None:
            harness.cpu.helper(sampler.pid)
        ledger = await self._files(run_dir, manifest, state, ending, sampler, checks, harness)
        state.phase = Phase.STARTING
        dispatch = (
            LocalDispatch(ledger, self._worker_setup(upstream, server.model, t0), client)
            if local
            else await self._pool(ledger, upstream, server.model, t0, workers, harness)
        )
        if self.source is not None:
            self.source.reserve()
            stack.callback(self.source.release)
        if fresh is not None:
            fresh.keep()
        return LiveRun(
            config=config,
            spec=spec,
            workload=self.workload,
            resume=resume,
            source=self.source,
            note=self.note,
            run_dir=run_dir,
            state=state,
            sampler=sampler,
            checks=checks,
            writer=ledger.writer,
            ledger=ledger,
            dispatch=dispatch,
            upstream=upstream,
            tasks=self._tasks(state, sampler, harness.lag),
            cpu=harness.cpu,
            ending=ending,
        )

    async def _server(self) -> _Server:
        """The server the run measures: the built-in simulator, started now, or the one it was
        given; and the model it serves."""
        config = self.config
        # before the simulator starts: it inherits the limit, and serves as many connections
        if message := ensure_open_files(self.spec.pool_size):
            self.note(message)
        sim = None
        if config.simulated:
            sim = await self.stack.enter_async_context(simulator(config.sim_config()))
        base_url = sim.base_url if sim else str(config.base_url)
        try:
            model = await serving_model(config, base_url)
        except Exception as exc:
            raise RunError(str(exc)) from None
        return _Server(sim, base_url, model)

    def _directory(self, server: _Server) -> tuple[Path, _FreshDirectory | None]:
        """The run directory: a fresh one made now (and discarded if the run fails before it
        measures), or the one a resumed run continues."""
        config, resume = self.config, self.resume
        label = self.label if server.sim is None else f"sim_{self.label}"
        run_dir = Path(
            config.output_dir
            or default_run_dir(Path(config.runs_root), server.model, self.workload.name, label)
        )
        if resume is None:
            fresh = _FreshDirectory(run_dir, config.overwrite)
            self.stack.push(fresh)
            return run_dir, fresh
        self.note(
            f"resuming {run_dir} as session {resume.session}: {len(resume.done_units)} units done, "
            f"{resume.dropped} partial records dropped (their units run again)"
        )
        return run_dir, None

    def _state(self, telemetry: TelemetrySetup, run_dir: Path) -> RunState:
        """What the display shows, planned to the units this session will run."""
        remaining = planned(self.config, self.workload)
        if remaining is not None and self.resume is not None:  # less what earlier sessions finished
            remaining = max(0, remaining - len(self.resume.measured_done))
        return reports.run_state(
            self.config, self.spec, self.label, self.source is None, remaining, telemetry, run_dir
        )

    def _meters(self, telemetry: TelemetrySetup, t0: int, ending: Ending) -> tuple[Sampler, CounterChecks]:
        """The sampler over the opened sources, and the check of their energy counters."""
        config = self.config
        process, why = sampler_place(config.sampler, telemetry.opened)
        if config.sampler == "process" and not process:
            self.note(f"note: the sampler runs as a thread: {why}")
        sampler = Sampler(
            telemetry.opened,
            config.sample_ms / 1000,
            t0,
            realtime=config.realtime_sampler,
            probe_s=config.counter_probe_s,
            process=process,
        )
        checks = CounterChecks(sampler, config.trust_counter, self.note, ending.counters_distrusted)
        if self.resume is not None:  # a counter an earlier session found faulty stays distrusted
            checks.carry(self.resume.manifest.meters)
        return sampler, checks

    async def _files(
        self,
        run_dir: Path,
        manifest: Manifest,
        state: RunState,
        ending: Ending,
        sampler: Sampler,
        checks: CounterChecks,
        harness: reports.Harness,
    ) -> RunLedger:
        """The run's files, opened, and the ledger that keeps the records in them."""
        config, resume, stack = self.config, self.resume, self.stack
        writer = RunWriter(
            run_dir,
            manifest,
            ending.abort.stop,
            telemetry=sampler.log if sampler.log.sources else None,  # no file without a source
            earlier_records=resume and resume.records,
            earlier_telemetry=resume and resume.telemetry,
        )
        ledger = RunLedger(
            writer,
            state,
            ending.abort,
            server=redact_url(config.base_url) if config.base_url else "the simulator",
            abort_after=config.abort_after_connect_errors,
            first_request_id=0 if resume is None else resume.next_request_id,
            done_units=frozenset() if resume is None else resume.done_units,
        )
        harness.cpu.writer = writer.cpu
        writer.follow(functools.partial(reports.progress, sampler, ledger, checks))
        writer.end(functools.partial(reports.ended, ending, checks, sampler, harness))
        await stack.enter_async_context(writer)
        # on the way out, before the meters' last update in run.json: a check the run ended
        # too soon for is done over what it has
        stack.push_async_callback(checks.finish)
        # on the way out, after the workers and tasks stopped: the sampler's last reading
        stack.push_async_callback(_last_reading, sampler)
        return ledger

    def _worker_setup(self, upstream: ClientConfig, model: str, t0_ns: int) -> WorkerSetup:
        """What each place units run in is given to perform them."""
        config = self.config
        return WorkerSetup(
            self.workload,
            upstream,
            t0_ns,
            BodyDefaults(model, config.max_tokens, config.temperature, config.params, config.endpoint),
            config.scorer or self.workload.scorer,
            0 if self.resume is None else self.resume.session,
        )

    async def _pool(
        self,
        ledger: RunLedger,
        upstream: ClientConfig,
        model: str,
        t0_ns: int,
        count: int,
        harness: reports.Harness,
    ) -> Pool:
        """``count`` worker processes or Ray actors, started now, each opening the workload
        (closed before the files: they keep the last records)."""
        config, stack = self.config, self.stack
        setup = self._worker_setup(upstream, model, t0_ns)
        pool: Pool = (
            RayPool(ledger, setup, count, config.ray)
            if config.ray is not None
            else WorkerPool(ledger, setup, count)
        )
        stack.push_async_callback(pool.close)
        await pool.start()
        harness.cpu.track(pool.pids)
        harness.workers = pool.report()
        where = f"Ray actors on {config.ray}" if config.ray is not None else "worker processes"
        self.note(f"{pool.count} {where} stream the load; this one schedules, samples and writes")
        return pool

    def _tasks(self, state: RunState, sampler: Sampler, lag: LoopLag) -> Tasks:
        """The background tasks, started now: the sampler, the loop's lag, the display."""
        tasks = Tasks()
        self.stack.push_async_callback(tasks.cancel_all)
        # before the first tick: the full collection holds the GIL for tens of ms (taken as the
        # measured phase began, it put the tick there 80–90 ms late and skipped one)
        self.stack.enter_context(gc_frozen())
        tasks.start(sampler.run())
        tasks.start(lag.measure())
        tasks.start(mirror(state, sampler, lag))
        if self.display is not None:
            tasks.start(self.display.run(state))
        return tasks

    def _worker_count(self) -> int:
        """Workers asked for; 0 for Ray's auto (one per node, known once it has joined)."""
        workers = self.config.workers
        if workers == "auto":
            return 0 if self.config.ray is not None else auto_workers(self.spec.pool_size)
        return int(workers)


async def _last_reading(sampler: Sampler) -> None:
    with contextlib.suppress(Exception):  # a source that fails now has said so before
        await sampler.sample_once()
