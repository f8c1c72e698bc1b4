"""Tests for the load driver: ramp shapes, and the closed and open loops following them."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ipw_async._clock import now_ns
from ipw_async.load import LoadSpec, drive

# ramps and deadlines are checked against the wall clock: no other test beside them
pytestmark = pytest.mark.timing

NS = 1_000_000_000


class Recorder:
    """A fake ``execute``: sleeps ``work_s``, noting each unit, when it started and how many ran."""

    def __init__(self, work_s: float) -> None:
        self.work_s = work_s
        self.t0 = now_ns()
        self.in_flight = 0
        self.units: list[Any] = []
        self.samples: list[tuple[float, int]] = []  # (seconds since t0, in flight with this one)
        self.scheduled_s: list[float] = []

    async def __call__(self, unit: Any, scheduled_ns: int) -> None:
        self.units.append(unit)
        self.in_flight += 1
        self.samples.append(((now_ns() - self.t0) / NS, self.in_flight))
        self.scheduled_s.append((scheduled_ns - self.t0) / NS)
        try:
            await asyncio.sleep(self.work_s)
        finally:
            self.in_flight -= 1

    def peak(self, lo: float, hi: float) -> int:
        return max(n for t, n in self.samples if lo <= t < hi)


async def _drive(
    spec: LoadSpec, units: Iterator[Any], rec: Recorder, until_s: float | None, **kw: Any
) -> float:
    """Drive from ``rec``'s t0; the seconds the drive took."""
    deadline = rec.t0 + int(until_s * NS) if until_s is not None else None
    await drive(spec, units, rec, np.random.default_rng(7), deadline, **kw)
    return (now_ns() - rec.t0) / NS


# -- the ramp's shape ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ramp", "expected"),
    [
        ("linear", [1.0, 8.5, 16.0, 16.0]),
        ("exponential", [1.0, 4.0, 16.0, 16.0]),
        ("steps", [1.0, 11.0, 16.0, 16.0]),  # stages 1, 6, 11, 16 of 2.5 s each
        (None, [16.0, 16.0, 16.0, 16.0]),
    ],
)
def test_target_at_start_middle_end_and_beyond(ramp: str | None, expected: list[float]) -> None:
    spec = LoadSpec(concurrency=16, ramp=ramp, ramp_duration=10.0, ramp_start=1.0)
    assert [spec.target_at(t) for t in (0.0, 5.0, 10.0, 25.0)] == pytest.approx(expected)


def test_steps_are_equal_stages_evenly_spaced_reaching_the_target_at_the_last() -> None:
    spec = LoadSpec(concurrency=16, ramp="steps", ramp_duration=10.0, ramp_start=1.0)
    times = [0.0, 2.49, 2.5, 4.99, 5.0, 7.49, 7.5, 9.99]
    assert [spec.target_at(t) for t in times] == pytest.approx([1, 1, 6, 6, 11, 11, 16, 16])
    # flat: pytest.approx takes no nested tuples (pytest 9.2 refuses them)
    changes = [value for change in spec.target_changes() for value in change]
    assert changes == pytest.approx([0.0, 1.0, 2.5, 6.0, 5.0, 11.0, 7.5, 16.0])
    assert LoadSpec(concurrency=16, ramp="steps", ramp_steps=1).target_at(0.0) == 16.0


def test_ramp_start_defaults_to_one_in_flight_or_a_tenth_of_the_rate_never_above_target() -> None:
    assert LoadSpec(concurrency=16, ramp="linear").target_at(0.0) == 1.0
    assert LoadSpec(rate=8.0, ramp="linear").target_at(0.0) == pytest.approx(0.8)
    assert LoadSpec(rate=8.0, ramp="linear", ramp_start=20.0).target_at(0.0) == 8.0
    assert LoadSpec(concurrency=2, ramp="exponential", ramp_start=5.0).target_at(1.0) == 2.0


def test_in_flight_level_rounds_half_up_and_is_at_least_one() -> None:
    spec = LoadSpec(concurrency=4, ramp="linear", ramp_duration=1.0, ramp_start=0.2)
    # target_at: 0.2 + 3.8 t
    assert [spec.in_flight_at(t) for t in (0.0, 0.3, 0.34, 0.35, 0.5, 1.0)] == [1, 1, 1, 2, 2, 4]
    levels = list(spec.target_changes())
    assert [v for _, v in levels] == [1.0, 2.0, 3.0, 4.0]
    assert [t for t, _ in levels] == pytest.approx([0.0, 1.3 / 3.8, 2.3 / 3.8, 3.3 / 3.8])


@pytest.mark.parametrize("ramp", ["linear", "exponential", "steps", None])
def test_cumulative_rate_integrates_target_and_inverts(ramp: str | None) -> None:
    spec = LoadSpec(rate=100.0, ramp=ramp, ramp_duration=2.0, ramp_start=10.0, ramp_steps=3)
    grid = np.linspace(0.0, 3.0, 30001)
    integral = np.concatenate([[0.0], np.cumsum(np.diff(grid) * [spec.target_at(t) for t in grid[:-1]])])
    assert [spec.cumulative(t) for t in grid[::1000]] == pytest.approx(integral[::1000], rel=2e-3, abs=1e-2)
    for t in (0.0, 0.3, 1.0, 1.9, 2.0, 2.7):
        assert spec.cumulative_inverse(spec.cumulative(t)) == pytest.approx(t, abs=1e-9)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(concurrency=4, ramp="bogus"),
        dict(concurrency=4, ramp="linear", ramp_duration=0.0),
        dict(rate=2.0, ramp="linear", ramp_start=0.0),
        dict(concurrency=4, ramp="steps", ramp_steps=0),
    ],
)
def test_bad_ramp_options_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="--ramp"):
        LoadSpec(**kwargs)


# -- the closed loop -----------------------------------------------------------------------------


async def test_closed_loop_in_flight_follows_a_linear_ramp() -> None:
    spec = LoadSpec(concurrency=8, ramp="linear", ramp_duration=1.0, ramp_start=1.0)
    rec = Recorder(0.02)
    await _drive(spec, itertools.count(), rec, until_s=1.4)
    # never above the level (drive starts after t0, so its level at a sample is at most this)
    assert all(n <= spec.in_flight_at(t) for t, n in rec.samples)
    assert rec.peak(0.0, 0.06) == 1  # level 2 from 1/14 s
    assert 3 <= rec.peak(0.45, 0.55) <= 5  # level 4.15 to 4.85: 4, then 5 from 0.5 s
    assert rec.peak(1.05, 1.4) == 8


async def test_closed_loop_steps_loses_no_unit_and_ends_when_units_run_out() -> None:
    spec = LoadSpec(concurrency=8, ramp="steps", ramp_duration=0.4, ramp_start=2.0)
    rec = Recorder(0.005)
    took = await _drive(spec, iter(range(300)), rec, until_s=None)
    assert sorted(rec.units) == list(range(300))  # each once: none lost, none twice
    assert rec.peak(0.0, 0.09) == 2 and rec.peak(0.32, took) == 8
    # a ramp longer than the units last: the workers still waiting for their level stop too
    rec = Recorder(0.01)
    slow = LoadSpec(concurrency=8, ramp="steps", ramp_duration=20.0, ramp_start=1.0)
    took = await _drive(slow, iter(range(10)), rec, until_s=None)
    assert sorted(rec.units) == list(range(10)) and rec.peak(0.0, took) == 1
    assert took < 1.0


async def test_closed_loop_ramp_stops_at_the_deadline() -> None:
    spec = LoadSpec(concurrency=6, ramp="exponential", ramp_duration=2.0, ramp_start=1.0)
    rec = Recorder(0.05)
    took = await _drive(spec, itertools.count(), rec, until_s=0.5)
    # the units started before it finish (50 ms each); none start after, and the drive does not
    # wait out the 2 s ramp (a loaded host wakes the last unit's sleep late: not 0.65 s)
    assert 0.5 <= took < 1.0
    assert rec.samples and max(t for t, _ in rec.samples) < 0.5
    assert rec.units == sorted(rec.units) == list(range(len(rec.units)))


async def test_closed_loop_without_ramp_holds_the_concurrency_from_the_start() -> None:
    rec = Recorder(0.02)
    targets: list[float] = []
    await _drive(LoadSpec(concurrency=4), iter(range(40)), rec, None, on_target=targets.append)
    assert rec.peak(0.0, 0.01) == 4 and sorted(rec.units) == list(range(40))
    assert targets == [4.0]


async def test_on_target_reports_each_level_of_the_ramp_in_order() -> None:
    spec = LoadSpec(concurrency=8, ramp="steps", ramp_duration=0.4, ramp_start=2.0)
    calls: list[tuple[float, float]] = []
    rec = Recorder(0.01)
    await _drive(
        spec, itertools.count(), rec, 0.5, on_target=lambda v: calls.append(((now_ns() - rec.t0) / NS, v))
    )
    assert [v for _, v in calls] == [2.0, 4.0, 6.0, 8.0]
    assert [t for t, _ in calls] == pytest.approx([0.0, 0.1, 0.2, 0.3], abs=0.03)


# -- the open loop -------------------------------------------------------------------------------


async def test_open_loop_arrivals_rise_with_a_linear_rate_ramp() -> None:
    spec = LoadSpec(rate=300.0, ramp="linear", ramp_duration=1.0, ramp_start=30.0)
    rec = Recorder(0.0)
    await _drive(spec, itertools.count(), rec, until_s=1.5)
    counts, _ = np.histogram(rec.scheduled_s, bins=[0.0, 0.5, 1.0, 1.5])
    # expected 52.5, 112.5 and 150 (Λ(t) = 30 t + 135 t² over the ramp, then 300/s)
    assert counts[1] > 1.6 * counts[0] and counts[2] > 1.1 * counts[1]
    assert 30 <= counts[0] <= 75 and 120 <= counts[2] <= 180
    assert max(t for t, _ in rec.samples) < 1.6  # scheduled, and sent, on time


async def test_open_loop_constant_arrivals_follow_the_inverse_cumulative_rate() -> None:
    spec = LoadSpec(rate=100.0, arrival="constant", ramp="linear", ramp_duration=1.0, ramp_start=10.0)
    rec = Recorder(0.0)
    targets: list[float] = []
    await _drive(spec, iter(range(75)), rec, None, on_target=targets.append)
    times = np.array(rec.scheduled_s)
    # Λ(t) = 10 t + 45 t²: arrival n at Λ⁻¹(n); Λ(1) = 55, then 100/s
    assert times[10] == pytest.approx((-10 + np.sqrt(100 + 180 * 10)) / 90, abs=2e-3)
    assert times[55] == pytest.approx(1.0, abs=2e-3)
    assert np.diff(times[56:]) == pytest.approx(0.01, abs=1e-4)
    assert times[1] - times[0] > 5 * (times[55] - times[54])  # gaps shrink as the rate rises
    assert targets[0] == pytest.approx(10.0) and targets[-1] == 100.0
    assert all(a < b for a, b in itertools.pairwise(targets)) and len(targets) == 5  # 0, .25, .5, .75, 1 s


async def test_open_loop_ramp_keeps_the_max_concurrency_cap() -> None:
    spec = LoadSpec(rate=400.0, ramp="exponential", ramp_duration=0.3, max_concurrency=3)
    rec = Recorder(0.03)
    await _drive(spec, iter(range(60)), rec, None)
    assert sorted(rec.units) == list(range(60)) and rec.peak(0.0, 10.0) == 3
