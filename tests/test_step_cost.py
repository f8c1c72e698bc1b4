"""The steps rule: step costs fitted to the meter and shared by accounting convention v2."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import polars as pl
import pytest
from rich.console import Console

from ipw_async import finalize
from ipw_async.energy import AttributionConfig, attribute, stepcost
from ipw_async.energy.attribution import model_choice
from ipw_async.energy.model import PowerModel
from ipw_async.energy.stepcost import (
    CONTEXT_COSTS,
    COSTS,
    DEFAULT_CONTEXT_COST,
    TERMS,
    StepCost,
    _decay,
    entry_features,
)
from ipw_async.energy.steps import Steps
from ipw_async.records import RequestRecord, records_frame
from ipw_async.report import summary_table
from ipw_async.rundir.files import read_arrow
from ipw_async.telemetry.base import Meter, Quantity, power_quantity

from .conftest import SHORT_RUN

MS = 1_000_000
ROOT = Path(__file__).resolve().parent.parent
GPU = Meter("dev", "counter", accelerator=True, source="dev")
STEP_MS = 20
STATIC_W = 100.0


def scripted(
    decoders: list[list[int]], tokens: list[list[float]], prefill: dict[int, tuple[int, float]]
) -> Steps:
    """Steps from each step's decoders (their tokens beside), and prompts {request: (step, tokens)}."""
    req, step, dec, pre = [], [], [], []
    for k, (rows, toks) in enumerate(zip(decoders, tokens, strict=True)):
        for r, t in zip(rows, toks, strict=True):
            req.append(r), step.append(k), dec.append(t), pre.append(0.0)
    for r, (k, t) in prefill.items():
        req.append(r), step.append(k), dec.append(0.0), pre.append(t)
    n = len(decoders)
    start = np.arange(n) * 20.0 * MS
    zeros = np.zeros(len(req))
    per_step_dec = np.bincount(step, weights=dec, minlength=n)
    per_step_pre = np.bincount(step, weights=pre, minlength=n)
    return Steps(
        start,
        start + 20 * MS,
        per_step_dec,
        per_step_pre,
        np.array(req),
        np.array(step),
        np.array(dec),
        np.array(pre),
        zeros,
        zeros,
    )


def entry_energy(steps: Steps, costs: dict[str, float], context_cost: str = "shared") -> np.ndarray:
    cost = StepCost(STATIC_W, np.array([costs.get(name, 0.0) for name in TERMS]), "given")
    return np.bincount(steps.req, weights=cost.entry_energy(entry_features(steps, context_cost)))


def test_a_step_s_own_cost_is_shared_equally_whatever_each_decoder_s_tokens() -> None:
    # one decoder took 3 tokens (speculative) and another 1: the step's cost is the same to each
    steps = scripted([[0, 1, 2]], [[3.0, 1.0, 1.0]], {})
    assert entry_energy(steps, {"per_decode_step_j": 2.1}) == pytest.approx([0.7, 0.7, 0.7])


def test_per_request_parts_are_the_request_s_own() -> None:
    steps = scripted([[0, 1], [0, 1]], [[1.0, 1.0], [1.0, 1.0]], {2: (1, 400.0)})
    energy = entry_energy(
        steps, {"per_decode_step_j": 2.0, "per_prefill_forward_j": 0.8, "per_prompt_token_j": 0.01}
    )
    # each decoder half of two steps' own cost; the prompt's forward and tokens all its own
    assert energy == pytest.approx([2.0, 2.0, 0.8 + 4.0])


def test_with_no_fixed_cost_it_is_the_old_rule_by_work() -> None:
    steps = scripted([[0, 1]], [[3.0, 1.0]], {})
    assert entry_energy(steps, {"per_decode_token_j": 0.5}) == pytest.approx([1.5, 0.5])


def test_the_context_a_padded_batch_reads_is_shared_and_unpadded_it_is_own() -> None:
    steps = scripted([[0, 1]], [[1.0, 1.0]], {})
    steps.entry_context = np.array([3.0, 1.0])  # thousands of KV positions each read
    assert entry_energy(steps, {"per_context_ktoken_j": 1.0}) == pytest.approx([2.0, 2.0])
    assert entry_energy(steps, {"per_context_ktoken_j": 1.0}, "own") == pytest.approx([3.0, 1.0])


def test_every_step_cost_is_a_row_whose_units_its_step_keeps_however_shared() -> None:
    steps = scripted([[0, 1, 2], [1, 2]], [[3.0, 1.0, 1.0], [1.0, 2.0]], {3: (0, 400.0), 4: (1, 100.0)})
    steps.entry_context = np.arange(steps.req.size, dtype=float)
    steps.entry_position = np.where(steps.entry_prefill > 0, 0.5, 0.0)
    assert len(set(TERMS)) == len(TERMS) and all(name.endswith(("_j", "_w")) for name in TERMS)
    own = np.column_stack([cost.units(steps) for cost in COSTS])
    decoding = steps.entry_decode > 0
    for reading in CONTEXT_COSTS:
        features = entry_features(steps, reading)
        assert features.shape == (steps.req.size, len(COSTS))
        for j, cost in enumerate(COSTS):
            assert steps.per_step(features[:, j]) == pytest.approx(steps.per_step(own[:, j])), cost.name
            if reading in cost.shared:  # its step's units, in equal parts to the decoders only
                for k in range(steps.count):
                    parts = features[(steps.step == k) & decoding, j]
                    assert parts == pytest.approx(np.full(parts.size, parts.mean())), cost.name
                assert not features[~decoding, j].any(), cost.name
            else:
                assert features[:, j] == pytest.approx(own[:, j]), cost.name


def _run(
    rng: np.random.Generator,
    per_step_j: float,
    per_token_j: float,
    streams: int = 6,
    seconds: float = 24.0,
    counter_ms: int = 100,
    decode_w: float = 0.0,
    curve: tuple[float, float, float, float] | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame, np.ndarray]:
    """A closed-loop server, scripted: every 20 ms step decodes one token for each running
    request and prefills (in the same step) the prompts of those that just arrived, each step's
    energy above static spread over its time; a counter of it every ``counter_ms``. Returns records,
    telemetry and each request's v2 truth (static equally among the requests on the server).
    With ``curve`` (scale W, exponent, cap W, a prompt token's work in decode tokens) a step
    draws min(cap, scale · work^exponent) above static, no cost of its own, and v2 shares it
    by work."""
    steps_total = int(seconds * 1000 / STEP_MS)
    t0 = 500  # ms of idle before the first request
    running: dict[int, list[int]] = {}  # request -> its chunk times
    windows: dict[int, list[float]] = {}  # request -> [sent ms, prompt tokens, end ms]
    truth: dict[int, float] = {}
    left: dict[int, int] = {}
    chunks: dict[int, list[int]] = {}
    nxt = 0
    power = np.zeros(t0 + steps_total * (STEP_MS + 20) + 600)  # W above static, per ms
    start = t0
    for k in range(steps_total):
        # the load moves between 1 and ``streams`` every 2 s: the batch sizes tell the costs apart
        target = 1 + (k // 100 * 5) % streams
        arriving = []
        while len(running) + len(arriving) < target:
            arriving.append(nxt)
            windows[nxt] = [start - rng.uniform(0.5, 5.0), float(rng.integers(64, 2048))]
            left[nxt], truth[nxt] = int(rng.integers(20, 120)), 0.0
            nxt += 1
        decoding = list(running)
        prompt = sum(windows[r][1] for r in arriving)
        # with ``decode_w``, a decode step is a graph over the batch padded to the highest busy
        # slot, which moves every second: what it costs shows in its time, not in its decoders
        decode_ms = STEP_MS * (1 + (k // 50) % 3) if decode_w else STEP_MS
        duration = decode_ms + int(prompt // 100)  # a prompt's tokens take time too
        step_j = decode_w * decode_ms / 1000 if decode_w else per_step_j
        if curve is None:
            energy = (step_j if decoding else 0.0) + sum(0.3 + per_token_j * windows[r][1] for r in arriving)
            for r in decoding:
                truth[r] += step_j / len(decoding)
            for r in arriving:
                truth[r] += 0.3 + per_token_j * windows[r][1]
        else:
            scale, exponent, cap, weight = curve
            work = {r: 1.0 for r in decoding} | {r: weight * windows[r][1] for r in arriving}
            total = sum(work.values())
            energy = min(cap, scale * total**exponent) * duration / 1000
            for r, w in work.items():
                truth[r] += energy * w / total
        power[start : start + duration] = energy / (duration / 1000)
        for r in arriving:
            running[r] = chunks[r] = []
        start += duration
        for r in list(running):
            running[r].append(start)
            left[r] -= 1
            if left[r] == 0:
                windows[r].append(start)
                del running[r]
    for r, times in running.items():  # still running at the end: ends at its last token
        windows[r].append(times[-1])
    # static: equally among the requests on the server at every ms
    on = np.zeros_like(power)
    for w in windows.values():
        on[int(np.ceil(w[0])) : int(w[2]) + 1] += 1
    for r, w in windows.items():
        span = slice(int(np.ceil(w[0])), int(w[2]) + 1)
        truth[r] += float(np.sum(STATIC_W / 1000 / on[span]))
    # read every 10 ms, as a sampler reads a counter that updates every ``counter_ms``
    t = np.arange(1, power.size, 10)
    updated = t // counter_ms * counter_ms
    energy = np.concatenate(([0.0], np.cumsum(power + STATIC_W) / 1000))[updated]
    tel = pl.DataFrame({"t_ns": t * MS, "dev.t_ns": t * MS, "dev.energy_j": energy})
    recs = [
        RequestRecord(
            request_id=r,
            query_id=f"q{r}",
            dataset="d",
            prompt="p",
            sent_ns=int(w[0] * MS),
            first_token_ns=chunks[r][0] * MS,
            last_token_ns=chunks[r][-1] * MS,
            closed_ns=chunks[r][-1] * MS + 200_000,
            chunk_ns=[c * MS for c in chunks[r]],
            chunk_tokens=[1] * len(chunks[r]),
            chunk_server_ns=[None] * len(chunks[r]),
            prompt_tokens=int(w[1]),
            usage_output_tokens=len(chunks[r]),
        )
        for r, w in windows.items()
    ]
    return records_frame(recs), tel, np.array([truth[r.request_id] for r in recs])


def _p95(records: pl.DataFrame, truth: np.ndarray) -> float:
    energy = records.sort("request_id").get_column("energy_j").to_numpy()
    return float(np.percentile(np.abs(energy - truth) / truth, 95))


@pytest.mark.parametrize(
    ("per_step_j", "per_token_j", "bound"),
    # an H100's decode step against its prompt tokens (1.1% measured; tokens 17%), and a device
    # whose prompts weigh more (4.7%: a forward's cost and its tokens' trade off; tokens 6.1%)
    [(2.2, 0.014, 0.03), (0.5, 0.05, 0.08)],
)
def test_the_steps_rule_recovers_a_v2_truth_and_beats_token_work(
    per_step_j: float, per_token_j: float, bound: float
) -> None:
    recs, tel, truth = _run(np.random.default_rng(7), per_step_j, per_token_j)
    steps, section = attribute(tel, [GPU], recs, AttributionConfig(baseline_w=STATIC_W))
    tokens, _ = attribute(tel, [GPU], recs, AttributionConfig(rule="tokens", baseline_w=STATIC_W))
    meter = section["meters"]["dev"]
    assert meter["power_model"]["chosen_by"]["chosen"] == "step costs"  # a fixed cost a step: its shape
    costs = meter["power_model"]["costs"]
    # steps of one length: their cost reads as per step or per second of decoding alike
    per_step = costs["per_decode_step_j"] + costs["per_decode_second_w"] * STEP_MS / 1000
    assert per_step == pytest.approx(per_step_j, rel=0.1)
    assert _p95(steps, truth) < bound and _p95(steps, truth) < _p95(tokens, truth)
    assert abs(meter["conservation_error"]) < 1e-9
    low, high = (steps.sort("request_id").get_column(c).to_numpy() for c in ("energy_low_j", "energy_high_j"))
    assert np.mean((low <= truth) & (truth <= high)) >= 0.9
    assert np.median((high - low) / 2 / truth) < 0.15


@pytest.mark.parametrize(("per_step_j", "per_token_j"), [(2.2, 0.014), (0.5, 0.05)])
def test_costs_the_meter_does_not_call_for_are_rarely_charged_and_the_split_comes_closer(
    monkeypatch: pytest.MonkeyPatch, per_step_j: float, per_token_j: float
) -> None:
    # the device has a decode step's cost, a prompt's forward (0.3 J) and its tokens; a fit of
    # every cost also charges padded rows' reads and prompt positions, which it has not
    recs, tel, truth = _run(np.random.default_rng(7), per_step_j, per_token_j)
    config = AttributionConfig(baseline_w=STATIC_W)
    has = {"per_decode_step_j", "per_decode_second_w", "per_prefill_forward_j", "per_prompt_token_j"}

    def fitted(section: dict[str, Any]) -> tuple[set[str], dict[str, Any]]:
        model = section["meters"]["dev"]["power_model"]
        return {name for name, c in model["costs"].items() if c}, model

    chosen, section = attribute(tel, [GPU], recs, config)
    _, model = fitted(section)
    # the costs charged are the mean of those chosen over the resamplings: one the device has
    # not is chosen in few of them, and the prompt token, which every one chose, is the device's
    lacks = {name: share for name, share in model["chosen_in"].items() if name not in has}
    assert lacks and max(lacks.values()) <= 0.25 and model["chosen_in"]["per_prompt_token_j"] == 1.0
    assert model["costs"]["per_prompt_token_j"] == pytest.approx(per_token_j, rel=0.05)
    assert "the mean of those chosen over 20 resamplings" in " ".join(model["notes"])
    monkeypatch.setattr(stepcost, "_selected", lambda problem, x, rows: stepcost._fit_rows(problem, x, rows))
    whole, section = attribute(tel, [GPU], recs, config)
    assert fitted(section)[0] - has  # every cost fitted: some the device has not
    assert _p95(chosen, truth) < _p95(whole, truth)


def test_a_cost_that_refines_another_is_never_chosen_without_it() -> None:
    """Prompts of nearly one length make a token's cost by its position (tokens × length) stand
    in for its plain cost: a device with only the plain cost, metered with noise, has the
    backward selection keep whichever fits the noise better. A refinement is left out before
    what it refines, so the plain cost stays in every selection: the position cost alone would
    charge a prompt by its length squared."""
    token, position = TERMS.index("per_prompt_token_j"), TERMS.index("per_prompt_position_ktoken_j")
    assert stepcost.REFINED[position] == token
    rng = np.random.default_rng(11)
    n = 400
    x = np.zeros((n, len(TERMS)))
    x[:, token] = rng.uniform(200.0, 2000.0, n)  # prompt tokens computed in each interval
    x[:, position] = x[:, token] * rng.normal(0.5, 0.001, n)  # × their thousands of positions
    dt = np.full(n, 0.1)
    kept_alone = 0
    for noise in rng.normal(size=(40, n)):
        energy = STATIC_W * dt + 0.02 * x[:, token] + 0.5 * noise
        problem = SimpleNamespace(energy=energy, dt=dt, static_w=STATIC_W)
        _, costs = stepcost._selected(problem, x, np.arange(n))  # type: ignore[arg-type]
        assert costs[token] > 0
        kept_alone += costs[position] > 0 and costs[token] == 0
    assert kept_alone == 0  # 8 of the 40 before the rule


def test_a_capped_concave_device_is_split_by_its_power_model_chosen_over_step_costs() -> None:
    # power concave in the step's work and clipped at a cap (a GPU at its power limit), with no
    # cost of its own per step: step costs can only approximate it, and the run's data say so
    recs, tel, truth = _run(np.random.default_rng(5), 0.0, 0.0, streams=12, curve=(40.0, 0.6, 260.0, 0.3))
    steps, section = attribute(tel, [GPU], recs, AttributionConfig(baseline_w=STATIC_W))
    tokens, _ = attribute(tel, [GPU], recs, AttributionConfig(rule="tokens", baseline_w=STATIC_W))
    model = section["meters"]["dev"]["power_model"]
    assert model["chosen_by"]["chosen"] == "power model" and model["chosen_by"]["bic_difference"] < -10
    assert model["r2"] > model["chosen_by"]["step_costs_r2"]
    assert _p95(steps, truth) < 0.05 and _p95(steps, truth) < _p95(tokens, truth) / 2
    low, high = (steps.sort("request_id").get_column(c).to_numpy() for c in ("energy_low_j", "energy_high_j"))
    assert np.mean((low <= truth) & (truth <= high)) >= 0.9


@pytest.mark.parametrize(
    ("model_r2", "prefill_guessed", "chosen"),
    # over 500 intervals at R² 0.99, four parameters each: a power model a little better is a
    # near tie (ΔBIC −5), one that halves the residual very strong evidence (ΔBIC −347); one that
    # could not be fitted, or whose prompt token weighs only its default, is never chosen
    [
        (0.99, False, "step costs"),
        (0.9901, False, "step costs"),
        (0.995, False, "power model"),
        (0.995, True, "step costs"),
        (None, False, "step costs"),
    ],
)
def test_the_power_model_replaces_step_costs_only_on_very_strong_evidence(
    model_r2: float | None, prefill_guessed: bool, chosen: str
) -> None:
    costs = StepCost(STATIC_W, np.array([2.0, 0, 0.3, 0, 0.5, 0.01, 0]), "measured", r2=0.99, intervals=500)
    errors = {"scale": 1.0, "prefill": 0.01, "exponent": 0.01, "cap": 5.0}
    model = PowerModel(
        STATIC_W, 40.0, 0.3, r2=model_r2, intervals=500, errors=errors, prefill_guessed=prefill_guessed
    )
    choice = model_choice(costs, model)
    assert choice["chosen"] == chosen
    assert ("kept_because" in choice) == prefill_guessed
    if model_r2 is not None:
        expected = 500 * np.log((1 - model_r2) / (1 - 0.99))
        assert choice["bic_difference"] == pytest.approx(expected)


def test_the_choice_weighs_what_the_chosen_costs_explain_not_their_bagged_mean() -> None:
    # a mean of fits explains less than each one; a power model between the two is no better
    # than the step costs the run chose (on a simulated device the mean's R² of 0.944 against
    # the chosen set's 0.960 handed its split to a curve 4 times worse at p95)
    costs = StepCost(STATIC_W, np.array([2.0, 0, 0.3, 0, 0.5, 0.01, 0]), "measured", r2=0.985, intervals=500)
    costs.chosen_r2, costs.parameters = 0.99, 4
    errors = {"scale": 1.0, "prefill": 0.01, "exponent": 0.01, "cap": 5.0}
    model = PowerModel(STATIC_W, 40.0, 0.3, r2=0.9875, intervals=500, errors=errors)
    choice = model_choice(costs, model)
    assert choice["chosen"] == "step costs" and choice["step_costs_r2"] == 0.99
    costs.chosen_r2 = None  # judged on the mean, the same curve would have been chosen
    assert model_choice(costs, model)["chosen"] == "power model"


def test_a_decode_step_whose_cost_shows_only_in_its_time_is_priced_by_its_time() -> None:
    # the batch padded to 1, 2 or 3 × 20 ms whatever its decoders: 300 W while decoding
    recs, tel, truth = _run(np.random.default_rng(11), 0.0, 0.014, decode_w=300.0)
    steps, section = attribute(tel, [GPU], recs, AttributionConfig(baseline_w=STATIC_W))
    tokens, _ = attribute(tel, [GPU], recs, AttributionConfig(rule="tokens", baseline_w=STATIC_W))
    costs = section["meters"]["dev"]["power_model"]["costs"]
    assert costs["per_decode_second_w"] == pytest.approx(300.0, rel=0.1)
    assert _p95(steps, truth) < 0.05 and _p95(steps, truth) < _p95(tokens, truth) / 2


def test_too_few_intervals_fit_no_costs_and_the_band_says_it_is_unsure() -> None:
    recs, tel, _ = _run(np.random.default_rng(3), 2.2, 0.014, streams=2, seconds=0.3, counter_ms=400)
    out, section = attribute(tel, [GPU], recs, AttributionConfig(baseline_w=STATIC_W))
    model = section["meters"]["dev"]["power_model"]
    assert "too few" in " ".join(model["notes"]) and model["held_out_error"] is None
    low, high = (out.get_column(c).to_numpy() for c in ("energy_low_j", "energy_high_j"))
    energy = out.get_column("energy_j").to_numpy()
    assert np.all(high - low >= energy)  # unmeasured error widens the band, it does not vanish


TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
# p95 of |error| against each real run's v2 reference, as this rule reached it (1.4 / 2.7 /
# 9.1%), with room for float noise: a change that makes any real run worse fails here. (The
# Poisson run's 8.8% before the costs were bagged rested on one step: read as after idle or
# not, it flipped a prompt's forward in or out of the chosen costs, 8.8 or 10.4%.)
REACHED = {"h100-8b-graphs/c8": 0.016, "h100-8b-graphs/c128": 0.029, "h100-8b-graphs/pois": 0.092}
# the band's median half-width there (5.5 / 9.0 / 13.7%): the bar is 15%
BAND = {"h100-8b-graphs/c8": 0.06, "h100-8b-graphs/c128": 0.095, "h100-8b-graphs/pois": 0.145}


# ... and against the reference rebuilt at the run's measured idle, the static the device drew
# between steps inside each run (2.1 / 3.2 / 3.4%)
REACHED_AT_IDLE = {"h100-8b-graphs/c8": 0.023, "h100-8b-graphs/c128": 0.034, "h100-8b-graphs/pois": 0.036}
needs_traces = pytest.mark.skipif(
    not TRACES.is_dir(), reason="the real traces (../shared/traces) are not beside this clone"
)


def _real_traces() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("real_traces", ROOT / "benchmarks" / "real_traces.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    return bench


@needs_traces
@pytest.mark.parametrize("name", sorted(REACHED))
def test_the_default_on_real_h100_runs_is_no_worse_than_it_reached(name: str, tmp_path: Path) -> None:
    bench = _real_traces()
    run = TRACES / name
    records, summary = bench.finalized(run, tmp_path, "steps")  # the runs recorded the old default
    score = bench.score(records, bench.reference(run))
    assert summary["energy"]["rule"] == "steps" and score.n > 50
    assert score.p95 <= REACHED[name] and abs(score.bias) < 0.02
    static = summary["energy"]["meters"]["gpu0"]["power_model"]["static_w"]
    at_idle = bench.score(records, bench.rebuild(run, static).reference)
    assert at_idle.p95 <= REACHED_AT_IDLE[name] and abs(at_idle.bias) < 0.02
    assert score.coverage is not None and score.coverage >= 0.9
    assert score.half_width is not None and score.half_width <= BAND[name]
    placed = summary["energy"]["meters"]["gpu0"]["power_model"]["prefill_placement"]
    if name != "h100-8b-graphs/c8":  # at 8 streams too few prompts wait to tell a budget
        # the server's 2,048 tokens a step, from first tokens alone
        assert placed["by"] == "token budget" and placed["budget_tokens"] == 2048


# Real H200 runs kept in this repository (benchmarks/traces), recorded after every choice the
# model makes was made: p95 as the default reached it (1.7 / 4.7 / 5.2 / 4.7%), with room for
# float noise, and `tokens` on the same requests (7.5 / 7.6 / 5.9 / 7.1%), which it must beat
H200 = ROOT / "benchmarks" / "traces" / "h200-8b-graphs"
REACHED_H200 = {"c8": 0.018, "c32": 0.048, "c128": 0.053, "pois": 0.048}
# the band's median half-width (5.9 / 8.3 / 10.2 / 13.9%; the Poisson run's was 23.7% while its
# held-out error came from predicting its first quarter, load still rising, from the rest)
BAND_H200 = {"c8": 0.06, "c32": 0.085, "c128": 0.105, "pois": 0.145}


@pytest.mark.parametrize("name", sorted(REACHED_H200))
def test_the_default_on_real_h200_runs_beats_tokens_and_is_no_worse_than_it_reached(
    name: str, tmp_path: Path
) -> None:
    bench = _real_traces()
    run = H200 / name
    ref = bench.reference(run)
    records, summary = bench.finalized(run, tmp_path, None)
    assert summary["energy"]["rule"] == "steps"  # what a user gets with no options
    default = bench.score(records, ref)
    tokens = bench.score(bench.finalized(run, tmp_path, "tokens")[0], ref)
    assert default.n == tokens.n > 40
    assert default.p95 <= REACHED_H200[name] and abs(default.bias) < 0.02
    assert default.p95 < tokens.p95
    assert default.coverage is not None and default.coverage >= 0.9
    assert default.half_width is not None and default.half_width <= BAND_H200[name]


@needs_traces
@pytest.mark.parametrize(
    ("name", "ended", "bound"),
    # c128's first 15 s: one wave of 64 prompts (1.8% against the whole run's 3.0% on them;
    # 7.8% before a refining cost was kept only with what it refines); the Poisson run's first
    # 11 s, 16 requests sent (3.7% against 5.5%; 14.4% while noise could pick a 110 ms lag)
    [("c128", 50, 0.025), ("pois", 10, 0.05)],
)
def test_a_real_run_cut_short_is_fitted_from_what_it_has_and_still_scores(
    name: str, ended: int, bound: float, tmp_path: Path
) -> None:
    """A real run cut at a quarter of its sends is a shorter run of the same GPU: the cut keeps
    every request on the server before it and no reading after it, and its own fit scores its
    requests about as the whole run's does them, with no meter lag (the energy counter has
    none), its band holding each reference."""
    bench = _real_traces()
    run = TRACES / "h100-8b-graphs" / name
    copy, until = bench.cut(run, tmp_path, 0.25)
    records = read_arrow(copy / "records.arrow")
    whole = read_arrow(run / "run" / "records.arrow")
    assert records.height == whole.filter(pl.col("sent_ns") <= until).height < whole.height
    times = read_arrow(copy / "telemetry.arrow").select(pl.col("^.*\\.t_ns$")).max()
    assert max(v for v in times.row(0) if v is not None) <= until
    result = finalize(copy, attribution="steps", context_cost=DEFAULT_CONTEXT_COST)
    assert result.summary["energy"]["meters"]["gpu0"]["power_model"]["lag_ms"] == 0.0
    finished = result.records
    done = finished.filter(pl.col("closed_ns") <= until).get_column("request_id").to_list()
    ref = bench.reference(run)
    short = bench.score(finished, {q: ref[q] for q in done}, warmup=True)
    assert short.n >= ended
    assert short.p95 <= bound and abs(short.bias) < 0.02
    assert short.coverage == 1.0


@needs_traces
def test_without_its_counter_a_real_h100_is_read_from_the_power_it_averaged(tmp_path: Path) -> None:
    """The c8 run read as a device without an energy counter: where the log has the device's
    1 s average and its instant field, the meter integrates the average (placed a window late),
    which scores the run's requests better than the instant field does (3.2% against 4.4% at
    p95; 7.0% before the instant field was kept over stretches): an H100 refreshes that point
    value every 100 ms, and read every 50 ms it samples 10-20 ms steps as chance has it."""
    bench = _real_traces()
    run = TRACES / "h100-8b-graphs" / "c8"
    logged = read_arrow(run / "run" / "telemetry.arrow").columns
    assert {"gpu0.power_w", "gpu0.avg_power_w"} <= set(logged)
    assert power_quantity("gpu0", logged) == Quantity.AVG_POWER_W
    scores = {name.split(" (")[0]: score for name, score in bench.power_scores(run, tmp_path)}
    average, instant = scores["its 1 s average"], scores["its instant field"]
    assert average.p95 <= 0.04 and abs(average.bias) < 0.02
    assert average.p95 < instant.p95
    # its band counts the average's windows as independent, not its readings (so, it held 83%)
    assert average.coverage is not None and average.coverage >= 0.9


# p95 of |error| from the instant field alone as it is now reached (7.8 / 11.1%), with its band's
# coverage (97 / 95%): kept interval by interval it was 32.0 / 30.9%, the band holding 68 / 69%
INSTANT = {"c128": 0.08, "pois": 0.115}


@needs_traces
@pytest.mark.parametrize("name", sorted(INSTANT))
def test_a_real_h100_read_from_its_instant_field_keeps_it_over_stretches(name: str, tmp_path: Path) -> None:
    """Read from its instant power alone (a point sample every 50 ms of a power that changes
    every step), the run's energy is kept over stretches of seconds that blocked
    cross-validation chose, not interval by interval: the fitted costs split each stretch,
    and the band holds the references."""
    bench = _real_traces()
    copy = bench.without_counter(TRACES / "h100-8b-graphs" / name, tmp_path, "power_w")
    result = finalize(copy, attribution="steps")
    score = bench.score(result.records, bench.reference(TRACES / "h100-8b-graphs" / name))
    assert score.p95 <= INSTANT[name] and abs(score.bias) < 0.02
    assert score.coverage is not None and score.coverage >= 0.9
    kept = result.summary["energy"]["meters"]["gpu0"]["power_model"]["conserved_over"]
    assert kept["length_s"] is None or kept["length_s"] >= 8
    console = Console(record=True, width=400)
    console.print(summary_table(result.summary))
    assert "its instant power kept over" in console.export_text()


def test_the_meter_lag_is_none_unless_held_out_intervals_call_for_it() -> None:
    """Each lag's fit is held out in stretches; a lag is taken only where it predicts them
    better by 2% of the mean absolute error and on more intervals than it predicts worse, the
    best of those that do, else none: noise that favours a lag by a hair, or a few intervals
    that favour it where most do not, picks none; a few intervals a jittering counter puts far
    off whatever the lag do not refuse one that most intervals call for."""
    rng = np.random.default_rng(5)
    noise = rng.normal(size=300)

    def fit(lag: float, residuals: np.ndarray | None) -> StepCost:
        held = None if residuals is None else float(np.sqrt(np.mean(residuals**2)))
        cost = StepCost(100.0, np.zeros(len(TERMS)), "measured", held_out_error=held, lag_ms=lag)
        cost.held_out_residuals = residuals
        return cost

    hair = [
        fit(0.0, noise),
        *(fit(lag, noise * (1 - 0.005 * i)) for i, lag in enumerate((20.0, 40.0, 70.0), 1)),
    ]
    assert stepcost._lag_earned(hair).lag_ms == 0.0  # 1.5% better at best: not earned
    lagging = [fit(0.0, noise), fit(20.0, noise * 0.9), fit(70.0, 0.4 * noise + 0.01 * rng.normal(size=300))]
    assert stepcost._lag_earned(lagging).lag_ms == 70.0
    # a few intervals much better, most a little worse: a lower RMS error, not a better fit
    few = noise.copy()
    few[:6] *= 8.0
    spiky = few * 1.03
    spiky[:6] = noise[:6]
    assert np.sqrt(np.mean(spiky**2)) < 0.8 * np.sqrt(np.mean(few**2))
    assert stepcost._lag_earned([fit(0.0, few), fit(110.0, spiky)]).lag_ms == 0.0
    too_few = [fit(0.0, None), fit(70.0, None)]
    assert stepcost._lag_earned(too_few).lag_ms == 0.0
    # most intervals 30% better at the lag, six read at a jittered moment far off: worse by the
    # mean square, better by the mean absolute error and interval by interval
    jittered = 0.7 * noise
    jittered[:6] = 6.0
    assert np.sqrt(np.mean(jittered**2)) > np.sqrt(np.mean(noise**2))
    assert stepcost._lag_earned([fit(0.0, noise), fit(40.0, jittered)]).lag_ms == 40.0


def test_a_power_model_that_explains_the_meter_about_as_well_is_inside_the_band(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where step costs are kept but the power model explains the meter's intervals nearly as
    well, the meter cannot say whose split is right: the estimate stays the step costs', the
    band spans the power model's split too. The recorded run's basic shape (the curve) explains
    0.064 less of its intervals than its step costs; counted a rival here by a looser margin."""
    attribute_module = sys.modules["ipw_async.energy.attribution"]

    def finished(name: str, rule: str, power_model: str | None = None) -> pl.DataFrame:
        shutil.copytree(SHORT_RUN, tmp_path / name)
        return finalize(tmp_path / name, attribution=rule, power_model=power_model).records.sort("request_id")

    alone = finished("alone", "steps")
    monkeypatch.setattr(attribute_module, "RIVAL_R2", 0.1)
    shutil.copytree(SHORT_RUN, tmp_path / "rival")
    result = finalize(tmp_path / "rival", attribution="steps")
    spanned = result.records.sort("request_id")
    chosen_by = result.summary["energy"]["meters"]["sim"]["power_model"]["chosen_by"]
    assert chosen_by["chosen"] == "step costs" and "band_spans_power_model" in chosen_by
    # the rival's own split: the fitted rule told the shape the first look fitted
    fitted = finished("fitted", "fitted", chosen_by["power_model"]).get_column("energy_j").to_numpy()
    assert spanned.get_column("energy_j").to_list() == pytest.approx(alone.get_column("energy_j").to_list())
    low, high = (spanned.get_column(c).to_numpy() for c in ("energy_low_j", "energy_high_j"))
    assert ((low <= fitted * (1 + 1e-9)) & (fitted <= high * (1 + 1e-9))).all()
    alone_low, alone_high = (alone.get_column(c).to_numpy() for c in ("energy_low_j", "energy_high_j"))
    assert not ((alone_low <= fitted) & (fitted <= alone_high)).all()  # it was not before


def test_the_band_narrows_as_the_meter_says_more_and_holds_the_truth_throughout() -> None:
    """The band spans the costs refitted to resamplings of the meter's intervals: a run four
    times as long pins the costs down better, so its band is narrower (less so than the refits
    alone: the token-work split it also spans is a different form of the costs, which more
    data do not move), and both hold the truth. The band is a function of the run: finalizing
    it again gives the same one."""
    widths = []
    for seconds in (12.0, 48.0):
        recs, tel, truth = _run(np.random.default_rng(3), 2.2, 0.014, seconds=seconds)
        out, _ = attribute(tel, [GPU], recs, AttributionConfig(baseline_w=STATIC_W))
        again, _ = attribute(tel, [GPU], recs, AttributionConfig(baseline_w=STATIC_W))
        out = out.sort("request_id")
        low, high = (out.get_column(c).to_numpy() for c in ("energy_low_j", "energy_high_j"))
        assert again.sort("request_id").get_column("energy_high_j").to_list() == high.tolist()
        assert np.mean((low <= truth) & (truth <= high)) >= 0.9
        widths.append(float(np.median((high - low) / 2 / out.get_column("energy_j").to_numpy())))
    assert widths[1] < 0.9 * widths[0]


def test_the_band_falls_over_a_request_as_the_fit_s_residuals_do() -> None:
    """A request's band widens by the fit's interval error over its window. Residuals
    independent from interval to interval fall as 1/√k over k intervals; a misfit that recurs
    (the same kind of step misjudged all run) falls far less, and the band says so; it never
    falls faster than independent errors would."""
    rng = np.random.default_rng(7)
    white = rng.normal(size=4000)
    persistent = np.repeat(rng.normal(size=40), 100) + 0.2 * white  # a misfit 100 intervals long
    spans = np.array([1.0, 16.0, 100.0, 400.0])
    errors = {}
    for name, residual in (("white", white), ("persistent", persistent)):
        cost = StepCost(100.0, np.zeros(len(TERMS)), "measured", held_out_error=0.1, decay=_decay(residual))
        errors[name] = cost.window_error(spans)
    independent = 0.1 / np.sqrt(spans)
    assert errors["white"] == pytest.approx(independent, rel=0.15)
    assert np.all(errors["persistent"] >= independent * (1 - 1e-12))
    assert errors["persistent"][2] > 5 * independent[2]  # over the misfit's length, little falls
    assert errors["persistent"][0] == pytest.approx(0.1)  # one interval: the interval error itself
    unknown = StepCost(100.0, np.zeros(len(TERMS)), "measured", held_out_error=0.1, decay=_decay(white[:10]))
    assert unknown.window_error(spans) == pytest.approx(independent)  # too few intervals to tell
    # read from a power averaged over 20 intervals, readings share their errors 20 apart: a
    # request's error falls only by the windows it spans, whatever the fit's residuals did
    averaged = StepCost(
        100.0, np.zeros(len(TERMS)), "measured", held_out_error=0.1, decay=_decay(white), window_intervals=20.0
    )
    windows = np.minimum(1.0, np.sqrt(20.0 / spans))
    assert averaged.window_error(spans) == pytest.approx(0.1 * windows, rel=0.15)


@needs_traces
def test_the_rebuilt_reference_reproduces_the_shipped_one_and_keeps_every_interval() -> None:
    """Rebuilt at the static it fits, as the traces' README builds it, the reference is the
    shipped one within 1.5% at p95 (c8); at any static every counter interval's energy is
    charged (to requests, or as idle where none was on the server)."""
    bench = _real_traces()
    run = TRACES / "h100-8b-graphs" / "c8"
    shipped = bench.reference(run)
    fitted = bench.rebuild(run, None)
    ids = sorted(shipped)
    drift = np.abs([fitted.reference[q] / shipped[q] - 1 for q in ids])
    assert np.percentile(drift, 95) < 0.015 and fitted.r2 > 0.9
    _, energy = bench.counter_intervals(run / "run")
    for static in (None, 123.5, 72.7):
        rebuilt = bench.rebuild(run, static)
        assert set(rebuilt.reference) == set(shipped) and rebuilt.idle_j > 0
        assert sum(rebuilt.reference.values()) + rebuilt.idle_j == pytest.approx(energy.sum(), rel=1e-9)


@needs_traces
def test_the_device_between_steps_draws_the_measured_idle_not_the_static_a_fit_trades_away() -> None:
    """On the Poisson run a free static fits the intervals as well at 99 W as the measured idle
    does at 125.5 W; the counter over the intervals no step came near says which is drawn."""
    bench = _real_traces()
    run = TRACES / "h100-8b-graphs" / "pois"
    clear, power = bench.between_steps(run)
    fitted = bench.rebuild(run, None)
    assert clear >= 5 and power is not None
    assert abs(power - 125.5) < 3 and fitted.static_w < power - 20
