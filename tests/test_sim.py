"""The simulator behaves like a batching server: load slows it, and its truth adds up."""

from __future__ import annotations

import asyncio
import math
import os
import random
import statistics
import time
from typing import Any

import httpx
import pytest

from ipw_async._clock import NS, now_ns
from ipw_async.sim import (
    EngineConfig,
    SimConfig,
    SimulatorError,
    SimulatorProcess,
    drawn_physics,
    simulator_apart,
)
from ipw_async.sim.device import Device
from ipw_async.sim.engine import Engine, SimRequest
from ipw_async.sim.physics import ABSENT, CLASSIC, EFFECTS, FIRST_LENGTH_BUCKET, MIN_CLOCK, effects_of
from ipw_async.telemetry.sim import SimDeviceSource
from ipw_async.workload.datasets import builtin_qa

from .conftest import fast_engine

# the simulator's TTFT and step times are measured in real time: no other test beside them
pytestmark = pytest.mark.timing


def classic_engine(**overrides: object) -> EngineConfig:
    """The earlier default device (:data:`CLASSIC`: a power-law curve, no padding, no
    per-step or per-chunk energy), quickened as :func:`fast_engine` quickens the default."""
    quick = {"step_base_ms", "step_per_seq_ms"}
    return fast_engine(**({k: v for k, v in CLASSIC.items() if k not in quick} | overrides))


async def _ttfts(base_url: str, n: int) -> list[float]:
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=n)) as client:

        async def one(i: int) -> float:
            body = {"model": "sim-small", "prompt": f"p{i} " * 200, "max_tokens": 10, "stream": True}
            start = time.perf_counter()
            async with client.stream("POST", f"{base_url}/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        return time.perf_counter() - start
            raise AssertionError("no token")

        return list(await asyncio.gather(*(one(i) for i in range(n))))


async def test_ttft_grows_with_load_and_truth_adds_up() -> None:
    with SimulatorProcess(SimConfig(engine=fast_engine(max_batch=16))) as sim:
        alone = min(await _ttfts(sim.base_url, 1))
        loaded = sorted(await _ttfts(sim.base_url, 48))
        truth = httpx.get(f"{sim.root_url}/sim/truth").json()
    assert loaded[len(loaded) // 2] > 2 * alone  # queueing behind a batch of 16
    assert len(truth["requests"]) == 49
    total = sum(truth["requests"].values()) + truth["idle_j"]
    assert abs(total - truth["total_j"]) < 1e-6 * truth["total_j"]


def test_answers_are_seeded_and_mostly_right() -> None:
    qa = builtin_qa().queries[:40]
    with SimulatorProcess(SimConfig(engine=fast_engine(zero_delay=True), accuracy=0.8)) as sim:
        answers = [
            httpx.post(
                f"{sim.base_url}/completions",
                json={"model": "sim-small", "prompt": q.prompt, "stop": ["\n"], "max_tokens": 8},
            ).json()["choices"][0]["text"]
            for q in qa
        ]
        again = httpx.post(
            f"{sim.base_url}/completions", json={"model": "sim-small", "prompt": qa[0].prompt, "stop": ["\n"]}
        ).json()["choices"][0]["text"]
        models = httpx.get(f"{sim.base_url}/models").json()
        health = httpx.get(f"{sim.root_url}/health").json()
    right = sum(a.strip() == q.reference for a, q in zip(answers, qa, strict=True))
    assert 0.6 * len(qa) <= right < len(qa)
    assert again == answers[0]
    assert models["data"][0]["id"] == "sim-small"
    assert health["simulated"] is True


def test_device_counter_is_quantised_and_periodic() -> None:
    config = SimConfig(engine=fast_engine(counter_period_ms=200.0))
    # read back to back: many reads fall within one 200 ms update
    with SimulatorProcess(config) as sim, httpx.Client() as client:
        readings = [client.get(f"{sim.root_url}/sim/device").json() for _ in range(40)]
    energies = [r["energy_mj"] for r in readings]
    assert all(isinstance(e, int) for e in energies)
    assert energies == sorted(energies)
    assert len(set(energies)) < len(energies)  # stale between 200 ms updates
    # idle just after the start: static power only, the clocks still up
    assert readings[-1]["power_w"] == config.engine.static_w + config.engine.clocks_up_w


def test_a_step_set_a_hair_before_the_last_one_ended_never_rewrites_the_counters_past() -> None:
    """The engine's loop timer can fire up to a millisecond early, so a step may be set before
    the previous step's work has ended. The device's past must stay what was read: with its
    segments out of time order, 34 of these 1,997 earlier readings changed afterwards."""
    device = Device(EngineConfig())
    rng = random.Random(0)
    t, ms, changed = device.t0, 1_000_000, 0
    for _ in range(200):
        worked = t + rng.randrange(5, 30) * ms
        device.set_power(t, rng.uniform(50, 500), until_ns=worked)
        past = [rng.randrange(max(device.t0, worked - 2 * NS), worked) for _ in range(10)]
        read = [device.energy_at(x) for x in past]
        t = worked - rng.randrange(0, ms)  # woken early
        device.set_power(t, rng.uniform(50, 500), until_ns=t + ms)
        changed += sum(device.energy_at(x) != e for x, e in zip(past, read, strict=True) if x <= t)
        t += ms
    assert changed == 0


def _usage(base_url: str, prompt: str) -> dict[str, object]:
    body = {"model": "sim-small", "prompt": prompt, "max_tokens": 4}
    return httpx.post(f"{base_url}/completions", json=body, timeout=30).json()["usage"]


def test_prefix_cache_skips_the_prefill_of_a_prompt_seen_before() -> None:
    shared = "You are a careful assistant. " * 40  # 1,160 characters: 18 blocks of 16 tokens
    engine = fast_engine(prefix_cache=True, step_per_prefill_token_ms=0.2, prefill_budget_tokens=64)
    with SimulatorProcess(SimConfig(engine=engine)) as sim:
        first = _usage(sim.base_url, shared + "Question one?")
        second = _usage(sim.base_url, shared + "Question two?")
        other = _usage(sim.base_url, "Something else entirely. " * 40)
        truth = httpx.get(f"{sim.root_url}/sim/truth").json()
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = second["prompt_tokens_details"]["cached_tokens"]  # type: ignore[index]
    assert cached == 18 * 16 and cached < second["prompt_tokens"]  # type: ignore[operator]
    assert other["prompt_tokens_details"] == {"cached_tokens": 0}
    # the cached prompt was cheaper: no prefill steps for its shared part
    first_j, second_j, _ = (truth["requests"][k] for k in sorted(truth["requests"], key=lambda k: int(k[4:])))
    assert second_j < 0.7 * first_j


def test_without_prefix_cache_usage_reports_no_cached_tokens(sim: SimulatorProcess) -> None:
    assert "prompt_tokens_details" not in _usage(sim.base_url, "hello " * 100)


def test_a_simulator_apart_keeps_to_its_core_and_this_process_to_the_others() -> None:
    cores = os.sched_getaffinity(0)
    if len(cores) < 2:
        with pytest.raises(SimulatorError, match="at least 2 cores"), simulator_apart():
            pass
        return
    last = max(cores)
    with simulator_apart(SimConfig(engine=fast_engine())) as sim:
        assert os.sched_getaffinity(sim._proc.pid) == {last}  # type: ignore[union-attr]
        assert os.sched_getaffinity(0) == cores - {last}
        assert httpx.get(f"{sim.root_url}/health", timeout=5).status_code == 200
    assert os.sched_getaffinity(0) == cores


def test_physics_drawn_from_a_seed() -> None:
    a, b, again = drawn_physics(1), drawn_physics(2), drawn_physics(1)
    assert a == again and a != b
    draws = [drawn_physics(seed) for seed in range(200)]
    assert all(0.5 <= d.work_exponent <= 1.0 and 30 <= d.static_w <= 150 for d in draws)
    assert all(512 <= d.prefill_budget_tokens <= 8192 and 10 <= d.counter_period_ms <= 500 for d in draws)
    assert {d.prefix_cache for d in draws} == {True, False}
    assert drawn_physics(1, static_w=99.0).static_w == 99.0  # a pinned field stays put


# --- device physics: each real-device effect, driven on the engine and device directly ---

_TODAYS_DRAWS = {  # drawn_physics(seed) before the effects existed (git cc20f05)
    0: (
        0.9222109257625241,
        1.1611361641164235,
        80.4685896997014,
        22.94583751464817,
        17.781868034215215,
        0.1051830823906458,
        0.044461594221855937,
        1187,
        64.5243932323604,
        False,
    ),
    1: (
        0.5671821220562006,
        1.2864072317121258,
        121.65295427719369,
        22.753451286971085,
        17.385877177298525,
        0.1118849924631209,
        0.03701598568696773,
        4560,
        14.436589996280313,
        True,
    ),
    7: (
        0.6619163824165812,
        0.31118884349430265,
        108.11213676478245,
        13.621814333377138,
        18.39705010766723,
        0.09961343506076928,
        0.01625586527200613,
        2091,
        11.579878402276718,
        True,
    ),
}
_DRAWN_FIELDS = (
    "work_exponent",
    "prefill_work",
    "static_w",
    "dynamic_w",
    "step_base_ms",
    "step_per_seq_ms",
    "step_per_prefill_token_ms",
    "prefill_budget_tokens",
    "counter_period_ms",
    "prefix_cache",
)


def _request(key: str, prompt_tokens: int, output_tokens: int, prompt: str = "") -> SimRequest:
    return SimRequest(key, prompt_tokens, ["x"] * output_tokens, "length", prompt=prompt)


async def _serve(engine: Engine, *requests: SimRequest) -> None:
    """Submit the requests and read each to its end."""

    async def drain(r: SimRequest) -> None:
        while await r.out.get() is not None:
            pass

    for r in requests:
        engine.submit(r)
    await asyncio.gather(*(drain(r) for r in requests))


async def _run(config: EngineConfig, *requests: SimRequest) -> Engine:
    engine = Engine(config)
    engine.start()
    try:
        await _serve(engine, *requests)
    finally:
        await engine.stop()
    return engine


def _nominal_s(config: EngineConfig, step: list[Any]) -> float:
    """A logged step's duration before any stretch, from its chunks and decoders (unpadded)."""
    _, _, chunks, decoders, *_ = step
    weighted = sum(w for _, _, w in chunks) / config.prefill_work
    return (
        config.step_base_ms
        + config.step_per_seq_ms * (len(chunks) + len(decoders))
        + config.step_per_prefill_token_ms * weighted
    ) / 1000


def _bucket(n: int, first: int) -> int:
    return first * 2 ** max(0, math.ceil(math.log2(n / first)))


def replayed_dynamic_j(
    config: EngineConfig, steps: list[Any], prompts: dict[str, int], slots: dict[str, int]
) -> float:
    """The dynamic energy the logged steps draw, rebuilt from the physics alone as the H100
    reference is: each request's prefill and decode replayed, its slot as given (``slots``),
    each step's padded shape, duration at full clocks, explicit energies and curve, and the
    power limit (stretched or clipped, a step draws at most the headroom over its logged time)."""
    prefilled = dict.fromkeys(prompts, 0)
    emitted = dict.fromkeys(prompts, 0)
    total = 0.0
    for start, end, chunks, decoders, work, static_w, *_ in steps:
        explicit = 0.0
        for key, tokens, _ in chunks:
            reach = prefilled[key] + tokens
            per_token = config.prefill_token_j + config.prefill_token_kv_j * reach
            explicit += config.prefill_forward_j + tokens * per_token
        rows = kv = 0
        if decoders:
            contexts = [prompts[key] + emitted[key] for key, _ in decoders]
            if config.padded_buckets:
                rows = min(_bucket(max(slots[key] for key, _ in decoders) + 1, 1), config.max_batch)
                kv = rows * _bucket(max(contexts), FIRST_LENGTH_BUCKET)
            else:
                rows, kv = len(decoders), sum(contexts)
            explicit += config.decode_step_j + config.decode_row_j * rows + config.decode_row_kv_j * kv
        weighted = sum(w for _, _, w in chunks) / config.prefill_work
        nominal = (
            config.step_base_ms
            + config.step_per_seq_ms * (rows + len(chunks))
            + config.step_per_prefill_token_ms * weighted
            + config.step_per_context_ms * kv / 1000
        ) / 1000
        demanded = config.step_w + config.dynamic_w * work**config.work_exponent + explicit / nominal
        total += min(demanded, config.max_w - static_w) * (end - start) / 1e9
        for key, tokens, _ in chunks:
            prefilled[key] += tokens
            emitted[key] += prefilled[key] == prompts[key]
        for key, _ in decoders:
            emitted[key] += 1
    return total


async def test_truth_adds_up_with_every_effect_on() -> None:
    every = {k: v for setting in EFFECTS.values() for k, v in setting.items()}
    config = fast_engine(record_steps=True, prefill_budget_tokens=512, **every)
    assert effects_of(config) == list(EFFECTS)
    engine = Engine(config)
    engine.start()
    try:
        first = [_request(f"a{i}", 100 + 300 * i, 20 + 5 * i) for i in range(8)]
        await _serve(engine, *first)
        await asyncio.sleep(0.15)  # idle: a warm device cools, charged to idle
        second = [_request(f"b{i}", 800, 30) for i in range(12)]
        await _serve(engine, *second)
        truth = engine.truth()
    finally:
        await engine.stop()
    requests = truth["requests"]
    assert isinstance(requests, dict) and len(requests) == 20
    total = truth["total_j"]
    assert isinstance(total, float) and isinstance(truth["idle_j"], float)
    assert sum(requests.values()) + truth["idle_j"] == pytest.approx(total, rel=1e-9)
    metered = truth["metered_total_j"]
    assert isinstance(metered, float) and 0.9 * total < metered < total  # a lagging meter trails
    # the log accounts for every step's dynamic energy: the device's, above its (warm) static
    steps = truth["steps"]
    assert isinstance(steps, list) and steps and all(len(step) == 8 for step in steps)
    for _, _, chunks, decoders, work, static_w, dynamic_w, caused in steps:
        assert work == pytest.approx(sum(w for _, _, w in chunks) + sum(w for _, w in decoders))
        # what each request caused: every request in the step, and no other
        assert {key for key, _ in caused} == {c[0] for c in chunks} | {d[0] for d in decoders}
        assert dynamic_w >= 0 and all(j > 0 for _, j in caused)
        assert config.static_w <= static_w <= config.static_w + config.thermal_leak_w + config.clocks_up_w
    # each wave came to an empty server: its requests took slots 0, 1, … in order
    slots = {r.key: i for wave in (first, second) for i, r in enumerate(wave)}
    prompts = {r.key: r.prompt_tokens for r in (*first, *second)}
    dynamic = replayed_dynamic_j(config, steps, prompts, slots)
    assert dynamic == pytest.approx(total - engine._settled_static_j, rel=1e-9)


def test_a_lagging_meter_trails_the_true_energy_then_catches_up() -> None:
    device = Device(EngineConfig(**(ABSENT | {"meter_lag_ms": 50.0})))  # type: ignore[arg-type]
    t0 = device.t0
    device.set_power(t0 + NS, 200.0)
    assert device.metered_power_at(t0 + NS + 50_000_000) == pytest.approx(70 + 200 * (1 - math.exp(-1)))
    trail = device.energy_at(t0 + NS + NS // 2) - device.metered_energy_at(t0 + NS + NS // 2)
    assert trail == pytest.approx(200 * 0.05, rel=1e-3)  # P·τ
    device.set_power(t0 + 2 * NS, 0.0)
    assert device.energy_at(t0 + 3 * NS) - device.metered_energy_at(t0 + 3 * NS) == pytest.approx(0, abs=1e-6)
    assert device.energy_at(t0 + 3 * NS) == pytest.approx(70 * 3 + 200)


async def test_a_lagging_meter_reports_lagged_power() -> None:
    device = Device(EngineConfig(**(ABSENT | {"meter_lag_ms": 50.0})))  # type: ignore[arg-type]
    device.set_power(device.t0, 200.0)
    await asyncio.sleep(0.02)
    reading = device.readout()
    assert 70 < reading["power_w"] < 269  # type: ignore[operator]
    assert device.power_at(now_ns()) == 270.0


def test_counter_updates_jitter_within_bounds_in_order_and_deterministically() -> None:
    device = Device(EngineConfig(counter_period_ms=100.0, counter_jitter_ms=5.0))
    period = 100_000_000
    times = [device.update_time(k) for k in range(2000)]
    offsets = [t - device.t0 - k * period for k, t in enumerate(times)]
    assert offsets[0] == 0 and all(abs(u) <= 5_000_000 for u in offsets)
    assert min(offsets) < -4_000_000 and max(offsets) > 4_000_000  # it does jitter
    assert times == sorted(times)
    again = Device(EngineConfig(counter_period_ms=100.0, counter_jitter_ms=5.0))
    assert [again.update_time(k) - again.t0 for k in range(2000)] == [t - device.t0 for t in times]
    rng = random.Random(0)
    for t in (device.t0 + rng.randrange(0, 1999 * period) for _ in range(500)):
        assert device.last_update(t) == max(u for u in times if u <= t)
    # too much jitter is clamped below half a period, so updates stay in order
    wild = Device(EngineConfig(counter_period_ms=10.0, counter_jitter_ms=8.0))
    wild_times = [wild.update_time(k) for k in range(2000)]
    assert wild_times == sorted(wild_times)
    assert all(abs(t - wild.t0 - k * 10_000_000) < 5_000_000 for k, t in enumerate(wild_times))


def test_static_power_warms_under_load_and_cools_when_idle() -> None:
    warming = {"thermal_leak_w": 40.0, "thermal_tau_s": 1.0}
    device = Device(EngineConfig(**(ABSENT | warming)))  # type: ignore[arg-type]
    t0 = device.t0
    assert device.set_power(t0, 315.0) == 70.0  # cold: target h = 315 / (700 - 70) = 0.5
    warm = device.static_at(t0 + 3 * NS)
    assert warm == pytest.approx(70 + 40 * 0.5 * (1 - math.exp(-3)))
    device.set_power(t0 + 3 * NS, 0.0)
    assert device.static_at(t0 + 6 * NS) == pytest.approx(70 + (warm - 70) * math.exp(-3))
    assert device.static_energy_at(t0 + 6 * NS) == pytest.approx(70 * 3 + warm * 3)


async def test_an_idle_engine_lets_its_warm_device_cool() -> None:
    config = classic_engine(thermal_leak_w=50.0, thermal_tau_s=0.3, record_steps=True)
    engine = Engine(config)
    engine.start()
    try:
        await _serve(engine, *(_request(f"r{i}", 200, 60) for i in range(32)))
        hot = engine.device.readout()
        await asyncio.sleep(0.5)
        cooled = engine.device.readout()
        truth = engine.truth()
    finally:
        await engine.stop()
    steps = truth["steps"]
    assert isinstance(steps, list)
    assert steps[0][5] == pytest.approx(70.0, abs=0.5) and steps[-1][5] > 75.0
    assert hot["temperature_c"] > cooled["temperature_c"] > 30  # type: ignore[operator]
    # the idle engine re-set the device's (held) static power as it cooled
    assert cooled["power_w"] < steps[-1][5] - 2  # type: ignore[operator]
    requests = truth["requests"]
    assert isinstance(requests, dict)
    assert sum(requests.values()) + truth["idle_j"] == pytest.approx(truth["total_j"], rel=1e-9)  # type: ignore[arg-type]


async def test_at_the_power_limit_steps_stretch_as_clocks_drop() -> None:
    # steps long enough that the event loop's lateness (~1 ms a sleep) stays small beside them
    limit = {"max_w": 150.0, "record_steps": True, "step_base_ms": 20.0, "step_w": 0.0}  # the curve alone
    requests = [(f"r{i}", 50, 30) for i in range(16)]  # 16 decoders demand 28·16^0.6 ≈ 148 W > 80 W
    ratios: dict[str, list[float]] = {}
    for mode in ("stretch", "clip"):
        config = classic_engine(power_limit=mode, **limit)
        engine = await _run(config, *(_request(*r) for r in requests))
        steps = engine.truth()["steps"]
        assert isinstance(steps, list)
        capped = [s for s in steps if config.dynamic_w * s[4] ** config.work_exponent > 80.0]
        assert len(capped) > 20
        # the clock the step ran at: power goes as f³, time as 1/f
        clock = [(80.0 / (config.dynamic_w * s[4] ** config.work_exponent)) ** (1 / 3) for s in capped]
        # the logged end is when the device finished: no event-loop lateness in it
        ratios[mode] = [
            (s[1] - s[0]) / 1e9 / _nominal_s(config, s) * f for s, f in zip(capped, clock, strict=True)
        ]
        for start, end, *_ in capped[-5:]:
            assert engine.device.power_at((start + end) // 2) == pytest.approx(150.0)
    # stretched, a step lasts nominal / clock at the limit's power
    assert all(r == pytest.approx(1.0, abs=1e-6) for r in ratios["stretch"])
    assert statistics.median(ratios["clip"]) < 0.9  # clipped, it lasts as long as ever
    engine = Engine(classic_engine(power_limit="stretch", max_w=150.0, step_w=0.0))
    demanded = 28 * 16**0.6
    stretched = 0.01 / (80 / demanded) ** (1 / 3)
    assert engine._step_power(70.0, demanded, 0.01) == pytest.approx((80.0, stretched))
    # far past the limit the clock stops at MIN_CLOCK: the step lasts 2.5 times as long at most
    assert engine._step_power(70.0, 28 * 1e6**0.6, 0.01) == pytest.approx((80.0, 0.01 / MIN_CLOCK))
    assert engine._step_power(70.0, 28.0, 0.01) == (28.0, 0.01)  # below the limit: as ever


async def test_decode_work_and_step_time_grow_with_context() -> None:
    context = {"context_work": 0.5, "step_per_context_ms": 1.0, "record_steps": True}
    short = await _run(classic_engine(**context), _request("s", 100, 30))
    long = await _run(classic_engine(**context), _request("l", 8000, 30))
    works = [s[3][0][1] for s in long.step_log if s[3]]
    assert works == sorted(works) and works[0] == pytest.approx(1 + 0.5 * 8.001)
    assert works[-1] - works[0] == pytest.approx(0.5 * (len(works) - 1) / 1000)

    def median_decode_ms(engine: Engine) -> float:
        return statistics.median((s[1] - s[0]) / 1e6 for s in engine.step_log if s[3] and not s[2])

    assert median_decode_ms(long) > median_decode_ms(short) + 5  # 8 ms more per step at 8k context


async def test_later_prefill_chunks_of_a_long_prompt_cost_more() -> None:
    config = classic_engine(
        prefill_position_work=0.5, prefill_budget_tokens=512, record_steps=True, prefix_cache=True
    )
    prompt = "".join(f"token {i:05d} " for i in range(1400))  # 16,800 characters
    engine = Engine(config)
    engine.start()
    try:
        await _serve(engine, _request("first", 4096, 2, prompt))
        await _serve(engine, _request("again", 4096, 2, prompt))
    finally:
        await engine.stop()
    chunks = [(s[2][0], (s[1] - s[0]) / 1e6) for s in engine.step_log if s[2]]
    first = [(c, ms) for c, ms in chunks if c[0] == "first"]
    assert len(first) == 8 and all(c[1] == 512 for c, _ in first)
    works = [c[2] for c, _ in first]
    assert works == sorted(works)
    positions = 512 * 3584 + 512 * 511 / 2  # the last chunk's positions, summed
    assert works[-1] == pytest.approx(config.prefill_work * (512 + 0.5 * positions / 1000))
    assert first[-1][1] > first[0][1] + 15  # and takes longer: 0.03 ms × 918 more weighted tokens
    # cached tokens are skipped but keep their positions: the one token computed is the 4096th
    ((cached, _),) = [(c, ms) for c, ms in chunks if c[0] == "again"]
    assert cached[1] == 1 and cached[2] == pytest.approx(config.prefill_work * (1 + 0.5 * 4.095))


def test_effects_off_draws_todays_physics() -> None:
    for seed, values in _TODAYS_DRAWS.items():
        for effects in (False, True):  # the effects come from a stream of their own
            drawn = drawn_physics(seed, effects=effects)
            assert tuple(getattr(drawn, name) for name in _DRAWN_FIELDS) == values
        off = drawn_physics(seed, effects=False)
        absent = {k: v for k, v in ABSENT.items() if k not in _DRAWN_FIELDS}
        assert effects_of(off) == [] and all(getattr(off, k) == v for k, v in absent.items())


def test_each_effect_is_drawn_present_and_absent() -> None:
    draws = [drawn_physics(seed) for seed in range(200)]
    for name in EFFECTS:
        present = sum(name in effects_of(d) for d in draws)
        assert 20 < present < 180, name
    assert {d.power_limit for d in draws} == {"clip", "stretch"}
    assert any(d.max_w < 700 and d.power_limit == "clip" for d in draws)
    for d in draws:
        assert d.counter_jitter_ms <= max(0.5, d.counter_period_ms / 4)
        assert d.max_w == 700.0 or 150 <= d.max_w - d.static_w - d.clocks_up_w <= 600
    pinned = [drawn_physics(seed, meter_lag_ms=0.0, step_w=33.0, power_limit="clip") for seed in range(50)]
    assert all(p.meter_lag_ms == 0.0 and p.step_w == 33.0 and p.power_limit == "clip" for p in pinned)
    assert all("lag" not in effects_of(p) and "step" in effects_of(p) for p in pinned)
    for name, setting in EFFECTS.items():
        assert effects_of(EngineConfig(**(ABSENT | setting))) == [name]  # type: ignore[arg-type]
    assert effects_of(EngineConfig(**ABSENT)) == []  # type: ignore[arg-type]
    # the default device looks like a measured H100 server: step time that grows with context,
    # a lagging meter on a jittered grid, steps that stretch at the limit, the H100's per-step,
    # per-row, per-chunk and per-token energy over padded buckets, static raised while serving
    assert effects_of(EngineConfig()) == [
        "context",
        "lag",
        "jitter",
        "stretch",
        "graph",
        "rows",
        "padded",
        "forward",
        "tokens",
        "serving",
    ]
    classic = EngineConfig(**CLASSIC)  # type: ignore[arg-type]
    assert effects_of(classic) == ["step", "lag", "jitter", "stretch"]


def test_bad_device_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="--power-limit must be one of clip, stretch"):
        EngineConfig(power_limit="throttle")
    with pytest.raises(ValueError, match="must exceed the warm static power"):
        EngineConfig(max_w=150.0, thermal_leak_w=40.0)  # 72.7 + 40 + 51.3 W with the clocks up
    with pytest.raises(ValueError, match="cannot be negative: meter_lag_ms"):
        EngineConfig(meter_lag_ms=-1.0)


def test_the_sim_source_reads_the_device_temperature(sim: SimulatorProcess) -> None:
    source = SimDeviceSource(sim.root_url)
    try:
        assert "sim.temp_c" in source.open().columns
        assert source.read().values["sim.temp_c"] == pytest.approx(30.0, abs=5)
    finally:
        source.close()
