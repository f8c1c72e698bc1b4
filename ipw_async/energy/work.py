"""What each request did, as weight densities for the split: per request and inferred step its
work, spread over its part of the step.

Placements of the same work: token work in the inferred steps (prefill spread as the steps'
time says), each prompt's prefill all in its first token's step (one end of the band), and a
fitted power model's share of each step as the meter saw it (the default).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy import sparse

from .model import PowerModel
from .split import Segments, StepShares, safe_div
from .steps import Steps, computed_prompt_tokens, steps_of


def last_step_segments(requests: pl.DataFrame, steps: np.ndarray) -> Segments:
    """Prefill work (prompt tokens, weighed later, + the first token) all over the engine step
    (``steps``: their start times) that ended with the first token, then each chunk's tokens
    over the gap since the previous chunk: one of the placements the band spans."""
    reqs, starts, ends, weights, prompts = [], [], [], [], []
    cols = requests.select("sent_ns", "end_ns", "chunk_ns", "chunk_tokens", computed_prompt_tokens())
    for i, (sent, end, chunks, tokens, prompt) in enumerate(cols.iter_rows()):
        if chunks:
            # the burst before the one holding the first token ended the previous step
            k = int(np.searchsorted(steps, chunks[0], side="right")) - 2
            if k >= 0:
                sent = max(sent, steps[k])
        if not chunks:
            reqs.append(i)
            starts.append(sent)
            ends.append(end)
            weights.append(1e-9)  # so a prompt of no computed tokens still marks the request busy
            prompts.append(float(prompt))
            continue
        # chunks stamped in the same read arrived together: their tokens share one gap
        uniq, inverse = np.unique(np.asarray(chunks, dtype=float), return_inverse=True)
        tok_u = np.bincount(inverse, weights=np.asarray(tokens, dtype=float))
        reqs.extend([i] * uniq.size)
        starts.extend([sent, *uniq[:-1].tolist()])
        ends.extend(uniq.tolist())
        weights.extend(tok_u.tolist())
        prompts.extend([float(prompt), *[0.0] * (uniq.size - 1)])
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    w = np.asarray(weights, dtype=float)
    p = np.asarray(prompts, dtype=float)
    dur = e - s
    ok = dur > 0
    return Segments(np.asarray(reqs, dtype=np.int64)[ok], s[ok], e[ok], w[ok] / dur[ok], p[ok] / dur[ok])


@dataclass
class Work:
    """What the requests did, as the client saw it: the same for every meter."""

    steps: Steps  # the engine steps inferred from the token bursts
    last_step: Segments  # each prompt's prefill all in its first token's step
    placed: Segments  # the tokens rule's work in the inferred steps (chunked prefill spread)

    @classmethod
    def of(cls, requests: pl.DataFrame) -> Work:
        steps = steps_of(requests)
        placed = _step_segments(requests, steps)
        return cls(steps, last_step_segments(requests, steps.end), placed)


def _step_segments(requests: pl.DataFrame, steps: Steps) -> Segments:
    """One segment per request and inferred step, inside the request's own window (a step may
    have begun before the request was sent), with its decode and prefill work over it."""
    sent = requests.get_column("sent_ns").to_numpy().astype(float)[steps.req]
    until = requests.get_column("end_ns").to_numpy().astype(float)[steps.req]
    start = np.maximum(steps.start[steps.step], sent)
    end = np.minimum(steps.end[steps.step], until)
    decode, prefill = steps.entry_decode, steps.entry_prefill
    ok = (end > start) & ((decode > 0) | (prefill > 0))
    dur = np.where(ok, end - start, 1.0)
    return Segments(steps.req[ok], start[ok], end[ok], (decode / dur)[ok], (prefill / dur)[ok])


def step_shares(steps: Steps, model: PowerModel, seconds_seen: sparse.csr_matrix) -> StepShares:
    """A power model's split of the steps (``seconds_seen``: the meter's design for the model's
    lag): each step's modelled dynamic energy in each meter interval, and each request's share
    of a step, its work over the step's (a step's own cost goes by the same shares)."""
    entry_work = model.entry_work(steps)
    work = steps.per_step(entry_work)
    seen = (seconds_seen @ sparse.diags(model.dynamic_w(work))).tocsr()
    return StepShares(seen, steps.req, steps.step, safe_div(entry_work, work[steps.step]))
