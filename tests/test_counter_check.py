"""An energy counter checked against its own power before a run trusts it: the check on
synthetic telemetry, the run's fallback to integrated power on the simulator with a faulty
counter, and the run table's warnings."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from rich.console import Console

from ipw_async import run_benchmark
from ipw_async.report import summary_table
from ipw_async.rundir import RunDir
from ipw_async.sim import SimConfig
from ipw_async.telemetry.base import Meter
from ipw_async.telemetry.counter_check import (
    BASE_TOLERANCE,
    POWER_LAG_S,
    check_counter,
    check_counters,
    events_since,
    window_wanted_ns,
)
from ipw_async.telemetry.grid import CounterGrid

from .conftest import fast_engine, quick_config

NS = 1_000_000_000
WINDOW = (0, 3 * NS)


def telemetry(
    power_w: Callable[[np.ndarray], np.ndarray],
    period_ms: float = 20.0,
    seconds: float = 3.0,
    phase_ms: float = 0.0,
    scale: float = 1.0,
) -> pl.DataFrame:
    """Reads every 50 ms of a power field and a counter that integrates it (times ``scale``),
    updating every ``period_ms`` from ``phase_ms``: each read sees its last update's value."""
    t = np.arange(0, seconds * NS + 1, 50e6)
    p = power_w(t / NS)
    true = np.concatenate(([0.0], np.cumsum((p[1:] + p[:-1]) / 2 * np.diff(t) / NS)))
    period, phase = period_ms * 1e6, phase_ms * 1e6
    updates = phase + np.floor((t - phase) / period) * period
    return pl.DataFrame(
        {
            "dev.t_ns": t.astype(np.int64),
            "gpu0.energy_j": np.interp(updates, t, true) * scale,
            "gpu0.power_w": p,
        }
    )


def flat(watts: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda s: np.full_like(s, watts)


def meter(period_ms: float | None = 20.0, phase_ms: float = 0.0) -> Meter:
    grids = () if period_ms is None else (CounterGrid(period_ms * 1e6, phase_ms * 1e6),)
    return Meter("gpu0", "counter", accelerator=True, source="dev", grids=grids)


def test_a_counter_that_agrees_with_its_power_is_ok() -> None:
    check = check_counter(telemetry(lambda s: 150 + 100 * np.sin(s * 7)), meter(), WINDOW)
    assert check.status == "ok" and not check.failed
    assert check.ratio == pytest.approx(1.0, abs=0.02)
    assert check.window_s == pytest.approx(3.0) and check.power_j == pytest.approx(check.counter_j, rel=0.02)
    lag = abs(check.tolerance - BASE_TOLERANCE - 2 * 0.02 / 3.0)  # the power's change over the window
    assert lag < 0.1


def test_a_load_step_under_a_lagging_power_field_is_no_fault() -> None:
    # idle, then loaded a second in: the counter follows the device, the power field a 1 s
    # average of it (NVML's power usage on many GPUs) that trails it across the window's end
    def device(s: np.ndarray) -> np.ndarray:
        return np.where(s < 1.0, 70.0, 400.0)

    frame = telemetry(device)
    t = frame.get_column("dev.t_ns").to_numpy() / NS
    averaged = np.array([device(np.linspace(max(0.0, x - 1.0), x, 50)).mean() for x in t])
    frame = frame.with_columns(pl.Series("gpu0.power_w", averaged))
    check = check_counter(frame, meter(), WINDOW)
    assert abs(check.ratio - 1) > BASE_TOLERANCE + 2 * 0.02 / 3.0  # beyond the tolerance without lag
    assert check.status == "ok", check.reason
    # a counter a quarter of what it should be under the same step is still caught
    low = frame.with_columns(pl.col("gpu0.energy_j") * 0.25)
    assert check_counter(low, meter(), WINDOW).status == "disagrees"


def test_a_counter_that_does_not_move_is_stuck() -> None:
    check = check_counter(telemetry(flat(200.0), scale=0.0), meter(None), WINDOW)
    assert check.status == "stuck" and check.failed
    assert check.counter_j == 0 and check.power_j == pytest.approx(600.0)
    assert "did not move in 3.0 s" in check.reason and "600.0 J" in check.reason


def test_a_counter_that_stepped_back_runs_backwards() -> None:
    frame = telemetry(flat(200.0))
    # the source's tracker saw a reset in the window, and kept its column monotonic
    reset = check_counter(frame, meter(), WINDOW, {"resets": 1, "wraps": 0})
    assert reset.status == "backwards" and "backwards once" in reset.reason
    # a wrap (RAPL's range) is no fault
    assert check_counter(frame, meter(), WINDOW, {"resets": 0, "wraps": 2}).status == "ok"
    # a column that goes down itself (a source with no tracker)
    energy = frame.get_column("gpu0.energy_j").to_numpy().copy()
    energy[30:] -= 20.0  # 10 J a read: one step of -10 J
    raw = check_counter(frame.with_columns(pl.Series("gpu0.energy_j", energy)), meter(), WINDOW)
    assert raw.status == "backwards"


@pytest.mark.parametrize(("scale", "side"), [(3.0, "above"), (1 / 3, "below")])
def test_a_counter_off_by_a_scale_factor_disagrees(scale: float, side: str) -> None:
    check = check_counter(telemetry(flat(200.0), scale=scale), meter(), WINDOW)
    assert check.status == "disagrees" and check.failed
    assert check.ratio == pytest.approx(scale, rel=0.02)
    assert f"% {side}" in check.reason and "scale error" in check.reason


@pytest.mark.parametrize("scale", [1.3, 0.7])
def test_a_counter_a_third_off_its_sampled_power_is_kept_and_the_ratio_said(scale: float) -> None:
    # bursty load between power readings does this to a correct counter over a few seconds
    check = check_counter(telemetry(flat(200.0), scale=scale), meter(), WINDOW)
    assert check.status == "ok" and not check.failed
    assert check.ratio == pytest.approx(scale, rel=0.02) and "counter is kept" in check.reason


H100_RUN = Path(__file__).resolve().parents[2] / "shared" / "traces" / "h100-8b-graphs" / "c128" / "run"


@pytest.mark.skipif(
    not H100_RUN.is_dir(), reason="the real H100 traces (../shared/traces) are not beside this clone"
)
def test_a_real_h100_counter_is_kept_in_every_3_s_window_of_bursty_load() -> None:
    # its sampled power reads 0.76-1.17 of the counter over these windows; the whole run agrees
    # within 2%. The check before this one called the counter faulty in two of them.
    run = RunDir.open(H100_RUN)
    manifest, frame = run.require_manifest(), run.measured_telemetry()
    assert frame is not None
    gpu = next(m for m in manifest.meters if m.channel == "gpu0")
    t = frame.get_column(gpu.time_column).drop_nulls().to_numpy()
    checks = [
        check_counter(frame, gpu, (int(a), int(a + 3 * NS))) for a in np.arange(t[0], t[-1] - 3 * NS, NS / 2)
    ]
    ratios = [c.ratio for c in checks if c.ratio is not None]
    assert len(ratios) > 100 and min(ratios) < 0.8 and max(ratios) > 1.15  # bursty, as measured
    assert not any(c.failed for c in checks)
    whole = check_counter(frame, gpu, (int(t[0]), int(t[-1])))
    assert whole.status == "ok" and abs(whole.ratio - 1) < 0.02


def test_a_slow_counter_is_allowed_its_quantisation() -> None:
    # a 100 ms counter whose last read is 99 ms stale, as load rises: 12% short of the power,
    # beyond the base tolerance but within the 2 periods the window allows for
    frame = telemetry(lambda s: np.where(s > 2.9 - 1e-9, 400.0, 100.0), period_ms=100.0, phase_ms=1.0)
    check = check_counter(frame, meter(100.0, 1.0), WINDOW)
    assert BASE_TOLERANCE < 1 - check.ratio < check.tolerance  # type: ignore[operator]
    # 2 periods over 3 s, and the power field's lag across a 300 W change between the ends
    lag = 300 * POWER_LAG_S / check.power_j  # type: ignore[operator]
    assert check.tolerance == pytest.approx(BASE_TOLERANCE + 2 * 0.1 / 3.0 + lag)
    assert check.status == "ok" and check.period_ms == pytest.approx(100.0)
    # the period comes from the readings where no grid was learned
    assert check_counter(frame, meter(None), WINDOW).period_ms == pytest.approx(100.0)


def test_without_power_or_enough_readings_a_counter_goes_unchecked() -> None:
    frame = telemetry(flat(200.0))
    no_power = check_counter(frame.drop("gpu0.power_w"), meter(), WINDOW)
    assert no_power.status == "unchecked" and not no_power.failed and "no power" in no_power.reason
    short = check_counter(frame, meter(), (0, 2 * NS))
    assert short.status == "unchecked" and "2.0 s, less than the 3 s" in short.reason
    # a 500 ms counter needs 10 updates: 5 s
    slow = check_counter(telemetry(flat(200.0), period_ms=500.0, seconds=4.0), meter(500.0), (0, 4 * NS))
    assert slow.status == "unchecked" and "10 of its 500 ms updates" in slow.reason
    idle = check_counter(telemetry(flat(0.1)), meter(), WINDOW)
    assert idle.status == "unchecked" and "too little" in idle.reason
    nulls = frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("gpu0.power_w"))
    assert "too few readings" in check_counter(nulls, meter(), WINDOW).reason


def test_only_counter_meters_are_checked_and_slow_ones_wait_longer() -> None:
    frame = telemetry(flat(200.0))
    meters = [meter(), Meter("cpu", "power", source="dev"), Meter("gpu1", "counter", source="dev")]
    checks = check_counters(frame, meters, WINDOW, {"gpu0": {"resets": 1}})
    assert set(checks) == {"gpu0", "gpu1"}
    assert checks["gpu0"].status == "backwards" and checks["gpu1"].status == "unchecked"
    assert window_wanted_ns(meter(), frame, 0) == 3 * NS
    assert window_wanted_ns(meter(500.0), frame, 0) == 10 * NS  # 20 updates
    assert events_since({"gpu0": {"resets": 1}}, {"gpu0": {"resets": 3, "wraps": 0}}) == {
        "gpu0": {"resets": 2, "wraps": 0}
    }


# --- whole runs on the simulator, its counter faulty or not ---


async def _run(tmp_path: Path, fault: str, **overrides: object) -> dict:  # type: ignore[type-arg]
    settings: dict[str, object] = {
        "max_queries": None,
        "duration": 2.5,
        "baseline_s": 0.5,  # the check extends it to 3 s into the load
        "sim": SimConfig(engine=fast_engine(counter_fault=fault), output_median=16),
    }
    config = quick_config(tmp_path, **(settings | overrides))
    result = await run_benchmark(config)
    assert result.complete
    return result.summary


def _run_json_meter(tmp_path: Path) -> dict:  # type: ignore[type-arg]
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    return next(m for m in manifest["telemetry"]["meters"] if m["channel"] == "sim")


async def test_a_healthy_counter_passes_and_is_used(tmp_path: Path) -> None:
    summary = await _run(tmp_path, "none")
    check = summary["telemetry"]["counter_checks"]["sim"]
    assert check["status"] == "ok" and check["action"] is None, check
    assert abs(check["ratio"] - 1) < check["tolerance"] and check["window_s"] >= 2.7
    assert summary["telemetry"]["counter_checks_skipped"] is None
    sim = summary["energy"]["meters"]["sim"]
    assert sim["kind"] == "counter" and sim["provenance"] == "measured" and "distrusted" not in sim
    assert _run_json_meter(tmp_path)["distrusted"] == ""


async def test_a_stuck_counter_falls_back_to_its_power(tmp_path: Path) -> None:
    summary = await _run(tmp_path, "stuck")
    check = summary["telemetry"]["counter_checks"]["sim"]
    assert check["status"] == "stuck" and check["action"] == "power integrated instead", check
    sim = summary["energy"]["meters"]["sim"]
    assert sim["kind"] == "power" and sim["provenance"] == "integrated"
    assert sim["distrusted"] == check["reason"] and "did not move" in sim["distrusted"]
    # the fallback measured the device: at least its 70 W static over the run, from the
    # power it averaged (an integral of what it drew), placed a window late
    assert sim["total_j"] > 70 * 2.5 and sim["power_averaged_over_s"] == 1.0
    assert _run_json_meter(tmp_path) | {"grids": []} == {
        "channel": "sim",
        "kind": "power",
        "accelerator": True,
        "power_quantity": "avg_power_w",
        "source": "sim",
        "grids": [],
        "distrusted": check["reason"],
    }
    records = pl.read_ipc_stream(tmp_path / "run" / "records.arrow")
    assert set(records.get_column("sim.provenance").to_list()) <= {"integrated", "imputed"}
    text = _text(summary_table(summary))
    assert "counter check" in text and "sim stuck: the counter did not move" in text


async def test_trust_counter_keeps_a_stuck_counter(tmp_path: Path) -> None:
    summary = await _run(tmp_path, "stuck", trust_counter=True)
    check = summary["telemetry"]["counter_checks"]["sim"]
    assert check["status"] == "stuck" and check["action"] == "counter kept (--trust-counter)"
    sim = summary["energy"]["meters"]["sim"]
    assert sim["kind"] == "counter" and "distrusted" not in sim
    assert sim["total_j"] == 0.0  # what the stuck counter says, as asked


async def test_a_counter_that_runs_backwards_falls_back_to_its_power(tmp_path: Path) -> None:
    summary = await _run(tmp_path, "backwards")
    check = summary["telemetry"]["counter_checks"]["sim"]
    # the source's tracker turns each backward step into a reset, which the run reports
    assert summary["telemetry"]["counter_events"]["sim"]["resets"] >= 1
    assert check["status"] == "backwards", check
    sim = summary["energy"]["meters"]["sim"]
    assert sim["kind"] == "power" and sim["distrusted"] == check["reason"]


async def test_a_run_shorter_than_the_window_goes_unchecked_and_keeps_its_counter(tmp_path: Path) -> None:
    summary = await _run(tmp_path, "stuck", duration=0.5, baseline_s=0.2, tail_s=0.1)
    check = summary["telemetry"]["counter_checks"]["sim"]
    assert check["status"] == "unchecked" and "less than the 3 s" in check["reason"]
    assert summary["energy"]["meters"]["sim"]["kind"] == "counter"


async def test_without_a_counter_no_check_runs_and_the_summary_says_why(tmp_path: Path) -> None:
    summary = (await run_benchmark(quick_config(tmp_path, telemetry="psutil"))).summary
    assert summary["telemetry"]["counter_checks"] is None
    assert summary["telemetry"]["counter_checks_skipped"] == "no meter reads an energy counter"


# --- the run table ---


def _text(table: object) -> str:
    console = Console(record=True, width=300, file=io.StringIO())
    console.print(table)
    return console.export_text()


def test_the_run_table_warns_of_skipped_ticks_and_gaps_longer_than_a_counter_period() -> None:
    summary = {
        "model": "m",
        "telemetry": {
            "sampler": {
                "lateness_ms": {"p99": 0.64},
                "skipped_ticks": 101,
                "gaps": {
                    "gpu0@host:9180": {"largest_ms": 5037.2, "counter_period_ms": 100.0},
                    "psutil": {"largest_ms": 80.0, "counter_period_ms": None},
                    "gpu1": {"largest_ms": 60.0, "counter_period_ms": 100.0},
                },
            },
            "counter_checks": {
                "gpu0": {
                    "status": "disagrees",
                    "reason": "it is 25% above",
                    "action": "power integrated instead",
                },
                "gpu1": {"status": "ok", "reason": "fine", "action": None},
            },
        },
    }
    text = _text(summary_table(summary))
    assert "101 ticks skipped" in text
    assert "gpu0@host:9180 went 5,037 ms without a reading (its counter updates every 100 ms)" in text
    assert "gpu1 went" not in text and "psutil went" not in text
    assert "gpu0 disagrees: it is 25% above; power integrated instead" in text and "gpu1 ok" not in text
    calm = summary | {"telemetry": {"sampler": {"lateness_ms": {"p99": 0.64}, "skipped_ticks": 0}}}
    text = _text(summary_table(calm))
    assert "skipped" not in text and "counter check" not in text
    one = summary | {"telemetry": {"sampler": {"lateness_ms": {"p99": 0.64}, "skipped_ticks": 1}}}
    assert "1 tick skipped" in _text(summary_table(one))
