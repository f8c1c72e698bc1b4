"""What a decode graph over padded buckets ran, replayed from what the client saw.

Engines that decode as CUDA graphs run each step's batch padded to the next batch size they
captured a graph at (vLLM's ``cudagraph_capture_sizes``: 1, 2, 4 and multiples of 8 by
default; a power of two on the H100 server of the real traces and the simulator's default).
A padded row costs what a real one does, so a step's cost follows neither its decoders nor
its time closely: host work sets much of a step's time (on the real Poisson H100 run, step
times explained the meter's intervals at R² 0.61, the buckets at 0.83).

Which rows a step pads depends on how the engine lays out its batch:

- ``slots``: each running request keeps a KV slot and a step runs a graph over the slots up to
  the highest one decoding, at an attention length the batch's longest context sets, padded
  likewise (the H100 server of the real traces). The client sees every request's first and last
  step, which is what slots are allocated by: a request takes the lowest free slot when its
  first step runs (first come first served) and frees it after its last. Replaying that from
  the inferred steps reproduces the real server's padded batch and attention bucket in every
  one of its steps.
- ``dense``: the engine moves requests down into the rows finished ones left (vLLM's and
  SGLang's persistent batch), so a step pads its decoders' count.

The user may name the capture sizes (``--capture-sizes``); otherwise, and for the layout
always, :func:`decode_graph` takes the candidate whose padded rows explain the decode steps'
times best (thousands of steps, where the meter's intervals are few: on the real c128 and
Poisson runs powers of two over slots left an RMS residual 3.1× and 4.9× smaller than vLLM's
sizes), and says which and why. Where the step times cannot tell the candidates apart (a batch that
never passed 8 rows pads alike under each), the padding does not matter to the split either,
and slots with powers of two are kept.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

FIRST_LENGTH_BUCKET = 128  # the shortest attention length a padded decode graph runs
# Fewer decode steps than this cannot tell one padding from another: slots and powers of two then
MIN_DECODE_STEPS = 30
# A candidate displaces the default only where it explains the step times better by this much
# of the Bayesian information criterion (very strong evidence on Kass and Raftery's scale) and
# by this share of their RMS residual: step times are heavy-tailed and run in streaks, so the
# criterion alone called a 0.2% better fit over 3,064 steps decisive (the real c8 run, whose
# batch never passed 8 rows)
NEAR_TIE_BIC = 10.0
MIN_GAIN = 0.05
# Decode steps longer than this many times the median are stalls or merged steps, not graphs
STALL = 3.0
LAYOUTS = ("slots", "dense")


@dataclass(frozen=True)
class CaptureSizes:
    """The batch sizes an engine captured decode graphs at (ascending; none: it pads nothing).
    A step's rows pad to the smallest that holds them; past the largest the engine runs the
    batch eagerly, as it is."""

    name: str
    sizes: tuple[int, ...]

    def pad(self, rows: np.ndarray) -> np.ndarray:
        if not self.sizes:
            return rows.astype(float)
        sizes = np.asarray(self.sizes, dtype=float)
        at = np.minimum(np.searchsorted(sizes, rows), sizes.size - 1)
        return np.where(rows <= 0, 0.0, np.where(rows <= sizes[-1], sizes[at], rows))


POWERS_OF_TWO = CaptureSizes("pow2", tuple(2**k for k in range(12)))
# vLLM's default: 1, 2, 4, multiples of 8 below 256, then of 16 up to its 512 cap
VLLM = CaptureSizes("vllm", (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)))
UNPADDED = CaptureSizes("none", ())
LADDERS = {ladder.name: ladder for ladder in (POWERS_OF_TWO, VLLM, UNPADDED)}
AUTO = "auto"


def parse_capture_sizes(text: str) -> CaptureSizes | None:
    """``auto`` (None: the step times choose), a name of :data:`LADDERS`, or the sizes
    themselves, comma-separated. Raises ValueError saying what it takes."""
    text = text.strip()
    if text == AUTO:
        return None
    if text in LADDERS:
        return LADDERS[text]
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1 or list(sizes) != sorted(set(sizes)):
        raise ValueError(
            f"capture sizes {text!r} are not auto, {', '.join(LADDERS)} or ascending batch sizes "
            "separated by commas (e.g. 1,2,4,8,16)"
        )
    return CaptureSizes(text, sizes)


class StepEntries(Protocol):
    """What the replay needs of the steps: their times (ns), each (request, step) entry, its
    decode tokens and the context they read (thousands of tokens)."""

    start: np.ndarray
    end: np.ndarray
    prefill: np.ndarray
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


def slot_replay(steps: StepEntries, admitted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the slots its decode graph ran over when requests take the lowest free slot
    (0 to the highest decoding one), and the longest context a decoder read (tokens); 0 where
    no request decoded. ``admitted`` orders requests that first ran in the same step (their
    send times)."""
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
    return rows, length


def decode_graph(
    steps: StepEntries, admitted: np.ndarray, given: CaptureSizes | None = None
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Per step, the rows its decode graph ran and their attention length (padded to a power
    of two from :data:`FIRST_LENGTH_BUCKET`), 0 where none decoded, and what was chosen: the
    layout and capture sizes (``given``, or each of :data:`LADDERS`) whose padded rows explain
    the decode steps' times best by least squares (with the padded attention and the context
    read), with each candidate's RMS residual."""
    slots, reach = slot_replay(steps, admitted)
    length = bucket(reach, FIRST_LENGTH_BUCKET)
    decoding = steps.entry_decode > 0
    decoders = np.bincount(steps.step[decoding], minlength=steps.count).astype(float)
    unpadded = {"slots": slots, "dense": decoders}
    ladders = (given,) if given is not None else tuple(LADDERS.values())
    default = ("slots", ladders[0].name)
    padded = {(layout, ladder.name): ladder.pad(unpadded[layout]) for layout in LAYOUTS for ladder in ladders}
    seconds = (steps.end - steps.start) / 1e9
    context = np.bincount(steps.step[decoding], weights=steps.entry_context[decoding], minlength=steps.count)
    timed = (decoders > 0) & (steps.prefill == 0) & (seconds > 0)
    if timed.any():
        timed &= seconds <= STALL * np.median(seconds[timed])
    described: dict[str, Any] = {"layout": default[0], "capture_sizes": default[1]}
    n = int(timed.sum())
    if n < MIN_DECODE_STEPS:
        assumed = f"assumed: {n} decode steps are too few to tell paddings apart"
        described["source"] = assumed if given is None else f"capture sizes given, layout {assumed}"
        return padded[default], length, described
    rms = {}
    for key, rows in padded.items():
        x = np.column_stack((np.ones(n), rows[timed], rows[timed] * length[timed] / 1000, context[timed]))
        y = seconds[timed] * 1000
        beta = np.linalg.lstsq(x, y, rcond=None)[0]
        rms[key] = float(np.sqrt(np.mean((y - x @ beta) ** 2)))

    def decisive(better: tuple[str, str], worse: tuple[str, str]) -> bool:
        ratio = max(rms[worse], 1e-12) / max(rms[better], 1e-12)
        return n * 2 * float(np.log(ratio)) > NEAR_TIE_BIC and ratio > 1 + MIN_GAIN

    best = min(rms, key=lambda key: (rms[key], key != default))
    chosen = best if decisive(best, default) else default
    runner_up = min((key for key in rms if key != chosen), key=rms.__getitem__)
    told = chosen != default or decisive(chosen, runner_up)
    source = "inferred from step times" if told else "kept: the step times do not tell the candidates apart"
    # sizes that pad this run's batches exactly as the chosen ones do (up to 8 rows, vLLM's and
    # powers of two are the same sizes): the run cannot tell them apart, nor need to
    alike = [
        name
        for (layout, name), rows in padded.items()
        if layout == chosen[0] and name != chosen[1] and np.array_equal(rows, padded[chosen])
    ]
    described |= {
        "layout": chosen[0],
        "capture_sizes": chosen[1],
        "source": source if given is None else f"capture sizes given, layout {source}",
        "alike": alike,
        "decode_steps": n,
        "step_time_rms_ms": {f"{layout} {name}": value for (layout, name), value in rms.items()},
    }
    return padded[chosen], length, described
