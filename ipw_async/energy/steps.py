"""Engine steps inferred from what the client saw, and each request's work in them.

A continuous-batching server emits a token for every running sequence at the end of each
step, so token arrivals across all streams come in bursts, one per step. A request decodes in
each step whose burst brings it a token, and prefills its computed prompt tokens (prompt less
what the prefix cache held) in the steps before its first token: under a per-step token
budget, a long prompt takes several steps, and those steps run longer than their decoding
alone explains. So step times are fitted as ``a + b·decoders + c·prefill tokens`` and the
prompts are placed first come, first served in the room the steps' extra time leaves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl
from scipy.optimize import nnls

from .._clock import NS

MIN_TIMED_STEPS = 4  # fewer steps of known length than this fit no step-time model
# Fewer prompt tokens a step than this is no engine's budget (vLLM's and llama.cpp's are in
# the thousands): steps that show no prefill time then did their prompts' work cheaply, in the
# step of each first token, rather than all running at a budget.
MIN_STEP_BUDGET = 64
# The shortest steps, as a low percentile of inter-token latency rather than its least: a
# stream whose reads fell behind catches up with near-zero gaps (well under 0.1% of them in
# our runs), and a burst split at those would cut every step apart.
SHORT_STEP_PERCENTILE = 2.0
# The batch's peak is a server's batch limit where at least this share of the steps ran at it
# (once or twice at the peak is only where load was highest).
BATCH_CEILING_SHARE = 0.05
# Refits of the step-time model with the placement it implies, at most
REFITS = 8
# A step longer than decoding alone by this share may have run prompt tokens
LONG_STEP = 0.05
# A step-time term for prompt positions must cut the squared error of step times by this share
POSITION_GAIN = 0.05


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
    # per entry, in thousands of tokens: the context its decode tokens read (prompt and tokens
    # so far: attention reads the whole KV cache), and the positions of its prefill tokens summed
    entry_context: np.ndarray = field(default_factory=lambda: np.zeros(0))
    entry_position: np.ndarray = field(default_factory=lambda: np.zeros(0))
    duration_fit: dict[str, float] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return self.start.size

    def per_step(self, entry_values: np.ndarray) -> np.ndarray:
        """An entry feature summed over each step's entries."""
        return np.bincount(self.step.astype(np.int64), weights=entry_values, minlength=self.count)

    @property
    def context(self) -> np.ndarray:
        """Thousands of context tokens the step's decoders read."""
        return self.per_step(self.entry_context) if self.entry_context.size else np.zeros(self.count)

    @property
    def position(self) -> np.ndarray:
        """The step's prefill tokens' positions summed, in thousands."""
        return self.per_step(self.entry_position) if self.entry_position.size else np.zeros(self.count)


def steps_of(requests: pl.DataFrame) -> Steps:
    """The engine steps the requests' token arrivals imply, with their computed prompts placed."""
    computed = requests.select(computed_prompt_tokens()).to_series().to_numpy().astype(float)
    prompt = requests.get_column("prompt_tokens").fill_null(0).to_numpy().astype(float)
    return infer_steps(requests, step_starts(requests), computed, prompt)


def infer_steps(
    requests: pl.DataFrame,
    bursts: np.ndarray,
    prefill_tokens: np.ndarray,
    prompt_tokens: np.ndarray | None = None,
) -> Steps:
    """Steps from burst times (:func:`step_starts`), with decode and prefill placed in them
    (``prompt_tokens``, cached ones too, say where each context and prefill position starts)."""
    n_steps = bursts.size
    prompt = prefill_tokens if prompt_tokens is None else np.maximum(prompt_tokens, prefill_tokens)
    if n_steps == 0:  # no token arrived: no step can be told apart
        empty = np.zeros(0)
        return Steps(
            empty, empty, empty, empty, empty.astype(int), empty.astype(int), empty, empty, empty, empty
        )
    end = bursts.astype(float)
    gaps = np.diff(end)
    # a lone step began when its first request arrived (set below)
    typical = float(np.median(gaps)) if gaps.size else np.inf
    start = np.concatenate(([end[0] - typical], end[:-1]))
    sent = requests.get_column("sent_ns").to_numpy().astype(float)
    req_idx, step_idx, dec, ctx, first_step, running = _decode_entries(requests, end, prompt)
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
        np.asarray(ctx, dtype=float),
        np.zeros(len(dec)),
    )
    _place_prefill(steps, sent, first_step, prefill_tokens, prompt - prefill_tokens, cold, running)
    # a step ran while one of its requests was on the server: none had arrived, none was served
    arrived = np.full(n_steps, np.inf)
    np.minimum.at(arrived, steps.step, sent[steps.req])
    steps.start = np.where(np.isfinite(arrived), np.clip(arrived, steps.start, steps.end), steps.start)
    return steps


def _place_prefill(
    steps: Steps,
    sent: np.ndarray,
    first_step: np.ndarray,
    tokens: np.ndarray,
    cached: np.ndarray,
    cold: np.ndarray,
    running: np.ndarray,
) -> None:
    """Each prompt in the room the steps' extra time (over decode alone) leaves, first come,
    first served as the engines we know schedule prefill (vLLM, SGLang, TGI): prompts in the
    order of their first tokens, each from the first step after its arrival, and no earlier
    than the first-token step of the prompt served before it nor than the last step before it
    at the batch's ceiling (a request queued for a batch slot does no work), taking what room
    earlier prompts left, its first-token step taking whatever remains. A prompt token's time
    grows with its position (attention over the tokens before it), so a long prompt's later
    chunks fill a step's room with fewer tokens. A ``cold`` step (the engine idle before it)
    lasts what the step-time fit says its work takes, within the time since its first request
    arrived.

    (Spreading a prompt over all its wait in proportion to the room put much of it in steps
    that were busy with the prompts queued ahead of it.) ``cached`` prompt tokens come first
    in each prompt: its computed tokens' positions start after them."""
    context = steps.context
    earliest = steps.start.copy()
    duration = steps.end - steps.start
    timed_steps = np.isfinite(duration) & (duration > 0) & ~cold  # a cold step's start is a guess
    times_cold_steps = timed_steps.sum() >= MIN_TIMED_STEPS  # else the fit is a median, no model
    order = np.argsort(first_step, kind="stable")
    have = order[(first_step[order] >= 0) & (tokens[order] > 0)]
    last = first_step[have]
    need = float(tokens[have].sum())
    # a request joins the batch at the first step that starts after it arrived
    # a batch limit shows as a ceiling the batch keeps reaching: no prompt ran in a step at it,
    # so a request whose first token came later waited for a slot until after the last such
    full = np.flatnonzero(running >= running.max()) if running.size else running.astype(int)
    if full.size < BATCH_CEILING_SHARE * steps.count:
        full = full[:0]
    j = np.searchsorted(full, last)
    admitted = np.where(j > 0, full[np.maximum(j - 1, 0)] + 1, 0) if full.size else np.zeros_like(last)
    first = np.minimum(np.maximum(np.searchsorted(steps.start, sent[have], side="left"), admitted), last)
    # steps some prompt could have been prefilled in
    cover = np.bincount(first, minlength=steps.count + 1) - np.bincount(last + 1, minlength=steps.count + 1)
    in_window = np.cumsum(cover[:-1]) > 0
    prefill, position = np.zeros(steps.count), np.zeros(steps.count)
    placement = _Placement(np.zeros(0, dtype=int), np.zeros(0, dtype=int), np.zeros(0), np.zeros(0))
    previous: tuple[float, ...] = ()
    # the first fit times decoding alone, over the steps no prompt could have run in
    # (or, where few are, over the shorter half of the steps)
    alone = timed_steps & ~in_window
    if alone.sum() < MIN_TIMED_STEPS:
        alone = (
            timed_steps & (duration <= np.median(duration[timed_steps])) if timed_steps.any() else timed_steps
        )
    first_fit = alone if alone.sum() >= MIN_TIMED_STEPS else timed_steps
    for iteration in range(REFITS):  # refit the step-time model with the placement it implies
        fitting = first_fit if iteration == 0 else timed_steps
        fitted = _fit_duration(
            duration[fitting], steps.decode[fitting], prefill[fitting], position[fitting], context[fitting]
        )
        if previous and np.allclose(fitted, previous, rtol=1e-3, atol=1e-3):
            break  # the placement it implies is the one already made
        previous = fitted
        a, b, c, e, d = fitted
        steps.duration_fit = {
            "base_ms": a / 1e6,
            "per_decode_ms": b / 1e6,
            "per_prefill_token_ms": c / 1e6,
            "per_position_ktoken_ms": e / 1e6,
            "per_context_ktoken_ms": d / 1e6,
        }
        decoding = a + b * steps.decode + d * context
        prefilling = c * prefill + e * position
        if times_cold_steps:
            modelled = decoding + prefilling
            since = np.where(modelled > 0, np.maximum(earliest, steps.end - modelled), earliest)
            steps.start[cold] = since[cold]
            duration = steps.end - steps.start
        # prefill time under 1% of a step is the fit's float residue: no room
        timed = (
            prefill.any()
            and c + e > 0
            and float(prefilling[prefill > 0].mean()) >= 0.01 * float(np.median(duration))
        )
        room, unit = (
            (np.maximum(duration - decoding, 0.0), (c, e)) if timed else (np.zeros(steps.count), (1.0, 0.0))
        )
        # Before any placement, and wherever every step at its token budget looks alike in time
        # (the fit cannot tell base time from prompt tokens, and the steps' room cannot hold
        # the prompts), the prompts themselves say what a step holds: all of them over the
        # steps they could have run in that ran longer than decoding alone explains (an engine
        # fills a token budget, so a prompt's chunks are alike in tokens, not in time).
        long = in_window & (duration - decoding > LONG_STEP * np.maximum(decoding, 0.0))
        steps_for = long if iteration == 0 and long.any() else in_window
        capacity = need / max(int(steps_for.sum()), 1)
        if (
            room.sum() < 0.5 * _prompt_time(tokens[have], cached[have], *unit).sum()
            and capacity >= MIN_STEP_BUDGET
        ):
            room, unit = np.where(steps_for, capacity, 0.0), (1.0, 0.0)
        placement = _fill(room, unit, have, first, last, tokens, cached)
        prefill = np.bincount(placement.step, weights=placement.tokens, minlength=steps.count)
        position = np.bincount(placement.step, weights=placement.position, minlength=steps.count)
    steps.prefill = prefill
    steps.req = np.concatenate((steps.req, placement.req))
    steps.step = np.concatenate((steps.step, placement.step))
    steps.entry_decode = np.concatenate((steps.entry_decode, np.zeros(placement.req.size)))
    steps.entry_prefill = np.concatenate((np.zeros(steps.entry_prefill.size), placement.tokens))
    steps.entry_context = np.concatenate((steps.entry_context, np.zeros(placement.req.size)))
    steps.entry_position = np.concatenate((steps.entry_position, placement.position))


@dataclass
class _Placement:
    """Prefill entries: request, step, prompt tokens and their positions summed (thousands)."""

    req: np.ndarray
    step: np.ndarray
    tokens: np.ndarray
    position: np.ndarray


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
) -> _Placement:
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
    return _Placement(
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


@dataclass
class ChunkGroups:
    """The token chunks of every request grouped by the step (burst) that brought them, in
    request then time order: per group its request, step, tokens, and whether it is the
    request's first (the one with the first token)."""

    req: np.ndarray
    step: np.ndarray
    tokens: np.ndarray
    opens: np.ndarray

    @classmethod
    def of(cls, requests: pl.DataFrame, bursts: np.ndarray) -> ChunkGroups:
        """All requests at once: a loop per request was a third of finalizing 100,000 of them."""
        lengths = requests.get_column("chunk_ns").list.len().fill_null(0).to_numpy()
        times = requests.get_column("chunk_ns").explode().drop_nulls().to_numpy().astype(float)
        tokens = requests.get_column("chunk_tokens").explode().drop_nulls().to_numpy().astype(float)
        req = np.repeat(np.arange(requests.height), lengths)
        k = np.clip(np.searchsorted(bursts, times, side="right") - 1, 0, max(bursts.size - 1, 0))
        # chunks come in time order within a request: one group per (request, step), in order
        new = np.concatenate(([True], (req[1:] != req[:-1]) | (k[1:] != k[:-1]))) if req.size else req > 0
        heads = np.flatnonzero(new)
        group_req = req[heads]
        per_group = np.add.reduceat(tokens, heads) if heads.size else np.zeros(0)
        opens = np.concatenate(([True], group_req[1:] != group_req[:-1])) if heads.size else new[:0]
        return cls(group_req, k[heads], per_group, opens)


def _decode_entries(
    requests: pl.DataFrame, end: np.ndarray, prompt: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per (request, step) with decode tokens: request, step, tokens and the context they read
    (thousands of tokens); per request its first token's step (-1: none); per step the requests
    that got a token in it (the batch, less multi-step prompts)."""
    groups = ChunkGroups.of(requests, end)
    group_req, group_step, opens = groups.req, groups.step, groups.opens
    first_step = np.full(requests.height, -1)
    first_step[group_req[opens]] = group_step[opens]
    running = np.bincount(group_step, minlength=end.size).astype(float)
    # the first token comes with the prefill; tokens after it are decode work
    per_group = groups.tokens - opens
    # a decode token reads the prompt, the first token and every token decoded before it
    done = np.cumsum(per_group) - per_group
    before = prompt[group_req] + 1.0 + done - np.maximum.accumulate(np.where(opens, done, 0.0))
    keep = per_group > 0
    decode = per_group[keep]
    context = decode * (before[keep] + (decode - 1) / 2) / 1000
    return group_req[keep], group_step[keep], decode, context, first_step, running
