"""The simulator's default device is the probed H100: padded decode buckets, per-step, per-row,
per-chunk and per-token energy, static raised while the clocks are up; its truth splits them by
convention v2 and adds up exactly, and ``drawn_physics`` draws them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ipw_async import run_benchmark
from ipw_async._clock import NS
from ipw_async.cli import app
from ipw_async.sim import EngineConfig, drawn_physics
from ipw_async.sim.device import Device
from ipw_async.sim.engine import Engine, SimRequest
from ipw_async.sim.physics import ABSENT, CLASSIC, EFFECTS, effects_of

from .conftest import quick_config
from .test_sim import _request, _serve, replayed_dynamic_j

# live engines run in real time: no other test beside them
pytestmark = pytest.mark.timing

H100_EFFECTS = ("graph", "rows", "padded", "forward", "tokens", "serving")
NO_STATIC = {"static_w": 0.0, "clocks_up_w": 0.0, "max_w": 1e6}  # the truth is the dynamic energy alone


def graph_j(config: EngineConfig, rows: int, length: int) -> float:
    """The decode graph's dynamic energy over ``rows`` rows at attention length ``length``."""
    return config.decode_step_j + rows * (config.decode_row_j + config.decode_row_kv_j * length)


def chunk_j(config: EngineConfig, tokens: int, end: int) -> float:
    """A prompt chunk's dynamic energy: its forward, its tokens, the positions it reaches."""
    return config.prefill_forward_j + tokens * (config.prefill_token_j + config.prefill_token_kv_j * end)


def _decoding(engine: Engine, key: str, slot: int, context: int) -> SimRequest:
    """A request already prefilled, its first token out, in ``slot``: it decodes next step."""
    r = _request(key, context - 1, 100)
    r.prefilled, r.emitted, r.slot = r.prompt_tokens, 1, slot
    engine._slots[slot] = r
    engine.running.append(r)
    return r


# --- the default is the probe's H100 (shared/traces/h100-8b-graphs/physics.json) ---

PROBE_DECODE = [  # (batch, context, step ms, J a step in all, with the 72.7 W idle)
    (1, 512, 7.638, 2.7907),
    (8, 512, 8.174, 3.0565),
    (64, 1024, 11.773, 5.4092),
    (128, 1536, 21.806, 11.3242),
    (128, 2040, 21.707, 11.3603),
]
PROBE_PREFILL = [(512, 16.689, 9.3258), (2048, 54.817, 37.1218)]  # (tokens from 0, ms, J in all)
PROBE_IDLE_W = 72.7


def test_the_default_device_is_the_probed_h100() -> None:
    config = EngineConfig()
    assert (config.static_w, config.static_w + config.clocks_up_w, config.max_w) == (72.7, 124.0, 700.0)
    assert config.padded_buckets and config.max_batch == 128 and config.prefill_budget_tokens == 2048
    assert config.dynamic_w == 0.0 and config.step_w == 0.0  # its dynamic energy is the probe's costs
    for batch, context, ms, joules in PROBE_DECODE:
        engine = Engine(config)
        for slot in range(batch):
            _decoding(engine, f"d{slot}", slot, context)
        step = engine._step_plan()
        assert step.duration * 1000 == pytest.approx(ms, rel=0.06)
        dynamic = sum(step.caused.values())
        assert dynamic + PROBE_IDLE_W * step.duration == pytest.approx(joules, rel=0.02)
    for tokens, ms, joules in PROBE_PREFILL:
        engine = Engine(config)
        engine.submit(_request("p", tokens, 4))
        step = engine._step_plan()
        # GPU-bound, of the probe's order (the probe's own server was host-bound: ~90 ms a chunk)
        assert 0.85 < step.duration * 1000 / ms < 1.15
        assert sum(step.caused.values()) == pytest.approx(joules - PROBE_IDLE_W * ms / 1000, rel=0.002)


def test_the_classic_preset_is_the_earlier_default() -> None:
    classic = EngineConfig(**CLASSIC)  # type: ignore[arg-type]
    curve = (classic.static_w, classic.dynamic_w, classic.step_w, classic.step_base_ms)
    assert curve == (70.0, 28.0, 60.0, 14.0)
    assert effects_of(classic) == ["step", "lag", "jitter", "stretch"]
    assert effects_of(EngineConfig(**ABSENT)) == []  # type: ignore[arg-type]


def test_the_sim_command_lists_the_new_options() -> None:
    result = CliRunner().invoke(app, ["sim", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for flag in (
        "--padded-buckets",
        "--decode-step-j",
        "--decode-row-j",
        "--decode-row-kv-j",
        "--prefill-forward-j",
        "--prefill-token-j",
        "--prefill-token-kv-j",
        "--clocks-up-w",
        "--clock-down-s",
    ):
        assert flag in result.output, flag


# --- padded buckets and slots, planned step by step ---


def test_one_decoder_in_a_high_slot_costs_the_padded_bucket() -> None:
    config = EngineConfig()
    high = Engine(config)
    alone = _decoding(high, "alone", 100, 300)
    step = high._step_plan()
    assert step.caused == {alone: pytest.approx(graph_j(config, 128, 512))}
    assert step.decode == [(alone, 128.0)]  # the curve's work is padded too
    full = Engine(config)
    for slot in range(128):
        _decoding(full, f"d{slot}", slot, 300)
    full_step = full._step_plan()
    # a padded step takes the time of its padded batch, and its energy
    assert step.duration == pytest.approx(full_step.duration)
    assert sum(full_step.caused.values()) == pytest.approx(graph_j(config, 128, 512))
    low = Engine(config)
    _decoding(low, "low", 0, 300)
    low_step = low._step_plan()
    assert sum(low_step.caused.values()) == pytest.approx(graph_j(config, 1, 512))
    padding_ms = 127 * (config.step_per_seq_ms + config.step_per_context_ms * 512 / 1000)
    assert (step.duration - low_step.duration) * 1000 == pytest.approx(padding_ms)
    unpadded = Engine(EngineConfig(padded_buckets=False))
    unpadded_alone = _decoding(unpadded, "alone", 100, 300)
    assert unpadded._step_plan().caused == {unpadded_alone: pytest.approx(graph_j(config, 1, 300))}


def test_a_dense_batch_pads_its_decoders_to_vllm_s_sizes_and_each_reads_its_own_context() -> None:
    """vLLM's layout: three decoders in slots 0, 40 and 100 run 4 rows (not 128), each row at
    its own context; the padded row's cost is shared, each one's reads its own."""
    config = EngineConfig(capture_sizes="vllm", dense_batch=True)
    engine = Engine(config)
    contexts = {"a": 300, "b": 1000, "c": 2000}
    requests = {
        key: _decoding(engine, key, slot, contexts[key])
        for key, slot in zip(contexts, (0, 40, 100), strict=True)
    }
    step = engine._step_plan()
    shared = (config.decode_step_j + 4 * config.decode_row_j) / 3
    for key, r in requests.items():
        assert step.caused[r] == pytest.approx(shared + config.decode_row_kv_j * contexts[key])
    eleven = Engine(config)
    for slot in range(11):
        _decoding(eleven, f"d{slot}", slot, 300)
    padded = eleven._step_plan()  # 11 decoders run vLLM's 16-row graph
    assert sum(padded.caused.values()) == pytest.approx(
        config.decode_step_j + 16 * config.decode_row_j + 11 * 300 * config.decode_row_kv_j
    )
    with pytest.raises(ValueError, match="not auto"):
        EngineConfig(capture_sizes="auto")


def test_the_longest_context_sets_every_rows_attention_length() -> None:
    config = EngineConfig()
    engine = Engine(config)
    short = _decoding(engine, "short", 0, 100)
    long = _decoding(engine, "long", 1, 600)
    step = engine._step_plan()
    each = graph_j(config, 2, 1024) / 2  # shared equally: every row of the graph is alike
    assert step.caused == {short: pytest.approx(each), long: pytest.approx(each)}
    assert step.decode[0][1] == step.decode[1][1] == 1.0


def test_slots_are_taken_lowest_first_and_reused() -> None:
    engine = Engine(EngineConfig(max_batch=4))
    first = [_request(f"r{i}", 10, 5) for i in range(5)]
    for r in first:
        engine.submit(r)
    engine._step_plan()
    assert [r.slot for r in first[:4]] == [0, 1, 2, 3] and list(engine.waiting) == [first[4]]
    engine.abort(first[1])
    engine.abort(first[2])
    later = _request("later", 10, 5)
    engine.submit(later)
    engine._step_plan()
    # first come first served into the lowest free slots
    assert (first[4].slot, later.slot) == (1, 2) and not engine.waiting


def test_a_prefill_chunk_is_its_requests_fixed_part_and_all() -> None:
    config = EngineConfig()
    engine = Engine(config)
    decoder = _decoding(engine, "decoder", 0, 200)
    short, long = _request("short", 100, 4), _request("long", 3000, 4)
    engine.submit(short)
    engine.submit(long)
    step = engine._step_plan()
    # each chunk a forward of its own: its fixed part too goes to the request prefilled
    assert step.caused == {
        decoder: pytest.approx(graph_j(config, 1, 256)),
        short: pytest.approx(chunk_j(config, 100, 100)),
        long: pytest.approx(chunk_j(config, 1948, 1948)),  # the budget's rest: 2,048 - 100
    }
    ms = config.step_base_ms + config.step_per_seq_ms * 3 + config.step_per_prefill_token_ms * 2048
    assert step.duration * 1000 == pytest.approx(ms + config.step_per_context_ms * 256 / 1000)


# --- the truth, in live runs ---


async def test_the_truth_charges_each_request_its_own_chunk_and_padded_graph() -> None:
    """101 one-token requests prefilled in one step, then the last alone in slot 100 for 19
    decode steps: each decode costs it the whole 128-row graph (alone in slot 0: one row)."""
    config = EngineConfig(**NO_STATIC)  # type: ignore[arg-type]
    energies = {}
    for name, others in (("slot 100", 100), ("slot 0", 0)):
        engine = Engine(config)
        engine.start()
        try:
            requests = [_request(f"r{i}", 10, 1) for i in range(others)] + [_request("last", 10, 20)]
            await _serve(engine, *requests)
            truth = engine.truth()
        finally:
            await engine.stop()
        by_key = truth["requests"]
        assert isinstance(by_key, dict) and len(by_key) == others + 1
        for i in range(others):
            assert by_key[f"r{i}"] == pytest.approx(chunk_j(config, 10, 10), rel=1e-9)
        total, idle = truth["total_j"], truth["idle_j"]
        assert isinstance(total, float) and isinstance(idle, float)
        assert sum(by_key.values()) + idle == pytest.approx(total, rel=1e-12)
        energies[name] = by_key["last"]
    prefill = chunk_j(config, 10, 10)
    assert energies["slot 100"] == pytest.approx(prefill + 19 * graph_j(config, 128, 128), rel=1e-9)
    assert energies["slot 0"] == pytest.approx(prefill + 19 * graph_j(config, 1, 128), rel=1e-9)


async def test_the_default_devices_truth_adds_up_and_its_clocks_drop_when_idle() -> None:
    config = EngineConfig(record_steps=True, clock_down_s=0.3, meter_lag_ms=0.0, prefill_budget_tokens=512)
    serving, idle = config.static_w + config.clocks_up_w, config.static_w
    engine = Engine(config)
    engine.start()
    try:
        assert engine.device.readout()["power_w"] == serving  # the server's start keeps the clocks up
        first = [_request(f"a{i}", 100 + 250 * i, 10 + 3 * i) for i in range(6)]
        await _serve(engine, *first)
        await asyncio.sleep(0.05)
        still_up = engine.device.readout()["power_w"]
        await asyncio.sleep(0.5)
        dropped = engine.device.readout()["power_w"]
        second = [_request(f"b{i}", 300, 12) for i in range(9)]
        await _serve(engine, *second)
        truth = engine.truth()
    finally:
        await engine.stop()
    assert (still_up, dropped) == (serving, idle)
    steps = truth["steps"]
    assert isinstance(steps, list) and all(s[5] == serving for s in steps)  # static while serving
    requests = truth["requests"]
    assert isinstance(requests, dict) and len(requests) == 15
    total, idle_j = truth["total_j"], truth["idle_j"]
    assert isinstance(total, float) and isinstance(idle_j, float)
    assert sum(requests.values()) + idle_j == pytest.approx(total, rel=1e-9)
    # every step's dynamic energy is what the physics says of its padded shape
    slots = {r.key: i for wave in (first, second) for i, r in enumerate(wave)}
    prompts = {r.key: r.prompt_tokens for r in (*first, *second)}
    dynamic = replayed_dynamic_j(config, steps, prompts, slots)
    assert dynamic == pytest.approx(total - engine._settled_static_j, rel=1e-9)


def test_static_is_raised_while_the_clocks_are_up() -> None:
    config = EngineConfig(clock_down_s=1.0, meter_lag_ms=0.0)
    device = Device(config)
    t0 = device.t0
    serving, idle = config.static_w + config.clocks_up_w, config.static_w
    assert device.static_at(t0) == serving  # the server's start counts as work
    assert device.static_at(t0 + 2 * NS) == idle
    assert device.static_at(t0 + 2 * NS, working=True) == serving
    assert device.clocks_drop_ns() == t0 + NS
    assert device.set_power(t0 + 2 * NS, 0.0) == idle and device.clocks_drop_ns() is None
    step_end = t0 + 3 * NS + 10_000_000
    assert device.set_power(t0 + 3 * NS, 300.0, until_ns=step_end) == serving
    assert device.power_at(step_end - 1) == serving + 300.0
    assert device.power_at(step_end) == serving  # the work is done, the clocks still up
    assert device.clocks_drop_ns() == step_end + NS
    # static held per setting: up from the start until set idle at 2 s, then idle, then up
    later = t0 + 4 * NS
    assert device.static_energy_at(later) == pytest.approx(serving * 2 + idle * 1 + serving * 1)
    assert device.energy_at(later) - device.static_energy_at(later) == pytest.approx(300.0 * 0.01)


async def test_a_runs_baseline_reads_the_serving_static(tmp_path: Path) -> None:
    config = quick_config(tmp_path, max_queries=8, baseline_s=1.0)  # a 100 ms counter needs a few updates
    await run_benchmark(config)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    engine = config.sim.engine
    meter = summary["energy"]["meters"]["sim"]
    serving = engine.static_w + engine.clocks_up_w
    # the counter's energy between its knots in the 1 s window: a knot timed as read, not on
    # its update grid (the start-of-run probe that learns the grid runs slow on a loaded host),
    # moves up to a 50 ms read, 6% of the window at either end (CI read 120.9 W for 124 W).
    # The idle static, what the baseline would read with the clocks down, is 41% below
    assert meter["baseline_w"] == pytest.approx(serving, rel=0.1), meter.get("counter_timing")
    assert engine.static_w < 0.9 * serving


# --- drawn physics ---

_EARLIER_EFFECT_FIELDS = (
    "step_w",
    "context_work",
    "step_per_context_ms",
    "prefill_position_work",
    "meter_lag_ms",
    "counter_jitter_ms",
    "thermal_leak_w",
    "thermal_tau_s",
    "power_limit",
)
_EARLIER_EFFECTS = {  # drawn_physics(seed) before the H100's effects joined (git 18ccd91), and max_w
    0: (
        45.2147444138981,
        0.6159748721761057,
        0.007428323460511482,
        0.2448414468506535,
        89.5253117876478,
        0.0,
        0.0,
        20.0,
        "stretch",
        453.08555433525817,
    ),
    1: (
        27.006596320669185,
        0.05011753777727441,
        0.023492689183680398,
        0.0,
        40.59512045809373,
        3.4675476383939623,
        9.941301398115543,
        31.690572624747794,
        "stretch",
        463.01992633468603,
    ),
    7: (92.36847934010044, 0.0, 0.0, 0.40704247470457977, 0.0, 0.0, 0.0, 20.0, "stretch", 623.4289365810586),
}


def test_drawn_physics_draw_the_h100s_effects_in_some_seeds_and_not_others() -> None:
    draws = [drawn_physics(seed) for seed in range(200)]
    for name in H100_EFFECTS:
        present = sum(name in effects_of(d) for d in draws)
        assert 50 < present < 150, name
    for d in draws:
        assert d.decode_step_j == 0 or 0.5 <= d.decode_step_j <= 4.0
        assert d.decode_row_j == 0 or 0.005 <= d.decode_row_j <= 0.03
        assert d.prefill_forward_j == 0 or 0.2 <= d.prefill_forward_j <= 2.0
        assert d.prefill_token_j == 0 or 0.005 <= d.prefill_token_j <= 0.03
        assert 1.0 <= (d.static_w + d.clocks_up_w) / d.static_w <= 1.8
    # together and apart: a device with per-row costs and no padding, and the reverse
    assert any("rows" in effects_of(d) and "padded" not in effects_of(d) for d in draws)
    assert any("padded" in effects_of(d) and "rows" not in effects_of(d) for d in draws)
    off = [set(effects_of(drawn_physics(seed, effects=False))) for seed in range(50)]
    assert all(names.isdisjoint(H100_EFFECTS) for names in off)
    # the earlier effects' draws stay what they were: the H100's have a stream of their own
    for seed, (*values, max_w) in _EARLIER_EFFECTS.items():
        d = drawn_physics(seed)
        assert [getattr(d, name) for name in _EARLIER_EFFECT_FIELDS] == values
        assert d.max_w - d.clocks_up_w == pytest.approx(max_w, rel=1e-12)  # drawn above the serving static
    pinned = [drawn_physics(seed, padded_buckets=True, clocks_up_w=0.0) for seed in range(30)]
    assert all("padded" in effects_of(p) and "serving" not in effects_of(p) for p in pinned)
    for name in H100_EFFECTS:
        assert effects_of(EngineConfig(**(ABSENT | EFFECTS[name]))) == [name]  # type: ignore[arg-type]
