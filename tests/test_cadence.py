"""Learning when an energy counter updates, and timing its reads by it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ipw_async._clock import NS, now_ns
from ipw_async.energy import counter_knots
from ipw_async.telemetry import OpenSource, Sampler
from ipw_async.telemetry.base import Meter, Reading, SourceInfo, TelemetrySource
from ipw_async.telemetry.cadence import learn_grid, settled
from ipw_async.telemetry.grid import CounterGrid, chained, last_updates

# the sampler's probes time a counter's updates to a fraction of a ms: no other test beside them
pytestmark = pytest.mark.timing

MS = 1_000_000


def stepped_counter(t: np.ndarray, period_ms: float, phase_ms: float, watts: float = 100.0) -> np.ndarray:
    """What a counter updating every period_ms (first at phase_ms) reads at t (ns)."""
    updated = phase_ms * MS + np.floor((t - phase_ms * MS) / (period_ms * MS)) * period_ms * MS
    return watts * updated / 1e9


def off_grid(t: float, phase: float, period: float) -> float:
    """How far t is from the nearest point of a grid, either way."""
    return abs((t - phase + period / 2) % period - period / 2)


def test_a_probe_recovers_the_update_grid() -> None:
    rng = np.random.default_rng(1)
    t = np.cumsum(rng.uniform(1.8, 2.4, 500)) * MS  # ~1 s of reads 2 ms apart, jittered
    grid = learn_grid(t, stepped_counter(t, 100.0, 37.0))
    assert grid is not None
    assert grid.period_ns == pytest.approx(100 * MS, rel=1e-3)
    assert off_grid(grid.phase_ns, 37 * MS, 100 * MS) < 0.6 * MS
    assert grid.learned_at_ns == t[0]


def test_a_period_off_the_reads_grid_is_learned_too() -> None:
    t = np.arange(0, 1000, 2.0) * MS  # a 33.3 ms counter read every 2 ms: gaps of 32 or 34 ms
    grid = learn_grid(t, stepped_counter(t, 33.3, 5.0))
    assert grid is not None
    assert grid.period_ns == pytest.approx(33.3 * MS, rel=1e-3)
    assert off_grid(grid.phase_ns, 5 * MS, 33.3 * MS) < 1.0 * MS


def test_a_probe_reads_on_until_its_reads_pin_the_phase_and_lands_nearer() -> None:
    # 200 probes of a 100 ms counter, reads 1–3 ms apart: a second of them leaves the phase
    # loose in most; read until it is pinned (at most twice as long), the grid lands nearer
    rng = np.random.default_rng(7)
    first, pinned, loose = [], [], 0
    for _ in range(200):
        phase = rng.uniform(0, 100)
        t = np.cumsum(rng.uniform(1.0, 3.0, 1000)) * MS
        e = stepped_counter(t, 100.0, phase)
        one = t < NS
        grid = learn_grid(t[one], e[one])
        assert grid is not None
        first.append(off_grid(grid.phase_ns, phase * MS, 100 * MS))
        if not settled(t[one], e[one], grid):
            loose += 1
            two = t < 2 * NS
            grid = learn_grid(t[two], e[two])
            assert grid is not None
        pinned.append(off_grid(grid.phase_ns, phase * MS, 100 * MS))
    assert 100 < loose < 200  # some are pinned in a second already, and end there
    assert np.percentile(pinned, 95) < 0.7 * np.percentile(first, 95)
    assert np.median(pinned) < 0.7 * np.median(first)


def test_more_reads_are_not_asked_of_a_counter_they_cannot_pin() -> None:
    t = np.cumsum(np.random.default_rng(3).uniform(1.0, 3.0, 500)) * MS
    fast = learn_grid(t, stepped_counter(t, 1.0, 0.3))
    assert fast is not None and settled(t, stepped_counter(t, 1.0, 0.3), fast)
    # updates 5 ms either side of their grid: brackets disagree however many there are
    jitter = np.random.default_rng(4).uniform(-5, 5, 40) * MS
    updates = 10 * MS + np.arange(40) * 100 * MS + jitter
    e = np.searchsorted(updates, t).astype(float)
    grid = learn_grid(t, e)
    assert grid is not None and settled(t, e, grid)


def test_a_probe_cut_short_is_not_taken_for_a_fast_counter() -> None:
    t = np.array([20_000.0, 20_002.0, 20_004.0]) * MS
    assert learn_grid(t, np.array([1.0, 1.0, 2.0])) is None


def test_a_counter_as_fast_as_its_reads_is_read_as_current() -> None:
    t = np.arange(0, 1000, 2.0) * MS
    grid = learn_grid(t, stepped_counter(t, 1.0, 0.3))
    assert grid is not None and grid.period_ns == 0
    assert (grid.last_update(t) == t).all()


def test_a_probe_slowed_by_a_busy_host_still_times_a_20_ms_counter() -> None:
    # reads 3–9 ms apart, a third of a 20 ms counter's period: too coarse for a sharp
    # bracket at each update, fine for the fit. Taken for a counter as fast as its reads,
    # the run timed each read as it came, up to a whole period late (10 ms on average).
    # Two seconds of reads: the sampler reads on while its brackets leave the phase loose
    rng = np.random.default_rng(5)
    for phase in rng.uniform(0, 20, 10):
        t = np.cumsum(rng.uniform(3.0, 9.0, 340)) * MS
        grid = learn_grid(t, stepped_counter(t, 20.0, phase))
        assert grid is not None and grid.period_ns == pytest.approx(20 * MS, rel=1e-2)
        later = t[-1] + rng.uniform(0, NS, 200)  # the run's reads in the second after the probe
        truth = phase * MS + np.floor((later - phase * MS) / (20 * MS)) * 20 * MS
        assert np.mean(np.abs(grid.last_update(later) - truth)) < 4 * MS


def test_no_grid_from_too_few_or_irregular_updates() -> None:
    t = np.arange(0, 1000, 2.0) * MS
    assert learn_grid(t, stepped_counter(t, 400.0, 10.0)) is None  # two updates in the probe
    irregular = np.searchsorted([90, 160, 400, 430, 700, 980], t / MS).astype(float)
    assert learn_grid(t, irregular) is None


def test_stale_reads_are_timed_to_the_update_that_produced_them() -> None:
    t = np.arange(0, 2001, 50.0) * MS  # read every 50 ms; the counter updates every 100 ms at 45 ms
    watts = np.where(t < 1000 * MS, 100.0, 300.0)  # a step in power, so timing matters
    true_j = np.concatenate(([0.0], np.cumsum(watts[:-1] * 0.05)))  # energy at each read time

    def energy_at(x: np.ndarray) -> np.ndarray:
        return np.interp(x, t, true_j)

    e = energy_at(45 * MS + np.floor((t - 45 * MS) / (100 * MS)) * 100 * MS)
    kt, ke = counter_knots(t, e, (CounterGrid(100 * MS, 45 * MS),))
    # every knot is an update time, holding the energy the device had then: the first read's
    # too, whose value the update 55 ms before it made
    assert all(off_grid(k, 45 * MS, 100 * MS) == 0 for k in kt)
    assert kt[0] == -55 * MS
    assert ke == pytest.approx(energy_at(kt), rel=1e-12)
    mid_t, _ = counter_knots(t, e)
    assert np.abs(mid_t[1:] - kt[1:]).min() == 20 * MS  # the midpoint guess is 20 ms early


def test_an_update_the_grid_puts_just_before_the_last_stale_read_came_right_after_it() -> None:
    t = np.arange(0, 1001, 50.0) * MS
    e = stepped_counter(t, 100.0, 50.5)  # each update lands 0.5 ms after a read
    learned = CounterGrid(100 * MS, 49.5 * MS)  # the probe put it 1 ms early
    kt, _ = counter_knots(t, e, (learned,))
    assert (kt[1:] / MS).tolist() == [50.0 + 100 * k for k in range(kt.size - 1)]  # not 75, 175, …


def test_each_read_is_timed_by_the_latest_grid_learned_before_it() -> None:
    first = CounterGrid(100 * MS, 0.0, learned_at_ns=0.0)
    later = CounterGrid(100 * MS, 10 * MS, learned_at_ns=20_000 * MS)  # the device clock drifted
    t = np.array([150.0, 19_990.0, 20_050.0]) * MS
    assert (last_updates((first, later), t) / MS).tolist() == [100.0, 19_900.0, 20_010.0]


def test_a_poor_probe_under_load_is_chained_by_the_period_before_it() -> None:
    true_period = 100.0 * MS
    probes = (
        CounterGrid(100.01 * MS, 5 * MS, learned_at_ns=0.0),
        CounterGrid(100.2 * MS, 5 * MS + 200 * true_period + 0.3 * MS, learned_at_ns=20_000 * MS),
        CounterGrid(99.9 * MS, 5 * MS + 400 * true_period - 0.2 * MS, learned_at_ns=40_000 * MS),
    )
    assert [g.period_ns for g in chained(probes)] == pytest.approx([true_period] * 3, abs=0.01 * MS)


def test_probes_20_s_apart_pin_the_period() -> None:
    true_period = 100.0037 * MS
    # each probe times its updates well but its period only to ±40 µs
    first = CounterGrid(100.04 * MS, 12 * MS, learned_at_ns=0.0)
    second = CounterGrid(99.97 * MS, 12 * MS + 200 * true_period, learned_at_ns=20_000 * MS)
    a, b = chained((first, second))
    assert a.period_ns == pytest.approx(true_period, abs=1.0)
    assert b.period_ns == a.period_ns and b.phase_ns == second.phase_ns
    # read 19.9 s in, the first grid alone would be off by 8 ms; chained it is exact
    t = np.array([12 * MS + 199 * true_period + 50 * MS])
    assert last_updates((first, second), t)[0] == pytest.approx(12 * MS + 199 * true_period, abs=10.0)


def test_probes_chain_when_the_first_period_is_off_by_a_tenth_of_a_ms() -> None:
    # as seen on an H100 under load: the first probe's period 0.137 ms short puts the second
    # probe 200.28 of its periods away; the second probe's own estimate counts it right
    true_period = 100.003 * MS
    first = CounterGrid(99.866 * MS, 7 * MS, learned_at_ns=0.0)
    second = CounterGrid(99.892 * MS, 7 * MS + 200 * true_period, learned_at_ns=20_000 * MS)
    a, b = chained((first, second))
    assert a.period_ns == b.period_ns == pytest.approx(true_period, abs=1.0)
    # unchained, a read late in the first grid's reign would be timed 27 ms off
    t = np.array([7 * MS + 199 * true_period + 50 * MS])
    assert last_updates((first, second), t)[0] == pytest.approx(7 * MS + 199 * true_period, abs=10.0)
    assert abs(first.last_update(t)[0] - (7 * MS + 199 * true_period)) > 20 * MS


def test_probes_too_far_apart_to_count_start_afresh() -> None:
    first = CounterGrid(99.0 * MS, 7 * MS, learned_at_ns=0.0)
    second = CounterGrid(101.0 * MS, 7 * MS + 200.5 * 100 * MS, learned_at_ns=20_000 * MS)
    a, b = chained((first, second))
    assert (a.period_ns, b.period_ns) == (first.period_ns, second.period_ns)


class GridCounter(TelemetrySource):
    """A counter that updates every ``period_ms`` on its own clock, like a GPU's."""

    name = "dev"

    def __init__(self, period_ms: float = 30.0, after_first_read_ms: float | None = None) -> None:
        self.period_ms = period_ms
        self.origin = now_ns() - 7 * MS
        self.after_first_read_ms = after_first_read_ms  # else: updates from 7 ms before it exists
        self.reads = 0

    def open(self) -> SourceInfo:
        return SourceInfo(columns=["dev.energy_j"], meters=[Meter("dev", "counter", accelerator=True)])

    def read(self) -> Reading:
        self.reads += 1
        t = now_ns()
        if self.reads == 1 and self.after_first_read_ms is not None:
            self.origin = t + int(self.after_first_read_ms * MS)
        energy = stepped_counter(np.array([t - self.origin]), self.period_ms, 0.0)[0]
        return Reading({"dev.energy_j": float(energy)}, t)


async def sample_for(source: GridCounter, seconds: float, probe_s: float) -> Sampler:
    sampler = Sampler([OpenSource(source, source.open())], period_s=0.05, t0_ns=now_ns(), probe_s=probe_s)
    task = asyncio.create_task(sampler.run())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return sampler


async def test_the_sampler_probes_its_counters_and_hands_the_grid_to_attribution() -> None:
    source = GridCounter(30.0)
    sampler = await sample_for(source, 1.0, probe_s=0.25)
    (meter,) = sampler.meters
    (grid,) = meter.grids
    assert grid.period_ns == pytest.approx(30 * MS, rel=0.01)
    assert off_grid(grid.phase_ns, source.origin - sampler.t0_ns, 30 * MS) < 1.5 * MS
    # the probe ended: at most twice its 0.25 s (~250 reads, while it pins the phase), then
    # one per 50 ms tick (not 500 at 2 ms)
    assert source.reads < 320
    # its fast reads stay out of the log: it holds the 50 ms ticks only
    assert len(sampler.log) <= 22


async def test_a_slow_counter_is_probed_until_it_shows_its_grid() -> None:
    source = GridCounter(150.0)  # one update in a 0.2 s probe: too few to trust
    sampler = await sample_for(source, 1.2, probe_s=0.2)
    (meter,) = sampler.meters
    (grid,) = meter.grids
    assert grid.period_ns == pytest.approx(150 * MS, rel=0.01)


async def test_a_counter_whose_period_the_probe_interval_divides_is_timed_to_its_updates() -> None:
    # A 10 ms counter updating 0.3 ms after the sampler's first read. Reads every 2 ms from
    # that read would bracket every update by the same [0, 2] ms and time them all 0.7 ms
    # late; then a 50 ms tick landing in those 0.7 ms is given the update after the one it saw.
    source = GridCounter(10.0, after_first_read_ms=0.3)
    sampler = await sample_for(source, 0.8, probe_s=0.5)
    (meter,) = sampler.meters
    (grid,) = meter.grids
    assert grid.period_ns == pytest.approx(10 * MS, rel=0.01)
    assert off_grid(grid.phase_ns, source.origin - sampler.t0_ns, 10 * MS) < 0.3 * MS


async def test_after_a_probe_the_ticks_read_the_counter_clear_of_its_updates() -> None:
    # A 10 ms counter updating 0.2 ms after the first read: every 50 ms tick from there would
    # read it 0.2 ms before an update, where a grid a fraction of a ms off (or drifting) gives
    # the read the update after the one it saw. After the probe the ticks move to mid-period.
    source = GridCounter(10.0, after_first_read_ms=0.2)
    sampler = await sample_for(source, 1.4, probe_s=0.3)
    stamps = sampler.log.frame().get_column("dev.t_ns").to_numpy().astype(float)
    after_probe = stamps[stamps > 0.7 * NS]  # a probe pinning its phase goes on to 0.6 s
    since = np.mod(after_probe - (source.origin - sampler.t0_ns), 10 * MS)
    assert after_probe.size >= 8
    # 5 ms either side at best (4.1 ms here); the median, not the least: a tick that wakes
    # late on a busy host reads wherever it lands, and the ticks after it are on the grid again
    assert np.median(np.minimum(since, 10 * MS - since)) > 3 * MS


async def test_a_slow_counters_period_is_pinned_by_a_second_probe_soon_after_the_first() -> None:
    # 13 updates of a 76.7 ms counter in a 1 s probe time its period only to some 100s of ppm
    # (10 ms adrift by 12 s into a run); a second probe 4 s later pins it from the span to
    # some 10s of ppm
    source = GridCounter(76.6658)
    sampler = await sample_for(source, 6.6, probe_s=1.0)
    (meter,) = sampler.meters
    assert len(meter.grids) == 2
    period = chained(meter.grids)[0].period_ns
    assert period == pytest.approx(76.6658 * MS, rel=1e-4)
