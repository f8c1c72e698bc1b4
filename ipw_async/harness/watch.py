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
from ..validity.precision import Estimate, batch_length, binned, met, ratio_interval
from ..validity.saturation import Arrivals, check

TICK_S = 1.0
# batches before a precision stop: fewer, and an early lucky spread would end the run too soon
MIN_STOP_BATCHES = 10


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
        self.sent: list[float] = []
        self.ended: list[float] = []
        self.first_token: list[float] = []
        self.wait: list[float] = []
        self.done: list[
            tuple[float, float, float, float, float, float]
        ] = []  # end, ttft, tpot, e2e, tokens, 1
        self.energy: list[tuple[float, float]] = []  # (s, accelerator J since the watch began)
        self.detected: dict[str, Any] | None = None
        self.estimates: dict[str, Estimate | None] = {}
        self.reached_s: float | None = None
        self._counters: dict[str, float] = {}

    def request_sent(self) -> None:
        self.sent.append(self._now())

    def request_ended(self, record: RequestRecord) -> None:
        end = self._now()
        self.ended.append(end)
        if record.first_token_ns is not None and record.sent_ns is not None:
            self.first_token.append(record.first_token_ns / NS)
            self.wait.append((record.first_token_ns - record.sent_ns) / NS)
        if record.status == "ok":
            nan = float("nan")
            self.done.append(
                (
                    end,
                    record.ttft_s if record.ttft_s is not None else nan,
                    record.tpot_s if record.tpot_s is not None else nan,
                    record.e2e_latency_s if record.e2e_latency_s is not None else nan,
                    float(record.output_tokens or 0),
                    1.0,
                )
            )

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
        arrivals = Arrivals(
            np.array(self.sent), np.array(self.ended), np.array(self.first_token), np.array(self.wait)
        )
        found = check(arrivals, start, now)
        if found is None or not found.oversaturated:
            return
        self.detected = {"detected_s": now, "reason": found.describe(), "action": self.action}
        if self.action == "stop":
            self.cut(f"over-saturated at {now - self.start_s:.0f} s: {found.describe()}")
        else:
            self.note(f"over-saturated: {found.describe()}; the run goes on (--on-oversaturation flag)")

    def _precision(self, now: float) -> None:
        if not self.done:
            return
        done = np.array(self.done)
        typical = float(np.nanmedian(done[:, 3])) if np.isfinite(done[:, 3]).any() else None
        span = now - self.start_s
        batch = batch_length(span, typical, None)
        k = int(span // batch)
        if k < MIN_STOP_BATCHES:
            return
        ends = done[:, 0]

        def per(column: int, weight: int = 5) -> Estimate | None:
            values = done[:, column]
            have = np.isfinite(values)
            return ratio_interval(
                binned(ends, np.where(have, values, np.nan), self.start_s, batch, k),
                binned(ends, np.where(have, done[:, weight], np.nan), self.start_s, batch, k),
                batch,
            )

        self.estimates = {"ttft": per(1), "tpot": per(2), "e2e": per(3)}
        if self.meters and self.energy:
            times, joules = np.array(self.energy).T
            edges = self.start_s + batch * np.arange(k + 1)
            per_batch = np.diff(np.interp(edges, np.r_[self.start_s, times], np.r_[0.0, joules]))
            queries = binned(ends, done[:, 5], self.start_s, batch, k)
            tokens = binned(ends, done[:, 4], self.start_s, batch, k)
            self.estimates["j_per_query"] = ratio_interval(per_batch, queries, batch)
            self.estimates["j_per_token"] = ratio_interval(per_batch, tokens, batch)
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
