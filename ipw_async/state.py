"""Live counters of a run, updated per completed request and read by progress displays."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from ._clock import NS, now_ns
from .records import RequestRecord, Status

if TYPE_CHECKING:
    from .workload import TaskLog


class Phase(StrEnum):
    STARTING = "starting"
    BASELINE = "baseline"  # idle power before any request
    WARMUP = "warmup"
    MEASURING = "measuring"
    FINISHING = "finishing"  # the telemetry tail after the last request
    DONE = "done"


@dataclass
class MeterState:
    """What a display shows for one energy meter: unavailable until a reading arrives."""

    name: str
    available: bool = True
    reason: str | None = None  # why it is unavailable
    power_w: float | None = None
    energy_j: float | None = None  # since the run started
    estimate: bool = False
    accelerator: bool = False  # counts toward the headline energy, as in the summary


@dataclass
class RunState:
    """Aggregates only: a display reads these, never the per-event data."""

    label: str
    simulated: bool
    target_in_flight: int | None
    planned: int | None  # requests to send, when known
    duration_s: float | None
    started_ns: int = field(default_factory=now_ns)
    phase: Phase = Phase.STARTING
    in_flight: int = 0
    done: int = 0
    ok: int = 0
    failed: int = 0
    output_tokens: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    # (completion time, output tokens) of recent requests, for rolling rates
    recent: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=65536))
    ttft_s: deque[float] = field(default_factory=lambda: deque(maxlen=512))
    tpot_s: deque[float] = field(default_factory=lambda: deque(maxlen=512))
    meters: dict[str, MeterState] = field(default_factory=dict)
    sampler_lateness_ms: float | None = None  # recent p99
    loop_lag_ms: float | None = None  # recent p99
    run_dir: str | None = None
    # multi-turn runs: units are tasks, each many requests
    tasks_in_flight: int = 0
    tasks_done: int = 0
    tasks_correct: int = 0
    # a --ramp: the target it is at now (set_target) and the one it ends at; in flight, or
    # requests/s when ramp_rate
    target_load: float | None = None
    ramp_to: float | None = None
    ramp_rate: bool = False

    @property
    def multi_turn(self) -> bool:
        return self.tasks_in_flight > 0 or self.tasks_done > 0

    @property
    def units_done(self) -> int:
        """What ``planned`` counts: tasks in a multi-turn run, else requests."""
        return self.tasks_done if self.multi_turn else self.done

    @property
    def ramping(self) -> bool:
        """A ramp is under way: its target is set and below the one it ends at."""
        return self.ramp_to is not None and self.target_load is not None and self.target_load < self.ramp_to

    def set_target(self, value: float) -> None:
        """The load's target now: the driver's ``on_target``."""
        self.target_load = value

    def task_started(self) -> None:
        self.tasks_in_flight += 1

    def task_finished(self, log: TaskLog) -> None:
        self.tasks_in_flight -= 1
        if not log.warmup:
            self.tasks_done += 1
            self.tasks_correct += bool(log.correct)

    def started(self) -> None:
        self.in_flight += 1

    def finished(self, record: RequestRecord) -> None:
        self.in_flight -= 1
        if record.warmup:
            return
        self.done += 1
        t = now_ns()
        if record.status is Status.OK:
            self.ok += 1
            tokens = record.output_tokens or 0
            self.output_tokens += tokens
            self.recent.append((t, tokens))
            if (ttft := record.ttft_s) is not None:
                self.ttft_s.append(ttft)
            if (tpot := record.tpot_s) is not None:
                self.tpot_s.append(tpot)
        else:
            self.failed += 1
            self.errors[str(record.error_type)] += 1

    def elapsed_s(self) -> float:
        return (now_ns() - self.started_ns) / NS

    def rates(self, window_s: float = 5.0) -> tuple[float, float]:
        """Requests/s and output tokens/s over the last ``window_s`` seconds."""
        t = now_ns()
        since = t - int(window_s * NS)
        n = tokens = 0
        for when, tok in reversed(self.recent):
            if when < since:
                break
            n += 1
            tokens += tok
        span = min(window_s, self.elapsed_s()) or 1.0
        return n / span, tokens / span
