"""What each request did, as weight densities for the split: per request and inferred step its
work, spread over its part of the step.

Placements of the same work: token work in the inferred steps (prefill spread as the steps'
time says), each prompt's prefill all in its first token's step (one end of the band), and a
fitted power model's share of each step as the meter saw it (the default).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl
from scipy import sparse

from .model import PowerModel
from .padding import CaptureSizes
from .split import Segments, StepShares, safe_div, sorted_runs
from .stepcost import entry_features
from .steps import ChunkGroups, Steps, computed_prompt_tokens, steps_of


def last_step_segments(requests: pl.DataFrame, steps: np.ndarray) -> Segments:
    """Prefill work (prompt tokens, weighed later, + the first token) all over the engine step
    that ended with the first token, then each step's tokens over the gap since the previous
    step that brought the request any (``steps``: the bursts' first arrivals, where the steps
    end): one of the placements the band spans. Cut at the bursts, not at each stream's read
    of them: a cut at every read made the timeline's pieces ten times the steps."""
    sent = requests.get_column("sent_ns").to_numpy().astype(float)
    end = requests.get_column("end_ns").to_numpy().astype(float)
    prompt = requests.select(computed_prompt_tokens()).to_series().to_numpy().astype(float)
    groups = ChunkGroups.of(requests, steps)
    g_req, opens = groups.req, groups.opens
    g_end = steps[groups.step] if steps.size else np.zeros(0)
    # the burst before the one holding the first token ended the previous step
    first_sent = sent[g_req[opens]]
    k = groups.step[opens] - 1
    g_start = np.concatenate(([0.0], g_end[:-1]))[: g_end.size]
    g_start[opens] = np.where(k >= 0, np.maximum(first_sent, steps[np.maximum(k, 0)]), first_sent)
    g_prompt = np.where(opens, prompt[g_req], 0.0)
    # a request with no chunk is busy all its window (a prompt of no computed tokens still is)
    silent = np.flatnonzero(np.bincount(g_req, minlength=requests.height) == 0)
    r = np.concatenate((g_req, silent))
    s = np.concatenate((g_start, sent[silent]))
    e = np.concatenate((g_end, end[silent]))
    w = np.concatenate((groups.tokens, np.full(silent.size, 1e-9)))
    p = np.concatenate((g_prompt, prompt[silent]))
    dur = e - s
    ok = dur > 0
    return Segments(r.astype(np.int64)[ok], s[ok], e[ok], w[ok] / dur[ok], p[ok] / dur[ok])


@dataclass
class Work:
    """What the requests did, as the client saw it: the same for every meter."""

    steps: Steps  # the engine steps inferred from the token bursts
    last_step: Segments  # each prompt's prefill all in its first token's step
    placed: Segments  # the tokens rule's work in the inferred steps (chunked prefill spread)

    _features: dict[str, np.ndarray] = field(default_factory=dict)

    def features(self, context_cost: str) -> np.ndarray:
        """Each (request, step) entry's units of every step cost (:func:`.stepcost.entry_features`),
        made once: the same for every meter and every split of the band."""
        if context_cost not in self._features:
            self._features[context_cost] = entry_features(self.steps, context_cost)
        return self._features[context_cost]

    @classmethod
    def of(cls, requests: pl.DataFrame, capture_sizes: CaptureSizes | None = None) -> Work:
        """The steps the requests' token arrivals imply, and the work in them."""
        return cls.over(requests, steps_of(requests, capture_sizes))

    @classmethod
    def over(cls, requests: pl.DataFrame, steps: Steps) -> Work:
        """The requests' work in ``steps`` (inferred, or an engine's own log)."""
        return cls(steps, last_step_segments(requests, steps.end), _step_segments(requests, steps))


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
    of a step by convention v2: of the step's power, the per-step part (``step_w``) equally
    among the requests in the step, the part that grows with work by work."""
    entry_work = model.entry_work(steps)
    work = steps.per_step(entry_work)
    power = model.dynamic_w(work)
    seen = (seconds_seen @ sparse.diags(power)).tocsr()
    # the per-step part of the step's power, its share kept where a cap clips both alike
    raw = model.step_w * (work > 0) + model.scale_w * np.power(np.maximum(work, 0.0), model.exponent)
    fixed = safe_div(model.step_w * (work > 0), raw)[steps.step]
    by_work = safe_div(entry_work, work[steps.step])
    return StepShares(seen, steps.req, steps.step, fixed * per_request(steps) + (1.0 - fixed) * by_work)


def per_request(steps: Steps) -> np.ndarray:
    """Per entry, its part of an equal share among the step's requests (a request that both
    decoded and prefilled in a step has two entries, which split its one share)."""
    pair = steps.step.astype(np.int64) * (int(steps.req.max(initial=0)) + 1) + steps.req
    order, opens = sorted_runs(pair)
    group = np.cumsum(opens) - 1
    entries = np.bincount(group)
    inverse = np.empty(pair.size, dtype=np.int64)
    inverse[order] = group
    requests = np.bincount(steps.step[order[opens]], minlength=steps.count).astype(float)
    return 1.0 / (requests[steps.step] * entries[inverse])
