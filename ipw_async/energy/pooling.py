"""How long a stretch of an instant power field's readings its energy is kept over.

A counter integrates: each of its intervals holds the energy drawn in it. A power field read
now and then does not: an instant reading is a point sample of a power that changes with every
engine step, and the trapezoid between two readings 50 ms apart is off by whatever the steps
between them did. On a real H100 the integrated instant field and the energy counter agree
within 0.9% over a whole run, but over 1 s their ratio moves by 5–13% (one standard deviation)
and over 10 s by 1.6–4.8% (``benchmarks/real_traces.py --without-counter``): sampling noise,
falling about as the square root of the readings. Kept
interval by interval, that noise is what each request is charged (on the 128-stream and
Poisson runs, p95 32% and 31% against the reference; kept over the stretches chosen here, 7.8%
and 11.1%).

So an instant field's energy is conserved over stretches of readings, and inside each stretch
it goes where the model that splits it (step costs or a power model, fitted to every reading)
says the steps put it. A stretch too short keeps the readings' noise; one too long keeps the
model's misfit (a drift or a load it does not describe). The length is the run's to say, by
blocked cross-validation: the run is cut into blocks of 1 s, and each block's energy is
predicted from the other blocks' readings within each candidate length around it, spread by
the model. Blocks, not alternate readings: a burst of load spans neighbouring readings, whose
noise it shares, and a reading beside a held-out one would predict it for that reason alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._clock import NS
from .counter import VirtualCounter

BLOCK_S = 1.0  # the held-out blocks: 20 readings at 50 ms, long beside a burst of steps
# Stretch lengths tried (s), around each held-out block; inf: the whole run.
POOL_LENGTHS_S = (4.0, 8.0, 16.0, 32.0, 64.0, float("inf"))
MIN_BLOCKS = 8  # fewer, and the run cannot tell the lengths apart: it keeps every interval


@dataclass(frozen=True)
class Pooling:
    """The stretch length chosen (s; inf: the whole run) and each candidate's error on the
    held-out blocks, relative to their energy (RMS)."""

    length_s: float
    errors: dict[float, float]

    def as_dict(self) -> dict[str, Any]:
        return {
            "length_s": None if np.isinf(self.length_s) else self.length_s,
            "by": f"blocked cross-validation of the readings ({BLOCK_S:g} s blocks)",
            "held_out_error": {("run" if np.isinf(s) else f"{s:g}"): e for s, e in self.errors.items()},
        }


def choose_pooling(vc: VirtualCounter, modelled: np.ndarray, static_j: np.ndarray) -> Pooling | None:
    """The stretch over which ``vc`` (a power meter's integrated readings) is best conserved,
    given the model's dynamic energy (``modelled``, J per ``vc`` interval) and its static
    energy (``static_j``, likewise). None where the run has too few blocks to tell."""
    usable = ~vc.imputed
    start, end = vc.t[:-1], vc.t[1:]
    mid = (start + end) / 2.0
    block = ((mid - vc.t[0]) // (BLOCK_S * NS)).astype(np.int64)
    counts = np.bincount(block[usable], minlength=int(block.max()) + 1)
    whole = np.flatnonzero(counts > 0)
    if whole.size < MIN_BLOCKS:
        return None
    measured = np.where(usable, vc.energies, 0.0)
    dynamic = measured - np.where(usable, static_j, 0.0)
    model = np.where(usable, modelled, 0.0)
    # per block: its energy, static, dynamic and modelled energy, its middle
    size = int(block.max()) + 1
    energy_b = np.bincount(block, weights=measured, minlength=size)[whole]
    static_b = np.bincount(block, weights=np.where(usable, static_j, 0.0), minlength=size)[whole]
    dynamic_b = np.bincount(block, weights=dynamic, minlength=size)[whole]
    model_b = np.bincount(block, weights=model, minlength=size)[whole]
    middle = vc.t[0] + (whole + 0.5) * BLOCK_S * NS
    dynamic_at = np.concatenate(([0.0], np.cumsum(dynamic_b)))
    model_at = np.concatenate(([0.0], np.cumsum(model_b)))
    scale = float(energy_b @ energy_b)
    if scale <= 0:
        return None
    errors: dict[float, float] = {}
    for length in POOL_LENGTHS_S:
        half = np.inf if np.isinf(length) else length * NS / 2.0
        lo = np.searchsorted(middle, middle - half, side="left")
        hi = np.searchsorted(middle, middle + half, side="right")
        # the blocks within the length around each block, itself left out
        pool_dynamic = dynamic_at[hi] - dynamic_at[lo] - dynamic_b
        pool_model = model_at[hi] - model_at[lo] - model_b
        ratio = np.where(pool_model > 0, pool_dynamic / np.where(pool_model > 0, pool_model, 1.0), 1.0)
        error = static_b + model_b * ratio - energy_b
        errors[length] = float(np.sqrt(error @ error / scale))
    best = min(errors, key=lambda s: errors[s])
    return Pooling(best, errors)


def pooled(vc: VirtualCounter, length_s: float) -> VirtualCounter:
    """``vc`` with its intervals merged into stretches of ``length_s`` (the whole run: inf),
    each imputed interval kept apart (what is imputed stays said), with how many of its
    intervals each stretch holds."""
    if vc.t.size < 3:
        return vc
    mid = (vc.t[:-1] + vc.t[1:]) / 2.0
    if np.isinf(length_s):
        key = np.zeros(mid.size, dtype=np.int64)
    else:
        key = ((mid - vc.t[0]) // (length_s * NS)).astype(np.int64)
    # an imputed interval is a stretch of its own, and so splits the stretch it falls in
    key = np.cumsum(np.r_[True, (np.diff(key) != 0) | vc.imputed[1:] | vc.imputed[:-1]])
    first = np.flatnonzero(np.r_[True, np.diff(key) != 0])
    knots = np.r_[first, vc.t.size - 1]
    return VirtualCounter(
        vc.t[knots], vc.e[knots], vc.imputed[first], vc.window_ns, np.diff(knots).astype(float)
    )
