"""A meter that trails the device: where it sees each step's energy."""

from __future__ import annotations

import itertools

import numpy as np

# A lagging meter sees a step's spilled energy over these multiples of its time constant after
# the step, each part flat: finer where the response falls fastest (three parts to 4τ put a
# 40 ms lag's tail so coarsely over a 20 ms counter that the exact steps split 8-10% off)
LAG_TAIL = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
# A power averaged over a window spreads each step's energy evenly over the window after it:
# copies of the step this far apart at most (a sampler's 50 ms), each with its part, and no
# more copies in all than this (a long run's segments, one per request and step, are tens of
# millions: there the copies stand further apart, at the least one at the window's middle)
WINDOW_STRIDE_NS = 50e6
MAX_COPIES = 5_000_000


def metered(
    start: np.ndarray, end: np.ndarray, lag_ms: float, window_ns: float = 0.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where the meter sees the energy of steps over [start, end]: (index of the step, start,
    end, share of its energy) per part. A first-order lag τ keeps ``τ(1 − e^(−d/τ))/d`` of a
    d-long step's energy out of its own time and spills it after, e-fold by e-fold; a power
    the device averaged over ``window_ns`` reaches the meter spread evenly over the window
    after that."""
    parts = _lagged(start, end, lag_ms)
    if not window_ns:
        return parts
    copies = max(1, min(int(np.ceil(window_ns / WINDOW_STRIDE_NS)), MAX_COPIES // max(parts[0].size, 1)))
    shifts = (np.arange(copies) + 0.5) * window_ns / copies
    which, a, b, share = parts
    return (
        np.tile(which, copies),
        (a[None, :] + shifts[:, None]).ravel(),
        (b[None, :] + shifts[:, None]).ravel(),
        np.tile(share / copies, copies),
    )


def _lagged(
    start: np.ndarray, end: np.ndarray, lag_ms: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    index = np.arange(start.size)
    if not lag_ms:
        return index, start, end, np.ones(start.size)
    tau = lag_ms * 1e6
    duration = np.maximum(end - start, 1.0)
    spill = tau * (1.0 - np.exp(-duration / tau)) / duration
    parts = [(index, start, end, 1.0 - spill)]
    for a, b in itertools.pairwise(LAG_TAIL):
        share = np.exp(-a) - (np.exp(-b) if b < LAG_TAIL[-1] else 0.0)  # the last takes the rest
        parts.append((index, end + a * tau, end + b * tau, spill * share))
    return tuple(np.concatenate(column) for column in zip(*parts, strict=True))  # type: ignore[return-value]
