"""Tests for the live dashboard: the figures a frame shows, and the Live's lifecycle."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from rich.cells import cell_len
from rich.console import Console

from ipw_async import dashboard
from ipw_async._clock import now_ns
from ipw_async.dashboard import Dashboard, PanelHistory, energy_meters, percentiles, render, sparkline
from ipw_async.progress import progress_line
from ipw_async.records import ErrorType, RequestRecord, Status
from ipw_async.report import summary_table
from ipw_async.results import RunResult
from ipw_async.state import MeterState, RunState

NS = 1_000_000_000
TTFTS = [0.1 + i * 0.01 for i in range(20)]


def _console(width: int = 120, terminal: bool = False) -> Console:
    return Console(record=True, width=width, file=io.StringIO(), force_terminal=terminal)


def _text(renderable: Any, width: int = 120) -> str:
    console = _console(width)
    console.print(renderable)
    return console.export_text()


def _line(text: str, word: str) -> str:
    matches = [line for line in text.splitlines() if word in line]
    assert len(matches) == 1, f"{word!r} on {len(matches)} lines:\n{text}"
    return matches[0]


def _ok(i: int, ttft_s: float) -> RequestRecord:
    first = round(ttft_s * NS)
    return RequestRecord(
        request_id=i,
        query_id=str(i),
        dataset="t",
        prompt="p",
        sent_ns=0,
        first_token_ns=first,
        last_token_ns=first + 49 * 10_000_000,  # 50 tokens, 10 ms apart
        usage_output_tokens=50,
    )


def _failed(i: int, kind: ErrorType) -> RequestRecord:
    return RequestRecord(
        request_id=i, query_id=str(i), dataset="t", prompt="p", status=Status.ERROR, error_type=kind
    )


def make_state(**overrides: Any) -> RunState:
    """20 ok requests (1,000 output tokens), 3 failures, 3 in flight, 10 s into measuring."""
    fields: dict[str, Any] = dict(
        label="c16", simulated=True, target_in_flight=16, planned=100, duration_s=None
    )
    fields |= overrides
    state = RunState(**fields)
    state.started_ns = now_ns() - 10 * NS
    state.phase = "measuring"
    records = [_ok(i, t) for i, t in enumerate(TTFTS)]
    records += [_failed(20, ErrorType.TIMEOUT), _failed(21, ErrorType.TIMEOUT), _failed(22, ErrorType.HTTP)]
    for record in records:
        state.started()
        state.finished(record)
    for _ in range(3):
        state.started()
    state.meters = {
        "gpu0": MeterState("gpu0", power_w=312.4, energy_j=1000.0),
        "cpu-model": MeterState("cpu-model", power_w=80.0, energy_j=500.0, estimate=True),
        "rapl": MeterState("rapl"),
        "nvml": MeterState("nvml", available=False, reason="NVML library not found"),
    }
    state.loop_lag_ms = 1.5
    state.sampler_lateness_ms = 0.4
    return state


# -- the figures of one frame --------------------------------------------------------------------


def test_frame_shows_the_counters_of_the_state() -> None:
    text = _text(render(make_state()))
    assert "23/100" in _line(text, "progress")
    assert "3 / 16 target" in _line(text, "in flight")
    # 20 ok completions in the last 5 s; 20 ok over ~10 s of run
    assert "4.0 (last 5 s) · 2.0 (run)" in _line(text, "requests/s")
    assert "200 (last 5 s) · 100 (run)" in _line(text, "output tok/s")
    assert "3: timeout 2, http_error 1" in _line(text, "errors")


def test_multi_turn_run_counts_tasks_and_shows_turns_in_flight() -> None:
    from ipw_async.workload import TaskLog

    state = make_state(planned=10)
    for correct in (True, True, False):
        state.task_started()
        log = TaskLog(0, "t", "agentic", False, "p", "1", 0)
        log.correct = correct
        state.task_finished(log)
    for _ in range(2):
        state.task_started()
    text = _text(render(state))
    assert "3/10 tasks" in _line(text, "progress")  # tasks, not the 23 requests
    assert "2 tasks / 16 target · 3 turns · 67% correct" in _line(text, "in flight")
    line = progress_line(state)
    assert "3/10 tasks done" in line and "2 tasks · 3 turns in flight" in line


def test_a_ramping_target_shows_where_it_is_and_where_it_ends() -> None:
    state = make_state(ramp_to=16.0)
    state.set_target(7.0)
    assert "3 / 7 target (ramp to 16)" in _line(_text(render(state)), "in flight")
    state.set_target(16.0)  # the ramp is over: shown as without one
    line = _line(_text(render(state)), "in flight")
    assert "3 / 16 target" in line and "ramp" not in line
    rate = make_state(label="r8", target_in_flight=None, ramp_to=8.0, ramp_rate=True)
    rate.set_target(3.2)
    text = _text(render(rate))
    assert "(run) · 3.2/s target (ramp to 8/s)" in _line(text, "requests/s")
    assert "target" not in _line(text, "in flight")


def test_latency_percentiles_are_those_of_the_ttft_and_tpot_windows() -> None:
    line = _line(_text(render(make_state())), "TTFT")
    p50, p95 = np.percentile(TTFTS, [50, 95]) * 1000
    assert f"TTFT p50 {p50:,.1f} ms" in line
    assert f"p95 {p95:,.1f} ms" in line
    assert "TPOT p50 10.0 ms" in line


def test_empty_state_shows_dashes_not_zeros() -> None:
    state = RunState(label="c1", simulated=False, target_in_flight=1, planned=None, duration_s=None)
    text = _text(render(state))
    assert "TTFT p50 — · p95 — · TPOT p50 —" in _line(text, "TTFT")
    assert "0:00 elapsed" in _line(text, "progress")
    assert "energy" not in text  # no meters, no energy row


def test_available_meter_shows_power_and_energy() -> None:
    line = _line(_text(render(make_state())), "│ gpu0 ")
    assert "312 W" in line
    assert "1,000.0 J" in line


def test_unavailable_meter_says_so_with_its_reason_and_no_number() -> None:
    line = _line(_text(render(make_state())), "│ nvml ")
    assert "unavailable: NVML library not found" in line
    assert "0 W" not in line
    assert " J" not in line


def test_meter_without_reading_shows_dash_and_estimate_is_labelled() -> None:
    text = _text(render(make_state()))
    rapl = _line(text, "│ rapl ")
    assert "—" in rapl
    assert "0 W" not in rapl
    assert "cpu-model (estimate)" in text


def test_energy_per_query_sums_measured_meters_only() -> None:
    # gpu0's 1,000 J over 20 ok queries and 1,000 tokens; the 500 J estimate is left out
    line = _line(_text(render(make_state())), "J/query")
    assert "50.00 J/query" in line
    assert "1.000 J/output token" in line
    assert "(gpu0)" in line


def test_energy_per_query_prefers_accelerator_meters_when_marked() -> None:
    state = make_state()
    state.meters["rapl"].energy_j = 300.0
    assert [m.name for m in energy_meters(state)] == ["gpu0", "rapl"]
    state.meters["gpu0"].accelerator = True  # type: ignore[attr-defined]
    assert [m.name for m in energy_meters(state)] == ["gpu0"]


def test_energy_per_query_leaves_out_energy_before_measuring() -> None:
    state = make_state()
    state.phase = "warmup"
    history = PanelHistory()
    history.append(state)
    assert history.energy_at_measuring_j is None
    state.meters["gpu0"].energy_j = 200.0  # baseline and warm-up energy
    state.phase = "measuring"
    history.append(state)
    state.meters["gpu0"].energy_j = 1200.0
    assert "50.00 J/query" in _line(_text(render(state, history)), "J/query")
    assert "60.00 J/query" in _line(_text(render(state)), "J/query")


def test_energy_shows_dash_before_any_reading() -> None:
    state = make_state()
    for meter in state.meters.values():
        meter.energy_j = None
    assert _line(_text(render(state)), "│ energy").split()[-2] == "—"


def test_title_carries_label_phase_and_simulated() -> None:
    first = _text(render(make_state())).splitlines()[0]
    assert "c16" in first and "[SIMULATED]" in first and "measuring" in first
    real = _text(render(make_state(simulated=False, label="r8")))
    assert "r8" in real.splitlines()[0]
    assert "SIMULATED" not in real


def test_duration_bound_progress_shows_elapsed_against_duration() -> None:
    line = _line(_text(render(make_state(planned=None, duration_s=60.0))), "progress")
    assert "0:10 / 1:00" in line
    assert "23 done" in line


def test_eta_follows_the_recent_rate() -> None:
    # 77 to go at 4 req/s: 19 s
    assert "ETA 0:19" in _line(_text(render(make_state())), "progress")


def test_health_warning_only_when_the_harness_lags() -> None:
    state = make_state()
    text = _text(render(state))
    assert "loop lag p99 1.5 ms · sampler lateness p99 0.4 ms" in _line(text, "harness")
    assert "bottleneck" not in text
    state.loop_lag_ms = 35.0
    assert "event-loop lag p99 35.0 ms" in _line(_text(render(state)), "the harness may be the bottleneck")
    state.loop_lag_ms = 20.0  # at the threshold: not over it
    assert "bottleneck" not in _text(render(state))
    state.sampler_lateness_ms = 12.5
    line = _line(_text(render(state)), "the harness may be the bottleneck")
    assert "sampler lateness p99 12.5 ms" in line
    assert "event-loop" not in line


def test_history_draws_power_and_tok_s_sparklines() -> None:
    state = make_state()
    history = PanelHistory(window_s=60.0, hz=1.0)
    for watts in (100.0, 200.0, 300.0):
        state.meters["gpu0"].power_w = watts
        history.append(state)
    text = _text(render(state, history))
    gpu = _line(text, "gpu0 W")
    assert "▁▅█" in gpu and "100–300 W" in gpu
    assert "rapl W" not in text  # never read: no chart
    assert "nvml W" not in text  # unavailable: no chart
    assert "200" in _line(text, "  output tok/s")


def test_history_keeps_one_minute_in_one_second_buckets() -> None:
    state = make_state()
    history = PanelHistory(window_s=60.0, hz=4.0)
    for tick in range(4 * 90 + 2):
        state.meters["gpu0"].power_w = float(tick // 4)
        history.append(state)
    values = history.power_w["gpu0"].values()
    assert len(values) == 61  # 60 full seconds and the one under way
    assert values[0] == 30.0 and values[-2] == 89.0 and values[-1] == 90.0


def test_sparkline_scales_between_min_and_max() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([10.0, None, 20.0]) == "▁ █"
    assert sparkline([5.0, 5.0]) == "▄▄"
    assert sparkline([None, None]) == "  "
    assert sparkline([]) == ""


def test_percentiles_match_numpy() -> None:
    values = [0.3, 0.1, 0.7, 0.2, 0.9]
    assert percentiles(values, (50, 95)) == pytest.approx(list(np.percentile(values, [50, 95])))
    assert percentiles([], (50,)) == [None]


def test_untrusted_text_cannot_break_the_box() -> None:
    state = make_state()
    state.meters["nvml"].reason = "driver said:\nfailed [bold]\x1b[31m"
    text = _text(render(state))
    assert all(line[0] in "╭│╰" for line in text.splitlines())
    assert "[bold]" in text  # shown as written, not read as markup


def test_narrow_terminal_crops_lines_to_its_width() -> None:
    text = _text(render(make_state()), width=50)
    assert all(cell_len(line) <= 50 for line in text.splitlines())


# -- the Live's lifecycle ------------------------------------------------------------------------

SHOW_CURSOR, HIDE_CURSOR = "\x1b[?25h", "\x1b[?25l"


def _result(run_dir: str) -> RunResult:
    summary = {"model": "m", "simulated": True, "complete": True, "requests": {"ok": 20, "measured": 23}}
    return RunResult(run_dir=Path(run_dir), summary=summary, records=pl.DataFrame())


def test_refresh_rate_is_capped_at_four_per_second() -> None:
    assert Dashboard(_console(), refresh_hz=100.0).interval_s == 0.25
    assert Dashboard(_console(), refresh_hz=2.0).interval_s == 0.5
    with pytest.raises(ValueError):
        Dashboard(_console(), refresh_hz=0)


async def test_run_stops_the_live_cleanly_when_cancelled() -> None:
    console = _console(terminal=True)
    dash = Dashboard(console)
    task = asyncio.create_task(dash.run(make_state()))
    await asyncio.sleep(0.35)  # one refresh tick
    live = dash.live
    assert live is not None and live.is_started
    assert dash.history.tok_s.values()  # the tick fed the history
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not live.is_started
    assert dash.live is None
    raw = console.file.getvalue()  # type: ignore[attr-defined]
    assert raw.rfind(SHOW_CURSOR) > raw.rfind(HIDE_CURSOR) >= 0  # the cursor is back
    assert "c16" in console.export_text()


async def test_run_stops_the_live_when_rendering_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0

    def failing(state: RunState, history: PanelHistory | None = None, **_: Any) -> str:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RuntimeError("boom")
        return "first frame"

    monkeypatch.setattr(dashboard, "render", failing)
    console = _console(terminal=True)
    dash = Dashboard(console)
    with pytest.raises(RuntimeError, match="boom"):
        await asyncio.wait_for(dash.run(make_state()), timeout=2)
    assert dash.live is None
    raw = console.file.getvalue()  # type: ignore[attr-defined]
    assert raw.rfind(SHOW_CURSOR) > raw.rfind(HIDE_CURSOR) >= 0
    assert "dashboard stopped: RuntimeError('boom')" in console.export_text()


async def test_note_prints_the_message_as_written_while_live() -> None:
    console = _console(terminal=True)
    dash = Dashboard(console)
    task = asyncio.create_task(dash.run(make_state()))
    await asyncio.sleep(0)
    dash.note("telemetry gpu0 skipped: [no driver]")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "telemetry gpu0 skipped: [no driver]" in console.export_text()


def test_finish_prints_the_summary_table_with_the_run_directory() -> None:
    console = _console()
    Dashboard(console).finish(_result("/runs/20250101T000000Z_m_qa_c16"))
    text = console.export_text()
    assert "run directory" in text
    assert "/runs/20250101T000000Z_m_qa_c16" in text
    assert "20 / 23" in text


async def test_finish_while_live_takes_the_panel_down_and_ends_run() -> None:
    console = _console(terminal=True)
    dash = Dashboard(console)
    task = asyncio.create_task(dash.run(make_state()))
    await asyncio.sleep(0)
    live = dash.live
    assert live is not None and live.is_started
    dash.finish(_result("/runs/x"))
    assert not live.is_started
    await asyncio.wait_for(task, timeout=2)  # returns on its own at the next tick
    text = console.export_text()
    assert text.index("c16") < text.index("run directory")
    await dash.run(make_state())  # after finish, a late run() shows nothing
    assert dash.live is None


def test_summary_table_says_how_telemetry_was_taken() -> None:
    summary = {
        "model": "m",
        "energy": {
            "total_j": 100.0,
            "attributed_j": 90.0,
            "idle_j": 10.0,
            "headline_meters": ["gpu0"],
            "meters": {
                "gpu0": {
                    "conservation_error": 0.0,
                    "counter_timing": "last update on its learned grid (100 ms)",
                }
            },
        },
        "telemetry": {"sampler": {"lateness_ms": {"p99": 0.84}}},
    }
    text = _text(summary_table(summary), width=200)
    assert "sampler p99 0.8 ms late; gpu0 counter: last update on its learned grid (100 ms)" in text


def test_summary_table_says_energy_was_not_measured_only_when_it_was_not() -> None:
    measured = {"model": "m", "energy": {"total_j": 10.0, "attributed_j": 9.0, "idle_j": 1.0, "skipped": {}}}
    assert "not measured" not in _text(summary_table(measured), width=200)
    host_only = {
        "model": "m",
        "energy": {"meters": {}, "skipped": {"nvml": "no driver"}},
        "telemetry": {"sampler": {"lateness_ms": {"p99": 1.2}}},
    }
    text = _text(summary_table(host_only), width=200)
    assert "not measured (no energy source)" in text and "sampler p99 1.2 ms late" in text


def test_summary_table_says_when_the_only_energy_is_this_machines_cpu_estimate() -> None:
    def summary(kind: str) -> dict[str, Any]:
        meter = {"kind": kind, "conservation_error": 0.0}
        energy = {"total_j": 50.0, "attributed_j": 40.0, "idle_j": 10.0, "headline_meters": ["m"]}
        return {"model": "m", "energy": energy | {"meters": {"m": meter}}}

    assert "ESTIMATE" in _text(summary_table(summary("estimate")), width=200)
    assert "ESTIMATE" not in _text(summary_table(summary("counter")), width=200)
