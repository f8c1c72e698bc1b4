"""Plain progress lines: one every few seconds, readable in a terminal or a CI log."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, TextIO

from rich.console import Console

from .state import RunState

if TYPE_CHECKING:
    from .results import RunResult


def progress_line(state: RunState) -> str:
    req_s, tok_s = state.rates()
    total = f"/{state.planned}" if state.planned else ""
    parts = [
        f"{'[simulated] ' if state.simulated else ''}{state.elapsed_s():6.1f}s {state.phase}",
        f"{state.units_done}{total}{' tasks' if state.multi_turn else ''} done",
        (
            f"{state.tasks_in_flight} tasks · {state.in_flight} turns in flight"
            if state.multi_turn
            else f"{state.in_flight} in flight"
        ),
        f"{req_s:.1f} req/s",
        f"{tok_s:,.0f} tok/s",
        f"errors {state.failed}",
    ]
    power = [f"{m.name} {m.power_w:.0f} W" for m in state.meters.values() if m.power_w is not None]
    if power:
        parts.append(", ".join(power))
    return " · ".join(parts)


async def report_lines(state: RunState, interval_s: float = 2.0, stream: TextIO | None = None) -> None:
    """Print a progress line every ``interval_s`` until cancelled."""
    out = stream or sys.stderr
    while True:
        await asyncio.sleep(interval_s)
        print(progress_line(state), file=out, flush=True)


class LinesDisplay:
    """Periodic plain lines on stderr, then the summary table: for logs and non-terminals."""

    def __init__(self, interval_s: float = 2.0, quiet: bool = False) -> None:
        self.interval_s = interval_s
        self.quiet = quiet
        self.console = Console(stderr=True, highlight=False)

    async def run(self, state: RunState) -> None:
        if self.quiet:
            return
        await report_lines(state, self.interval_s, self.console.file)

    def note(self, message: str) -> None:
        if not self.quiet:
            self.console.print(message, markup=False, soft_wrap=True)

    def finish(self, result: RunResult) -> None:
        if self.quiet:
            return
        from .report import summary_table

        self.console.print(summary_table(result.summary, str(result.run_dir)))
