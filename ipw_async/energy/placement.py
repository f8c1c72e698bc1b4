"""Where the prompts ran: each request's computed prompt placed in the inferred steps' room.

Engines with chunked prefill (vLLM, SGLang, TGI, the H100 server of the real traces) fill a
fixed token budget a step, first come, first served. Where one budget, filled so, brings
nearly every request's first token in the step it came in, that budget is the room: on the
real H100 runs it is the server's 2,048 tokens, found from first tokens alone, and the
prompts then lie exactly where the server's step log has them. Otherwise a step that ran
longer than its decoding explains had room for prompt tokens: step times are fitted as
``a + b·decoders + c·prefill tokens + e·their positions + d·context read``, and the prompts
are placed first come, first served in the room that leaves, then the fit is redone with that
placement until the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from scipy.optimize import nnls

MIN_TIMED_STEPS = 4  # fewer steps of known length than this fit no step-time model
# Fewer prompt tokens a step than this is no engine's budget (vLLM's and llama.cpp's are in
# the thousands): steps that show no prefill time then did their prompts' work cheaply, in the
# step of each first token, rather than all running at a budget.
MIN_STEP_BUDGET = 64
# The batch's peak is a server's batch limit where at least this share of the steps ran at it
# (once or twice at the peak is only where load was highest).
BATCH_CEILING_SHARE = 0.05
# Refits of the step-time model with the placement it implies, at most
REFITS = 8
# A step longer than decoding alone by this share may have run prompt tokens
LONG_STEP = 0.05
# A step-time term for prompt positions must cut the squared error of step times by this share
POSITION_GAIN = 0.05
# The step-time fit as summary.json gives it, in the order _fit_duration returns it
STEP_TIME_TERMS = (
    "base_ms",
    "per_decode_ms",
    "per_prefill_token_ms",
    "per_position_ktoken_ms",
    "per_context_ktoken_ms",
)
# A token budget is the steps' room where filling it first come, first served brings at least
# this share of the prompts to their first token in the step it came in
BUDGET_AGREEMENT = 0.9
# Only a prompt that could have run before its first token's step tells a budget from a
# larger one: fewer such prompts than this infer none
BUDGET_EVIDENCE = 10
# The budgets tried first: four a doubling from 64 to 131,072 tokens (every power of two among
# them, as engines' defaults are), then finer between the best one's neighbours
BUDGETS = 2.0 ** (6 + np.arange(4 * 11 + 1) / 4)
REFINE = 16
ZOOMS = 3
CHECKED_PROMPTS = 20_000


class StepTimes(Protocol):
    """What placing prompts needs of the steps: their times, batch and context read."""

    start: np.ndarray
    end: np.ndarray
    decode: np.ndarray

    @property
    def count(self) -> int: ...

    @property
    def context(self) -> np.ndarray: ...


@dataclass
class Placed:
    """The prompts placed: the steps' starts (a cold step's moved to what its work takes), each
    step's prefill tokens and their positions, the entries, the step-time model fitted, and
    how the room was found (:meth:`TokenBudget.as_dict`, or by step time)."""

    start: np.ndarray
    prefill: np.ndarray
    entries: Placement
    duration_fit: dict[str, float]
    by: dict[str, object]


@dataclass
class TokenBudget:
    """Prompt tokens an engine computes a step (less the step's decode tokens where they share
    it, as vLLM's ``max_num_batched_tokens``), and the share of first tokens it explains."""

    tokens: float
    with_decode: bool
    agreement: float

    def room(self, decode: np.ndarray) -> np.ndarray:
        return np.maximum(self.tokens - decode, 0.0) if self.with_decode else np.full(decode.size, self.tokens)

    def as_dict(self) -> dict[str, object]:
        return {
            "by": "token budget",
            "budget_tokens": round(self.tokens),
            "decode_in_budget": self.with_decode,
            "first_tokens_explained": self.agreement,
        }


@dataclass
class PromptQueue:
    """Prompts in order of arrival, as a budget serves them: the tokens arrived by each step, and
    the tokens through each prompt."""

    arrived: np.ndarray
    through: np.ndarray

    @classmethod
    def of(cls, first: np.ndarray, tokens: np.ndarray, steps: int) -> PromptQueue:
        """Prompts of ``tokens``, each from its ``first`` step, over ``steps`` steps."""
        return cls(np.cumsum(np.bincount(first, weights=tokens, minlength=steps)), np.cumsum(tokens))

    def finishing(self, room: np.ndarray, prompts: slice = slice(None)) -> np.ndarray:
        """The step each prompt finishes in, filling ``room`` first come, first served. A queue
        served ``room[k]`` a step has served ``min(S[k-1] + room[k], A[k])`` by step k (A: tokens
        arrived), that is ``K[k] + min(0, min over j ≤ k of A[j] - K[j])`` with K the room so
        far: one pass, not a loop over steps."""
        capacity = np.cumsum(room)
        served = capacity + np.minimum(np.minimum.accumulate(self.arrived - capacity), 0.0)
        return np.searchsorted(served, self.through[prompts] - 1e-6, side="left")


def infer_budget(
    decode: np.ndarray, first: np.ndarray, last: np.ndarray, tokens: np.ndarray
) -> TokenBudget | None:
    """The token budget (:data:`BUDGETS`, refined) that, filled first come, first served, brings
    the most prompts (``tokens`` from step ``first``, in order of arrival) to their first token
    in step ``last``, with or without the decode tokens in it; None where none brings
    :data:`BUDGET_AGREEMENT` of them (an engine that does not schedule prompts so), or where
    fewer than :data:`BUDGET_EVIDENCE` prompts waited a step or more."""
    if int(np.count_nonzero(first < last)) < BUDGET_EVIDENCE:
        return None
    queue = PromptQueue.of(first, tokens, decode.size)
    # a long run's prompts checked in a sample: every one still queues behind all before it
    checked = slice(None, None, max(1, tokens.size // CHECKED_PROMPTS))

    def agreement(budget: float, with_decode: bool) -> float:
        room = TokenBudget(budget, with_decode, 0.0).room(decode)
        return float(np.mean(queue.finishing(room, checked) == last[checked]))

    best: TokenBudget | None = None
    for with_decode in (False, True):
        scores = np.array([agreement(b, with_decode) for b in BUDGETS])
        # the middle of the budgets that explain the most: those on either side of the truth
        # that still explain as much differ from it at most by as much
        top = np.flatnonzero(scores == scores.max())
        breaks = np.flatnonzero(np.diff(top) > 1)
        run = top[: breaks[0] + 1] if breaks.size else top
        i = int(run[run.size // 2])
        found = TokenBudget(float(BUDGETS[i]), with_decode, float(scores[i]))
        low, high = BUDGETS[max(i - 1, 0)], BUDGETS[min(i + 1, BUDGETS.size - 1)]
        for _ in range(ZOOMS):  # agreement peaks sharply at an engine's budget: close in on it
            grid = np.round(np.linspace(low, high, REFINE + 2))
            for b in grid[1:-1]:
                score = agreement(float(b), with_decode)
                if score > found.agreement:  # a round budget keeps a tie
                    found = TokenBudget(float(b), with_decode, score)
            step = grid[1] - grid[0]
            low, high = max(found.tokens - step, 1.0), found.tokens + step
        if best is None or found.agreement > best.agreement:
            best = found
    return best if best is not None and best.agreement >= BUDGET_AGREEMENT else None


def place_prefill(
    steps: StepTimes,
    sent: np.ndarray,
    first_step: np.ndarray,
    tokens: np.ndarray,
    cached: np.ndarray,
    cold: np.ndarray,
    running: np.ndarray,
) -> Placed:
    """Each prompt placed first come, first served (as vLLM, SGLang and TGI schedule prefill) in
    the room of the steps from the first after its arrival (and after any wait for a batch
    slot) to its first token's, which takes whatever remains: the engine's token budget where
    one explains the first tokens (:func:`infer_budget`), else the time the steps took beyond
    decoding alone, a token's time growing with its position. ``cached`` prompt tokens come
    first in each prompt. A ``cold`` step (the engine idle before it) lasts what the step-time
    fit says its work takes, within the time since its first request arrived. (Spreading a
    prompt over all its wait put much of it in steps busy with the prompts ahead of it.)"""
    context = steps.context
    start = steps.start.copy()
    earliest = steps.start.copy()
    duration = steps.end - start
    timed_steps = np.isfinite(duration) & (duration > 0) & ~cold  # a cold step's start is a guess
    times_cold_steps = timed_steps.sum() >= MIN_TIMED_STEPS  # else the fit is a median, no model
    have, first, last = _windows(start, sent, first_step, tokens, running)
    need = float(tokens[have].sum())
    arrival = np.lexsort((sent[have], first))
    budget = infer_budget(steps.decode, first[arrival], last[arrival], tokens[have][arrival])
    # steps some prompt could have been prefilled in
    cover = np.bincount(first, minlength=steps.count + 1) - np.bincount(last + 1, minlength=steps.count + 1)
    in_window = np.cumsum(cover[:-1]) > 0
    prefill, position = np.zeros(steps.count), np.zeros(steps.count)
    placement = Placement(np.zeros(0, dtype=int), np.zeros(0, dtype=int), np.zeros(0), np.zeros(0))
    duration_fit: dict[str, float] = {}
    previous: tuple[float, ...] = ()
    # the first fit times decoding alone, over the steps no prompt could have run in
    # (or, where few are, over the shorter half of the steps)
    alone = timed_steps & ~in_window
    if alone.sum() < MIN_TIMED_STEPS:
        alone = (
            timed_steps & (duration <= np.median(duration[timed_steps])) if timed_steps.any() else timed_steps
        )
    first_fit = alone if alone.sum() >= MIN_TIMED_STEPS else timed_steps
    if budget is not None:
        placement = _fill(budget.room(steps.decode), (1.0, 0.0), have, first, last, tokens, cached)
        prefill, position = placement.per_step(steps.count)
    for iteration in range(REFITS):  # refit the step-time model with the placement it implies
        fitting = first_fit if iteration == 0 else timed_steps
        fitted = _fit_duration(
            duration[fitting], steps.decode[fitting], prefill[fitting], position[fitting], context[fitting]
        )
        if previous and np.allclose(fitted, previous, rtol=1e-3, atol=1e-3):
            break  # the placement it implies is the one already made
        previous = fitted
        a, b, c, e, d = fitted
        duration_fit = dict(zip(STEP_TIME_TERMS, (v / 1e6 for v in fitted), strict=True))
        decoding = a + b * steps.decode + d * context
        prefilling = c * prefill + e * position
        if times_cold_steps:
            modelled = decoding + prefilling
            since = np.where(modelled > 0, np.maximum(earliest, steps.end - modelled), earliest)
            start[cold] = since[cold]
            duration = steps.end - start
        if budget is not None:
            continue  # the placement stands: the step times are refitted to it
        # prefill time under 1% of a step is the fit's float residue: no room
        timed = (
            prefill.any()
            and c + e > 0
            and float(prefilling[prefill > 0].mean()) >= 0.01 * float(np.median(duration))
        )
        room, unit = (
            (np.maximum(duration - decoding, 0.0), (c, e)) if timed else (np.zeros(steps.count), (1.0, 0.0))
        )
        if room.sum() < 0.5 * _prompt_time(tokens[have], cached[have], *unit).sum():
            room, unit = _room_in_tokens(room, unit, duration - decoding, decoding, in_window, need, iteration == 0)
        placement = _fill(room, unit, have, first, last, tokens, cached)
        prefill, position = placement.per_step(steps.count)
    return Placed(start, prefill, placement, duration_fit, budget.as_dict() if budget else {"by": "step time"})


@dataclass
class Placement:
    """Prefill entries: request, step, prompt tokens and their positions summed (thousands)."""

    req: np.ndarray
    step: np.ndarray
    tokens: np.ndarray
    position: np.ndarray

    def per_step(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Each step's prompt tokens and their positions."""
        return (
            np.bincount(self.step, weights=self.tokens, minlength=count),
            np.bincount(self.step, weights=self.position, minlength=count),
        )


def _room_in_tokens(
    room: np.ndarray,
    unit: tuple[float, float],
    extra: np.ndarray,
    decoding: np.ndarray,
    in_window: np.ndarray,
    need: float,
    first_placement: bool,
) -> tuple[np.ndarray, tuple[float, float]]:
    """Where the steps' time cannot hold the prompts: before any placement, and wherever every
    step at its token budget looks alike in time (the fit cannot tell base time from prompt
    tokens), the prompts themselves say what a step holds: all of them (``need`` tokens) over
    the steps they could have run in that ran longer (``extra``) than decoding alone explains
    (an engine fills a token budget, so a prompt's chunks are alike in tokens, not in time).
    The time's ``room`` where that would be less than any engine's budget."""
    long = in_window & (extra > LONG_STEP * np.maximum(decoding, 0.0))
    steps_for = long if first_placement and long.any() else in_window
    capacity = need / max(int(steps_for.sum()), 1)
    if capacity < MIN_STEP_BUDGET:
        return room, unit
    return np.where(steps_for, capacity, 0.0), (1.0, 0.0)


def _windows(
    start: np.ndarray, sent: np.ndarray, first_step: np.ndarray, tokens: np.ndarray, running: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The prompts to place (in order of their first tokens) and the steps each could have run
    in: from the first that started after it arrived and after any wait for a batch slot, to
    its first token's."""
    order = np.argsort(first_step, kind="stable")
    have = order[(first_step[order] >= 0) & (tokens[order] > 0)]
    last = first_step[have]
    # a batch limit shows as a ceiling the batch keeps reaching: no prompt ran in a step at it,
    # so a request whose first token came later waited for a slot until after the last such
    full = np.flatnonzero(running >= running.max()) if running.size else running.astype(int)
    if full.size < BATCH_CEILING_SHARE * start.size:
        full = full[:0]
    j = np.searchsorted(full, last)
    admitted = np.where(j > 0, full[np.maximum(j - 1, 0)] + 1, 0) if full.size else np.zeros_like(last)
    first = np.minimum(np.maximum(np.searchsorted(start, sent[have], side="left"), admitted), last)
    return have, first, last


def _prompt_time(
    tokens: np.ndarray, offset: np.ndarray, per_token: float, per_kposition: float
) -> np.ndarray:
    """Time (in the room's unit) to prefill ``tokens`` prompt tokens that start at position
    ``offset``: each costs ``per_token`` plus ``per_kposition`` per thousand positions before it."""
    return per_token * tokens + per_kposition * (tokens * offset + tokens * (tokens - 1) / 2) / 1000


def _tokens_within(time: np.ndarray, offset: float, per_token: float, per_kposition: float) -> np.ndarray:
    """The inverse of :func:`_prompt_time`: how many tokens from ``offset`` fit in ``time``."""
    quadratic = per_kposition / 2000
    linear = max(per_token + per_kposition * (offset - 0.5) / 1000, 1e-12)
    return 2 * time / (linear + np.sqrt(linear * linear + 4 * quadratic * time))


def _fill(
    room: np.ndarray,
    unit: tuple[float, float],
    have: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    tokens: np.ndarray,
    cached: np.ndarray,
) -> Placement:
    """The prompts ``have`` placed first come, first served into ``room`` (what each step has
    for prefill, in time or tokens as ``unit`` prices a token), each over steps ``first`` to
    ``last`` (its first token's), no earlier than the first-token step of the one before it."""
    per_token, per_kposition = unit
    used = np.zeros(room.size)
    reqs: list[int] = []
    where: list[int] = []
    parts: list[float] = []
    positions: list[float] = []
    served = -1  # where the prompt served before this one got its first token
    for i, lo, f in zip(have.tolist(), first.tolist(), last.tolist(), strict=True):
        lo = max(lo, min(served, f))
        served = f
        offset, total = float(cached[i]), float(tokens[i])
        if lo == f:  # one step to run in (most prompts): all of it there, without arrays
            used[f] += per_token * total + per_kposition * (total * offset + total * (total - 1) / 2) / 1000
            reqs.append(i)
            where.append(f)
            parts.append(total)
            positions.append(total * (offset + (total - 1) / 2) / 1000)
            continue
        window = np.arange(lo, f + 1)
        free = np.maximum(room[window] - used[window], 0.0)
        free[free < per_token + per_kposition * offset / 1000] = 0.0  # less than a token: full
        done = np.minimum(_tokens_within(np.cumsum(free), offset, per_token, per_kposition), total)
        done[-1] = total  # the first-token step takes whatever remains
        before = np.concatenate(([0.0], done[:-1]))
        take = done - before
        at = offset + before
        used[window] += _prompt_time(take, at, per_token, per_kposition)
        keep = take > 0
        reqs.extend([i] * int(keep.sum()))
        where.extend(window[keep].tolist())
        parts.extend(take[keep].tolist())
        positions.extend((take * (at + (take - 1) / 2) / 1000)[keep].tolist())
    return Placement(
        np.array(reqs, dtype=int),
        np.array(where, dtype=int),
        np.array(parts, dtype=float),
        np.array(positions, dtype=float),
    )


def _fit_duration(
    duration: np.ndarray, decode: np.ndarray, prefill: np.ndarray, position: np.ndarray, context: np.ndarray
) -> tuple[float, float, float, float, float]:
    """Step time = a + b·decoders + c·prefill tokens + e·their positions + d·context read, all
    non-negative (least squares): attention reads every decoder's KV cache, and every prompt
    token the tokens before it, so long contexts and long prompts make long steps.

    The position term is kept only where it explains the steps' times clearly better: with
    few prefill steps it can fit any split of a prompt between them, and the placement it
    implies then agrees with it whatever the truth."""
    if duration.size < MIN_TIMED_STEPS:
        return float(np.median(duration)) if duration.size else 0.0, 0.0, 0.0, 0.0, 0.0
    columns = np.column_stack((np.ones_like(duration), decode, prefill, position, context))
    without_position = [0, 1, 2, 4]
    coef = np.zeros(5)
    coef[without_position], simple_rss = nnls(columns[:, without_position], duration)
    if (prefill > 0).sum() >= 2 * MIN_TIMED_STEPS:
        rich, rich_rss = nnls(columns, duration)
        if rich_rss**2 < (1 - POSITION_GAIN) * simple_rss**2:
            coef = rich
    a, b, c, e, d = (float(v) for v in coef)
    return a, b, c, e, d
