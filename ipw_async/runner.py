"""One benchmark run, end to end: server, load, telemetry, attribution, files on disk."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import gc
import importlib.metadata
import itertools
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import anyio
import numpy as np
import polars as pl

from . import io
from ._clock import ClockAnchor, now_ns
from .client import ClientConfig, StreamingClient, list_models
from .datasets import Dataset, DatasetError, Query, resolve
from .energy import AttributionConfig, attribute
from .load import LoadSpec, drive
from .records import ErrorType, RequestRecord, Status
from .scoring import SCORERS, score
from .sim import SimConfig, SimulatorProcess
from .state import MeterState, RunState
from .stats import distribution, latency_stats
from .telemetry import Sampler, TelemetrySetup, open_sources
from .traces import traces_from_records, write_traces


class RunError(Exception):
    """The run cannot start or go on; the message says what to do."""


@dataclass
class RunConfig:
    """Every option of a run; ``ipw-async run`` flags map one to one onto these fields."""

    base_url: str | None = None  # None: start the built-in simulator
    model: str | None = None
    endpoint: str = "chat"
    api_key: str | None = field(default=None, repr=False)
    dataset: str = "qa"
    prompt_column: str = "prompt"
    answer_column: str = "answer"
    scorer: str | None = None
    prompt_tokens: int = 256
    output_tokens: int = 128
    length_sigma: float = 0.5
    concurrency: int | None = None
    rate: float | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_concurrency: int | None = None
    warmup: int = 0
    max_queries: int | None = None
    duration: float | None = None
    seed: int = 0
    dataset_seed: int | None = None  # synthetic lengths; default: seed (a sweep holds it fixed)
    max_tokens: int = 256
    temperature: float | None = 0.0
    params: dict[str, Any] = field(default_factory=dict)
    connect_timeout: float = 10.0
    read_timeout: float = 300.0
    output_dir: Path | None = None
    runs_root: Path = Path("runs")
    overwrite: bool = False
    telemetry: str = "auto"
    gpus: list[str] | None = None
    sample_ms: float = 50.0
    realtime_sampler: bool = True
    counter_probe_s: float = 1.0
    baseline_s: float = 1.0
    baseline_w: float | None = None
    attribution: str = "tokens"
    prefill_weight: float = 0.25
    tail_s: float = 0.5
    abort_after_connect_errors: int = 16
    sim: SimConfig = field(default_factory=SimConfig)

    def load_spec(self) -> LoadSpec:
        concurrency = self.concurrency
        if concurrency is None and self.rate is None:
            concurrency = 16
        return LoadSpec(concurrency, self.rate, self.arrival, self.burstiness, self.max_concurrency)

    def public(self) -> dict[str, Any]:
        """The config as written to summary.json: never the API key."""
        out = dataclasses.asdict(self)
        out.pop("api_key")
        out["api_key_set"] = self.api_key is not None
        if self.base_url is not None:
            out.pop("sim")
        return out


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    records: pl.DataFrame

    @property
    def complete(self) -> bool:
        return bool(self.summary.get("complete"))


class Display(Protocol):
    """Something that shows a run's progress: plain lines, a live dashboard, or nothing."""

    async def run(self, state: RunState) -> None: ...  # until cancelled

    def finish(self, result: RunResult) -> None: ...

    def note(self, message: str) -> None: ...


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-")[:40] or "x"


def default_run_dir(root: Path, model: str, dataset: str, label: str) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return root / f"{stamp}_{slug(model)}_{slug(dataset)}_{label}"


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for pkg in ("ipw-async", "httpx", "aiohttp", "polars", "pyarrow", "numpy", "nvidia-ml-py"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def _host() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def _is_local(base_url: str) -> bool:
    host = urlsplit(base_url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.") or host == socket.gethostname()


class LoopLag:
    """How late the event loop runs a 10 ms timer: the harness's own health."""

    def __init__(self, period_s: float = 0.01) -> None:
        self.period_s = period_s
        self.lags_ms: list[float] = []

    async def run(self) -> None:
        while True:
            start = now_ns()
            await asyncio.sleep(self.period_s)
            self.lags_ms.append(max(0.0, (now_ns() - start) / 1e6 - self.period_s * 1e3))

    def recent_p99(self, n: int = 500) -> float | None:
        recent = self.lags_ms[-n:]
        return float(np.percentile(recent, 99)) if recent else None


class HarnessCpu:
    """CPU time of this process (all its threads) over the measured phase, which it keeps
    free of full garbage collections over import-time objects."""

    def __init__(self) -> None:
        self._start: tuple[float, float] | None = None
        self._stop: tuple[float, float] | None = None

    def start(self) -> None:
        # A full collection walks every object the imports made (polars, pyarrow, numpy):
        # tens of ms with the loop stopped. Frozen, they are skipped for the measured phase.
        gc.collect()
        gc.freeze()
        self._start = (time.process_time(), time.perf_counter())

    def stop(self) -> None:
        if self._start is not None and self._stop is None:
            self._stop = (time.process_time(), time.perf_counter())
            gc.unfreeze()

    def summary(self) -> dict[str, float | None]:
        if self._start is None or self._stop is None:
            return {"cpu_s": None, "cpu_share": None}
        cpu, wall = self._stop[0] - self._start[0], self._stop[1] - self._start[1]
        return {"cpu_s": cpu, "cpu_share": cpu / wall if wall > 0 else None}


class _Run:
    """State shared by the parts of one run (kept off the public API)."""

    def __init__(self, config: RunConfig, dataset: Dataset, client: StreamingClient, model: str) -> None:
        self.config = config
        self.dataset = dataset
        self.client = client
        self.model = model
        self.scorer = config.scorer or dataset.scorer
        self.records: list[RequestRecord] = []
        self.ids = itertools.count()
        self.connect_errors = 0
        self.abort_reason: str | None = None
        self.abort = asyncio.Event()

    def items(
        self,
        queries: Iterator[Query],
        count: int | None,
        warmup: bool,
        writer: io.RecordWriter,
        state: RunState,
    ) -> Iterator[Callable[[int], Awaitable[None]]]:
        drawn = queries if count is None else itertools.islice(queries, count)
        for query in drawn:
            if self.abort.is_set():
                return
            yield self._item(query, warmup, writer, state)

    def _item(
        self, query: Query, warmup: bool, writer: io.RecordWriter, state: RunState
    ) -> Callable[[int], Awaitable[None]]:
        async def send(scheduled_abs: int) -> None:
            t0 = self.client.t0_ns
            record = RequestRecord(
                request_id=next(self.ids),
                query_id=query.id,
                dataset=self.dataset.name,
                prompt=query.prompt,
                reference=query.reference,
                warmup=warmup,
                scheduled_ns=scheduled_abs - t0,
                dispatched_ns=now_ns() - t0,
            )
            self.records.append(record)
            state.started()
            try:
                await self.client.send(record, self.client.body(query, self.model, self.dataset.stop))
            finally:
                if record.status is Status.OK:
                    record.correct = score(record.answer, record.reference, self.scorer)
                state.finished(record)
                self._watch(record)
                if writer.add(record):
                    await writer.flush()

        return send

    def _watch(self, record: RequestRecord) -> None:
        """A server that refuses every connection is gone: stop rather than fail every request."""
        if record.error_type is ErrorType.CONNECT:
            self.connect_errors += 1
            if self.connect_errors >= self.config.abort_after_connect_errors and not self.abort.is_set():
                self.abort_reason = (
                    f"the server at {self.config.base_url or 'the simulator'} stopped accepting connections "
                    f"({self.connect_errors} in a row)"
                )
                self.abort.set()
        elif record.status is Status.OK:
            self.connect_errors = 0


async def _preflight(config: RunConfig, base_url: str) -> str:
    models = await list_models(base_url, config.api_key, timeout=config.connect_timeout)
    if config.model is None:
        if not models:
            raise RunError(f"{base_url} serves no models; name one with --model")
        return models[0]
    if models and config.model not in models:
        raise RunError(f"model {config.model!r} is not served at {base_url}; available: {', '.join(models)}")
    return config.model


def _validate(config: RunConfig) -> tuple[LoadSpec, Dataset]:
    try:
        spec = config.load_spec()
    except ValueError as exc:
        raise RunError(str(exc)) from None
    if config.endpoint not in ("chat", "completions"):
        raise RunError("--endpoint must be chat or completions")
    if config.max_queries is not None and config.max_queries < 1:
        raise RunError("--max-queries must be at least 1")
    if config.duration is not None and not config.duration > 0:
        raise RunError("--duration must be a positive number of seconds")
    if config.warmup < 0:
        raise RunError("--warmup cannot be negative")
    if config.scorer is not None and config.scorer not in SCORERS:
        raise RunError(f"unknown scorer {config.scorer!r}; choose one of {', '.join(SCORERS)}")
    if not config.sample_ms > 0:
        raise RunError("--sample-ms must be positive")
    if config.counter_probe_s < 0:
        raise RunError("--counter-probe-s cannot be negative")
    try:
        AttributionConfig(rule=config.attribution)
    except ValueError as exc:
        raise RunError(str(exc)) from None
    try:
        dataset = resolve(
            config.dataset,
            prompt_column=config.prompt_column,
            answer_column=config.answer_column,
            synthetic_n=config.max_queries or 512,
            prompt_tokens=config.prompt_tokens,
            output_tokens=config.output_tokens,
            length_sigma=config.length_sigma,
            seed=config.seed if config.dataset_seed is None else config.dataset_seed,
        )
    except DatasetError as exc:
        raise RunError(str(exc)) from None
    return spec, dataset


def _prepare_dir(path: Path, overwrite: bool) -> None:
    if path.exists() and any(path.iterdir()):
        if not overwrite:
            raise RunError(f"{path} already holds a run; choose another --output-dir or pass --overwrite")
        for name in (io.RECORDS, io.TELEMETRY, io.TRACES, io.SUMMARY):
            (path / name).unlink(missing_ok=True)
    path.mkdir(parents=True, exist_ok=True)


async def run_benchmark(config: RunConfig, display: Display | None = None) -> RunResult:
    """Run one benchmark and write its directory; raises RunError when it cannot start.

    Interruption (Ctrl-C, cancellation) and a server that goes away still leave every record
    measured so far on disk, with ``complete: false`` in the summary.
    """
    spec, dataset = _validate(config)
    simulated = config.base_url is None
    sim: SimulatorProcess | None = None
    try:
        if simulated:
            sim = SimulatorProcess(config.sim)
            try:
                await anyio.to_thread.run_sync(sim.start)
            except Exception as exc:
                raise RunError(str(exc)) from None
            base_url = sim.base_url
        else:
            assert config.base_url is not None
            base_url = config.base_url
        try:
            model = await _preflight(config, base_url)
        except Exception as exc:
            raise RunError(str(exc)) from None
        run_dir = config.output_dir or default_run_dir(
            config.runs_root, model, dataset.name, spec.label if not simulated else f"sim_{spec.label}"
        )
        _prepare_dir(run_dir, config.overwrite)
        try:
            telemetry = await anyio.to_thread.run_sync(
                lambda: open_sources(
                    config.telemetry, sim_root_url=_sim_root(config, sim, base_url), gpus=config.gpus
                )
            )
        except ValueError as exc:
            raise RunError(str(exc)) from None
        try:
            return await _execute(
                config, spec, dataset, base_url, model, run_dir, telemetry, simulated, sim, display
            )
        finally:
            telemetry.close()
    finally:
        if sim is not None:
            await anyio.to_thread.run_sync(sim.stop)


def _sim_root(config: RunConfig, sim: SimulatorProcess | None, base_url: str) -> str | None:
    """Where the simulated device answers: ours, or a standalone ``ipw-async sim`` named in --telemetry."""
    if sim is not None:
        return sim.root_url
    if "sim" in config.telemetry.split(","):
        parts = urlsplit(base_url)
        return f"{parts.scheme}://{parts.netloc}"
    return None


def _planned(config: RunConfig, dataset: Dataset) -> int | None:
    if config.max_queries is not None:
        return config.max_queries
    return None if config.duration is not None else len(dataset)


async def _execute(
    config: RunConfig,
    spec: LoadSpec,
    dataset: Dataset,
    base_url: str,
    model: str,
    run_dir: Path,
    telemetry: TelemetrySetup,
    simulated: bool,
    sim: SimulatorProcess | None,
    display: Display | None,
) -> RunResult:
    anchor = ClockAnchor.take()
    t0 = anchor.monotonic_ns
    planned = _planned(config, dataset)
    state = RunState(
        label=spec.label,
        simulated=simulated,
        target_in_flight=spec.concurrency or spec.max_concurrency,
        planned=planned,
        duration_s=config.duration,
        run_dir=str(run_dir),
    )
    for s in telemetry.opened:
        for m in s.info.meters:
            state.meters[m.channel] = MeterState(
                m.channel, estimate=m.kind == "estimate", accelerator=m.accelerator
            )
    for name, reason in telemetry.skipped.items():
        state.meters[name] = MeterState(name, available=False, reason=reason)
    if display is not None:
        if simulated:
            display.note(
                "SIMULATED run: built-in simulator server and simulated device (no real GPU measured)"
            )
        for s in telemetry.opened:
            display.note(f"telemetry {s.source.name}: {s.info.description or ', '.join(s.info.columns)}")
        for name, reason in telemetry.skipped.items():
            display.note(f"telemetry {name} skipped: {reason}")
        if not simulated and telemetry.opened and not _is_local(base_url):
            display.note(f"telemetry measures this machine; the server at {base_url} may be elsewhere")

    client = StreamingClient(
        ClientConfig(
            base_url=base_url,
            endpoint=config.endpoint,
            api_key=config.api_key,
            max_tokens=config.max_tokens,
            temperature=config.temperature,
            params=config.params,
            connect_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
            max_connections=spec.pool_size,
        ),
        t0_ns=t0,
    )
    run = _Run(config, dataset, client, model)
    writer = io.RecordWriter(run_dir / io.RECORDS)
    sampler = Sampler(
        telemetry.opened,
        config.sample_ms / 1000,
        t0,
        realtime=config.realtime_sampler,
        probe_s=config.counter_probe_s,
    )
    lag = LoopLag()
    cpu = HarnessCpu()
    rng = np.random.default_rng(config.seed)
    background: list[asyncio.Task[None]] = []
    complete = False
    interrupted: BaseException | None = None
    baseline_window: tuple[int, int] | None = None
    loop = asyncio.get_running_loop()
    try:
        background.append(loop.create_task(sampler.run()))
        background.append(loop.create_task(lag.run()))
        background.append(loop.create_task(_mirror(state, sampler, lag)))
        if display is not None:
            background.append(loop.create_task(display.run(state)))
        if config.baseline_s > 0 and telemetry.opened and config.baseline_w is None:
            state.phase = "baseline"
            start = now_ns() - t0
            await asyncio.sleep(config.baseline_s)
            baseline_window = (start, now_ns() - t0)
        queries = dataset.cycle()
        if config.warmup:
            state.phase = "warmup"
            await drive(spec, run.items(queries, config.warmup, True, writer, state), rng)
        state.phase = "measuring"
        state.started_ns = now_ns()
        cpu.start()
        deadline = now_ns() + int(config.duration * 1e9) if config.duration else None
        load = loop.create_task(drive(spec, run.items(queries, planned, False, writer, state), rng, deadline))
        aborter = loop.create_task(run.abort.wait())
        background += [load, aborter]  # so an interruption cancels them too
        await asyncio.wait({load, aborter}, return_when=asyncio.FIRST_COMPLETED)
        if run.abort.is_set():
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
        else:
            aborter.cancel()
            await load
            complete = True
        cpu.stop()
        state.phase = "finishing"
        await asyncio.sleep(config.tail_s if telemetry.opened else 0)
    except (asyncio.CancelledError, KeyboardInterrupt) as exc:
        interrupted = exc
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        with contextlib.suppress(Exception):
            await sampler.sample_once()
        cpu.stop()
        await client.aclose()
        await writer.close()
        state.phase = "done"
    result = await _finish(
        config,
        run,
        run_dir,
        anchor,
        sampler,
        telemetry,
        lag,
        cpu,
        baseline_window,
        complete,
        interrupted,
        model,
        base_url,
        simulated,
    )
    if display is not None:
        display.finish(result)
    if interrupted is not None:
        raise interrupted
    if run.abort_reason:
        raise RunError(f"{run.abort_reason}; {len(run.records)} records kept in {run_dir}")
    return result


async def _mirror(state: RunState, sampler: Sampler, lag: LoopLag) -> None:
    """Copy the latest power readings and harness health into the run state, 4 times a second."""
    log = sampler.log
    meters = log.meters
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
        lateness = [v for v in log.columns["lateness_ns"][-200:] if v is not None]
        state.sampler_lateness_ms = float(np.percentile(lateness, 99)) / 1e6 if lateness else None
        state.loop_lag_ms = lag.recent_p99()


async def _finish(
    config: RunConfig,
    run: _Run,
    run_dir: Path,
    anchor: ClockAnchor,
    sampler: Sampler,
    telemetry: TelemetrySetup,
    lag: LoopLag,
    cpu: HarnessCpu,
    baseline_window: tuple[int, int] | None,
    complete: bool,
    interrupted: BaseException | None,
    model: str,
    base_url: str,
    simulated: bool,
) -> RunResult:
    """Attribute energy, then write records (with energy), telemetry, traces and the summary."""
    records = io.read_arrow(run_dir / io.RECORDS).sort("request_id")
    tel = sampler.log.frame()
    energy_section: dict[str, Any] = {
        "meters": {},
        "skipped": telemetry.skipped,
        "baseline_window_ns": baseline_window,  # to re-attribute later exactly as here
    }
    if telemetry.opened:
        io.write_frame(tel, run_dir / io.TELEMETRY)
        meters = sampler.meters
        if meters:
            cfg = AttributionConfig(
                rule=config.attribution,
                prefill_weight=config.prefill_weight,
                baseline_w=config.baseline_w,
                baseline_window_ns=baseline_window,
            )
            records, section = await anyio.to_thread.run_sync(lambda: attribute(tel, meters, records, cfg))
            energy_section |= section
    # Rewritten whole, in request order and with energy: the incremental file was only the
    # crash-safe copy.
    io.write_frame(records, run_dir / io.RECORDS)
    write_traces(run_dir / io.TRACES, traces_from_records(records))
    quality = sampler.quality()
    summary: dict[str, Any] = {
        "complete": complete,
        "simulated": simulated,
        "interrupted": interrupted is not None,
        "aborted": run.abort_reason,
        "model": model,
        "base_url": None if simulated else base_url,
        "dataset": run.dataset.name,
        "scorer": run.scorer,
        "clock": {
            "t0_monotonic_ns": anchor.monotonic_ns,
            "t0_unix_ns": anchor.unix_ns,
            "unit": "ns since t0",
        },
        "started_at": dt.datetime.fromtimestamp(anchor.unix_ns / 1e9, dt.UTC).isoformat(),
        **latency_stats(records),
        "energy": energy_section | _per_query_energy(records),
        "telemetry": {
            "sources": {s.source.name: s.info.description for s in telemetry.opened},
            "skipped": telemetry.skipped,
            "sampler": dataclasses.asdict(quality),
        },
        "harness": {"loop_lag_ms": distribution(lag.lags_ms), **cpu.summary()},
        "config": config.public(),
        "versions": _versions(),
        "host": _host(),
    }
    io.write_json(run_dir / io.SUMMARY, summary)
    return RunResult(run_dir=run_dir, summary=summary, records=records)


def _per_query_energy(records: pl.DataFrame) -> dict[str, Any]:
    if "energy_j" not in records.columns:
        return {}
    ok = records.filter(~pl.col("warmup") & (pl.col("status") == "ok"))
    energy = ok.get_column("energy_j").drop_nulls()
    tokens = ok.filter(pl.col("energy_j").is_not_null()).get_column("output_tokens").drop_nulls().sum()
    return {
        "per_query_j": distribution(energy.to_numpy()),
        "j_per_output_token": float(energy.sum()) / tokens if tokens else None,
    }


def run(config: RunConfig, display: Display | None = None) -> RunResult:
    """Blocking form of :func:`run_benchmark`, for scripts and notebooks without a loop."""
    return asyncio.run(run_benchmark(config, display))
