"""Was a run valid: over-saturation, the steady window, the precision of its means, and the
rules that end a run by them; the statistics on planted cases, then whole runs on the simulator."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest

from ipw_async import run_benchmark
from ipw_async.harness import RunConfig
from ipw_async.harness.search import Probe
from ipw_async.sim import EngineConfig, SimConfig
from ipw_async.validity.options import parse_targets
from ipw_async.validity.precision import ratio_interval
from ipw_async.validity.saturation import Arrivals, assess
from ipw_async.validity.steady import BATCH, level_shift, mser

# over-saturation and steady windows are read from TTFT trends: no other test beside them
pytestmark = pytest.mark.timing


def queue(rate: float, servers: int, service_s: float, seconds: float, seed: int = 0) -> Arrivals:
    """Poisson arrivals served first come, first served by ``servers`` servers."""
    rng = np.random.default_rng(seed)
    arrived = np.cumsum(rng.exponential(1 / rate, int(rate * seconds * 1.2)))
    arrived = arrived[arrived < seconds]
    service = rng.exponential(service_s, arrived.size)
    free = np.zeros(servers)
    started = np.empty_like(arrived)
    for i, a in enumerate(arrived):
        k = int(np.argmin(free))
        started[i] = max(a, free[k])
        free[k] = started[i] + service[i]
    first = started + 0.02  # a first token soon after its turn comes
    return Arrivals(arrived, started + service, first, first - arrived)


def test_a_queue_below_capacity_is_not_oversaturated() -> None:
    for seed in range(5):
        found = assess(queue(rate=7, servers=10, service_s=1.0, seconds=60, seed=seed), 0.0, 60.0)
        assert found["oversaturated"] is False, found


def test_a_queue_above_capacity_is_flagged_early_and_its_onset_found() -> None:
    found = assess(queue(rate=15, servers=10, service_s=1.0, seconds=60), 0.0, 60.0)
    assert found["oversaturated"] is True
    assert found["detected_s"] <= 30
    assert found["began_s"] < 10 and found["share_of_run"] > 0.8
    # below capacity for 30 s, then above: the pile-up is placed where it began
    calm, storm = queue(7, 10, 1.0, 30, seed=1), queue(20, 10, 1.0, 30, seed=2)
    # the second half's queue starts where the first left off: shift it in time
    joined = Arrivals(
        np.r_[calm.arrived_s, storm.arrived_s + 30],
        np.r_[calm.ended_s, storm.ended_s + 30],
        np.r_[calm.first_token_s, storm.first_token_s + 30],
        np.r_[calm.wait_s, storm.wait_s],
    )
    found = assess(joined, 0.0, 60.0)
    assert found["oversaturated"] is True
    assert 25 <= found["began_s"] <= 36
    assert 0.3 <= found["share_of_run"] <= 0.6


def test_too_short_a_run_is_not_judged() -> None:
    found = assess(queue(15, 10, 1.0, 8), 0.0, 8.0)
    assert found["oversaturated"] is None and "too short" in found["reason"]


def test_mser_crops_a_planted_warmup_and_no_more() -> None:
    rng = np.random.default_rng(3)
    values = 1.0 + 0.05 * rng.standard_normal(600)
    values[:80] += np.linspace(1.0, 0.0, 80)  # slow at first, settling
    cut = mser(values)
    assert 40 <= cut <= 100 and cut % BATCH == 0
    burst = values.copy()
    burst[200:240] *= 1.15  # a second of another process's load after the warm-up: not warm-up
    assert mser(burst) == cut
    assert mser(1.0 + 0.05 * rng.standard_normal(600)) == 0  # nothing planted: nothing cropped
    drift = 1.0 + 0.002 * rng.standard_normal(600)
    drift[:150] *= 1.012  # a 1% step on a tight series is no warm-up
    assert mser(drift) == 0


def test_a_planted_level_shift_is_found_where_it_is() -> None:
    rng = np.random.default_rng(4)
    times = np.linspace(0, 60, 600)
    values = 1.0 + 0.05 * rng.standard_normal(600)
    assert level_shift(times, values) is None
    values[400:] *= 1.3
    shift = level_shift(times, values)
    assert shift is not None
    assert abs(shift["at_s"] - times[400]) <= 1.0
    assert shift["change"] == pytest.approx(0.3, abs=0.05)


def test_batch_means_intervals_cover_the_truth_about_95_percent() -> None:
    rng = np.random.default_rng(5)
    covered = 0
    for _ in range(400):
        count = rng.poisson(20, 12).astype(float)
        energy = count * 10.0 + rng.normal(0, 8, 12)  # 10 J a query, noisy per batch
        estimate = ratio_interval(energy, count, 1.0)
        assert estimate is not None
        covered += abs(estimate.mean - 10.0) <= estimate.half_width
    assert 0.90 <= covered / 400 <= 0.99
    assert ratio_interval(np.ones(3), np.ones(3), 1.0) is None  # under 5 batches: not known


def test_precision_targets_parse_and_bad_ones_say_what_to_give() -> None:
    assert parse_targets(["j_per_query=2%", "ttft=0.05"]) == {"j_per_query": 0.02, "ttft": 0.05}
    with pytest.raises(ValueError, match="METRIC=PCT"):
        parse_targets(["joules=2%"])
    with pytest.raises(ValueError, match="between 0% and 100%"):
        parse_targets(["tpot=150%"])
    with pytest.raises(ValueError, match="needs a share"):
        parse_targets(["tpot=fast"])


def test_an_oversaturated_probe_fails_whatever_its_slos() -> None:
    probe = Probe(4.0, Path("x"), status="ok", margins={"ttft_p99": 0.4}, oversaturated=True)
    assert not probe.passed and probe.tightest <= -1.0
    assert Probe(4.0, Path("x"), status="ok", margins={"ttft_p99": 0.4}).passed


# A small server: 4 sequences a step, 10 ms steps, so it serves about 21 requests/s.
SMALL = SimConfig(engine=EngineConfig(max_batch=4, step_base_ms=10.0, step_per_seq_ms=0.05), output_median=16)


def small_config(tmp_path: Path, **overrides: object) -> RunConfig:
    config = RunConfig(
        output_dir=tmp_path / "run",
        baseline_s=0.2,
        tail_s=0.2,
        telemetry="none",
        max_queries=100_000,
        sim=SMALL,
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


async def test_a_rate_far_above_capacity_is_stopped_and_every_record_kept(tmp_path: Path) -> None:
    config = small_config(tmp_path, rate=60.0, duration=40.0, on_oversaturation="stop")
    result = await run_benchmark(config)
    summary = result.summary
    assert summary["saturation"]["oversaturated"] is True
    assert summary["stopped"].startswith("over-saturated at")
    assert summary["saturation"]["live"]["detected_s"] <= 30
    assert summary["window_s"] < 25  # stopped, not run to its 40 s
    # requests in flight at the stop are cancelled and kept, not lost
    statuses = set(result.records.get_column("status").to_list())
    assert "cancelled" in statuses and "ok" in statuses
    assert summary["loss"]["requests_not_recorded"] == 0
    assert summary["steady"]["steady"] in (False, None)


# slow (21 s): `python benchmarks/search_validity.py --only oversaturation` runs it 20 times
@pytest.mark.slow
async def test_a_rate_at_two_thirds_of_capacity_is_steady_and_not_flagged(tmp_path: Path) -> None:
    result = await run_benchmark(small_config(tmp_path, rate=14.0, duration=20.0, on_oversaturation="stop"))
    summary = result.summary
    assert summary["saturation"]["oversaturated"] is False and summary["stopped"] is None
    steady = summary["steady"]
    assert steady["steady"] is True and steady["start_s"] < steady["end_s"]
    assert steady["requests"] > 150 and steady["latency_s"]["tpot"]["count"] > 0


async def test_the_steady_window_crops_a_planted_warmup_and_finds_a_level_shift(tmp_path: Path) -> None:
    engine = EngineConfig(step_base_ms=8.0, step_per_seq_ms=0.05, slow_start_s=3.0, slow_start_factor=3.0)
    shifted = EngineConfig(step_base_ms=8.0, step_per_seq_ms=0.05, slow_after_s=7.0, slow_after_factor=1.6)
    # side by side, each against its own simulator: their wall time is most of this file's
    async with asyncio.TaskGroup() as runs:
        warm_run, shifted_run = (
            runs.create_task(
                run_benchmark(
                    small_config(
                        tmp_path / name, concurrency=8, duration=duration, sim=SimConfig(engine=e, output_median=16)
                    )
                )
            )
            for name, e, duration in (("w", engine, 10.0), ("s", shifted, 13.0))
        )
    warm, run = warm_run.result(), shifted_run.result()
    steady = warm.summary["steady"]
    assert steady["warmup_cropped_requests"] > 0
    assert 1.5 <= steady["start_s"] <= 4.5  # the warm-up fades over the server's first 3 s
    steady = run.summary["steady"]
    assert steady["steady"] is False and "shifts" in steady["reason"]
    shift = steady["level_shift"]
    # the server starts before the run's clock does: the shift lands a little before 7 s
    assert 5.0 <= shift["at_s"] <= 7.5 and shift["change"] == pytest.approx(0.55, abs=0.2)


async def test_a_run_stops_once_its_means_are_known_to_the_precision_asked(tmp_path: Path) -> None:
    config = small_config(tmp_path, concurrency=4, duration=60.0, until_precision={"tpot": 0.02, "e2e": 0.05})
    result = await run_benchmark(config)
    summary = result.summary
    assert summary["complete"] is True
    assert summary["stopped"].startswith("precision reached")
    assert summary["window_s"] < 45
    live = summary["precision"]["live"]
    assert live["reached_s"] is not None
    assert live["estimates"]["tpot"]["relative"] <= 0.02 and live["estimates"]["e2e"]["relative"] <= 0.05
    final = summary["precision"]["metrics"]
    assert final["tpot"]["target"] == 0.02 and math.isfinite(final["tpot"]["relative"])


def test_the_watch_reads_each_finished_request_as_its_record_defines_it() -> None:
    """The live watch's latencies are the record's own ttft_s, tpot_s and e2e_latency_s (a
    stream with one token has no TPOT), however many requests it has heard before a look."""
    from ipw_async.harness.watch import RunWatch
    from ipw_async.records import RequestRecord, Status
    from ipw_async.telemetry import TelemetryLog

    watch = RunWatch(0, "flag", {}, [], TelemetryLog([]), print, print, print)
    records = []
    for i in range(1500):
        r = RequestRecord(i, f"q{i}", "d", "p", sent_ns=i * 1000, first_token_ns=i * 1000 + 5_000_000)
        tokens = 1 + i % 7
        r.last_token_ns = r.first_token_ns + (tokens - 1) * 2_000_000
        r.chunk_ns, r.chunk_tokens = [r.first_token_ns] * tokens, [1] * tokens
        r.status = Status.OK
        watch.request_ended(r)
        records.append(r)
        if i == 600:
            assert len(watch.done.rows) == 601  # a look between ends sees every one so far
    done = watch.done.rows
    nan = float("nan")
    expect = [[r.ttft_s, nan if r.tpot_s is None else r.tpot_s, r.e2e_latency_s] for r in records]
    assert np.allclose(done[:, 1:4], expect, equal_nan=True)
    assert np.isnan(done[0, 2]) and done[:, 4].tolist() == [float(r.output_tokens) for r in records]
