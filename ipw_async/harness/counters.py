"""The run's energy counters checked against their own power before they are trusted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from .._clock import NS, now_ns
from ..telemetry import Meter, Sampler
from ..telemetry.counter_check import (
    MIN_WINDOW_NS,
    CounterCheck,
    check_counters,
    counter_meters,
    events_since,
    window_wanted_ns,
)


class CounterChecks:
    """Every energy counter checked against its own power before the run trusts it (see
    :mod:`ipw_async.telemetry.counter_check`), over the baseline made at least 3 s and 20 counter
    updates long. A task waits for the telemetry to cover that window and computes off the
    loop; a run that ends sooner is checked over what it has on the way out. A failing counter
    is distrusted (its power integrated instead) unless ``--trust-counter``."""

    def __init__(
        self,
        sampler: Sampler,
        trust: bool,
        note: Callable[[str], None],
        distrusted: Callable[[list[Meter]], None],
    ) -> None:
        self.sampler = sampler
        self.trust = trust
        self.note = note
        self.distrusted = distrusted  # told the meters after each demotion
        self.checks: dict[str, dict[str, Any]] | None = None
        self.skipped = "the run stopped before its energy counters could be checked"
        self._t0 = 0
        self._window: tuple[int, int] | None = None  # ns since run start; its end is a minimum
        self._events: dict[str, dict[str, int]] = {}

    def carry(self, meters: list[Meter]) -> None:
        """Distrust again the counters an earlier session distrusted."""
        for m in meters:
            if m.distrusted and not self.trust:
                self.sampler.distrust(m.channel, m.distrusted)

    def begin(self, t0_ns: int, baseline_s: float) -> Coroutine[Any, Any, None] | None:
        """The window starts now; the task that checks it, or None with nothing to check."""
        if not counter_meters(self.sampler.meters):
            self.skipped = "no meter reads an energy counter"
            return None
        self._t0 = t0_ns
        start = now_ns() - t0_ns
        self._window = (start, start + max(int(baseline_s * NS), MIN_WINDOW_NS))
        self._events = self.sampler.counter_events()
        return self._run()

    async def _run(self) -> None:
        assert self._window is not None
        start, end = self._window
        await self._until(end)
        # a counter's period is known by now (its grid, or its reads): a slow one needs longer
        frame = await asyncio.to_thread(self.sampler.log.frame)
        wanted = max(window_wanted_ns(m, frame, start) for m in counter_meters(self.sampler.meters))
        end = max(end, start + wanted)
        await self._until(end)
        await asyncio.sleep(2 * self.sampler.period_ns / NS)  # the tick at the window's end logged
        self._apply(await asyncio.to_thread(self._check, (start, end)))

    async def _until(self, t_ns: int) -> None:
        await asyncio.sleep(max(0.0, (self._t0 + t_ns - now_ns()) / NS))

    def _check(self, window: tuple[int, int]) -> dict[str, CounterCheck]:
        events = events_since(self._events, self.sampler.counter_events())
        return check_counters(self.sampler.log.frame(), self.sampler.meters, window, events)

    async def finish(self) -> None:
        """On the way out: check what the run had, if its window was never covered."""
        if self.checks is not None or self._window is None:
            return
        window = (self._window[0], now_ns() - self._t0)
        try:
            self._apply(await asyncio.to_thread(self._check, window))
        except Exception as exc:  # the run's data matter more than its check: keep them
            self.skipped = f"the energy counter check failed ({type(exc).__name__}: {exc})"

    def _apply(self, checks: dict[str, CounterCheck]) -> None:
        self.checks = {}
        demoted = False
        for channel, check in checks.items():
            action = None
            if check.failed:
                if self.trust:
                    action = "counter kept (--trust-counter)"
                    self.note(f"{channel}: {check.reason}; the counter is kept, as --trust-counter asks")
                else:
                    action = "power integrated instead"
                    self.sampler.distrust(channel, check.reason)
                    demoted = True
                    self.note(
                        f"{channel}: {check.reason}; its power is integrated instead "
                        "(give --trust-counter to use the counter)"
                    )
            self.checks[channel] = check.as_dict() | {"action": action}
        if demoted:
            self.distrusted(self.sampler.meters)

    def report(self) -> dict[str, Any]:
        """What run.json keeps: each counter's check, or why none ran."""
        return {
            "meters": self.checks,
            "skipped": None if self.checks is not None else self.skipped,
            "trust_counter": self.trust,
        }
