"""Per meter: the rule's split, the band, and the columns and summary the run writes.

A rule is an entry of :data:`RULES`: how it weighs the work in each meter interval, what static
power it shares equally, and whether it pools a meter interval's dynamic energy over the work
in it. ``steps`` (the default) gives each inferred step the energy of its costs fitted to the
run (:mod:`.stepcost`) and shares them by accounting convention v2: static power equally among
the requests on the server, a step's own cost equally among its decoders, the rest to the
request that caused it. ``fitted`` weighs each inferred step by the power model fitted to the
run (:mod:`.fit`), its per-step power shared equally, the rest by work; ``tokens`` counts work
linearly, a prompt token at ``prefill_weight``; ``equal`` gives every active request the same; ``window`` gives each request its whole window's device energy, as a
sequential profiler reports (it counts overlaps again: no conservation, no band).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import polars as pl
from scipy import sparse

from .._clock import NS
from ..records import CHARS_PER_TOKEN, end_ns
from ..telemetry.base import Meter
from .band import BAND_PREFILL_WEIGHTS, band, cost_band, interval_error, perturbed
from .counter import VirtualCounter, counter_timing, covering, idle_power, series, virtual_counter
from .fit import fit
from .model import PowerModel
from .pooling import Pooling, choose_pooling, pooled
from .problem import Problem, design
from .settings import AttributionConfig
from .split import Segments, StepShares, Timeline, equal_segments, safe_div
from .stepcost import (
    MIN_INTERVALS,
    NEAR_TIE_BIC,
    StepCost,
    fit_step_cost,
)
from .steps import Steps, estimated_prompts
from .work import Work, step_shares


@dataclass
class MeterResult:
    """One meter's attribution: per-request arrays aligned with the requests frame."""

    meter: str
    kind: str
    energy_j: np.ndarray
    window_j: np.ndarray
    provenance: list[str]
    mean_power_w: np.ndarray
    low_j: np.ndarray  # the band: the least and the most each request could have used
    high_j: np.ndarray
    totals: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Inputs:
    """What every rule may split by, for one meter."""

    requests: pl.DataFrame
    work: Work
    active: Segments
    baseline: float | None
    prefill_weight: float
    model: PowerModel | None
    step_cost: StepCost | None
    designs: Callable[[float], sparse.csr_matrix]  # the meter's design at a lag (ms)
    window_ns: float = 0.0  # how long the device averaged the power the meter integrates

    @cached_property
    def placed(self) -> Segments:
        """The requests' work as the meter sees it: where its power was averaged over a
        window, spread over the window after it."""
        return self.work.placed.averaged(self.window_ns)

    @cached_property
    def last_step(self) -> Segments:
        """Each request's last step as the meter sees it (as :attr:`placed`)."""
        return self.work.last_step.averaged(self.window_ns)

    def model_split(self, model: PowerModel) -> Split:
        shares = step_shares(self.work.steps, model, self.designs(model.lag_ms))
        return Split(None, model.static_at, True, shares)


@dataclass(frozen=True)
class Split:
    """How one rule splits: weights over time, or a power model's shares of each step as the
    meter saw them; static power (W, a constant or a function of time); and whether a meter
    interval's energy is pooled over its work."""

    segments: Segments | None
    static: float | Callable[[np.ndarray], float | np.ndarray] | None
    pooled: bool
    shares: StepShares | None = None


def _steps(inputs: _Inputs) -> Split:
    if inputs.step_cost is None:  # a host meter: the step costs are the accelerator's
        return _tokens(inputs)
    return step_cost_split(inputs.step_cost, inputs.work, inputs.designs(inputs.step_cost.lag_ms))


def step_cost_split(cost: StepCost, work: Work, seconds_seen: sparse.csr_matrix) -> Split:
    features = work.features(cost.context_cost)
    return Split(None, cost.static_w, True, cost.shares(work.steps, features, seconds_seen))


def _fitted(inputs: _Inputs) -> Split:
    if inputs.model is None:  # a host meter: the power model describes the accelerator
        return _tokens(inputs)
    return inputs.model_split(inputs.model)


def _tokens(inputs: _Inputs) -> Split:
    return Split(inputs.placed.weighted(inputs.prefill_weight), inputs.baseline, True)


def _equal(inputs: _Inputs) -> Split:
    return Split(inputs.active, inputs.baseline, False)


# each rule's split; ``window`` has none
RULES: dict[str, Callable[[_Inputs], Split] | None] = {
    "steps": _steps,
    "fitted": _fitted,
    "tokens": _tokens,
    "equal": _equal,
    "window": None,
}


CURVE = frozenset({"curve"})
# A BIC difference past 10 is very strong evidence (Kass and Raftery, 1995): step costs, the
# convention's own shape, give way only to that, so a near tie cannot flip a run's split
VERY_STRONG_BIC = NEAR_TIE_BIC


def model_choice(cost: StepCost, model: PowerModel) -> dict[str, Any]:
    """Which model the steps rule splits by: its step costs, unless the device's fitted power
    model explains the meter's intervals better by the Bayesian information criterion
    (n ln(RSS_model / RSS_costs) + (k_model − k_costs) ln n over the same n intervals; k: the
    parameters each fitted), by more than :data:`VERY_STRONG_BIC`. A capped or concave
    device's energy is the power model's shape, which step costs can only approximate; where
    both fit about alike, or the power model's prompt token weighs only its default, the step
    costs are kept."""
    n = cost.intervals
    out: dict[str, Any] = {
        "rule": "BIC over the meter's intervals: the power model where it explains them better",
        "step_costs_r2": cost.family_r2,
        "power_model": model.name,
        "power_model_r2": model.r2,
        "chosen": "step costs",
    }
    if cost.family_r2 is None or model.r2 is None or n != model.intervals or n < MIN_INTERVALS:
        return out
    k_costs = (cost.parameters or int(np.count_nonzero(cost.costs))) + (cost.static_source == "fitted")
    k_model = len(model.errors) + (cost.static_source == "fitted")
    rss = (max(1.0 - model.r2, 1e-12), max(1.0 - cost.family_r2, 1e-12))
    difference = n * float(np.log(rss[0] / rss[1])) + (k_model - k_costs) * float(np.log(n))
    out["bic_difference"] = difference
    if difference >= -VERY_STRONG_BIC:
        return out
    if model.prefill_guessed:
        # its prompt tokens' share would be a default's, where step costs measured theirs
        out["kept_because"] = "the power model's prefill weight is only its default"
        return out
    out["chosen"] = "power model"
    return out


def _apply(
    timeline: Timeline, split: Split, *, imputed: bool = True
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Each request's energy by ``split``, its imputed part (zeros without ``imputed``: a
    band's estimates need only the energy), the idle energy and what of it went to work."""
    static = split.static(timeline.mid) if callable(split.static) else split.static
    if split.shares is not None:
        return timeline.split_by_steps(split.shares, static, imputed=imputed)
    assert split.segments is not None
    return timeline.split(split.segments, static, pooled=split.pooled, imputed=imputed)


def _energy(timeline: Timeline, split: Split) -> np.ndarray:
    """Each request's energy by ``split``: one of a band's estimates."""
    return _apply(timeline, split, imputed=False)[0]


def request_windows(records: pl.DataFrame) -> pl.DataFrame:
    """The requests that reached the server, with ``end_ns`` (see :func:`records.end_ns`)."""
    return records.with_columns(end_ns().alias("end_ns")).filter(pl.col("sent_ns").is_not_null())


def _windows(requests: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return (
        requests.get_column("sent_ns").to_numpy().astype(float),
        requests.get_column("end_ns").to_numpy().astype(float),
    )


def split_with_known(
    telemetry: pl.DataFrame,
    meter: Meter,
    requests: pl.DataFrame,
    steps: Steps,
    model: PowerModel,
    config: AttributionConfig,
    exact: Callable[[sparse.csr_matrix], StepShares] | None = None,
) -> np.ndarray:
    """Each request's energy when the engine's steps and the device's power model are known
    rather than inferred (a simulator's own account): the same pooled split of every meter
    interval, so what remains against the truth is what the meter could not resolve. The
    steps' split is the model's, or ``exact``'s given the seconds of each step the meter saw
    (the split the device itself made, where it logged one)."""
    sent, end = _windows(requests)
    vc = covering(virtual_counter(telemetry, meter, config.gap_factor, config.session_starts_ns), sent, end)
    if vc is None or not requests.height:
        return np.full(requests.height, np.nan)
    seen = design(vc.t, steps, model.lag_ms, vc.window_ns)
    shares = step_shares(steps, model, seen) if exact is None else exact(seen)
    split = Split(None, model.static_at, True, shares)
    return _apply(Timeline(vc, equal_segments(sent, end), [], requests.height), split)[0]


def _temperature(telemetry: pl.DataFrame, meter: Meter) -> tuple[np.ndarray, np.ndarray] | None:
    read = series(telemetry, meter.time_column, meter.temperature_column)
    return None if read is None or np.ptp(read[1]) == 0 else read


def _baseline_w(vc: VirtualCounter, meter: Meter, config: AttributionConfig) -> float | None:
    if config.baseline_w is not None and meter.accelerator:
        return config.baseline_w
    if config.baseline_window_ns is None:
        return None
    return idle_power(vc, config.baseline_window_ns)


def _static_source(meter: Meter, config: AttributionConfig) -> str:
    """Where the static power the step costs stand on came from (fitted where neither)."""
    return "given" if config.baseline_w is not None and meter.accelerator else "measured"


def _missing(meter: Meter, n: int) -> MeterResult:
    nan = np.full(n, np.nan)
    reason = {
        "kind": meter.kind,
        "missing_reason": "the source produced fewer than two readings",
        **_distrusted(meter),
    }
    return MeterResult(meter.channel, meter.kind, nan, nan, ["missing"] * n, nan, nan, nan, reason)


def _distrusted(meter: Meter) -> dict[str, str]:
    """Why a counter meter's power is integrated instead, where it is."""
    return {"distrusted": meter.distrusted} if meter.distrusted else {}


def _step_costs_or_model(
    problem: Problem, work: Work, meter: Meter, config: AttributionConfig
) -> tuple[StepCost | None, PowerModel | None, list[PowerModel], dict[str, Any]]:
    """The steps rule's split: its step costs, or the power model where :func:`model_choice`
    picks it (with the candidates alike to it, for the band), and the choice. Where step
    costs are kept, the power models that explain the meter nearly as well (:func:`rival`: the
    basic shape, the whole selection where it ran) are returned as the candidates alike: the
    band spans their splits too."""
    cost = fit_step_cost(
        problem, work.features(config.context_cost), _static_source(meter, config), config.context_cost
    )
    # a first look with the power model's basic shape (a tenth of a second), the whole
    # selection (seconds) only where that shape already explains the meter better on the
    # criterion alone (the whole selection may tell the prompt weight the curve could not).
    # Where the shape only comes close it joins the band, without the selection: run there
    # too, the selection took a 1,000-request default run's finalize from 0.7 to 6 s once the
    # shape worked padded rows (and moved 3 of 45 kept draws by -13.1 to +2.1 points, 2 of
    # them for the worse). Where the run replayed padded decode graphs, the shape
    # works their rows: on a simulated padded device (seed 30010) the curve over decoders
    # explained the meter at R² 0.82 and lost to step costs (15.6% at p95), over padded rows
    # at 0.996 (1.2%)
    curve = fit(problem, CURVE | ({"padding"} if problem.has_padding else frozenset()))[0]
    choice = model_choice(cost, curve)
    if choice.get("bic_difference", 0.0) >= -VERY_STRONG_BIC:
        return cost, None, _rivals(choice, cost, [curve]), choice
    model, alike = fit(problem, config.effects)
    choice = model_choice(cost, model)
    if choice["chosen"] == "power model":
        return None, model, alike, choice
    return cost, None, _rivals(choice, cost, [curve, model]), choice


def _rivals(choice: dict[str, Any], cost: StepCost, models: list[PowerModel]) -> list[PowerModel]:
    """Of ``models``, those the band spans beside the step costs kept (:func:`rival`), said in
    the ``choice``."""
    rivals = [m for m in models if rival(cost, m)]
    if rivals:
        choice["band_spans_power_model"] = (
            f"it explains the meter's intervals within {RIVAL_R2:g} of R² of step costs: the band spans its split"
        )
    return rivals


# Where the power model explains the meter's intervals within this share of their variance of
# what step costs explain, the meter cannot say which split is right: both fit the totals, and
# they differ in how a step's energy is shared (a concave curve by work, a per-step cost
# equally). On the real H100 runs the curve explains 0.43-0.78 less of the variance; on four
# simulated devices with a concave curve step costs explained 0.010-0.017 more and split 2 to 51
# points worse at p95 than the power model (benchmarks/attribution_accuracy.py, seeds 11002-11005).
RIVAL_R2 = 0.05


def rival(cost: StepCost, model: PowerModel) -> bool:
    """Whether ``model`` explains the meter about as well as the step costs kept over it."""
    return cost.family_r2 is not None and model.r2 is not None and model.r2 >= cost.family_r2 - RIVAL_R2


def _models(
    problem: Problem, work: Work, meter: Meter, config: AttributionConfig, requests: int
) -> tuple[
    Callable[[_Inputs], Split] | None, StepCost | None, PowerModel | None, list[PowerModel], dict[str, Any]
]:
    """The rule a meter is split by and what it fitted for it: the steps rule's costs (or the
    power model where it explains the meter better, and the rule is then the fitted one); for
    the other rules' band and the fitted rule's split, the device's power model. Each describes
    the accelerator: a host meter, or a run with no request, fits neither."""
    rule = RULES[config.rule]
    if not meter.accelerator or requests == 0 or rule is None:
        return rule, None, None, [], {}
    if rule is _steps:
        cost, model, alike, choice = _step_costs_or_model(problem, work, meter, config)
        return (_fitted if model is not None else rule), cost, model, alike, choice
    model, alike = fit(problem, config.effects)
    return rule, None, model, alike, {}


def attribute_meter(
    telemetry: pl.DataFrame, meter: Meter, requests: pl.DataFrame, config: AttributionConfig, work: Work
) -> MeterResult:
    """Attribute one meter's energy to ``requests`` (a :func:`request_windows` frame, whose
    ``work`` is :meth:`Work.of` it)."""
    n = requests.height
    base_prov = {"counter": "measured", "power": "integrated", "estimate": "estimated"}[meter.kind]
    sent, end = _windows(requests)
    vc = covering(virtual_counter(telemetry, meter, config.gap_factor, config.session_starts_ns), sent, end)
    if vc is None:
        return _missing(meter, n)
    # the extension beyond the telemetry is imputed: it adds to both terms alike
    measured_j = float(vc.e[-1] - vc.e[0] - np.sum(np.diff(vc.e)[vc.imputed]))
    baseline = _baseline_w(vc, meter, config)
    problem = Problem(vc, work.steps, baseline, config.prefill_weight, _temperature(telemetry, meter))
    rule, cost, model, alike, choice = _models(problem, work, meter, config, n)
    inputs = _Inputs(
        requests,
        work,
        equal_segments(sent, end),
        baseline,
        config.prefill_weight,
        model,
        cost,
        problem.design,
        vc.window_ns,
    )
    window = np.interp(end, vc.t, vc.e) - np.interp(sent, vc.t, vc.e)
    vc, inputs, pooling = _kept_over_stretches(meter, vc, inputs, rule)
    if rule is None:
        estimate = _window_estimate(vc, inputs, window)
    elif cost is not None:
        estimate = _cost_estimate(vc, inputs, rule, cost, alike)
    else:
        estimate = _model_estimate(vc, inputs, rule, model, alike)
    timeline, energy, imputed_part, idle, pooled_idle, low, high = estimate
    provenance = [base_prov if base_prov == "estimated" or imp <= 0 else "imputed" for imp in imputed_part]
    total = timeline.total
    attributed = float(energy.sum())
    fitted = _described(cost if cost is not None else model, work.steps, choice, pooling)
    return MeterResult(
        meter=meter.channel,
        kind=meter.kind,
        energy_j=energy,
        window_j=window,
        provenance=provenance,
        mean_power_w=safe_div(energy, (end - sent) / NS),
        low_j=low,
        high_j=high,
        totals={
            "kind": meter.kind,
            "provenance": base_prov,
            "total_j": total,
            "measured_j": measured_j,
            "imputed_j": total - measured_j,
            "attributed_j": attributed,
            "idle_j": idle,
            # of the energy while no request was in flight, what went to the work in its reading
            "idle_to_work_j": pooled_idle,
            "conservation_error": (attributed + idle - total) / total if total else None,
            "window_sum_j": float(window.sum()),
            "window_overcount": float(window.sum()) / (total - idle) if total - idle > 0 else None,
            "baseline_w": baseline,
            **({"power_model": fitted} if fitted else {}),
            **_how_read(meter, vc),
        },
    )


def _how_read(meter: Meter, vc: VirtualCounter) -> dict[str, Any]:
    """The summary's account of how the meter was read: its span, its counter's timing, why it
    was distrusted and the window its power was averaged over (each step's energy placed that
    much later, as the meter saw it)."""
    return {
        "span_s": float((vc.t[-1] - vc.t[0]) / NS),
        **counter_timing(meter),
        **_distrusted(meter),
        **({"power_averaged_over_s": vc.window_ns / NS} if vc.window_ns else {}),
    }


def _kept_over_stretches(
    meter: Meter, vc: VirtualCounter, inputs: _Inputs, rule: Callable[[_Inputs], Split] | None
) -> tuple[VirtualCounter, _Inputs, Pooling | None]:
    """An instant power meter's counter pooled over the stretches its energy is best kept over
    (:mod:`.pooling`) by the model that splits it (step costs, or a power model), and the
    inputs whose design reads the stretches; as they were for any other meter or rule, or
    where the run is too short to tell. A power the device averaged integrates itself."""
    if meter.kind != "power" or vc.window_ns or rule not in (_steps, _fitted):
        return vc, inputs, None
    if inputs.step_cost is None and inputs.model is None:
        return vc, inputs, None
    split = rule(inputs)
    if split.shares is None:
        return vc, inputs, None
    modelled = np.asarray(split.shares.seen.sum(axis=1)).ravel()
    dt = np.diff(vc.t) / NS
    static = split.static((vc.t[:-1] + vc.t[1:]) / 2.0) if callable(split.static) else split.static
    pooling = choose_pooling(vc, modelled, np.zeros_like(dt) if static is None else np.asarray(static) * dt)
    if pooling is None:
        return vc, inputs, None
    stretches = pooled(vc, pooling.length_s)
    designs: dict[float, sparse.csr_matrix] = {}

    def design_at(lag_ms: float) -> sparse.csr_matrix:
        if lag_ms not in designs:
            designs[lag_ms] = design(stretches.t, inputs.work.steps, lag_ms, stretches.window_ns)
        return designs[lag_ms]

    return stretches, replace(inputs, designs=design_at), pooling


def _described(
    described: StepCost | PowerModel | None, steps: Steps, choice: dict[str, Any], pooling: Pooling | None
) -> dict[str, Any]:
    """The summary's ``power_model``: the model that split, the steps it split, why it was
    chosen and the stretches of an instant power field it split."""
    if described is None:
        return {}
    return (
        described.as_dict()
        | {
            "step_time": steps.duration_fit,
            "prefill_placement": steps.placement,
            "decode_graph": steps.graph,
            "steps": steps.count,
        }
        | ({"chosen_by": choice} if choice else {})
        | ({"conserved_over": pooling.as_dict()} if pooling is not None else {})
    )


_Estimate = tuple[Timeline, np.ndarray, np.ndarray, float, float, np.ndarray, np.ndarray]


def _window_estimate(vc: VirtualCounter, inputs: _Inputs, window: np.ndarray) -> _Estimate:
    """Each request's whole-window energy; idle as the split by activity says."""
    n = inputs.requests.height
    timeline = Timeline(vc, inputs.active, [], n)
    _, imputed_part, idle, pooled_idle = timeline.split(inputs.active, inputs.baseline, pooled=True)
    nan = np.full(n, np.nan)  # the window rule counts overlaps again: no band to give
    return timeline, window, imputed_part, idle, pooled_idle, nan, nan


def _cost_estimate(
    vc: VirtualCounter,
    inputs: _Inputs,
    rule: Callable[[_Inputs], Split],
    cost: StepCost,
    alike: list[PowerModel],
) -> _Estimate:
    """The step costs' split, with the band of the costs chosen and refitted over resampled
    intervals and their near ties, the other reading of the context (neither the meter nor
    step times tell them apart), a rival power model's split and the splits by token work over
    the same static power, a prompt token worth the least it does on the servers we know, the
    run's prefill weight and the most: the form of the costs is itself a model, and token work
    is the split convention v2 gives a step with no fixed cost. The band spans what each could
    move. (Token work at the run's weight alone left it holding the reference for 83% of a
    real H100 Poisson run's requests, which the prompt-token cost the run fitted undercharges
    at 2,047 tokens; a request's split is not monotonic in the weight, so the run's stays.)"""
    timeline = Timeline(vc, inputs.active, [inputs.placed], inputs.requests.height)
    energy, imputed_part, idle, pooled_idle = _apply(timeline, rule(inputs))
    seen = inputs.designs(cost.lag_ms)
    others = [_energy(timeline, step_cost_split(c, inputs.work, seen)) for c in cost.alternatives()]
    others += [_energy(timeline, inputs.model_split(m)) for m in alike]
    placed = inputs.placed
    weights = (BAND_PREFILL_WEIGHTS[0], inputs.prefill_weight, BAND_PREFILL_WEIGHTS[1])
    others += [_energy(timeline, Split(placed.weighted(w), cost.static_w, True)) for w in weights]
    low, high = cost_band(timeline, [energy, *others], cost.window_error)
    return timeline, energy, imputed_part, idle, pooled_idle, low, high


def _model_estimate(
    vc: VirtualCounter,
    inputs: _Inputs,
    rule: Callable[[_Inputs], Split],
    model: PowerModel | None,
    alike: list[PowerModel],
) -> _Estimate:
    """A rule's split with the band of the fitted model where the rule is not it, the
    candidates the data cannot tell from it, and its weights moved by their standard errors."""
    chosen = rule(inputs)
    models = [] if model is None else [*([model] if rule is not _fitted else []), *alike, *perturbed(model)]
    splits = [inputs.model_split(m) for m in models]
    # one cut of the meter for every split: sorting the edges is most of the work at scale
    cuts = [s.segments for s in (chosen, *splits) if s.segments is not None]
    timeline = Timeline(vc, inputs.active, [*cuts, inputs.last_step, inputs.placed], inputs.requests.height)
    energy, imputed_part, idle, pooled_idle = _apply(timeline, chosen)
    others = [_energy(timeline, split) for split in splits]
    # no power model, no model error; one not held out widens the band by what it did measure
    error = 0.0 if model is None else interval_error(model.held_out_error, model.in_sample_error)
    low, high = band(
        timeline, [inputs.last_step, inputs.placed], [energy, *others], inputs.baseline, chosen.pooled, error
    )
    return timeline, energy, imputed_part, idle, pooled_idle, low, high


def attribute(
    telemetry: pl.DataFrame, meters: list[Meter], records: pl.DataFrame, config: AttributionConfig
) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Energy columns for ``records`` (joined on request_id) and the energy section of a summary.

    Per meter ``<meter>.energy_j``, ``.provenance``, ``.power_w`` and ``.window_j``; and the
    headline ``energy_j``/``energy_provenance``/``power_w``: the sum over accelerator meters
    (or over CPU meters when there are none).
    """
    requests = request_windows(records)
    columns: dict[str, Any] = {"request_id": requests.get_column("request_id")}
    section: dict[str, Any] = {
        "rule": config.rule,
        "prefill_weight": config.prefill_weight,
        "power_model": config.power_model,
        "context_cost": config.context_cost,
        "capture_sizes": config.capture_sizes,
        "meters": {},
    }
    work = Work.of(requests, config.capture)  # inferred once: every meter's split uses the same steps
    if estimated := estimated_prompts(requests):
        section["prompt_tokens_estimated"] = {
            "requests": estimated,
            "why": f"the server reported no prompt token count: a token per {CHARS_PER_TOKEN} characters of the prompt",
        }
    results = [attribute_meter(telemetry, m, requests, config, work) for m in meters]
    for r in results:
        columns[f"{r.meter}.energy_j"] = _nullable(r.energy_j)
        columns[f"{r.meter}.provenance"] = r.provenance
        columns[f"{r.meter}.power_w"] = _nullable(r.mean_power_w)
        columns[f"{r.meter}.window_j"] = _nullable(r.window_j)
        columns[f"{r.meter}.energy_low_j"] = _nullable(r.low_j)
        columns[f"{r.meter}.energy_high_j"] = _nullable(r.high_j)
        section["meters"][r.meter] = r.totals
    headline = (
        [r for r, m in zip(results, meters, strict=True) if m.accelerator]
        or [r for r in results if r.kind != "estimate"]
        or results
    )
    if headline:
        energy = np.sum([r.energy_j for r in headline], axis=0)
        power = np.sum([r.mean_power_w for r in headline], axis=0)
        prov = [_combine([r.provenance[i] for r in headline]) for i in range(requests.height)]
        columns["energy_j"] = _nullable(energy)
        # a sum of bands: each meter's extremes together (the widest the headline can be)
        columns["energy_low_j"] = _nullable(np.sum([r.low_j for r in headline], axis=0))
        columns["energy_high_j"] = _nullable(np.sum([r.high_j for r in headline], axis=0))
        columns["power_w"] = _nullable(power)
        columns["energy_provenance"] = prov
        section["headline_meters"] = [r.meter for r in headline]
        section["total_j"] = (
            sum(r.totals.get("total_j", 0.0) for r in headline) if _complete(headline) else None
        )
        section["attributed_j"] = (
            sum(r.totals.get("attributed_j", 0.0) for r in headline) if _complete(headline) else None
        )
        section["idle_j"] = (
            sum(r.totals.get("idle_j", 0.0) for r in headline) if _complete(headline) else None
        )
    frame = pl.DataFrame(columns)
    return records.join(frame, on="request_id", how="left"), section


def _complete(results: list[MeterResult]) -> bool:
    return all("total_j" in r.totals for r in results)


def _combine(provenances: list[str]) -> str:
    for worst in ("missing", "imputed", "estimated", "integrated"):
        if worst in provenances:
            return worst
    return "measured"


def _nullable(values: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else float(v) for v in values]
