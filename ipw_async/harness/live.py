"""One benchmark run: every lifecycle entered in one stack, the phases as a short sequence.

The simulator, telemetry sources, client, files and background tasks enter one exit stack, so
every way out (the end, an error, Ctrl-C, a dead server) unwinds the same path: tasks stop,
the last telemetry is sampled and written, the records file is closed, ``run.json`` says how
the run ended, the sources close and the simulator stops. Then :func:`finalize` turns the
directory into attributed records, traces and a summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Coroutine
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import anyio
import numpy as np

from .._clock import NS, ClockAnchor, now_ns
from .._loop import loop_name
from .._loop import run as run_loop
from ..client import ClientConfig, StreamingClient
from ..errors import RunAborted, RunError
from ..load import LoadSpec, drive
from ..results import RunResult, finalize
from ..rundir.manifest import Manifest, RunDirError, default_run_dir, discard, prepare
from ..rundir.writer import RunWriter
from ..state import MeterState, Phase, RunState
from ..stats import distribution
from ..telemetry import Meter, Sampler, TelemetrySetup
from ..telemetry.http import redact_url
from ..workload import Workload
from ..workload.body import BodyDefaults
from .config import RunConfig
from .counters import CounterChecks
from .dispatch import Dispatch, LocalDispatch
from .health import HarnessCpu, LoopLag, gc_frozen
from .ledger import Abort, RunLedger
from .limits import ensure_open_files
from .ray_pool import RayPool
from .resume import Resume, continue_manifest, resume_from
from .setup import client_config, open_telemetry, serving_model, simulator
from .watch import RunWatch
from .worker_protocol import WorkerSetup
from .workers import WorkerPool, auto_workers
from .workloads import workload_of


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


class Display(Protocol):
    """Something that shows a run's progress: plain lines, a live dashboard, or nothing."""

    async def run(self, state: RunState) -> None: ...  # until cancelled

    def finish(self, result: RunResult) -> None: ...

    def note(self, message: str) -> None: ...


async def run_benchmark(
    config: RunConfig,
    display: Display | None = None,
    workload: Workload | None = None,
    source: CallSource | None = None,
) -> RunResult:
    """Run one benchmark and write its directory; raises RunError when it cannot start.

    ``workload`` replaces the one the config describes (its dataset). Interruption (Ctrl-C,
    cancellation) and a server that goes away still leave every record measured so far on
    disk, with ``complete: false`` in the summary. With a ``source`` the calls come from it
    rather than from the load driver, and Ctrl-C is its normal end.
    """
    spec = config.validate()
    resume = None
    if config.resume is not None:
        config, resume = resume_from(config)
        spec = config.validate()
    live = _LiveRun(config, spec, workload or workload_of(config), display, resume, source)
    await live.run()
    assert live.run_dir is not None
    try:
        result = await anyio.to_thread.run_sync(finalize, live.run_dir)
    except (OSError, RunDirError) as exc:
        if live.abort.reason is None:
            raise
        raise RunAborted(f"{live.abort.reason}; the run could not be finished ({exc})") from None
    if display is not None:
        display.finish(result)
    if live.interrupted is not None:
        raise live.interrupted
    if live.abort.reason:
        count = result.records.height
        raise RunAborted(f"{live.abort.reason}; {count} records kept in {live.run_dir}")
    return result


def run(config: RunConfig, display: Display | None = None, workload: Workload | None = None) -> RunResult:
    """Blocking form of :func:`run_benchmark`, for scripts and notebooks without a loop."""
    return run_loop(run_benchmark(config, display, workload))


class _Tasks:
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


class _LiveRun:
    """The parts of one run while it is live."""

    def __init__(
        self,
        config: RunConfig,
        spec: LoadSpec,
        workload: Workload,
        display: Display | None,
        resume: Resume | None = None,
        source: CallSource | None = None,
    ):
        self.config = config
        self.source = source
        self.spec = spec
        self.workload = workload
        self.display = display
        self.resume = resume
        self.run_dir: Path | None = None
        self.unstarted: tuple[Path, bool] | None = None  # a fresh run's directory until it measures
        self.interrupted: BaseException | None = None
        self.abort = Abort()  # the first reason the run stopped early for
        self.complete = False
        self.lag = LoopLag()
        self.cpu = HarnessCpu()
        self.pool_report: dict[str, Any] | None = None  # the workers: where, and their clocks
        self.watch: RunWatch | None = None  # while measuring
        self.stopped: str | None = None  # why the run ended before its plan, by its own rule
        self.counter_check: CounterChecks | None = None  # the energy counters' check, once sampling
        self.upstream: ClientConfig | None = None  # the server, as a source's calls reach it

    def _note(self, message: str) -> None:
        if self.display is not None:
            self.display.note(message)

    async def run(self) -> None:
        try:
            await self._run()
        except RunError:
            # it stopped before measuring (an MCP server or a worker that did not start): no
            # half-made directory stands in the way of the same command once fixed
            if self.unstarted is not None:
                discard(*self.unstarted)
            raise

    async def _run(self) -> None:
        config = self.config
        # before the simulator starts: it inherits the limit, and serves as many connections
        if note := ensure_open_files(self.spec.pool_size):
            self._note(note)
        async with contextlib.AsyncExitStack() as stack:
            sim = (
                await stack.enter_async_context(simulator(config.sim_config())) if config.simulated else None
            )
            base_url = sim.base_url if sim else str(config.base_url)
            try:
                model = await serving_model(config, base_url)
            except Exception as exc:
                raise RunError(str(exc)) from None
            label = self.spec.label if self.source is None else self.source.label
            label = label if sim is None else f"sim_{label}"
            run_dir = Path(
                config.output_dir or default_run_dir(Path(config.runs_root), model, self.workload.name, label)
            )
            resume = self.resume
            if resume is None:
                created = not run_dir.exists()
                prepare(run_dir, config.overwrite)
                self.unstarted = (run_dir, created)
            else:
                self._note(
                    f"resuming {run_dir} as session {resume.session}: {len(resume.done_units)} units done, "
                    f"{resume.dropped} partial records dropped (their units run again)"
                )
            self.run_dir = run_dir
            telemetry = await open_telemetry(config, sim, base_url, self._note)
            stack.callback(telemetry.close)
            anchor = ClockAnchor.take() if resume is None else resume.manifest.anchor
            client = StreamingClient(
                client_config(self.config, base_url, self.spec.pool_size), t0_ns=anchor.monotonic_ns
            )
            stack.push_async_callback(client.aclose)
            state = self._state(telemetry, run_dir)
            sampler = Sampler(
                telemetry.opened,
                config.sample_ms / 1000,
                anchor.monotonic_ns,
                realtime=config.realtime_sampler,
                probe_s=config.counter_probe_s,
            )
            checks = self.counter_check = CounterChecks(
                sampler, config.trust_counter, self._note, self._watched
            )
            if resume is not None:  # a counter an earlier session found faulty stays distrusted
                checks.carry(resume.manifest.meters)
            manifest = self._manifest(anchor, model, base_url, telemetry, sampler)
            if resume is not None:
                continue_manifest(manifest, resume, now_ns() - anchor.monotonic_ns)
            stack.callback(setattr, state, "phase", Phase.DONE)
            writer = RunWriter(
                run_dir,
                manifest,
                self.abort.stop,
                telemetry=sampler.log if telemetry.opened else None,
                earlier_records=resume and resume.records,
                earlier_telemetry=resume and resume.telemetry,
            )
            ledger = RunLedger(
                writer,
                state,
                self.abort,
                server=redact_url(config.base_url) if config.base_url else "the simulator",
                abort_after=config.abort_after_connect_errors,
                first_request_id=0 if resume is None else resume.next_request_id,
                done_units=frozenset() if resume is None else resume.done_units,
            )
            writer.follow(functools.partial(_progress, sampler, ledger, checks))
            writer.end(lambda: self._end(sampler))
            await stack.enter_async_context(writer)
            # on the way out, before the meters' last update in run.json: a check the run ended
            # too soon for is done over what it has
            stack.push_async_callback(checks.finish)
            # on the way out, after the workers and tasks stopped: the sampler's last reading
            stack.push_async_callback(_last_reading, sampler)
            state.phase = Phase.STARTING
            dispatch = await self._dispatch(stack, ledger, client, model, anchor.monotonic_ns, base_url)
            if self.source is not None:
                self.source.reserve()
                stack.callback(self.source.release)
            self.unstarted = None
            tasks = _Tasks()
            stack.push_async_callback(tasks.cancel_all)
            # before the first tick: the full collection holds the GIL for tens of ms (taken
            # as the measured phase began, it put the tick there 80–90 ms late and skipped one)
            stack.enter_context(gc_frozen())
            tasks.start(sampler.run())
            tasks.start(self.lag.watch())
            tasks.start(_mirror(state, sampler, self.lag))
            if self.display is not None:
                tasks.start(self.display.run(state))
            self.upstream = client_config(self.config, base_url, self.spec.pool_size)
            try:
                await self._phases(state, ledger, dispatch, writer, tasks, sampler)
            except (asyncio.CancelledError, KeyboardInterrupt) as exc:
                self.interrupted = exc

    async def _dispatch(
        self,
        stack: contextlib.AsyncExitStack,
        ledger: RunLedger,
        client: StreamingClient,
        model: str,
        t0_ns: int,
        base_url: str,
    ) -> Dispatch:
        """Where units run: this loop, or worker processes or Ray actors started now (closed
        before the files: they keep the last records)."""
        config = self.config
        setup = WorkerSetup(
            self.workload,
            client_config(self.config, base_url, self.spec.pool_size),
            t0_ns,
            BodyDefaults(model, config.max_tokens, config.temperature, config.params),
            config.scorer or self.workload.scorer,
            0 if self.resume is None else self.resume.session,
        )
        count = self._worker_count()
        if config.ray is None and count <= 1:
            local = LocalDispatch(ledger, setup, client)
            stack.push_async_callback(local.close)
            await local.start()
            return local
        pool: Dispatch = (
            RayPool(ledger, setup, count, config.ray)
            if config.ray is not None
            else WorkerPool(ledger, setup, count)
        )
        stack.push_async_callback(pool.close)
        await pool.start()
        self.cpu.track(pool.pids)
        self.pool_report = pool.report()
        where = f"Ray actors on {config.ray}" if config.ray is not None else "worker processes"
        self._note(f"{pool.count} {where} stream the load; this one schedules, samples and writes")
        return pool

    async def _phases(
        self,
        state: RunState,
        ledger: RunLedger,
        dispatch: Dispatch,
        writer: RunWriter,
        tasks: _Tasks,
        sampler: Sampler,
    ) -> None:
        config, spec = self.config, self.spec
        has_telemetry = bool(sampler.meters)
        rng = np.random.default_rng(config.seed)
        baseline = (
            self.resume is None and has_telemetry and config.baseline_w is None and config.baseline_s > 0
        )
        assert self.counter_check is not None
        t0 = writer.manifest.anchor.monotonic_ns
        if check := self.counter_check.begin(t0, config.baseline_s if baseline else 0.0):
            tasks.start(check)
        if self.resume is not None:  # the baseline and warm-up belong to the first session
            list(self.workload.units(config.warmup, True))  # their unit ids stay theirs
        elif baseline:
            state.phase = Phase.BASELINE
            start = now_ns() - t0
            await asyncio.sleep(config.baseline_s)
            writer.update(baseline_window_ns=(start, now_ns() - t0))
        if config.warmup and self.resume is None:
            state.phase = Phase.WARMUP
            # the ramp belongs to the measured load
            steady = dataclasses.replace(spec, ramp=None)
            await drive(steady, ledger.units(self.workload, config.warmup, True), dispatch.execute, rng)
        state.phase = Phase.MEASURING
        state.started_ns = now_ns()
        deadline = now_ns() + int(config.duration * NS) if config.duration else None
        cut = asyncio.Event()  # the run ends now: in-flight requests are cancelled

        def stop_now(reason: str) -> None:
            ledger.end_early(reason)
            cut.set()

        self.watch = ledger.watch = RunWatch(
            writer.manifest.anchor.monotonic_ns,
            config.on_oversaturation,
            config.until_precision,
            sampler.meters,
            sampler.log,
            ledger.end_early,
            stop_now,
            self._note,
            spec.ramp_duration if spec.ramp else None,
        )
        tasks.start(self.watch.run())
        with self.cpu.measuring():
            if self.source is None:
                units = ledger.units(self.workload, self._planned(), False)
                measured = drive(spec, units, dispatch.execute, rng, deadline, on_target=state.set_target)
            else:
                assert self.upstream is not None
                measured = self.source.serve(ledger, self.upstream, t0, deadline)
            load = tasks.start(measured)
            ends = {load, tasks.start(self.abort.event.wait()), tasks.start(cut.wait())}
            try:
                await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                if self.source is None:
                    raise
                # Ctrl-C is how a source's run ends: what it recorded is the whole run
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
                self._note("stopping: the calls in flight are recorded as cancelled")
                cut.set()
            if self.abort.event.is_set() or cut.is_set():
                load.cancel()
                await asyncio.gather(load, return_exceptions=True)
            else:
                await load
            self.complete = not self.abort.event.is_set()
        self.stopped = ledger.stopped
        if self.stopped:
            self._note(f"stopped: {self.stopped}")
        state.phase = Phase.FINISHING
        await asyncio.sleep(config.tail_s if has_telemetry else 0)

    def _watched(self, meters: list[Meter]) -> None:
        """The run's watch counts a distrusted counter's energy from its power too."""
        if self.watch is not None:
            self.watch.meters = [m for m in meters if m.accelerator]

    def _worker_count(self) -> int:
        """Workers asked for; 0 for Ray's auto (one per node, known once it has joined)."""
        workers = self.config.workers
        if workers == "auto":
            return 0 if self.config.ray is not None else auto_workers(self.spec.pool_size)
        return int(workers)

    def _planned(self) -> int | None:
        if self.config.max_queries is not None:
            return self.config.max_queries
        return None if self.config.duration is not None else self.workload.size()

    def _remaining(self) -> int | None:
        """Units this session will run: the plan, less what an earlier session finished."""
        planned = self._planned()
        if planned is None or self.resume is None:
            return planned
        return max(0, planned - len(self.resume.measured_done))

    def _end(self, sampler: Sampler) -> dict[str, Any]:
        return {
            "complete": self.complete and self.interrupted is None,
            "interrupted": self.interrupted is not None,
            "aborted": self.abort.reason,
            "stopped": self.stopped,
            "watch": self.watch.report() if self.watch else None,
            "counter_checks": None if self.counter_check is None else self.counter_check.report(),
            "sampler": asdict(sampler.quality()),
            "harness": {
                "loop_lag_ms": distribution(self.lag.lags_ms),
                **self.cpu.summary(),
                "workers": self.pool_report,
                "processes": 1 + (workers if (workers := self._worker_count()) > 1 else 0),
                "event_loop": loop_name(),
            },
        }

    def _state(self, telemetry: TelemetrySetup, run_dir: Path) -> RunState:
        spec = self.spec
        # a call source's load is its callers' (a proxy's concurrency is its upstream pool's
        # size, which no one set out to reach)
        state = RunState(
            label=spec.label if self.source is None else self.source.label,
            simulated=self.config.simulated or telemetry.simulated,
            target_in_flight=spec.concurrency or spec.max_concurrency if self.source is None else None,
            ramp_to=spec.target if spec.ramp else None,
            ramp_rate=spec.rate is not None,
            planned=self._remaining(),
            duration_s=self.config.duration,
            run_dir=str(run_dir),
        )
        for s in telemetry.opened:
            for m in s.info.meters:
                state.meters[m.channel] = MeterState(
                    m.channel, estimate=m.kind == "estimate", accelerator=m.accelerator
                )
        for name, reason in telemetry.skipped.items():
            state.meters[name] = MeterState(name, available=False, reason=reason)
        return state

    def _manifest(
        self, anchor: ClockAnchor, model: str, base_url: str, telemetry: TelemetrySetup, sampler: Sampler
    ) -> Manifest:
        config, spec = self.config, self.spec
        return Manifest(
            config=config.public(),
            anchor=anchor,
            simulated=config.simulated or telemetry.simulated,
            model=model,
            base_url=None if config.simulated else redact_url(base_url),
            workload={
                "kind": type(self.workload).__name__,
                "dataset": self.workload.name,
                "scorer": config.scorer or self.workload.scorer,
            },
            load=asdict(spec) | {"label": spec.label},
            sources={s.source.name: s.info.description for s in telemetry.opened},
            skipped=telemetry.skipped,
            meters=sampler.meters,
            sample_ms=config.sample_ms,
            probe_s=config.counter_probe_s,
        )


def _progress(sampler: Sampler, ledger: RunLedger, checks: CounterChecks) -> dict[str, Any]:
    """What run.json says as the run goes: grids learned, counter resets and checks, requests
    sent."""
    return {
        "meters": sampler.meters,
        "counter_events": sampler.counter_events(),
        "counter_checks": None if checks.checks is None else checks.report(),
        "clocks": sampler.clocks(),
        "dispatched": ledger.dispatched,
    }


async def _last_reading(sampler: Sampler) -> None:
    with contextlib.suppress(Exception):  # a source that fails now has said so before
        await sampler.sample_once()


async def _mirror(state: RunState, sampler: Sampler, lag: LoopLag) -> None:
    """Copy the latest power readings and harness health into the run state, 4 times a second."""
    log = sampler.log
    meters = sampler.meters
    first: dict[str, float] = {}
    while True:
        await asyncio.sleep(0.25)
        for m in meters:
            ms = state.meters[m.channel]
            ms.power_w = log.latest(m.power_column)
            energy = log.latest(m.energy_column)
            if energy is not None:
                first.setdefault(m.channel, energy)
                ms.energy_j = energy - first[m.channel]
        lateness = log.recent("lateness_ns", 200)
        state.sampler_lateness_ms = float(np.percentile(lateness, 99)) / 1e6 if lateness else None
        state.loop_lag_ms = lag.recent_p99()
