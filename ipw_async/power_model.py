"""The device's power model, fitted to the run itself, over engine steps inferred from the client.

A continuous-batching server emits a token for every running sequence at the end of each
step, so token arrivals across all streams come in bursts, one per step. A request decodes in
each step whose burst brings it a token, and prefills its computed prompt tokens (prompt less
what the prefix cache held) in the steps before its first token: under a per-step token
budget, a long prompt takes several steps, and those steps run longer than their decoding
alone explains. So step times are fitted as ``a + b·decoders + c·prefill tokens`` and the
prompts are placed first come, first served in the room the steps' extra time leaves.

Then the meter's energy in each of its intervals is fitted as static power plus, over the
steps in it, ``scale · (decode tokens + w · prefill tokens) ** exponent`` × step time. The
fitted model says how a meter interval's dynamic energy splits between its steps and, inside
a step, between its requests (a prefill token weighs ``w`` decode tokens). Where the run
cannot identify a parameter, it keeps a stated default and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
from scipy.optimize import least_squares, nnls

from ._clock import NS

DEFAULT_EXPONENT = 1.0
MIN_TIMED_STEPS = 4  # fewer steps of known length than this fit no step-time model
MIN_R2 = 0.5  # below it, the fitted curve is noise: work is counted linearly instead
# Fewer prompt tokens a step than this is no engine's budget (vLLM's and llama.cpp's are in
# the thousands): steps that show no prefill time then did their prompts' work cheaply, in the
# step of each first token, rather than all running at a budget.
MIN_STEP_BUDGET = 64
# The shortest steps, as a low percentile of inter-token latency rather than its least: a
# stream whose reads fell behind catches up with near-zero gaps (well under 0.1% of them in
# our runs), and a burst split at those would cut every step apart.
SHORT_STEP_PERCENTILE = 2.0
# A prompt token's weight where the run cannot tell it because its prefill ran at the power
# cap: a device at its cap is compute-bound, and a prompt token takes the same FLOPs as a
# decode token (about 2 × parameters), so they weigh alike. Below the cap decode is
# memory-bound and a decode token costs more: there the fit finds the weight itself.
CAPPED_PREFILL_WEIGHT = 1.0
# the least and most a prompt token weighs against a decode token on the servers we know
LEAST_PREFILL_WEIGHT, MOST_PREFILL_WEIGHT = 0.1, 1.5
# Where more prefill than this ran at the cap even at that least weight, the run cannot tell a
# prompt token's weight. (At half, the default simulator at 256 streams, whose prompts
# mostly cap but whose lighter prefill steps identify the weight to 10%, was refused it.)
CAPPED_SHARE = 0.75
# Where more prefill than this ran at the cap at the fitted weight itself, the few steps below
# the cap are all that tell the weight (at 79%, those left identify it to 5% on exact steps).
FIT_CAPPED_SHARE = 0.9
# The batch's peak is a server's batch limit where at least this share of the steps ran at it
# (once or twice at the peak is only where load was highest).
BATCH_CEILING_SHARE = 0.05


def step_starts(requests: pl.DataFrame, split: float = 0.5) -> np.ndarray:
    """Client-side times at which the server's engine steps delivered tokens.

    A continuous-batching server emits one token for every running sequence at the end of each
    step, so token arrivals across all requests come in bursts; a burst starts where arrivals
    pause for more than ``split`` × the shortest step, the inter-token latency's
    ``SHORT_STEP_PERCENTILE``-th percentile. (Half the *median* step merged a short decode step
    into the next one wherever most steps carried a long prefill.)
    """
    arrivals = np.unique(requests.get_column("chunk_ns").explode().drop_nulls().to_numpy().astype(float))
    if arrivals.size == 0:
        return arrivals
    itl = requests.get_column("itl_s").explode().drop_nulls().to_numpy()
    itl = itl[itl > 0]
    pause = split * float(np.percentile(itl, SHORT_STEP_PERCENTILE)) * NS if itl.size else 0.0
    return arrivals[np.concatenate(([True], np.diff(arrivals) > pause))]


def computed_prompt_tokens() -> pl.Expr:
    """Prompt tokens the server computed: those its prefix cache held were never prefilled."""
    return pl.col("prompt_tokens").fill_null(0) - pl.col("cached_prompt_tokens").fill_null(0)


@dataclass
class Steps:
    """Inferred engine steps and each request's work in them (one entry per request and step)."""

    start: np.ndarray  # ns, per step
    end: np.ndarray
    decode: np.ndarray  # decode tokens in the step
    prefill: np.ndarray  # prefill tokens in the step
    req: np.ndarray  # per entry: request index
    step: np.ndarray  # per entry: step index
    entry_decode: np.ndarray
    entry_prefill: np.ndarray
    duration_fit: dict[str, float] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return self.start.size


def steps_of(requests: pl.DataFrame) -> Steps:
    """The engine steps the requests' token arrivals imply, with their computed prompts placed."""
    computed = requests.select(computed_prompt_tokens()).to_series().to_numpy().astype(float)
    return infer_steps(requests, step_starts(requests), computed)


def infer_steps(requests: pl.DataFrame, bursts: np.ndarray, prefill_tokens: np.ndarray) -> Steps:
    """Steps from burst times (``energy.step_starts``), with decode and prefill placed in them."""
    n_steps = bursts.size
    if n_steps == 0:  # no token arrived: no step can be told apart
        empty = np.zeros(0)
        return Steps(empty, empty, empty, empty, empty.astype(int), empty.astype(int), empty, empty)
    end = bursts.astype(float)
    gaps = np.diff(end)
    # a lone step began when its first request arrived (set below)
    typical = float(np.median(gaps)) if gaps.size else np.inf
    start = np.concatenate(([end[0] - typical], end[:-1]))
    sent = requests.get_column("sent_ns").to_numpy().astype(float)
    req_idx, step_idx, dec = [], [], []
    first_step = np.full(requests.height, -1)
    running = np.zeros(n_steps)  # requests that got a token in the step: the batch, less multi-step prompts
    for i, (chunks, tokens) in enumerate(requests.select("chunk_ns", "chunk_tokens").iter_rows()):
        if not chunks:
            continue
        k = np.searchsorted(end, np.asarray(chunks, dtype=float), side="right") - 1
        k = np.clip(k, 0, n_steps - 1)
        first_step[i] = k[0]
        running[np.unique(k)] += 1
        per_step = np.bincount(k - k[0], weights=np.asarray(tokens, dtype=float))
        # the first token comes with the prefill; tokens after it are decode work
        per_step[0] -= 1
        for offset in np.flatnonzero(per_step > 0):
            req_idx.append(i)
            step_idx.append(k[0] + offset)
            dec.append(per_step[offset])
    decode = np.bincount(np.asarray(step_idx, dtype=int), weights=dec, minlength=n_steps)
    # An engine idle before a step started it no earlier than its first request arrived, and
    # how much later the server's own work (accepting, parsing, tokenizing: 100 ms for 256
    # connections at once on the simulator) the step-time fit says, in the placement below.
    busy_before = np.zeros(n_steps, dtype=bool)
    busy_before[np.asarray(step_idx, dtype=int)] = True
    cold = ~np.concatenate(([False], busy_before[:-1]))
    for k in np.flatnonzero(cold):
        arrivals = sent[(first_step == k) & (sent < end[k])]
        if arrivals.size:  # the first step has no burst before it: only the typical guess
            start[k] = float(arrivals.min()) if k == 0 else max(start[k], float(arrivals.min()))
    steps = Steps(
        start,
        end,
        decode,
        np.zeros(n_steps),
        np.asarray(req_idx, dtype=int),
        np.asarray(step_idx, dtype=int),
        np.asarray(dec, dtype=float),
        np.zeros(len(dec)),
    )
    _place_prefill(steps, sent, first_step, prefill_tokens, cold, running)
    return steps


def _place_prefill(
    steps: Steps,
    sent: np.ndarray,
    first_step: np.ndarray,
    tokens: np.ndarray,
    cold: np.ndarray,
    running: np.ndarray,
) -> None:
    """Each prompt in the room the steps' extra time (over decode alone) leaves, first come,
    first served as the engines we know schedule prefill (vLLM, SGLang, TGI): prompts in the
    order of their first tokens, each from the first step after its arrival, and no earlier
    than the first-token step of the prompt served before it nor than the last step before it
    at the batch's ceiling (a request queued for a batch slot does no work), taking what room
    earlier prompts left, its first-token step taking whatever remains. A ``cold`` step (the engine idle before it) lasts what the step-time
    fit says its work takes, within the time since its first request arrived.

    (Spreading a prompt over all its wait in proportion to the room put much of it in steps
    that were busy with the prompts queued ahead of it.)"""
    earliest = steps.start.copy()
    duration = steps.end - steps.start
    timed_steps = np.isfinite(duration) & (duration > 0) & ~cold  # a cold step's start is a guess
    times_cold_steps = timed_steps.sum() >= MIN_TIMED_STEPS  # else the fit is a median, no model
    order = np.argsort(first_step, kind="stable")
    have = [(i, int(first_step[i])) for i in order if first_step[i] >= 0 and tokens[i] > 0]
    placed: dict[tuple[int, int], float] = {}
    prefill = np.zeros(steps.count)
    need = float(sum(tokens[i] for i, _ in have))
    # a request joins the batch at the first step that starts after it arrived
    # a batch limit shows as a ceiling the batch keeps reaching: no prompt ran in a step at it,
    # so a request whose first token came later waited for a slot until after the last such
    full = np.flatnonzero(running >= running.max()) if running.size else running.astype(int)
    if full.size < BATCH_CEILING_SHARE * steps.count:
        full = full[:0]
    admitted = [int(full[j - 1]) + 1 if (j := int(np.searchsorted(full, f))) else 0 for _, f in have]
    windows = [
        np.arange(min(max(int(np.searchsorted(steps.start, sent[i], side="left")), adm), f), f + 1)
        for (i, f), adm in zip(have, admitted, strict=True)
    ]
    in_window = np.zeros(steps.count, dtype=bool)  # steps some prompt could have been prefilled in
    for window in windows:
        in_window[window] = True
    for _ in range(4):  # refit the step-time model with the placement it implies
        a, b, c = _fit_duration(duration[timed_steps], steps.decode[timed_steps], prefill[timed_steps])
        steps.duration_fit = {"base_ms": a / 1e6, "per_decode_ms": b / 1e6, "per_prefill_token_ms": c / 1e6}
        if times_cold_steps:
            modelled = a + b * steps.decode + c * prefill
            since = np.where(modelled > 0, np.maximum(earliest, steps.end - modelled), earliest)
            steps.start[cold] = since[cold]
            duration = steps.end - steps.start
        # a per-token cost that explains under 1% of a step is the fit's float residue: no room
        typical = float(prefill[prefill > 0].mean()) if prefill.any() else 0.0
        timed = c * typical >= 0.01 * float(np.median(duration))
        room = np.maximum(duration - a - b * steps.decode, 0.0) / c if timed else np.zeros(steps.count)
        # Every step at its token budget looks alike in time, and the fit cannot tell base time
        # from prompt tokens: then the steps' room cannot hold the prompts. The prompts
        # themselves then say what a step holds: all of them over the steps they waited in.
        capacity = need / max(int(in_window.sum()), 1)
        if room.sum() < 0.5 * need and capacity >= MIN_STEP_BUDGET:
            room = np.full(steps.count, capacity)
        prefill = np.zeros(steps.count)
        placed = {}
        served = -1  # where the prompt served before this one got its first token
        for (i, f), window in zip(have, windows, strict=True):
            window = window[window >= min(served, f)]
            served = f
            free = np.maximum(room[window] - prefill[window], 0.0)
            free[free < 1.0] = 0.0  # less than a token: a step filled to its room
            take = np.minimum(free, np.maximum(tokens[i] - (np.cumsum(free) - free), 0.0))
            take[-1] += tokens[i] - take.sum()
            for k, part in zip(window, take, strict=True):
                if part > 0:
                    placed[(i, int(k))] = float(part)
                    prefill[k] += part
    steps.prefill = prefill
    extra_req = np.array([i for i, _ in placed], dtype=int)
    extra_step = np.array([k for _, k in placed], dtype=int)
    steps.req = np.concatenate((steps.req, extra_req))
    steps.step = np.concatenate((steps.step, extra_step))
    steps.entry_decode = np.concatenate((steps.entry_decode, np.zeros(extra_req.size)))
    steps.entry_prefill = np.concatenate(
        (np.zeros(steps.entry_prefill.size), np.fromiter(placed.values(), float, len(placed)))
    )


def _fit_duration(
    duration: np.ndarray, decode: np.ndarray, prefill: np.ndarray
) -> tuple[float, float, float]:
    """Step time = a + b·decoders + c·prefill tokens, all non-negative (least squares)."""
    if duration.size < MIN_TIMED_STEPS:
        return float(np.median(duration)) if duration.size else 0.0, 0.0, 0.0
    coef, _ = nnls(np.column_stack((np.ones_like(duration), decode, prefill)), duration)
    return float(coef[0]), float(coef[1]), float(coef[2])


@dataclass
class PowerModel:
    """Static power (W) and dynamic power ``min(cap, scale · work ** exponent)`` (W), work in
    decode tokens: at the cap (a device's power limit) more work costs time, not power."""

    static_w: float
    scale_w: float
    prefill_weight: float
    exponent: float
    cap_w: float = float("inf")
    r2: float | None = None
    intervals: int = 0
    notes: list[str] = field(default_factory=list)

    def dynamic_w(self, work: np.ndarray) -> np.ndarray:
        return np.minimum(self.cap_w, self.scale_w * np.power(np.maximum(work, 0.0), self.exponent))

    def as_dict(self) -> dict[str, Any]:
        return {
            "static_w": self.static_w,
            "scale_w": self.scale_w,
            "prefill_weight": self.prefill_weight,
            "exponent": self.exponent,
            "cap_w": self.cap_w if np.isfinite(self.cap_w) else None,
            "r2": self.r2,
            "intervals": self.intervals,
            "notes": self.notes,
        }


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


def _capped_share(steps: Steps, w: float, scale_w: float, gamma: float, cap: float) -> float:
    """The share of prefill tokens in steps the model puts at the power cap, at weight ``w``."""
    raw = scale_w * np.power(np.maximum(steps.decode + w * steps.prefill, 1e-9), gamma)
    return float(steps.prefill[raw >= cap].sum()) / max(float(steps.prefill.sum()), 1e-9)


def _pieces(knots: np.ndarray, steps: Steps) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The steps cut at the meter's knots: (knot interval, step, duration ns) per piece."""
    pts = np.unique(np.concatenate((knots, steps.start, steps.end)))
    mid = (pts[:-1] + pts[1:]) / 2
    k = np.clip(np.searchsorted(steps.end, mid, side="left"), 0, steps.count - 1)
    in_step = (steps.start[k] <= mid) & (mid <= steps.end[k])
    j = np.searchsorted(knots, mid, side="right") - 1
    ok = in_step & (j >= 0) & (j < knots.size - 1)
    return j[ok], k[ok], np.diff(pts)[ok]


def fit(
    knots: np.ndarray,
    energy: np.ndarray,
    usable: np.ndarray,
    steps: Steps,
    static_w: float | None,
    default_prefill_weight: float,
) -> PowerModel:
    """Fit the model to the meter's intervals (``energy`` J per knot interval; ``usable`` marks
    those measured, not imputed). ``static_w``, when measured, anchors static power."""
    notes: list[str] = []
    dt = np.diff(knots) / NS
    intervals = int(usable.sum())
    guess_static = (
        static_w if static_w is not None else float(np.percentile(energy / np.maximum(dt, 1e-9), 5))
    )
    if steps.count < 8 or intervals < 8:
        notes.append("too few steps or meter intervals to fit: defaults kept")
        return PowerModel(
            guess_static, 1.0, default_prefill_weight, DEFAULT_EXPONENT, intervals=intervals, notes=notes
        )

    j, k, dur = _pieces(knots, steps)

    def model(p: np.ndarray) -> np.ndarray:
        static, scale, w, gamma, cap = p
        work = steps.decode + w * steps.prefill
        step_power = np.minimum(cap, scale * np.power(np.maximum(work, 1e-9), gamma))
        dyn = np.bincount(j, weights=step_power[k] * dur / NS, minlength=dt.size)
        return static * dt + dyn

    scale0 = max(float(np.mean(energy / np.maximum(dt, 1e-9))) - guess_static, 1.0) / max(
        float(np.mean(steps.decode)), 1.0
    )
    peak = float(np.max((energy / np.maximum(dt, 1e-9))[usable])) - guess_static
    lo = [0.0, 0.0, 0.01, 0.2, 0.0]
    hi = [np.inf, np.inf, 10.0, 1.5, np.inf]
    p0 = [guess_static, scale0, default_prefill_weight, 0.8, 2 * max(peak, 1.0)]
    if static_w is not None:  # anchored: a hair of room so the bounds stay valid
        lo[0], hi[0], p0[0] = static_w * 0.999, static_w * 1.001 + 1e-9, static_w
    if not steps.prefill.any():
        lo[2], hi[2] = default_prefill_weight * 0.999, default_prefill_weight * 1.001 + 1e-9
        notes.append("no prefill seen: prefill weight not identified, default kept")
    scale = max(float(np.median(energy[usable])), 1e-9)

    def residuals(p: np.ndarray) -> np.ndarray:
        return (model(p) - energy)[usable] / scale

    # static power and a flat power curve trade off against each other: start from several
    # curvatures and keep the best
    try:
        result = min(
            (
                least_squares(
                    residuals,
                    [*p0[:3], gamma0, p0[4]],
                    bounds=(lo, hi),
                    x_scale="jac",
                    max_nfev=2000,
                    ftol=1e-12,
                    xtol=1e-12,
                    gtol=1e-12,
                )
                for gamma0 in (0.5, 0.8, 1.1)
            ),
            key=lambda r: r.cost,
        )
    except (ValueError, np.linalg.LinAlgError) as exc:
        notes.append(f"fit failed ({exc}): defaults kept")
        return PowerModel(
            guess_static, scale0, default_prefill_weight, DEFAULT_EXPONENT, intervals=intervals, notes=notes
        )
    static, scale_w, w, gamma, cap = (float(v) for v in result.x)
    resid = (model(result.x) - energy)[usable]
    total = energy[usable] - energy[usable].mean()
    r2 = 1.0 - float(resid @ resid) / float(total @ total) if total.any() else None
    work = steps.decode + w * steps.prefill
    busy = work[work > 0]
    if busy.size == 0 or np.ptp(busy) < 0.5 * float(np.mean(busy)):
        notes.append("too little variation in step work to identify the exponent: 1.0 kept")
        gamma, cap = DEFAULT_EXPONENT, float("inf")  # only the scale matters: all steps work alike
    elif r2 is None or r2 < MIN_R2:
        shown = "n/a" if r2 is None else f"{r2:.2f}"
        notes.append(
            f"the model explains too little of the meter's intervals (R² {shown}): work counted linearly"
        )
        w, gamma, cap = default_prefill_weight, DEFAULT_EXPONENT, float("inf")
    else:
        error = _standard_errors(result.jac, result.fun)
        # at the cap even were a prompt token worth little: the weight found is not the run's
        capped = _capped_share(steps, min(w, LEAST_PREFILL_WEIGHT), scale_w, gamma, cap)
        if lo[2] * 1.001 < hi[2] and capped > CAPPED_SHARE:
            # a step at the power cap draws the same power whatever its prefill: the weight
            # the fit found there is an artefact of the rest of the model
            notes.append(
                f"prefill weight not identified ({capped:.0%} of prefill ran at the power cap): "
                f"{CAPPED_PREFILL_WEIGHT:g} taken, as compute-bound tokens cost alike"
            )
            w = CAPPED_PREFILL_WEIGHT
        elif (
            lo[2] * 1.001 < hi[2]
            and (at_fit := _capped_share(steps, w, scale_w, gamma, cap)) > FIT_CAPPED_SHARE
        ):
            # A weight that puts nearly all prefill at the cap fits as well as any larger one:
            # the meter has only the few steps below the cap to tell it by, and at 256 streams
            # (97% capped) those made it anything from 0.16 to 5.8 from run to run. What it
            # does tell is a least weight: one that caps that prefill as the fit found it.
            trial = np.geomspace(LEAST_PREFILL_WEIGHT, max(w, LEAST_PREFILL_WEIGHT), 32)
            shares = [_capped_share(steps, x, scale_w, gamma, cap) for x in trial]
            least = float(trial[np.argmax(np.asarray(shares) >= FIT_CAPPED_SHARE)])
            kept = float(
                np.clip(max(default_prefill_weight, least), LEAST_PREFILL_WEIGHT, MOST_PREFILL_WEIGHT)
            )
            notes.append(
                f"prefill weight not identified ({at_fit:.0%} of prefill at the power cap at the "
                f"fit's {w:.2g}, at least {least:.2g}): {kept:.2g} taken"
            )
            w = kept
        elif lo[2] * 1.001 < hi[2] and not LEAST_PREFILL_WEIGHT <= w <= MOST_PREFILL_WEIGHT:
            # outside what a prompt token weighs on any server we know: the fit has made up for
            # something else (a misplaced prompt, the meter's timing)
            notes.append(
                f"prefill weight not identified (the fit's {w:.2g} is outside "
                f"{LEAST_PREFILL_WEIGHT:g}–{MOST_PREFILL_WEIGHT:g}): default {default_prefill_weight:g} kept"
            )
            w = default_prefill_weight
        elif lo[2] * 1.001 < hi[2] and error[2] > 0.5 * max(w, 0.1):
            # e.g. every prefill step at the power cap: its power says nothing of a token's work
            notes.append(
                f"prefill weight not identified (±{error[2]:.2g}): default {default_prefill_weight:g} kept"
            )
            w = default_prefill_weight
        work = steps.decode + w * steps.prefill
        if cap >= float(np.max(scale_w * np.power(np.maximum(work, 1e-9), gamma))):
            cap = float("inf")  # no step reached it: the run says nothing of a cap
    return PowerModel(static, scale_w, w, gamma, cap, r2, intervals, notes)
