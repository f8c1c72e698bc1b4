"""Engine steps inferred from what the client saw, and each request's work in them.

A continuous-batching server emits a token for every running sequence at the end of each
step, so token arrivals across all streams come in bursts, one per step. A request decodes in
each step whose burst brings it a token, and prefills its computed prompt tokens (prompt less
what the prefix cache held) in the steps before its first token: under a per-step token
budget, a long prompt takes several steps, and those steps run longer than their decoding
alone explains. The prompts are placed first come, first served in each step's room: the
engine's token budget where one explains the first tokens, else the time the steps took beyond
decoding (:mod:`.placement`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from .._clock import NS
from ..records import CHARS_PER_TOKEN
from .padding import CaptureSizes, decode_graph
from .placement import place_prefill
from .split import distinct, safe_div

# The shortest steps, as a low percentile of inter-token latency rather than its least: a
# stream whose reads fell behind catches up with near-zero gaps (well under 0.1% of them in
# our runs), and a burst split at those would cut every step apart.
SHORT_STEP_PERCENTILE = 2.0


def step_starts(requests: pl.DataFrame, split: float = 0.5) -> np.ndarray:
    """Client-side times at which the server's engine steps delivered tokens.

    A continuous-batching server emits one token for every running sequence at the end of each
    step, so token arrivals across all requests come in bursts; a burst starts where arrivals
    pause for more than ``split`` × the shortest step, the inter-token latency's
    ``SHORT_STEP_PERCENTILE``-th percentile. (Half the *median* step merged a short decode step
    into the next one wherever most steps carried a long prefill.)
    """
    arrivals = distinct(requests.get_column("chunk_ns").explode().drop_nulls().to_numpy().astype(float))
    if arrivals.size == 0:
        return arrivals
    itl = requests.get_column("itl_s").explode().drop_nulls().to_numpy()
    itl = itl[itl > 0]
    pause = split * float(np.percentile(itl, SHORT_STEP_PERCENTILE)) * NS if itl.size else 0.0
    return arrivals[np.concatenate(([True], np.diff(arrivals) > pause))]


def prompt_tokens() -> pl.Expr:
    """A request's prompt tokens: the server's count, or where it reported none (no usage in
    the stream) its prompt's characters over :data:`ipw_async.records.CHARS_PER_TOKEN`. Unreported is not an
    empty prompt: counted as none, its prefill would be charged to whoever decoded then."""
    return pl.col("prompt_tokens").fill_null(pl.col("prompt").str.len_chars() // CHARS_PER_TOKEN).fill_null(0)


def estimated_prompts(requests: pl.DataFrame) -> int:
    """How many requests' prompt tokens :func:`prompt_tokens` estimated from their text."""
    return int(
        requests.select((pl.col("prompt_tokens").is_null() & pl.col("prompt").is_not_null()).sum()).item()
    )


def computed_prompt_tokens() -> pl.Expr:
    """Prompt tokens the server computed: those its prefix cache held were never prefilled."""
    return prompt_tokens() - pl.col("cached_prompt_tokens").fill_null(0)


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
    placement: dict[str, object] = field(default_factory=dict)  # how the prompts were placed
    # per step, a padded decode graph's rows and attention length (:mod:`.padding`)
    padded_rows: np.ndarray = field(default_factory=lambda: np.zeros(0))
    padded_length: np.ndarray = field(default_factory=lambda: np.zeros(0))
    graph: dict[str, Any] = field(default_factory=dict)  # the padding chosen, and why
    _first_decoders: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def count(self) -> int:
        return self.start.size

    def per_step(self, entry_values: np.ndarray) -> np.ndarray:
        """An entry feature summed over each step's entries."""
        return np.bincount(self.step.astype(np.int64), weights=entry_values, minlength=self.count)

    def first_decoders(self) -> np.ndarray:
        """Each step's first decoding entry (steps with none have none), found once: every
        step cost and both readings of the context start from it."""
        if self._first_decoders is None:
            decoding = self.entry_decode > 0
            _, head = np.unique(np.where(decoding, self.step, -1), return_index=True)
            self._first_decoders = head[decoding[head]]
        return self._first_decoders

    @property
    def padded_decode(self) -> np.ndarray:
        """Per step, its decode work in the rows its graph ran: the padded rows where a
        padding was replayed and the step decoded, else its decode tokens."""
        if not self.padded_rows.size:
            return self.decode
        return np.where(self.decode > 0, self.padded_rows, self.decode)

    @property
    def entry_padded(self) -> np.ndarray:
        """Per entry, its part of its step's padded rows: the rows shared by its decode tokens
        (convention v2: a padded row is the step's, whatever request it pads for)."""
        return self.entry_decode * safe_div(self.padded_decode, self.decode)[self.step]

    @property
    def context(self) -> np.ndarray:
        """Thousands of context tokens the step's decoders read."""
        return self.per_step(self.entry_context) if self.entry_context.size else np.zeros(self.count)

    @property
    def position(self) -> np.ndarray:
        """The step's prefill tokens' positions summed, in thousands."""
        return self.per_step(self.entry_position) if self.entry_position.size else np.zeros(self.count)


def steps_of(requests: pl.DataFrame, capture_sizes: CaptureSizes | None = None) -> Steps:
    """The engine steps the requests' token arrivals imply, with their computed prompts placed
    and their decode graphs padded to ``capture_sizes`` (None: the step times choose)."""
    computed = requests.select(computed_prompt_tokens()).to_series().to_numpy().astype(float)
    prompt = requests.select(prompt_tokens()).to_series().to_numpy().astype(float)
    return infer_steps(requests, step_starts(requests), computed, prompt, capture_sizes)


def infer_steps(
    requests: pl.DataFrame,
    bursts: np.ndarray,
    prefill_tokens: np.ndarray,
    prompt_tokens: np.ndarray | None = None,
    capture_sizes: CaptureSizes | None = None,
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
    cold = ~np.concatenate(([False], _busy_after(end, step_idx, sent, first_step)[:-1]))
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
    placed = place_prefill(steps, sent, first_step, prefill_tokens, prompt - prefill_tokens, cold, running)
    steps.start, steps.prefill, steps.duration_fit = placed.start, placed.prefill, placed.duration_fit
    steps.placement = placed.by
    entries = placed.entries
    steps.req = np.concatenate((steps.req, entries.req))
    steps.step = np.concatenate((steps.step, entries.step))
    steps.entry_decode = np.concatenate((steps.entry_decode, np.zeros(entries.req.size)))
    steps.entry_prefill = np.concatenate((np.zeros(steps.entry_prefill.size), entries.tokens))
    steps.entry_context = np.concatenate((steps.entry_context, np.zeros(entries.req.size)))
    steps.entry_position = np.concatenate((steps.entry_position, entries.position))
    # a step ran while one of its requests was on the server: none had arrived, none was served
    arrived = np.full(n_steps, np.inf)
    np.minimum.at(arrived, steps.step, sent[steps.req])
    steps.start = np.where(np.isfinite(arrived), np.clip(arrived, steps.start, steps.end), steps.start)
    steps.padded_rows, steps.padded_length, steps.graph = decode_graph(steps, sent, capture_sizes)
    return steps


def _busy_after(
    end: np.ndarray, decode_step: np.ndarray, sent: np.ndarray, first_step: np.ndarray
) -> np.ndarray:
    """Per step, whether the engine had work left when it ended: a request decoded in it, or one
    had arrived that still awaited its first token (its prompt, or the rest of it, to run). A
    step that only finished prompts has no decoders, yet the engine went straight on to the
    prompts behind them; taking the next step for one after idle moved its start to what the
    step-time fit says, and the prompt tokens it ran with it."""
    busy = np.zeros(end.size + 1)
    busy[np.asarray(decode_step, dtype=int)] = 1.0
    # a request sent at s awaits its first token (step f) at the end of steps k, end[k] > s, k < f
    waiting = first_step >= 0
    lo = np.searchsorted(end, sent[waiting], side="right")
    hi = first_step[waiting]
    spans = lo < hi
    pending = np.zeros(end.size + 1)
    np.add.at(pending, lo[spans], 1.0)
    np.add.at(pending, hi[spans], -1.0)
    return (busy[:-1] > 0) | (np.cumsum(pending)[:-1] > 0)


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
