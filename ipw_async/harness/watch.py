"""A run's watch while it measures: over-saturation (flagged, or the run stopped there) and the
precision targets of ``--until-precision`` (the run stops once every one is reached).

It looks once a second at what the ledger has heard, with the same statistics the finished
run's summary uses (:mod:`..validity`). Live, a request counts as arrived when it is sent, and
J/query is the accelerator meters' energy over the queries that finished, per batch: the
attributed figures exist only once the run is finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np

from .._clock import NS, now_ns
from ..records import RequestRecord
from ..telemetry import TelemetryLog
from ..telemetry.base import Meter
from ..validity.precision import Batches, Estimate, batch_length, met, ratio_interval
from ..validity.saturation import WINDOW_S, Arrivals, check

TICK_S = 1.0
# batches before a precision stop: fewer, and an early lucky spread would end the run too soon
MIN_STOP_BATCHES = 10
LATENCIES = {"ttft": 1, "tpot": 2, "e2e": 3}  # their columns in RunWatch.done


class Rows:
    """Rows of floats added one at a time, read as one array without copying them. A row is
    kept as a tuple until the rows are read (once a tick): a numpy row assignment per request
    cost the event loop a µs, three times a request."""

    def __init__(self, width: int) -> None:
        self._data = np.empty((1024, width))
        self._count = 0
        self._pending: list[tuple[float, ...]] = []

    def add(self, *row: float) -> None:
        self._pending.append(row)

    @property
    def rows(self) -> np.ndarray:
        if self._pending:
            block = np.array(self._pending, dtype=float)
            self._pending.clear()
            end = self._count + len(block)
            if end > len(self._data):
                grown = np.empty((max(end, 2 * len(self._data)), self._data.shape[1]))
                grown[: self._count] = self._data[: self._count]
                self._data = grown
            self._data[self._count : end] = block
            self._count = end
        return self._data[: self._count]


class RunWatch:
    """Hears every measured request sent and ended (from the ledger), and looks once a tick."""

    def __init__(
        self,
        t0_ns: int,
        on_oversaturation: str,
        targets: dict[str, float],
        meters: list[Meter],
        log: TelemetryLog,
        finish: Callable[[str], None],
        cut: Callable[[str], None],
        note: Callable[[str], None],
        ramp_s: float | None = None,
    ) -> None:
        self.t0_ns = t0_ns
        self.action = on_oversaturation
        self.targets = targets
        self.meters = [m for m in meters if m.accelerator]
        self.log = log
        self.finish = finish  # send no more; what is in flight finishes
        self.cut = cut  # end now: what is in flight is cancelled
        self.note = note
        self.ramp_s = ramp_s or 0.0
        self.start_s = (now_ns() - t0_ns) / NS
        # appended in time order, so each stays sorted by its first column
        self.sent = Rows(1)  # when
        self.ended = Rows(3)  # when, its first token (NaN: none), the wait for it
        self.done = Rows(6)  # the ok ones: when, ttft, tpot, e2e, output tokens, 1
        self.energy: list[tuple[float, float]] = []  # (s, accelerator J since the watch began)
        self.detected: dict[str, Any] | None = None
        self.estimates: dict[str, Estimate | None] = {}
        self.reached_s: float | None = None
        self._counters: dict[str, float] = {}

    def request_sent(self) -> None:
        self.sent.add(self._now())

    def request_ended(self, record: RequestRecord) -> None:
        end = self._now()
        nan = float("nan")
        first = wait = nan
        if record.first_token_ns is not None and record.sent_ns is not None:
            first, wait = record.first_token_ns / NS, (record.first_token_ns - record.sent_ns) / NS
        self.ended.add(end, first, wait)
        if record.status == "ok":
            # the record's ttft_s (the wait), e2e_latency_s and tpot_s, each property read once
            tokens = record.output_tokens
            e2e = record.e2e_latency_s
            e2e = nan if e2e is None else e2e
            tpot = (e2e - wait) / (tokens - 1) if tokens is not None and tokens >= 2 else nan
            self.done.add(end, wait, tpot, e2e, float(tokens or 0), 1.0)

    async def run(self) -> None:
        """Look every :data:`TICK_S` until cancelled."""
        joules, last = 0.0, self._now()
        self._energy_step(0.0)  # the counters' values at the start
        while True:
            await asyncio.sleep(TICK_S)
            now = self._now()
            joules += self._energy_step(now - last)
            last = now
            self.energy.append((now, joules))
            self.look(now)

    def look(self, now: float) -> None:
        if self.detected is None:
            self._saturation(now)
        if self.targets and self.reached_s is None:
            self._precision(now)

    def _saturation(self, now: float) -> None:
        start = self.start_s + self.ramp_s
        # only the window's requests, and a count of those outstanding when it began: a look
        # costs the window, not the run, on the event loop
        lo = max(start, now - WINDOW_S)
        sent, ended = self.sent.rows[:, 0], self.ended.rows
        i, j = int(np.searchsorted(sent, lo)), int(np.searchsorted(ended[:, 0], lo))
        arrivals = Arrivals(sent[i:], ended[j:, 0], ended[j:, 1], ended[j:, 2], already=i - j)
        found = check(arrivals, start, now)
        if found is None or not found.oversaturated:
            return
        self.detected = {"detected_s": now, "reason": found.describe(), "action": self.action}
        if self.action == "stop":
            self.cut(f"over-saturated at {now - self.start_s:.0f} s: {found.describe()}")
        else:
            self.note(f"over-saturated: {found.describe()}; the run goes on (--on-oversaturation flag)")

    def _precision(self, now: float) -> None:
        done = self.done.rows
        if not done.size:
            return
        recent = done[-1000:, 3]  # a typical request lately: enough to size the batches
        typical = float(np.nanmedian(recent)) if np.isfinite(recent).any() else None
        span = now - self.start_s
        batch = batch_length(span, typical, None)
        k = int(span // batch)
        if k < MIN_STOP_BATCHES:
            return
        batches = Batches(done[:, 0], self.start_s, batch, k)
        self.estimates = {name: batches.mean(done[:, column]) for name, column in LATENCIES.items()}
        if self.meters and self.energy:
            times, joules = np.array(self.energy).T
            edges = self.start_s + batch * np.arange(k + 1)
            per_batch = np.diff(np.interp(edges, np.r_[self.start_s, times], np.r_[0.0, joules]))
            self.estimates["j_per_query"] = ratio_interval(per_batch, batches.sum(done[:, 5]), batch)
            self.estimates["j_per_token"] = ratio_interval(per_batch, batches.sum(done[:, 4]), batch)
        if met(self.estimates, self.targets):
            self.reached_s = now
            reached = ", ".join(
                f"{metric} ±{self.estimates[metric].relative:.1%}"  # type: ignore[union-attr]
                for metric in self.targets
            )
            self.finish(f"precision reached after {now - self.start_s:.0f} s: {reached}")

    def _energy_step(self, dt: float) -> float:
        """Accelerator joules over the last tick: a counter's rise, else power × time."""
        total = 0.0
        for m in self.meters:
            counter = self.log.latest(m.energy_column) if m.kind == "counter" else None
            if counter is not None:
                before = self._counters.get(m.channel, counter)
                self._counters[m.channel] = counter
                total += counter - before
            else:
                total += (self.log.latest(m.power_column) or 0.0) * dt
        return total

    def report(self) -> dict[str, Any]:
        """What ``run.json`` keeps of the watch."""
        return {
            "oversaturation": self.detected,
            "precision": {
                "targets": self.targets,
                "reached_s": None if self.reached_s is None else self.reached_s - self.start_s,
                "estimates": {k: None if e is None else e.as_dict() for k, e in self.estimates.items()},
            }
            if self.targets
            else None,
        }

    def _now(self) -> float:
        return (now_ns() - self.t0_ns) / NS
