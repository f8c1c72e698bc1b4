"""What a decode graph over padded buckets ran, replayed from what the client saw.

Engines that decode as CUDA graphs captured at a few batch sizes keep each running request in
a KV slot and run a graph over the slots up to the highest one decoding, padded to the next
captured size, at an attention length the batch's longest context sets, padded likewise (the
H100 server of the real traces; the simulator's ``--padded-buckets``). A padded row costs what
a real one does, so one decoder left in slot 100 makes a step cost what 128 rows do, and a
step's cost follows neither its decoders nor its time closely: host work sets much of a step's
time (on the real Poisson H100 run, step times explained the meter's intervals at R² 0.61,
the buckets at 0.83).

The client sees every request's first and last step, which is what slots are allocated by: a
request takes the lowest free slot when its first step runs (its prompt's first chunk, first
come first served) and frees it after its last. Replaying that from the inferred steps
reproduces the real server's padded batch and attention bucket in every one of its steps.
An engine that keeps its batch dense (moving requests down into the rows finished ones left)
pads only its decoders' count, which the replay's highest slot can exceed: there the fit,
beside a cost per decoded token and per second, gives these costs what the meter shows.
"""

from __future__ import annotations

import heapq
from typing import Protocol

import numpy as np

FIRST_LENGTH_BUCKET = 128  # the shortest attention length a padded decode graph runs


class StepEntries(Protocol):
    """What the replay needs of the steps: each (request, step) entry, its decode tokens and
    the context they read (thousands of tokens)."""

    req: np.ndarray
    step: np.ndarray
    entry_decode: np.ndarray
    entry_context: np.ndarray

    @property
    def count(self) -> int: ...


def bucket(n: np.ndarray, first: float) -> np.ndarray:
    """The smallest of ``first``, 2·``first``, 4·``first``, … that holds each ``n`` (0 where
    ``n`` is 0: no graph ran)."""
    return np.where(n > 0, first * 2.0 ** np.ceil(np.log2(np.maximum(n, first) / first)), 0.0)


def padded_buckets(steps: StepEntries, admitted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the rows its decode graph ran (slots 0 to the highest decoding one, padded to
    a power of two) and the attention length (the longest decoding context, padded to a power
    of two from :data:`FIRST_LENGTH_BUCKET`); 0 where no request decoded. ``admitted`` orders
    requests that first ran in the same step (their send times)."""
    rows, length = np.zeros(steps.count), np.zeros(steps.count)
    if steps.req.size == 0:
        return rows, length
    n = int(steps.req.max()) + 1
    first = np.full(n, steps.count)
    last = np.full(n, -1)
    np.minimum.at(first, steps.req, steps.step)
    np.maximum.at(last, steps.req, steps.step)
    ran = np.flatnonzero(last >= 0)
    arrivals = ran[np.lexsort((admitted[ran], first[ran]))]
    departures = ran[np.argsort(last[ran], kind="stable")]
    slot = np.zeros(n, dtype=int)
    free: list[int] = []
    opened = 0  # slots ever used: the next new one
    leaving = 0
    for i in arrivals.tolist():
        k = int(first[i])
        while leaving < departures.size and last[departures[leaving]] < k:
            heapq.heappush(free, int(slot[departures[leaving]]))
            leaving += 1
        if free:
            slot[i] = heapq.heappop(free)
        else:
            slot[i], opened = opened, opened + 1
    decoding = steps.entry_decode > 0
    step = steps.step[decoding]
    np.maximum.at(rows, step, slot[steps.req[decoding]] + 1.0)
    # an entry's context is summed over its decode tokens: its mean token's reach
    reach = steps.entry_context[decoding] * 1000 / steps.entry_decode[decoding]
    np.maximum.at(length, step, reach)
    return bucket(rows, 1.0), bucket(length, FIRST_LENGTH_BUCKET)
