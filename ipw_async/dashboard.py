"""Live terminal dashboard: one boxed panel redrawn at most 4 times a second from RunState counters.

A frame is built as pre-styled segments rather than a rich Table: a Table of the same rows costs
about 6 ms to lay out and draw, this about 0.5 ms, and the frame is drawn on the event loop that
times the requests.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.live import Live
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style

from .report import DASH, ms
from .state import MeterState, RunState

if TYPE_CHECKING:
    from .results import RunResult

MAX_HZ = 4.0
LOOP_LAG_WARN_MS = 20.0
SAMPLER_LATENESS_WARN_MS = 10.0
SPARK = "▁▂▃▄▅▆▇█"
BAR_WIDTH = 30

KEY = Style(bold=True)
METER = Style(bold=True, color="cyan")
TITLE = Style(bold=True)
SIMULATED = Style(bold=True, color="magenta")
ERROR = Style(color="red")
UNAVAILABLE = Style(color="yellow")
WARNING = Style(bold=True, color="yellow")
DIM = Style(dim=True)

Piece = tuple[str, Style | None]
Line = list[Piece]

# names and reasons come from devices and exceptions: a newline or escape would break the box
_CONTROL = {c: " " for c in (*range(32), 127)}


def _clean(text: str) -> str:
    return text.translate(_CONTROL)


class Frame:
    """A box of pre-styled lines with a title in its top border: no wrapping, markup or layout pass."""

    def __init__(self, title: Line, lines: list[Line]) -> None:
        self.title = title
        self.lines = lines

    @staticmethod
    def _width(line: Line) -> int:
        return sum(cell_len(text) for text, _ in line)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        inner = max([self._width(self.title) + 2, *(self._width(line) for line in self.lines)])
        return Measurement(inner + 4, inner + 4).clamp(max_width=options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = [self._width(line) for line in self.lines]
        title_width = self._width(self.title)
        inner = max(1, min(max([title_width + 2, *widths]), options.max_width - 4))
        newline = Segment.line()
        title = [Segment(text, style) for text, style in self.title]
        if title_width > inner - 2:
            title = Segment.adjust_line_length(title, max(0, inner - 2), pad=False)
            title_width = inner - 2
        yield Segment("╭─ ")
        yield from title
        yield Segment(" " + "─" * (inner - title_width - 1) + "╮")
        yield newline
        left, right = Segment("│ "), Segment(" │")
        for line, width in zip(self.lines, widths, strict=True):
            yield left
            if width > inner:
                yield from Segment.adjust_line_length([Segment(t, s) for t, s in line], inner)
            else:
                for text, style in line:
                    yield Segment(text, style)
                if width < inner:
                    yield Segment(" " * (inner - width))
            yield right
            yield newline
        yield Segment("╰" + "─" * (inner + 2) + "╯")
        yield newline


class _Series:
    """One value per bucket of ``per_bucket`` ticks (a mean, None where no tick had a value)."""

    def __init__(self, per_bucket: int, buckets: int) -> None:
        self.per_bucket = per_bucket
        self.done: deque[float | None] = deque(maxlen=buckets)
        self._sum = 0.0
        self._valued = 0
        self._ticks = 0

    def add(self, value: float | None) -> None:
        if value is not None and math.isfinite(value):
            self._sum += value
            self._valued += 1
        self._ticks += 1
        if self._ticks == self.per_bucket:
            self.done.append(self._sum / self._valued if self._valued else None)
            self._sum, self._valued, self._ticks = 0.0, 0, 0

    def values(self) -> list[float | None]:
        out = list(self.done)
        if self._ticks:
            out.append(self._sum / self._valued if self._valued else None)
        return out


class PanelHistory:
    """The last minute of power and output tok/s for the sparklines, fed once per refresh tick.

    Ticks are averaged into 1 s buckets as they arrive, so a frame never scans the raw points.
    It also remembers each meter's energy when the measuring phase began: ``MeterState.energy_j``
    counts from the run's first reading (baseline and warm-up included), while ``ok`` and
    ``output_tokens`` count measured requests only.
    """

    def __init__(self, window_s: float = 60.0, hz: float = MAX_HZ) -> None:
        self.window_s = window_s
        self.per_bucket = max(1, round(hz))
        self.buckets = max(1, math.ceil(window_s * hz / self.per_bucket))
        self.power_w: dict[str, _Series] = {}
        self.tok_s = _Series(self.per_bucket, self.buckets)
        self.energy_at_measuring_j: dict[str, float] | None = None

    def append(self, state: RunState, rates: tuple[float, float] | None = None) -> None:
        """Add this tick's power per meter and output tok/s (``rates`` saves a second scan)."""
        for name, meter in state.meters.items():
            if not meter.available:
                continue
            series = self.power_w.get(name)
            if series is None:
                series = self.power_w[name] = _Series(self.per_bucket, self.buckets)
            series.add(meter.power_w)
        self.tok_s.add((rates or state.rates())[1])
        if self.energy_at_measuring_j is None and state.phase in ("measuring", "finishing", "done"):
            # a meter with no reading yet starts from 0 J, which is where its energy_j will start
            self.energy_at_measuring_j = {
                name: m.energy_j or 0.0 for name, m in state.meters.items() if m.available
            }


# -- figures -------------------------------------------------------------------------------------


def percentiles(values: Iterable[float], qs: Sequence[float]) -> list[float | None]:
    """The qs-th percentiles (0-100), linear interpolation as numpy's default; None when empty."""
    ordered = sorted(values)
    if not ordered:
        return [None] * len(qs)
    out: list[float | None] = []
    for q in qs:
        pos = (len(ordered) - 1) * q / 100
        lo = math.floor(pos)
        hi = min(lo + 1, len(ordered) - 1)
        out.append(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))
    return out


def sparkline(values: Sequence[float | None]) -> str:
    """One block character per value, scaled between the values' minimum and maximum; None is blank.

    Min-to-max scaling shows the shape; the caller prints the range beside it so that a flat
    300 W line with 5 W of noise is not read as a large swing.
    """
    present = [v for v in values if v is not None]
    if not present:
        return " " * len(values)
    lo, hi = min(present), max(present)
    top = len(SPARK) - 1
    if hi - lo <= 1e-9 * max(1.0, abs(hi)):
        level = SPARK[top // 2] if hi else SPARK[0]
        return "".join(" " if v is None else level for v in values)
    scale = top / (hi - lo)
    return "".join(" " if v is None else SPARK[int((v - lo) * scale + 0.5)] for v in values)


def energy_meters(state: RunState) -> list[MeterState]:
    """Meters summed for J/query and J/token: measured (not estimates) and with a reading.

    Only accelerator meters when there are any, as the summary's headline energy does.
    """
    measured = [m for m in state.meters.values() if m.available and not m.estimate and m.energy_j is not None]
    accelerators = [m for m in measured if m.accelerator]
    return accelerators or measured


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _bar(fraction: float) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * BAR_WIDTH)
    return "█" * filled + "░" * (BAR_WIDTH - filled)


def _progress(state: RunState, elapsed: float, rate: float) -> str:
    done = state.units_done
    unit = " tasks" if state.multi_turn else ""
    if state.multi_turn:
        rate = done / elapsed if elapsed > 0 else 0.0
    if state.planned:
        fraction = done / state.planned
        remaining = state.planned - done
        eta = _clock(remaining / rate) if rate > 0 and remaining > 0 else DASH
        return f"{_bar(fraction)} {done:,}/{state.planned:,}{unit} ({fraction:.0%}) · ETA {eta}"
    if state.duration_s:
        return (
            f"{_bar(elapsed / state.duration_s)} {_clock(elapsed)} / {_clock(state.duration_s)}"
            f" · {done:,}{unit} done"
        )
    return f"{_clock(elapsed)} elapsed · {done:,}{unit} done"


def _meter_value(meter: MeterState) -> Line:
    if not meter.available:
        # never a number: an unavailable meter measured nothing, which is not 0 W
        reason = f"unavailable: {_clean(meter.reason)}" if meter.reason else "unavailable"
        return [(reason, UNAVAILABLE)]
    power = DASH if meter.power_w is None else f"{meter.power_w:,.0f} W"
    energy = DASH if meter.energy_j is None else f"{meter.energy_j:,.1f} J"
    return [(f"{power:>9}  {energy:>13} so far", None)]


def _energy_value(state: RunState, history: PanelHistory | None) -> str:
    meters = energy_meters(state)
    if not meters:
        return DASH
    start = history.energy_at_measuring_j if history is not None else None
    total = sum((m.energy_j or 0.0) - (start.get(m.name, 0.0) if start else 0.0) for m in meters)
    per_query = f"{total / state.ok:,.2f}" if state.ok else DASH
    per_token = f"{total / state.output_tokens:,.3f}" if state.output_tokens else DASH
    names = "+".join(_clean(m.name) for m in meters)
    return f"{per_query} J/query · {per_token} J/output token  ({names})"


def _health(state: RunState) -> tuple[str, str | None]:
    lag, late = state.loop_lag_ms, state.sampler_lateness_ms
    line = (
        f"loop lag p99 {DASH if lag is None else f'{lag:,.1f} ms'} · "
        f"sampler lateness p99 {DASH if late is None else f'{late:,.1f} ms'}"
    )
    causes = []
    if lag is not None and lag > LOOP_LAG_WARN_MS:
        causes.append(f"event-loop lag p99 {lag:,.1f} ms > {LOOP_LAG_WARN_MS:.0f} ms")
    if late is not None and late > SAMPLER_LATENESS_WARN_MS:
        causes.append(f"sampler lateness p99 {late:,.1f} ms > {SAMPLER_LATENESS_WARN_MS:.0f} ms")
    warning = "the harness may be the bottleneck: " + "; ".join(causes) if causes else None
    return line, warning


def render(
    state: RunState,
    history: PanelHistory | None = None,
    *,
    rates: tuple[float, float] | None = None,
) -> RenderableType:
    """One frame of the dashboard from the state's aggregated counters (and the history, if any).

    ``rates`` is ``state.rates()`` when the caller has it already.
    """
    elapsed = state.elapsed_s()
    req_s, tok_s = rates or state.rates()
    run_req_s = state.ok / elapsed if elapsed > 0 else 0.0
    run_tok_s = state.output_tokens / elapsed if elapsed > 0 else 0.0
    ttft50, ttft95 = percentiles(state.ttft_s, (50, 95))
    (tpot50,) = percentiles(state.tpot_s, (50,))

    rows: list[tuple[str, Style, Line]] = []

    def row(key: str, value: str | Line, key_style: Style = KEY) -> None:
        rows.append((key, key_style, [(value, None)] if isinstance(value, str) else value))

    row("progress", _progress(state, elapsed, req_s or run_req_s))
    target = f" / {state.target_in_flight} target" if state.target_in_flight else ""
    rate_target = ""
    if state.ramping:
        assert state.target_load is not None and state.ramp_to is not None
        per_s = "/s" if state.ramp_rate else ""
        ramp = f" (ramp to {state.ramp_to:,g}{per_s})"
        if state.ramp_rate:
            rate_target = f" · {state.target_load:,.1f}/s target{ramp}"
        else:
            target = f" / {state.target_load:,.0f} target{ramp}"
    if state.multi_turn:
        accuracy = f" · {state.tasks_correct / state.tasks_done:.0%} correct" if state.tasks_done else ""
        row("in flight", f"{state.tasks_in_flight:,} tasks{target} · {state.in_flight:,} turns{accuracy}")
    else:
        row("in flight", f"{state.in_flight:,}{target}")
    row("requests/s", f"{req_s:,.1f} (last 5 s) · {run_req_s:,.1f} (run){rate_target}")
    row("output tok/s", f"{tok_s:,.0f} (last 5 s) · {run_tok_s:,.0f} (run)")
    row("latency", f"TTFT p50 {ms(ttft50)} · p95 {ms(ttft95)} · TPOT p50 {ms(tpot50)}")
    if state.errors:
        detail = ", ".join(f"{_clean(kind)} {n:,}" for kind, n in state.errors.most_common())
        row("errors", [(f"{state.failed:,}: {detail}", ERROR)])
    else:
        row("errors", "0")
    for meter in state.meters.values():
        name = _clean(meter.name) + (" (estimate)" if meter.estimate else "")
        row(name, _meter_value(meter), METER)
    if state.meters:
        row("energy", _energy_value(state, history))
    if history is not None:
        charts: list[tuple[str, Line]] = []
        for name, series in history.power_w.items():
            values = series.values()
            present = [v for v in values if v is not None]
            if present:
                span = f"  {min(present):,.0f}–{max(present):,.0f} W"
                charts.append((f"  {_clean(name)} W", [(sparkline(values), None), (span, DIM)]))
        values = history.tok_s.values()
        present = [v for v in values if v is not None]
        if present:
            span = f"  {min(present):,.0f}–{max(present):,.0f}"
            charts.append(("  output tok/s", [(sparkline(values), None), (span, DIM)]))
        if charts:
            row("last minute", "")
            for key, value in charts:
                row(key, value)
    line, warning = _health(state)
    row("harness", line)

    key_width = max(cell_len(key) for key, _, _ in rows)
    lines: list[Line] = [
        [(key + " " * (key_width - cell_len(key)), style), ("  ", None), *value] for key, style, value in rows
    ]
    if warning:
        lines.append([(f"⚠ {warning}", WARNING)])
    title: Line = [(f"ipw-async {_clean(state.label)}", TITLE)]
    if state.simulated:
        title.append((" [SIMULATED]", SIMULATED))
    title.append((f" · {_clean(state.phase)}", None))
    return Frame(title, lines)


class Dashboard:
    """A live panel on the terminal while the run goes, then the summary table."""

    def __init__(self, console: Console | None = None, refresh_hz: float = MAX_HZ) -> None:
        if not refresh_hz > 0:
            raise ValueError("refresh_hz must be positive")
        self.console = console or Console(stderr=True)
        # capped: each frame costs CPU on the loop that times the requests
        self.interval_s = 1.0 / min(refresh_hz, MAX_HZ)
        self.history = PanelHistory(hz=1.0 / self.interval_s)
        self._live: Live | None = None
        self._finished = False

    @property
    def live(self) -> Live | None:
        """The rich Live while the panel is shown, else None."""
        return self._live

    async def run(self, state: RunState) -> None:
        """Redraw every ``interval_s`` until cancelled; the Live is always stopped on the way out."""
        if self._finished:
            return
        live = Live(
            render(state, self.history),
            console=self.console,
            auto_refresh=False,  # rich's refresh thread would draw off our timer and contend for the GIL
        )
        self._live = live
        live.start(refresh=True)
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                if self._live is not live:  # finish() took it down meanwhile
                    return
                rates = state.rates()
                self.history.append(state, rates)
                live.update(render(state, self.history, rates=rates), refresh=True)
        except Exception as exc:
            self._stop()
            self.console.print(f"dashboard stopped: {exc!r}", markup=False, highlight=False)
            raise
        finally:
            self._stop()

    def _stop(self) -> None:
        live, self._live = self._live, None
        if live is not None:
            live.stop()

    def note(self, message: str) -> None:
        """Print a line above the live panel."""
        self.console.print(message, markup=False, highlight=False)

    def finish(self, result: RunResult) -> None:
        """Take the panel down (its last frame stays), then print the end-of-run summary table."""
        from .report import summary_table

        self._finished = True
        self._stop()
        self.console.print(summary_table(result.summary, str(result.run_dir)))
