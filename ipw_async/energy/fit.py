"""The power model fitted to a meter's own intervals, as rich as the run's data support.

Each meter interval's energy is modelled as static power × time (+ its drift) plus, over the
inferred steps in it, each step's modelled power × its time there (:mod:`.model`). Candidate
models differ in the effects they have; a richer one is kept only where it predicts meter
intervals it was not fitted to better: blocked cross-validation, contiguous stretches of the
run held out in turn, so that a slow effect cannot be learned from its neighbours. The
selection is greedy: from static + linear work, add the effect that predicts best while it
earns its place (in a short run, where none does alone, the best pair of them). A meter's lag
is fitted over a grid of time constants (each step's energy spills past it as a first-order
response), a drifting static over a covariate's time constants, the rest by bounded least
squares with an analytic Jacobian: the parameters, their bounds and their terms are the table
in :mod:`.parameters`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np
from scipy.optimize import least_squares
from scipy.stats import wilcoxon

from .drift import Drift
from .model import PowerModel
from .parameters import EFFECTS, NAMES, PARAMETERS, Evaluation, applicable_effects, bounds
from .prefill import identified_prefill_weight
from .problem import LAGS_MS, Problem

FOLDS = 4
MIN_FOLD_INTERVALS = 6  # fewer usable intervals a fold than this: no selection, the base model
# A longer run's model is chosen over this many meter intervals mid-run (4 min of a 100 ms
# counter): every candidate fit scales with the steps, and a 100,000-request run took 135 s
SELECTION_INTERVALS = 2400
# A richer model must predict held-out intervals better by this share of the error, and
# significantly, to be kept.
MIN_GAIN = 0.02
# Held-out errors are relative to a typical interval's energy; below this gain a model explains
# only float residue (a counter in mJ resolves 1e-4 of a 10 J interval)
RESOLUTION = 1e-3
SIGNIFICANCE = 0.05
# Below this many intervals, where no single effect earns its place over linear work, pairs
# are tried: a short run's lag and curve can each predict worse alone than neither, and best
# together. A long run has the data to show each one's gain alone, and there the pairs took a
# third of finalizing 10,000 requests. Past the first effect kept, pairs are not tried: there
# they were a third of a 48-request run's finishing (10 pairs of lag's five fits each) and
# changed the result of none of the simulator's 45 kept draws.
PAIRS_BELOW = 600
# What every GPU serving a model does, kept unless it predicts held-out intervals worse: each
# step streams the weights (a cost per step whatever its batch) and each decoder reads its own
# KV cache (work that grows with its context). The meter often cannot show them past MIN_GAIN,
# as they move with the batch and the curve stands in for them, yet a split without them is
# wrong in a known direction: without context every long-context request is charged as a
# short one (on three of the simulator's drawn devices, seeds 23000, 23004 and 23006, per-query
# error fell with prompt length at a correlation of -0.67 to -0.78, a p95 of 11.5-17.6%; with
# the presumption 6.4-10.7%). Fitted, each may still come out near zero where a device lacks
# it: one the fit cannot tell from nothing is not kept.
PRESUMED = ("step", "context")
MIN_R2 = 0.5  # below it, without a selection to say better, work is counted linearly


@dataclass
class Fit:
    """One candidate fitted: its parameters, lag and drift covariate, and its cost."""

    effects: frozenset[str]
    theta: np.ndarray
    lag_ms: float
    drift: Drift | None
    cost: float
    jac: np.ndarray
    residuals: np.ndarray
    free: np.ndarray


def _solve(
    problem: Problem,
    effects: frozenset[str],
    train: np.ndarray,
    lag_ms: float,
    drift: Drift | None,
    starts: Iterable[np.ndarray],
) -> Fit:
    """Bounded least squares of the intervals in ``train``, best of ``starts``."""
    design = problem.design(lag_ms)
    h = drift.integral(problem.counter.t) if drift is not None else np.zeros_like(problem.dt)
    peak = float(np.max(problem.energy[problem.usable] / np.maximum(problem.dt[problem.usable], 1e-9)))
    base, lo, hi = bounds(problem, effects, peak)
    free = lo < hi
    best: Fit | None = None
    for start in starts:
        theta = np.where(free, np.clip(start, lo, np.where(np.isfinite(hi), hi, np.inf)), base)
        theta = np.where(free & ~np.isfinite(theta), base, theta)

        def residuals(x: np.ndarray, theta: np.ndarray = theta) -> np.ndarray:
            full = theta.copy()
            full[free] = x
            return (Evaluation.at(full, problem, design, h).energy - problem.energy)[train] / problem.scale

        def jacobian(x: np.ndarray, theta: np.ndarray = theta) -> np.ndarray:
            full = theta.copy()
            full[free] = x
            return Evaluation.at(full, problem, design, h).jacobian(free)[train] / problem.scale

        x0 = np.clip(theta[free], lo[free], hi[free])
        try:
            result = least_squares(
                residuals, x0, jac=jacobian, bounds=(lo[free], hi[free]), x_scale="jac", max_nfev=200
            )
        except (ValueError, np.linalg.LinAlgError):
            continue
        full = theta.copy()
        full[free] = result.x
        if best is None or result.cost < best.cost:
            best = Fit(effects, full, lag_ms, drift, float(result.cost), result.jac, result.fun, free)
    if best is None:
        raise ValueError("no start converged")
    return best


def _fit(problem: Problem, effects: frozenset[str], train: np.ndarray, starts: list[np.ndarray]) -> Fit:
    """A candidate fitted to ``train``: over the lag grid and drift time constants it has."""
    lags = LAGS_MS if "lag" in effects else (0.0,)
    taus = problem.drift_taus() if "drift" in effects else ()
    fits = []
    for lag in lags:
        drifts = [problem.drift(tau) for tau in taus] or [None]
        fits += [_solve(problem, effects, train, lag, d, starts) for d in drifts]
    return min(fits, key=lambda f: f.cost)


def _held_out(problem: Problem, full: Fit) -> np.ndarray:
    """Each usable interval's error (relative to a typical interval) when its stretch of the run
    was held out. The lag and the drift's time constant stay as the whole run chose them: each
    is one number the run pins well, and trying them per fold costs ten fits a fold."""
    usable = np.flatnonzero(problem.usable)
    out = np.full(problem.energy.size, np.nan)
    h = full.drift.integral(problem.counter.t) if full.drift else np.zeros_like(problem.dt)
    for block in np.array_split(usable, FOLDS):
        train = problem.usable.copy()
        train[block] = False
        fold = _solve(problem, full.effects, train, full.lag_ms, full.drift, [full.theta])
        predicted = Evaluation.at(fold.theta, problem, problem.design(fold.lag_ms), h).energy
        out[block] = (predicted - problem.energy)[block] / problem.scale
    return out[usable]


def _rmse(errors: np.ndarray) -> float:
    return float(np.sqrt(np.mean(errors**2)))


def mean_absolute(errors: np.ndarray) -> float:
    return float(np.mean(np.abs(errors)))


def predicts_better(
    richer: np.ndarray,
    simpler: np.ndarray,
    tried: int = 1,
    significance: float = SIGNIFICANCE,
    error: Callable[[np.ndarray], float] = _rmse,
) -> bool:
    """Whether ``richer`` predicts held-out intervals better: by MIN_GAIN of the ``error`` (the
    root mean square unless said), by more than a meter's own resolution, and interval by
    interval more often than chance would (a one-sided signed-rank test at ``significance``: a
    mean of squares is ruled by the few worst intervals), chance over the ``tried`` candidates
    it was the best of (Bonferroni)."""
    if not (error(richer) < (1 - MIN_GAIN) * error(simpler) and error(simpler) - error(richer) > RESOLUTION):
        return False
    gain = np.abs(simpler) - np.abs(richer)
    if not gain.any():
        return False
    return float(wilcoxon(gain, alternative="greater").pvalue) < significance / tried


def _model(problem: Problem, chosen: Fit, notes: list[str]) -> PowerModel:
    values = dict(zip(NAMES, (float(v) for v in chosen.theta), strict=True))
    resid = chosen.residuals * problem.scale
    target = problem.energy[problem.usable] - problem.energy[problem.usable].mean()
    r2 = 1.0 - float(resid @ resid) / float(target @ target) if target.any() else None
    errors = _standard_errors(chosen.jac, chosen.residuals)
    free_names = [name for name, f in zip(NAMES, chosen.free, strict=True) if f]
    model = PowerModel(
        **{row.attribute: values[row.name] for row in PARAMETERS if row.attribute},
        lag_ms=chosen.lag_ms,
        drift=None if chosen.drift is None else replace(chosen.drift, coef_w=values["drift"]),
        effects=tuple(e for e in EFFECTS if e in chosen.effects),
        r2=r2,
        in_sample_error=_rmse(chosen.residuals),
        intervals=int(problem.usable.sum()),
        notes=notes,
        errors=dict(zip(free_names, (float(e) for e in errors), strict=True)),
    )
    work = np.maximum(model.step_work(problem.steps), 1e-9)
    if np.isfinite(model.cap_w) and model.cap_w > float(
        np.max(model.step_w + model.scale_w * np.power(work, model.exponent))
    ):
        model.cap_w = float("inf")  # no step reached it: the run says nothing of a cap
    if problem.has_prefill:
        error = model.errors.get("prefill", np.inf)
        taken = identified_prefill_weight(model, problem.steps, error, problem.default_prefill_weight)
        if taken.note:
            notes.append(taken.note)
            model.prefill_weight, model.prefill_guessed = taken.weight, taken.guessed
    return model


def _standard_errors(jac: np.ndarray, residuals: np.ndarray) -> np.ndarray:
    """Each parameter's standard error from a least-squares fit (inf where unidentified)."""
    dof = max(residuals.size - jac.shape[1], 1)
    variance = float(residuals @ residuals) / dof
    try:
        cov = np.linalg.pinv(jac.T @ jac) * variance
    except np.linalg.LinAlgError:
        return np.full(jac.shape[1], np.inf)
    diag = np.diag(cov)
    return np.where(diag > 0, np.sqrt(np.abs(diag)), np.inf)


def _curve_starts(problem: Problem, parent: np.ndarray) -> list[np.ndarray]:
    """Static power and a flat curve trade off against each other, and a linear fit's prefill
    weight is a poor start for a curve's: start from several curvatures at the stated weight,
    each scaled to draw the parent's mean step power, its heaviest steps at the cap."""
    decode, context, prefill, position, padded = problem.features
    v = dict(zip(NAMES, parent, strict=True))
    step, scale, w0 = v["step"], v["scale"], problem.default_prefill_weight
    decode = decode + v["padding"] * (padded - decode)
    linear = decode + v["context"] * context + v["prefill"] * prefill
    mean_power = float(np.mean(np.minimum(v["cap"], step + scale * linear ** v["exponent"])))
    work = np.maximum(decode + v["context"] * context + w0 * (prefill + v["position"] * position), 1e-9)
    starts = []
    for curvature in (0.5, 0.8, 1.1):
        start = parent.copy()
        start[NAMES.index("exponent")] = curvature
        start[NAMES.index("prefill")] = w0
        start[NAMES.index("scale")] = max(mean_power - step, 1e-3) / float(np.mean(work**curvature))
        # a cap above every step has no gradient to come down by: start it where a few bind
        raw = step + start[NAMES.index("scale")] * work**curvature
        start[NAMES.index("cap")] = float(np.percentile(raw, 95))
        starts.append(start)
    return starts


def _starts(problem: Problem, effects: frozenset[str], parent: np.ndarray) -> list[np.ndarray]:
    """Where a fit of ``effects`` starts from its parent's: there; from the curve's starts where
    the parent had no curve (a curve's parent is a curve fit already: starting its children
    from scratch again, each at every lag, was most of a long run's selection); and with
    padding's weight at a whole padded row where the parent had none (between none and all of
    it, the least squares may settle at either end)."""
    fresh_curve = "curve" in effects and not np.isfinite(parent[NAMES.index("cap")])
    starts = [parent, *(_curve_starts(problem, parent) if fresh_curve else [])]
    k = NAMES.index("padding")
    if "padding" in effects and parent[k] == 0.0:
        whole = parent.copy()
        whole[k] = 1.0
        starts.append(whole)
    return starts


def fit(problem: Problem, given: frozenset[str] | None = None) -> tuple[PowerModel, list[PowerModel]]:
    """The model the run supports (or the ``given`` effects, fitted), and the other candidates
    its data cannot tell from it (none for a given model: its band is its own uncertainty)."""
    intervals = int(problem.usable.sum())
    if problem.steps.count < 8 or intervals < 8:
        static = (
            problem.static_w
            if problem.static_w is not None
            else float(np.percentile(problem.energy / np.maximum(problem.dt, 1e-9), 5))
        )
        note = "too few steps or meter intervals to fit: defaults kept; the band widens by all their energy"
        return PowerModel(static, 1.0, problem.default_prefill_weight, intervals=intervals, notes=[note]), []
    notes = [] if problem.has_prefill else ["no prefill seen: prefill weight not identified, default kept"]
    sample = problem.window(SELECTION_INTERVALS)
    chosen, held, alike = _select(sample, notes) if given is None else _given(sample, given)
    if sample is not problem:
        tau = None if chosen.drift is None else chosen.drift.tau_s
        drift = None if chosen.drift is None else problem.drift(tau)
        chosen = _solve(problem, chosen.effects, problem.usable, chosen.lag_ms, drift, [chosen.theta])
        notes.append(
            f"model chosen over the {sample.energy.size} meter intervals mid-run, then fitted to all {intervals}"
        )
    model = _model(problem, chosen, notes)
    rule = (
        f"blocked cross-validation over {FOLDS} stretches of the run; an effect is kept where it "
        f"predicts held-out meter intervals at least {MIN_GAIN:.0%} better, and significantly (in a run of "
        f"fewer than {PAIRS_BELOW} intervals, two together where neither earns it alone); "
        f"{' and '.join(PRESUMED)}, which every serving GPU has, unless they predict them worse "
        "or the fit cannot tell them from nothing"
    )
    model.selection = {
        "rule": rule if given is None else "given (--power-model); held-out errors beside linear work's",
        "given": given is not None,
        "held_out_error": {_name(e): _rmse(v) for e, v in held.items()},
        "indistinguishable": [_name(f.effects) for f in alike],
    }
    if model.held_out_error is None:
        notes.append(
            f"{intervals} meter intervals: too few to hold any out; the band takes twice the in-sample error"
        )
    return model, [_model(sample, f, []) for f in alike]


def _given(
    problem: Problem, effects: frozenset[str]
) -> tuple[Fit, dict[frozenset[str], np.ndarray], list[Fit]]:
    """The ``effects`` asked for, fitted as the selection would reach them (an effect at a time,
    each fit starting from the last), with its held-out errors and linear work's to compare."""
    current: frozenset[str] = frozenset()
    chosen = _fit(problem, current, problem.usable, [bounds(problem, current, 1.0)[0]])
    linear = chosen
    for effect in (e for e in EFFECTS if e in effects):
        current |= {effect}
        chosen = _fit(problem, current, problem.usable, _starts(problem, current, chosen.theta))
    held = {}
    if int(problem.usable.sum()) >= FOLDS * MIN_FOLD_INTERVALS:
        held = {fit.effects: _held_out(problem, fit) for fit in (linear, chosen)}
    return chosen, held, []


def _select(problem: Problem, notes: list[str]) -> tuple[Fit, dict[frozenset[str], np.ndarray], list[Fit]]:
    """Greedy forward selection: the chosen fit, every candidate's held-out errors, and the
    candidates that predicted about as well as the chosen one."""
    intervals = int(problem.usable.sum())
    base = bounds(problem, frozenset(), 1.0)[0]
    select = intervals >= FOLDS * MIN_FOLD_INTERVALS
    fits: dict[frozenset[str], Fit] = {}
    held: dict[frozenset[str], np.ndarray] = {}

    def evaluate(effects: frozenset[str], parent: np.ndarray) -> None:
        fits[effects] = _fit(problem, effects, problem.usable, _starts(problem, effects, parent))
        if select:
            held[effects] = _held_out(problem, fits[effects])

    applicable = applicable_effects(problem)
    current: frozenset[str] = frozenset()
    evaluate(current, base)
    if not select:
        evaluate(frozenset({"curve"}), base)
        r2 = _model(problem, fits[frozenset({"curve"})], []).r2
        if r2 is not None and r2 >= MIN_R2:
            current = frozenset({"curve"})
        notes.append(
            f"{intervals} meter intervals: too few to compare models out of sample, R² {r2 or 0:.2f}"
        )
        return fits[current], held, []

    def earned(candidates: list[frozenset[str]], tried: int) -> frozenset[str] | None:
        best = min(candidates, key=lambda c: _rmse(held[c]), default=None)
        return best if best is not None and predicts_better(held[best], held[current], tried) else None

    while True:
        singles = [current | {e} for e in applicable if e not in current]
        for single in singles:
            evaluate(single, fits[current].theta)
        step = earned(singles, 1)
        if step is None and not current and intervals < PAIRS_BELOW:
            pairs = [a | b for a, b in combinations(singles, 2)]
            for pair in pairs:
                evaluate(pair, min((fits[s] for s in singles if s < pair), key=lambda f: f.cost).theta)
            step = earned(pairs, len(pairs))
        if step is None:
            break
        current = step
    for effect in PRESUMED:
        presumed = current | {effect}
        if effect in applicable and effect not in current:
            if presumed not in held:
                evaluate(presumed, fits[current].theta)
            if _rmse(held[presumed]) <= _rmse(held[current]) and _told_from_nothing(fits[presumed], effect):
                current = presumed
    # the band spans the candidates that predicted held-out intervals about as well (within
    # five times the gain that keeps an effect): the run cannot say which of them is right
    near = (1 + 5 * MIN_GAIN) * _rmse(held[current]) + RESOLUTION
    return fits[current], held, [fits[e] for e in held if e != current and _rmse(held[e]) <= near]


def _told_from_nothing(fit: Fit, effect: str) -> bool:
    """Whether the fit tells what ``effect`` adds from nothing (a presumed effect is off at
    zero): each parameter it frees above its standard error, and what it adds to the modelled
    intervals, to first order its Jacobian column times it, more than a meter resolves."""
    free = [name for name, f in zip(NAMES, fit.free, strict=True) if f]
    errors = _standard_errors(fit.jac, fit.residuals)
    values = dict(zip(NAMES, fit.theta, strict=True))
    rows = [free.index(row.name) for row in PARAMETERS if row.effect == effect and row.name in free]
    return bool(rows) and all(
        values[free[k]] > errors[k]
        and values[free[k]] * float(np.sqrt(np.mean(fit.jac[:, k] ** 2))) > RESOLUTION
        for k in rows
    )


def _name(effects: frozenset[str]) -> str:
    return "+".join(e for e in EFFECTS if e in effects) or "linear"
