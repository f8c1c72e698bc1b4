"""Each engine step's energy as costs the client can see, shared by accounting convention v2.

A step's dynamic energy (above static power) is a sum of costs, each a non-negative joule
figure per unit, fitted to the meter's intervals (a row each of :data:`COSTS`, with its units):

- a decode step's own cost, once per step with any decoder, whatever its batch (on a real GPU
  most of a decode step's energy: the weights streamed from memory, the launches, rows padded
  to a captured batch size; 2.2 J a step against 0.013 J a row on an H100);
- per second of decoding (W): a CUDA graph over the batch padded to the highest busy slot
  costs what its time shows, not what its decoders would (on the real H100 runs, one decoder
  in a high slot ran 22 ms, 11 J steps);
- per decoded token, and per thousand tokens of context it read (attention over its KV cache);
- a prefill forward's own cost, once per request prefilled in the step;
- per prompt token computed, and per thousand positions before those tokens.

Convention v2 shares them as their causes do: the per-step and per-second costs equally among
the requests that decoded in the step (the Shapley value of a fixed cost), and the context read too where
attention is padded to the batch's longest context (:data:`CONTEXT_COSTS`); every other cost to
the request that incurred it. A fit finds the costs by non-negative least squares of every usable meter
interval's energy less static power × its time, against the steps' modelled energy spread
evenly over each step's time. Static power is the run's measured idle baseline where it has
one (the device with its clocks up and nothing computed, as it draws between steps), and
fitted beside the costs only where none was measured: over a run's intervals a free static
power trades off against the costs (on a real H100 run it took 400 W of a 473 W mean).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy import sparse
from scipy.optimize import nnls

from .band import interval_error
from .fit import SELECTION_INTERVALS, mean_absolute, predicts_better
from .problem import LAGS_MS, Problem
from .settings import CONTEXT_COSTS, DEFAULT_CONTEXT_COST
from .split import StepShares, safe_div
from .steps import Steps

# How a decode step's context reads are shared: each request's own where it reads only its own
# KV cache (paged attention, as vLLM runs it: the default), or equally by its decoders. The
# meter cannot tell them apart (the step's total is the same). Attention padded to the batch's
# longest context (CUDA graphs over attention-length buckets, as the H100 server of the real
# traces runs it) is priced apart, per padded row × thousand positions, and shared under both:
# its cost is the step's whatever each request reads. Shared, the context read stood in for a
# curve's by-work context part too (simulated draws 21006, 21011, 22000: 15.7 / 12.9 / 15.4%
# at p95, own 9.9 / 8.0 / 12.3%, the real traces alike within 0.01 points).
FOLDS = 4
REPLICATES = 20  # the band's bootstrap refits of the costs
# A fit without one of the costs joins the band unless the whole fit explains the meter's
# intervals better by this much of the Bayesian information criterion (very strong evidence
# on Kass and Raftery's scale, as the choice between step costs and a power model asks)
NEAR_TIE_BIC = 10.0
STRETCH = 10  # meter intervals resampled together: a second at NVML's 100 ms
# Fewer stretches than this and a resampling can miss a whole regime of the run (its prompts,
# its drain): of 20 resamplings of a 49-interval simulated run, 8 priced a prompt token at a
# fifth of the others, and their mean with them. The costs charged are then the chosen set's.
BAGGED_STRETCHES = 20
MIN_FOLD_INTERVALS = 6
MIN_INTERVALS = 8  # fewer usable intervals than this fit nothing: costs by token work alone


def _no_tokens(_prefill_weight: float) -> float:
    return 0.0


@dataclass(frozen=True)
class Cost:
    """One step cost, a row of :data:`COSTS`: a non-negative figure per unit of its term."""

    name: str  # its key in the summary's costs and errors; its last word is its unit (J or W)
    units: Callable[[Steps], np.ndarray]  # its term: each (request, step) entry's own units of it
    # the readings of the context (CONTEXT_COSTS) under which a step's units of it go to its
    # decoders in equal parts (the Shapley value of a cost the step pays whatever its batch)
    shared: tuple[str, ...] = ()
    # its figure where the run is too short to fit any, a prompt token weighing the given
    # prefill weight: energy is then shared by token work
    fallback: Callable[[float], float] = _no_tokens
    # the cost whose units this one's refine by a length (a prompt token's by its position):
    # the selection keeps it only with that one. Not a padded row's by its attention length:
    # where batches pad alike, a padded row's cost is the step's own, and the length is what
    # varies (a simulated H100 at c=16 and a 500 ms counter: 2.0% at p95, 5.1% with the rule)
    refines: str | None = None


def _recorded(entries: np.ndarray, steps: Steps) -> np.ndarray:
    """An entry column the run may not have (no context or positions recorded): none then."""
    return entries if entries.size else np.zeros(steps.req.size)


def _recorded_steps(per_step: np.ndarray, steps: Steps) -> np.ndarray:
    """A step column the steps may not have (logged steps carry no padded buckets): none then."""
    return per_step if per_step.size else np.zeros(steps.count)


def _on_first_decoder(steps: Steps, per_step: np.ndarray) -> np.ndarray:
    """Each step's units on its first decoding entry: a cost every reading shares among the
    step's decoders is the step's, and sharing spreads it from there."""
    head = steps.first_decoders()
    units = np.zeros(steps.req.size)
    units[head] = per_step[steps.step[head]]
    return units


# the fitted costs, in the order of their columns and of the summary
COSTS = (
    Cost("per_decode_step_j", lambda s: _on_first_decoder(s, np.ones(s.count)), CONTEXT_COSTS),
    Cost("per_decode_second_w", lambda s: _on_first_decoder(s, decode_seconds(s)), CONTEXT_COSTS),
    Cost(
        "per_padded_row_j", lambda s: _on_first_decoder(s, _recorded_steps(s.padded_rows, s)), CONTEXT_COSTS
    ),
    Cost(
        "per_padded_row_ktoken_j",
        lambda s: _on_first_decoder(s, _recorded_steps(s.padded_rows * s.padded_length / 1000, s)),
        CONTEXT_COSTS,
    ),
    Cost("per_decode_token_j", lambda s: s.entry_decode, fallback=lambda _: 1.0),
    Cost("per_context_ktoken_j", lambda s: _recorded(s.entry_context, s), ("shared",)),
    Cost("per_prefill_forward_j", lambda s: (s.entry_prefill > 0).astype(float)),
    Cost("per_prompt_token_j", lambda s: s.entry_prefill, fallback=lambda weight: weight),
    Cost(
        "per_prompt_position_ktoken_j", lambda s: _recorded(s.entry_position, s), refines="per_prompt_token_j"
    ),
)
TERMS = tuple(cost.name for cost in COSTS)
# each refining cost's column → the column of the cost it refines
REFINED = {TERMS.index(cost.name): TERMS.index(cost.refines) for cost in COSTS if cost.refines}


def entry_features(steps: Steps, context_cost: str = DEFAULT_CONTEXT_COST) -> np.ndarray:
    """Per (request, step) entry, its units of every cost (an entry × cost matrix). A cost
    shared under ``context_cost`` gives the step's units in equal parts to its decoding
    entries: a column's sum over a step is the step's units either way."""
    # by columns: each is filled, shared and summed alone (row by row, 9 columns of 6.7 million
    # entries at 100,000 requests took 1.2 s to stack)
    own = np.empty((steps.req.size, len(COSTS)), order="F")
    for j, cost in enumerate(COSTS):
        own[:, j] = cost.units(steps)
    decoding = steps.entry_decode > 0
    decoders = np.bincount(steps.step[decoding], minlength=steps.count).astype(float)
    per_decoder = np.where(decoding, safe_div(np.ones(steps.req.size), decoders[steps.step]), 0.0)
    for j, cost in enumerate(COSTS):
        if context_cost in cost.shared:
            step_units = np.bincount(steps.step, weights=own[:, j], minlength=steps.count)
            own[:, j] = step_units[steps.step] * per_decoder
    return own


def decode_seconds(steps: Steps) -> np.ndarray:
    """Each step's time spent decoding (s): a decode step's whole time; a step that also ran
    prompt tokens, what its decoding alone takes by the step-time fit, at most its time. A
    decode step's energy follows its time where the engine pads the batch (a CUDA graph over
    slots up to the highest one decoding costs what 128 rows do while one decodes)."""
    duration = np.maximum(steps.end - steps.start, 0.0) / 1e9
    fit = steps.duration_fit
    alone = (
        fit.get("base_ms", 0.0)
        + fit.get("per_decode_ms", 0.0) * steps.decode
        + fit.get("per_context_ktoken_ms", 0.0) * steps.context
    ) / 1e3
    mixed = steps.prefill > 0
    seconds = np.where(mixed, np.minimum(duration, alone), duration)
    return np.where(steps.decode > 0, seconds, 0.0)


@dataclass
class StepCost:
    """The fitted costs (J per unit, in :data:`COSTS` order) and static power (W)."""

    static_w: float
    costs: np.ndarray
    static_source: str  # "measured" (the baseline window), "given" or "fitted"
    errors: np.ndarray = field(default_factory=lambda: np.zeros(0))  # standard errors (inf: unidentified)
    r2: float | None = None
    held_out_error: float | None = None  # interval RMS error out of sample, relative to a typical interval
    in_sample_error: float | None = None  # the same, in sample
    intervals: int = 0
    notes: list[str] = field(default_factory=list)
    lag_ms: float = 0.0  # the meter's lag behind the device the fit chose
    context_cost: str = DEFAULT_CONTEXT_COST  # how a step's context reads are shared (CONTEXT_COSTS)
    replicates: list[tuple[float, np.ndarray]] = field(default_factory=list)  # (static, costs) bootstrapped
    # how the fit's error falls over windows of meter intervals (:func:`_decay`): lengths, factors
    decay: tuple[np.ndarray, np.ndarray] | None = None
    # how many meter intervals one reading averages over (an averaged power's window; 1 for a
    # counter): readings closer than that share their errors
    window_intervals: float = 1.0
    # costs the whole fit found that no resampling's choice kept (:func:`_bag`)
    unsupported: tuple[str, ...] = ()
    parameters: int = 0  # costs in the chosen set (:func:`_selected`): the model's size
    # the chosen set's own R² (the bagged costs' is lower, as any mean of fits): how well step
    # costs can explain the meter, for the choice between them and a power model
    chosen_r2: float | None = None
    # per cost, the share of the resamplings whose choice kept it
    chosen_in: np.ndarray = field(default_factory=lambda: np.zeros(0))
    every_cost: tuple[float, np.ndarray] | None = None  # that whole fit's (static, costs), for the band
    # each usable interval's error when its stretch was held out, relative to a typical
    # interval (None: too few to hold any out): what a lag must predict better
    held_out_residuals: np.ndarray | None = None

    def entry_energy(self, features: np.ndarray) -> np.ndarray:
        """Each entry's modelled energy (J): its own costs and its equal share of the step's."""
        return features @ self.costs

    def shares(self, steps: Steps, features: np.ndarray, seconds_seen: sparse.csr_matrix) -> StepShares:
        """The split for :meth:`Timeline.split_by_steps`: each step's modelled energy spread
        evenly over its time as the meter saw it, and each entry's part of its step's energy."""
        entry = self.entry_energy(features)
        step = np.bincount(steps.step, weights=entry, minlength=steps.count)
        duration = np.maximum(steps.end - steps.start, 1.0) / 1e9
        seen = (seconds_seen @ sparse.diags(step / duration)).tocsr()
        return StepShares(seen, steps.req, steps.step, safe_div(entry, step[steps.step]))

    @property
    def family_r2(self) -> float | None:
        """How well step costs explain the meter's intervals: the chosen set's fit."""
        return self.chosen_r2 if self.chosen_r2 is not None else self.r2

    @property
    def band_error(self) -> float:
        """The interval error the band widens by (:func:`.band.interval_error`)."""
        return interval_error(self.held_out_error, self.in_sample_error)

    def window_error(self, spanned: np.ndarray) -> np.ndarray:
        """The band's relative error for requests spanning ``spanned`` meter intervals: the
        interval error (:attr:`band_error`) falling over that many intervals as the fit's
        residuals fall when summed over windows that long, and never faster than independent
        errors do (1/√k). A cost form that misjudges one kind of step errs alike wherever that
        step recurs, and over a long request its error falls far less than 1/√k. Readings of a
        power averaged over m intervals are independent only m apart (1/√(k/m)): the fit's
        residuals on the real H200 c8 run's 1 s average fell to 0.27 over 59 intervals, and
        the band so drawn held 74% of the references."""
        k = np.maximum(spanned, 1.0)
        independent = 1.0 / np.sqrt(np.maximum(k / self.window_intervals, 1.0))
        if self.decay is None:
            return self.band_error * independent
        lengths, factors = self.decay
        longest = lengths[-1]
        # beyond the longest window measured, errors are taken as independent from there on
        within = np.exp(np.interp(np.log(np.minimum(k, longest)), np.log(lengths), np.log(factors)))
        return self.band_error * np.maximum(within * np.sqrt(np.minimum(k, longest) / k), independent)

    def alternatives(self) -> list[StepCost]:
        """The band's other fits: the costs chosen and refitted over resamplings of the meter's
        intervals (:func:`_bootstrap`) and their near ties; these costs under the other reading
        of the context; and where the BIC left costs out, the fit with every cost under both
        readings (a context cost left out changes nothing between them). Costs the meter tells
        apart only together (a step's time and its padded rows, a prompt's forward and its
        tokens) move together in a refit, each still a fit; each cost moved alone by its
        standard error, the others held, charged 3.6 J a padded row on a real H100 run, and
        clipped at zero its twin, splits that fit no interval."""
        bare = replace(self, replicates=[], every_cost=None, notes=[])
        other = next(c for c in CONTEXT_COSTS if c != self.context_cost)
        fits = [replace(bare, static_w=static, costs=costs) for static, costs in self.replicates]
        fits.append(replace(bare, context_cost=other))
        if self.every_cost is not None:
            whole = replace(bare, static_w=self.every_cost[0], costs=self.every_cost[1])
            fits += [whole, replace(whole, context_cost=other)]
        return fits

    def as_dict(self) -> dict[str, Any]:
        def finite(v: float) -> float | None:
            return float(v) if np.isfinite(v) else None

        return {
            "model": "step costs",
            "convention": "v2",
            "static_w": self.static_w,
            "static_source": self.static_source,
            "costs": {name: float(c) for name, c in zip(TERMS, self.costs, strict=True)},
            "errors": {name: finite(e) for name, e in zip(TERMS, self.errors, strict=False)},
            "shared_equally": [cost.name for cost in COSTS if self.context_cost in cost.shared],
            "unsupported": list(self.unsupported),
            # how often each cost was chosen over the resamplings whose mean the costs are
            "chosen_in": {name: float(v) for name, v in zip(TERMS, self.chosen_in, strict=False) if v > 0},
            "r2": self.r2,
            "held_out_error": self.held_out_error,
            "in_sample_error": self.in_sample_error,
            "lag_ms": self.lag_ms,
            "intervals": self.intervals,
            # meter intervals per averaged reading: the band's errors fall only once a window
            "window_intervals": self.window_intervals,
            "notes": self.notes,
        }


def _per_step(steps: Steps, features: np.ndarray) -> np.ndarray:
    """Each step's units of every term (a step × term matrix)."""
    return np.column_stack(
        [np.bincount(steps.step, weights=features[:, j], minlength=steps.count) for j in range(len(TERMS))]
    )


def _columns(problem: Problem, per_step: np.ndarray, seconds_seen: sparse.csr_matrix) -> np.ndarray:
    """Each interval's units of every term: the steps' units spread evenly over their time."""
    steps = problem.steps
    duration = np.maximum(steps.end - steps.start, 1.0) / 1e9
    return np.asarray(seconds_seen @ (per_step / duration[:, None]))


def _solve(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    scale = np.maximum(np.abs(x).max(axis=0), 1e-12)  # columns of very different units
    coef, _ = nnls(x / scale, y, maxiter=50 * x.shape[1])
    return coef / scale


def _standard_errors(x: np.ndarray, residuals: np.ndarray) -> np.ndarray:
    """Standard errors of the costs (a cost at its bound: the fit's spread around it, from the
    same curvature); inf where the data do not identify one, 0 for a term never used."""
    active = np.flatnonzero(np.abs(x).sum(axis=0) > 0)
    out = np.full(x.shape[1], np.inf)
    dof = max(residuals.size - active.size, 1)
    xa = x[:, active]
    try:
        cov = np.linalg.pinv(xa.T @ xa) * (float(residuals @ residuals) / dof)
    except np.linalg.LinAlgError:
        return out
    out[active] = np.sqrt(np.abs(np.diag(cov)))
    out[np.abs(x).sum(axis=0) == 0] = 0.0  # a term the run never used moves nothing
    return out


def fit_step_cost(
    problem: Problem, features: np.ndarray, static_source: str, context_cost: str = DEFAULT_CONTEXT_COST
) -> StepCost:
    """The costs the meter's intervals support (``problem.static_w``: static power where the run
    measured or was given it; fitted beside the costs where it is None), with the meter's lag
    behind the device where one earns its place (:func:`_lag_earned`); ``features`` are
    :func:`entry_features` with ``context_cost``."""
    usable = problem.usable
    n = int(usable.sum())
    static = problem.static_w
    source = static_source if static is not None else "fitted"
    if n < MIN_INTERVALS or problem.steps.count < MIN_INTERVALS:
        fallback = np.array([cost.fallback(problem.default_prefill_weight) for cost in COSTS])
        if static is None:
            static = float(np.percentile(problem.energy / np.maximum(problem.dt, 1e-9), 5))
        note = (
            f"{n} meter intervals and {problem.steps.count} steps: too few to fit step costs; "
            "energy shared by token work (a prompt token at the prefill weight)"
        )
        unfitted = np.full(len(TERMS), np.inf)
        return StepCost(
            static, fallback, source, unfitted, intervals=n, notes=[note], context_cost=context_cost
        )
    per_step = _per_step(problem.steps, features)
    # a long run's lag is chosen mid-run, over SELECTION_INTERVALS: each lag's design costs what
    # the steps do, and five of them over 100,000 requests took most of finalizing them
    sample = problem.window(SELECTION_INTERVALS)
    units = per_step if sample.inside is None else per_step[sample.inside]
    best = _lag_earned([_fit_at(sample, units, lag) for lag in LAGS_MS])
    whole = best if sample is problem else _fit_at(problem, per_step, best.lag_ms)
    x = _columns(problem, per_step, problem.design(whole.lag_ms))
    every = (whole.static_w, whole.costs.copy())  # kept apart: the chosen fit may be this one, bagged below
    kept = _selected(problem, x, np.flatnonzero(usable))[1] > 0
    # refitted without the costs left out: its own held-out error
    best = whole if not ((whole.costs > 0) & ~kept).any() else _fit_at(problem, per_step * kept, whole.lag_ms)
    best.parameters, best.chosen_r2 = int(np.count_nonzero(best.costs)), best.r2
    if sample is not problem:
        best.notes.append(
            f"meter lag chosen over the {sample.energy.size} meter intervals mid-run, then fitted to all {n}"
        )
    best.static_source, best.context_cost = source, context_cost
    # the band: the costs chosen and fitted again over resampled intervals (the choice is as
    # uncertain as the fit), their near ties, and the fit with every cost (the splits the
    # meter could not tell from the one chosen)
    resampled = _bootstrap(problem, x)
    best.replicates = resampled + _near_ties(problem, x, kept)
    if resampled and int(usable.sum()) >= BAGGED_STRETCHES * STRETCH:
        _bag(best, problem, x, resampled)
    if (unsupported := (every[1] > 0) & (best.costs == 0)).any():
        best.unsupported = tuple(TERMS[j] for j in np.flatnonzero(unsupported))
        best.notes.append(
            f"{', '.join(best.unsupported)}: not called for by the meter's intervals (BIC) in any "
            "resampling, so not charged; the band spans the fit with them"
        )
    if best is not whole or resampled:
        best.every_cost = every
    if best.held_out_error is None:
        best.notes.append(
            f"{n} meter intervals: too few to hold any out; the band takes twice the in-sample error"
        )
    return best


# A lag is one number the meter's timing sets, not an effect of the device: it is taken where
# it predicts held-out intervals better by the power model's margin and on more of them than
# it predicts worse (a one-sided signed-rank p below this), not only where that is significant
LAG_SIGNIFICANCE = 0.5


def _lag_earned(fits: list[StepCost]) -> StepCost:
    """The fit at no lag (the first of ``fits``, one per lag of :data:`LAGS_MS`), unless a lag's
    fit predicts held-out intervals better (:func:`.fit.predicts_better` at
    :data:`LAG_SIGNIFICANCE`, by their mean absolute error); of those that do, the one that
    predicts best. Chosen by the lowest held-out error alone, the real H100 Poisson run's first
    11 s took 110 ms (an energy counter that trails nothing), better on the few intervals of its
    prompt bursts and worse on most (p = 0.88), and its requests erred 14.4% at p95; at no lag,
    3.7%. The simulator's 40 ms meter lag passes (c=1 at a 10 ms counter: p = 0.04, 0.4% at p95
    where no lag gives 1.6%). The error is the mean absolute, not the mean square: a lag moves
    the bulk of the intervals, and a counter whose reads jitter puts a few far off whatever the
    lag. By the mean square, two simulated devices with 1.9 and 2.4 ms of jitter on 15 and
    21 ms intervals (seeds 30011, 31004) kept no lag where 40 and 20 ms (the meters': 57 and
    30 ms) predicted most intervals better (p < 0.001) and 4.7% and 15% better in absolute error;
    their requests erred 20.4% and 9.4% at p95, and 11.6% and 4.6% with the lag."""
    none, *lagged = fits
    if (unlagged := none.held_out_residuals) is None:
        return none  # too few intervals to say the meter lags
    earned = [
        (mean_absolute(held), f)
        for f in lagged
        if (held := f.held_out_residuals) is not None
        and predicts_better(held, unlagged, significance=LAG_SIGNIFICANCE, error=mean_absolute)
    ]
    return min(earned, key=lambda e: e[0], default=(0.0, none))[1]


def _bag(cost: StepCost, problem: Problem, x: np.ndarray, resampled: list[tuple[float, np.ndarray]]) -> None:
    """The static power and costs charged: the mean of those chosen over the resamplings
    (bootstrap aggregation). Costs that stand in for each other fit the meter's intervals
    alike, and the choice between them can rest on a single step: on the real H100 Poisson
    run, one step of 2,483 read as after idle or not put a prompt's forward in or out of the
    chosen costs and moved the p95 error by 1.6 points. Each resampling chooses for itself, and
    their mean charges a cost in the measure the meter calls for it. Its fit to the meter
    (R², in-sample error, residual decay) is the mean's own; its standard errors are the
    resamplings' spread; its held-out error stays the chosen set's."""
    statics = np.array([static for static, _ in resampled])
    costs = np.array([c for _, c in resampled])
    cost.static_w, cost.costs = float(statics.mean()), costs.mean(axis=0)
    cost.errors = costs.std(axis=0, ddof=1)
    cost.chosen_in = (costs > 0).mean(axis=0)
    usable = problem.usable
    y = problem.energy
    residual = (y - cost.static_w * problem.dt - x @ cost.costs)[usable]
    centred = y[usable] - y[usable].mean()
    cost.r2 = 1.0 - float(residual @ residual) / float(centred @ centred) if centred.any() else None
    cost.in_sample_error = float(np.sqrt(np.mean(residual**2))) / problem.scale
    cost.decay = _decay(residual)
    cost.notes.append(
        f"costs: the mean of those chosen over {len(resampled)} resamplings of the meter's intervals"
    )


def _bootstrap(problem: Problem, x: np.ndarray) -> list[tuple[float, np.ndarray]]:
    """The static power and costs chosen and fitted (:func:`_selected`) again over
    :data:`REPLICATES` resamplings of the meter's intervals (the design ``x``) in stretches of
    :data:`STRETCH` (a moving-block bootstrap: neighbouring intervals share steps and errors),
    seeded so a run's band is reproducible."""
    usable = np.flatnonzero(problem.usable)
    if usable.size < FOLDS * MIN_FOLD_INTERVALS:
        return []
    starts = np.arange(max(usable.size - STRETCH + 1, 1))
    blocks = -(-usable.size // STRETCH)
    rng = np.random.default_rng(0)
    stretch = np.arange(min(STRETCH, usable.size))
    return [
        _selected(problem, x, usable[(rng.choice(starts, blocks)[:, None] + stretch).ravel()])
        for _ in range(REPLICATES)
    ]


class _Subsets:
    """Least squares of the design ``x`` over the meter intervals ``rows`` (indices, which may
    repeat), reduced once to its triangular factor: a fit of any subset of the costs is then
    solved over a few rows, not over every interval again (a run of 100,000 requests has
    35,000 intervals, and choosing costs over 20 resamplings fits hundreds of subsets)."""

    def __init__(self, problem: Problem, x: np.ndarray, rows: np.ndarray) -> None:
        y, dt = problem.energy[rows], problem.dt[rows]
        self.static = problem.static_w
        a = x[rows] if self.static is not None else np.column_stack((dt, x[rows]))
        b = y - self.static * dt if self.static is not None else y
        self.scale = np.maximum(np.abs(a).max(axis=0), 1e-12)  # columns of very different units
        q, self.r = np.linalg.qr(a / self.scale)
        self.z = q.T @ b
        outside = b - q @ self.z  # what no cost can explain (b·b − z·z would cancel on a close fit)
        self.rest = float(outside @ outside)
        self.n = rows.size

    def fit(self, mask: np.ndarray) -> tuple[float, np.ndarray, float]:
        """Static power, the costs in ``mask`` (a mask over :data:`TERMS`; the others 0) and the
        fit's BIC, up to a constant: n ln RSS + k ln n, k its non-zero costs and its static
        power where fitted."""
        m = mask if self.static is not None else np.concatenate(([True], mask))
        coef, norm = nnls(self.r * m, self.z, maxiter=50 * m.size)
        coef = coef * m / self.scale
        static, costs = (self.static, coef) if self.static is not None else (float(coef[0]), coef[1:])
        rss = max(norm * norm + self.rest, 1e-12)
        k = int(np.count_nonzero(costs)) + (self.static is None)
        return static, costs, self.n * float(np.log(rss)) + k * float(np.log(self.n))


def _selected(problem: Problem, x: np.ndarray, rows: np.ndarray) -> tuple[float, np.ndarray]:
    """Static power and the costs the meter intervals ``rows`` call for (those left out at 0):
    all fitted, then the one whose leaving out lowers the BIC most left out and the rest
    refitted, until leaving out any other would raise it. Costs that stand in for each other (a
    prompt's forward and its tokens, a step's time and its padded rows) fit the intervals
    alike while splitting a step differently, and a fit of all of them takes its split from
    the meter's noise: on a real H100 Poisson run it charged 2.7 J a prompt's forward and
    0.013 J a token where the GPU spends 1.1 J and 0.019 J, a forward the BIC leaves out. A cost
    that another refines (:attr:`Cost.refines`) is left out only after it (the marginality of
    linear models): over the first half of the real c128 run, resamplings that kept a prompt
    token's cost by its position and left its plain cost out made the mean charge 3.1 J a
    forward and 0.009 J a token (the GPU: 1.1 J and 0.019 J; p95 4.4%); kept together, 0.65 J and
    0.018 J (1.4%)."""
    subsets = _Subsets(problem, x, rows)
    static, costs, current = _marginal_fit(subsets, np.ones(x.shape[1], dtype=bool))
    while (kept := costs > 0).any():
        trials = []
        for j in np.flatnonzero(kept):
            if any(kept[refining] for refining, refined in REFINED.items() if refined == j):
                continue
            mask = kept.copy()
            mask[j] = False
            trials.append(_marginal_fit(subsets, mask))
        s, c, bic = min(trials, key=lambda t: t[2])
        if bic >= current:
            break
        static, costs, current = s, c, bic
    return static, costs


def _marginal_fit(subsets: _Subsets, mask: np.ndarray) -> tuple[float, np.ndarray, float]:
    """The fit of the costs in ``mask`` (:meth:`_Subsets.fit`), each cost that refines one the
    fit left at 0 left out too and the rest refitted: non-negative least squares may keep a
    refinement in place of what it refines, where the two are nearly collinear."""
    static, costs, bic = subsets.fit(mask)
    while orphans := [
        refining for refining, refined in REFINED.items() if costs[refining] > 0 and costs[refined] == 0
    ]:
        mask = mask.copy()
        mask[orphans] = False
        static, costs, bic = subsets.fit(mask)
    return static, costs, bic


def _near_ties(problem: Problem, x: np.ndarray, chosen: np.ndarray) -> list[tuple[float, np.ndarray]]:
    """The costs refitted with each one the run used left out of the ``chosen`` ones (a mask
    over :data:`TERMS`) or added to them, where the meter's intervals cannot tell that fit from
    the chosen one (:data:`NEAR_TIE_BIC`): costs that stand in for each other (a prompt's
    forward and its tokens, a step's time and its padded rows) split a step differently while
    fitting the totals alike, and resampling the intervals moves neither."""
    rows = np.flatnonzero(problem.usable)
    if rows.size < MIN_INTERVALS:
        return []
    subsets = _Subsets(problem, x, rows)
    bic = subsets.fit(chosen)[2]
    out = []
    for j in np.flatnonzero(np.abs(x).sum(axis=0) > 0):
        mask = chosen.copy()
        mask[j] = not mask[j]
        static, costs, other = subsets.fit(mask)
        if other - bic < NEAR_TIE_BIC:
            out.append((static, costs))
    return out


def _decay(residual: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """How ``residual`` (an interval's, in time order) falls when summed over windows of w
    intervals: the windows' RMS over w times the intervals' (1/√w where they are independent),
    for w on a log grid up to a quarter of the run (longer ones have too few windows to say);
    None with too few intervals to tell."""
    if residual.size < FOLDS * MIN_FOLD_INTERVALS:
        return None
    rms = float(np.sqrt(np.mean(residual**2)))
    if rms <= 0:
        return None
    summed = np.concatenate(([0.0], np.cumsum(residual)))
    lengths = np.unique(np.geomspace(1, residual.size // 4, 24).astype(int))
    factors = np.array([np.sqrt(np.mean((summed[w:] - summed[:-w]) ** 2)) / (w * rms) for w in lengths])
    return lengths.astype(float), np.maximum(factors, 1e-12)


def _fit_rows(problem: Problem, x: np.ndarray, rows: np.ndarray) -> tuple[float, np.ndarray]:
    """Static power (the problem's, or fitted where it has none) and the costs, fitted to the
    meter intervals ``rows`` (a mask, or indices that may repeat) of the design ``x``."""
    y, dt, static = problem.energy, problem.dt, problem.static_w
    if static is not None:
        return static, _solve(x[rows], y[rows] - static * dt[rows])
    coef = _solve(np.column_stack((dt, x))[rows], y[rows])
    return float(coef[0]), coef[1:]


def _folds(problem: Problem) -> list[np.ndarray]:
    """The held-out folds over the problem's usable intervals. Step costs have no term for
    time, so each fold is held out from a fit that saw every part of the run: stretches of
    :data:`STRETCH` intervals (a second of NVML's; neighbours, which share steps, mostly fall
    in one fold) dealt to :data:`FOLDS` folds in turn. Held out as a quarter of the run, the
    real H200 Poisson run's first quarter (its load still rising) was predicted from the
    saturated rest at 1.5 typical intervals of error, against 0.02-0.15 for the other quarters,
    and its requests' bands were ±24% at the median for an extrapolation the whole fit never
    makes (±14% so, holding 99% of the references).

    A power averaged over a window keeps the quarters. Each of its readings holds a window of
    the power before it, so its request errors come mostly from undoing the average, which no
    interval's residual measures: in stretches (of 10 s, ten windows) the real H100 Poisson
    run read from its 1 s average had a band of ±14% holding 87% of the references, its p95
    error 14.9%; in quarters, ±28% holding 100%."""
    usable_at = np.flatnonzero(problem.usable)
    if problem.counter.window_ns > 0:
        return np.array_split(usable_at, FOLDS)
    stretches = np.array_split(usable_at, max(usable_at.size // STRETCH, FOLDS))
    return [np.concatenate(stretches[f::FOLDS]) for f in range(FOLDS)]


def _window_intervals(problem: Problem) -> float:
    """How many of the problem's meter intervals one reading averages over (1 for a counter)."""
    if problem.counter.window_ns <= 0 or not problem.usable.any():
        return 1.0
    return max(problem.counter.window_ns / 1e9 / float(np.median(problem.dt[problem.usable])), 1.0)


def _fit_at(problem: Problem, per_step: np.ndarray, lag_ms: float) -> StepCost:
    usable = problem.usable
    x = _columns(problem, per_step, problem.design(lag_ms))
    y = problem.energy
    static_w, costs = _fit_rows(problem, x, usable)
    residual = (y - static_w * problem.dt - x @ costs)[usable]
    centred = y[usable] - y[usable].mean()
    r2 = 1.0 - float(residual @ residual) / float(centred @ centred) if centred.any() else None
    held_out, held_residuals = None, None
    if int(usable.sum()) >= FOLDS * MIN_FOLD_INTERVALS:
        out = np.zeros(y.size)
        for block in _folds(problem):
            train = usable.copy()
            train[block] = False
            s, c = _fit_rows(problem, x, train)
            out[block] = (y - s * problem.dt - x @ c)[block]
        held_residuals = out[usable] / problem.scale
        held_out = float(np.sqrt(np.mean(held_residuals**2)))
    in_sample = float(np.sqrt(np.mean(residual**2))) / problem.scale
    errors = _standard_errors(x[usable], residual)
    return StepCost(
        static_w,
        costs,
        "",
        errors,
        r2,
        held_out,
        in_sample,
        int(usable.sum()),
        lag_ms=lag_ms,
        decay=_decay(residual),
        window_intervals=_window_intervals(problem),
        held_out_residuals=held_residuals,
    )
