"""What a run says of itself: the manifest its ``run.json`` starts as, the state its display
shows, and what ``run.json`` adds as the run goes and once it has ended."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._clock import ClockAnchor
from .._loop import loop_name
from ..load import LoadSpec
from ..rundir.manifest import Manifest
from ..state import MeterState, RunState
from ..stats import distribution
from ..telemetry import Sampler, TelemetrySetup
from ..telemetry.http import redact_url
from ..workload import Workload
from ..workload.replay import trace_of
from .config import RunConfig
from .counters import CounterChecks
from .health import HarnessCpu, LoopLag
from .ledger import RunLedger
from .measuring import Ending


def manifest(
    config: RunConfig,
    spec: LoadSpec,
    workload: Workload,
    anchor: ClockAnchor,
    model: str,
    base_url: str,
    telemetry: TelemetrySetup,
    sampler: Sampler,
) -> Manifest:
    return Manifest(
        config=config.public(),
        anchor=anchor,
        simulated=config.simulated or telemetry.simulated,
        model=model,
        base_url=None if config.simulated else redact_url(base_url),
        workload=_described(config, workload),
        load=asdict(spec) | {"label": spec.label},
        sources={s.source.name: s.info.description for s in telemetry.opened},
        skipped=telemetry.skipped,
        meters=sampler.meters,
        sample_ms=config.sample_ms,
        probe_s=config.counter_probe_s,
    )


def _described(config: RunConfig, workload: Workload) -> dict[str, Any]:
    """The workload as run.json keeps it; a replay adds its trace: format, entries, and the
    entries skipped as the trace's failures."""
    described = {
        "kind": type(workload).__name__,
        "dataset": workload.name,
        "scorer": config.scorer or workload.scorer,
    }
    trace = trace_of(workload)
    return described if trace is None else described | {"trace": trace.describe()}


def run_state(
    config: RunConfig,
    spec: LoadSpec,
    label: str,
    by_driver: bool,
    remaining: int | None,
    telemetry: TelemetrySetup,
    run_dir: Path,
) -> RunState:
    """The state a display shows; ``remaining``: the units this session will run. A call
    source's load (not ``by_driver``) is its callers' (a proxy's concurrency is its upstream
    pool's size, which no one set out to reach)."""
    state = RunState(
        label=label,
        simulated=config.simulated or telemetry.simulated,
        target_in_flight=spec.concurrency or spec.max_concurrency if by_driver else None,
        ramp_to=spec.target if spec.ramp else None,
        ramp_rate=spec.rate is not None,
        planned=remaining,
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
    return state


def progress(sampler: Sampler, ledger: RunLedger, checks: CounterChecks) -> dict[str, Any]:
    """What run.json says as the run goes: grids learned, counter resets and checks, requests
    sent."""
    return {
        "meters": sampler.meters,
        "counter_events": sampler.counter_events(),
        "counter_checks": None if checks.checks is None else checks.report(),
        "clocks": sampler.clocks(),
        "dispatched": ledger.dispatched,
    }


@dataclass
class Harness:
    """The harness's own health while the run goes."""

    lag: LoopLag
    cpu: HarnessCpu
    processes: int  # this one, and its worker processes
    workers: dict[str, Any] | None = None  # a pool's workers: where, and their clocks

    def report(self) -> dict[str, Any]:
        return {
            "loop_lag_ms": distribution(self.lag.lags_ms),
            **self.cpu.summary(),
            "workers": self.workers,
            "processes": self.processes,
            "event_loop": loop_name(),
        }


def ended(ending: Ending, checks: CounterChecks, sampler: Sampler, harness: Harness) -> dict[str, Any]:
    """How the run ended, as run.json keeps it."""
    return {
        "complete": ending.complete and ending.interrupted is None,
        "interrupted": ending.interrupted is not None,
        "aborted": ending.abort.reason,
        "stopped": ending.stopped,
        "watch": ending.validity.report() if ending.validity else None,
        "counter_checks": checks.report(),
        "sampler": asdict(sampler.quality()),
        "harness": harness.report(),
    }
