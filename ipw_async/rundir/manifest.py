"""``run.json``: the run directory's description, written first and kept current.

``run.json`` holds what finishing needs besides the data: the config (no secrets), the clock
anchor, the load, the workload, every telemetry meter with its counter grids, the baseline
window, counter resets and wraps as they happen, and, once the run ends, how it ended. It is
rewritten atomically whenever one of those changes.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._clock import NS, ClockAnchor
from ..telemetry.base import Meter
from . import files
from .host import host, versions

# The run directory's format, carried by run.json and summary.json: raised when what a file
# holds changes so that an older reader would misread it. 2: the records as measured are in
# measured.arrow, never rewritten; records.arrow holds them as finished
FORMAT = 2


class RunDirError(ValueError):
    """A directory that is not (or not enough of) a run; the message says which file is missing."""


def check_format(data: Any, path: Path) -> None:
    """Refuse, in one line, a file written by a newer ipw-async than this one."""
    written = data.get("format", FORMAT) if isinstance(data, dict) else FORMAT
    if isinstance(written, int) and written > FORMAT:
        raise RunDirError(
            f"{path} was written in run format {written} by a newer ipw-async; this one reads "
            f"format {FORMAT} and older: upgrade ipw-async to read it"
        )


@dataclass(frozen=True)
class Finishing:
    """What finishing reads of a run's config (``run.json``'s ``config``), typed: how its energy
    is attributed, its price, its concurrency and its precision targets. A field an older run
    did not write takes the default that run had."""

    attribution: str
    prefill_weight: float
    power_model: str
    baseline_w: float | None
    context_cost: str
    capture_sizes: str
    price: str | None
    concurrency: int | None
    until_precision: dict[str, float]

    @classmethod
    def of(cls, config: dict[str, Any]) -> Finishing:
        try:
            return cls(
                attribution=config["attribution"],
                prefill_weight=float(config["prefill_weight"]),
                power_model=config.get("power_model", "auto"),
                baseline_w=config["baseline_w"],
                context_cost=config.get("context_cost", "shared"),
                capture_sizes=config.get("capture_sizes", "auto"),
                price=config.get("price"),
                concurrency=config.get("concurrency"),
                until_precision=config.get("until_precision") or {},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RunDirError(f"run.json's config lacks what finishing needs ({exc})") from None


@dataclass
class Manifest:
    """The contents of ``run.json``."""

    config: dict[str, Any]
    anchor: ClockAnchor
    simulated: bool
    model: str
    base_url: str | None
    workload: dict[str, Any]  # kind, dataset name, scorer
    load: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)  # opened telemetry source -> description
    skipped: dict[str, str] = field(default_factory=dict)  # telemetry source -> why not
    meters: list[Meter] = field(default_factory=list)
    sample_ms: float = 50.0
    probe_s: float = 1.0
    baseline_window_ns: tuple[int, int] | None = None
    counter_events: dict[str, dict[str, int]] = field(default_factory=dict)
    # each energy counter's check, once it ran: kept as it happens, so a killed run still says
    counter_checks: dict[str, Any] | None = None
    clocks: dict[str, dict[str, Any]] = field(default_factory=dict)  # remote sources: clock alignment
    # per device that can tell: the PIDs computing on it as the measured load began and ended
    gpu_processes: dict[str, dict[str, list[int] | None]] = field(default_factory=dict)
    end: dict[str, Any] | None = None  # how the run ended; None while it runs (or after a crash)
    dispatched: int = 0  # requests sent so far, kept current as records are flushed: what a crash can lose
    # one entry per --resume: when the session started (ns on the run clock), records dropped
    sessions: list[dict[str, Any]] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    versions: dict[str, str | None] = field(default_factory=versions)
    host: dict[str, Any] = field(default_factory=host)
    format: int = FORMAT  # as read: a run written by an older version keeps its layout

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "run_id": self.run_id,
            "simulated": self.simulated,
            "model": self.model,
            "base_url": self.base_url,
            "clock": {
                "t0_monotonic_ns": self.anchor.monotonic_ns,
                "t0_unix_ns": self.anchor.unix_ns,
                "unit": "ns since t0",
            },
            "started_at": dt.datetime.fromtimestamp(self.anchor.unix_ns / NS, dt.UTC).isoformat(),
            "workload": self.workload,
            "load": self.load,
            "telemetry": {
                "sources": self.sources,
                "skipped": self.skipped,
                "meters": [m.as_dict() for m in self.meters],
                "sample_ms": self.sample_ms,
                "probe_s": self.probe_s,
                "counter_events": self.counter_events,
                "counter_checks": self.counter_checks,
                "clocks": self.clocks,
                "gpu_processes": self.gpu_processes,
            },
            "baseline_window_ns": list(self.baseline_window_ns) if self.baseline_window_ns else None,
            "end": self.end,
            "dispatched": self.dispatched,
            "sessions": self.sessions,
            "config": self.config,
            "versions": self.versions,
            "host": self.host,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        tel = data["telemetry"]
        window = data.get("baseline_window_ns")
        return cls(
            config=data["config"],
            anchor=ClockAnchor(data["clock"]["t0_monotonic_ns"], data["clock"]["t0_unix_ns"]),
            simulated=data["simulated"],
            model=data["model"],
            base_url=data["base_url"],
            workload=data["workload"],
            load=data["load"],
            sources=tel["sources"],
            skipped=tel["skipped"],
            meters=[Meter.from_dict(m) for m in tel["meters"]],
            sample_ms=tel["sample_ms"],
            probe_s=tel["probe_s"],
            baseline_window_ns=(int(window[0]), int(window[1])) if window else None,
            counter_events=tel.get("counter_events", {}),
            counter_checks=tel.get("counter_checks"),
            clocks=tel.get("clocks", {}),
            gpu_processes=tel.get("gpu_processes", {}),
            end=data.get("end"),
            dispatched=data.get("dispatched", 0),
            sessions=data.get("sessions", []),
            run_id=data["run_id"],
            versions=data["versions"],
            host=data["host"],
            format=data.get("format", 1),
        )

    @property
    def finishing(self) -> Finishing:
        return Finishing.of(self.config)

    @property
    def session_starts_ns(self) -> tuple[int, ...]:
        """Where a resumed session began: energy counters are not continued across these."""
        return tuple(int(s["started_ns"]) for s in self.sessions)

    def write(self, run_dir: Path) -> None:
        files.write_json(run_dir / files.RUN, self.as_dict())

    @classmethod
    def read(cls, run_dir: Path) -> Manifest:
        path = run_dir / files.RUN
        if not run_dir.is_dir():
            raise RunDirError(f"{run_dir} is not a directory")
        if not path.is_file():
            raise RunDirError(
                f"{run_dir} holds no {files.RUN}: it is not a run directory, or an ipw-async older "
                "than 0.2 wrote it"
            )
        try:
            data = files.read_json(path)
        except ValueError as exc:
            raise RunDirError(f"{path} is not a run description ipw-async can read ({exc})") from None
        check_format(data, path)
        try:
            return cls.from_dict(data)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RunDirError(f"{path} is not a run description ipw-async can read ({exc})") from None
