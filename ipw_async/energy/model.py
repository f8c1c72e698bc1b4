"""The device's power model: what a step draws, and how its dynamic energy splits in it.

A step's work is the sum of its requests' work: a decode token is 1 plus ``context_weight``
per thousand tokens of context it read (attention reads the whole KV cache), a prompt token
``prefill_weight`` times 1 plus ``position_weight`` per thousand positions before it. The step
draws ``min(cap, step_w + scale · work ** exponent)`` above static power: a cost per step
whatever its batch (weight streaming, launches), a curve that flattens as the device fills,
and a power limit (where clocks stretch the step rather than power rising). Static power may
drift with the die's temperature (``drift``), and the meter may trail the device (``lag_ms``).
Each request's share of a step is its work over the step's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .steps import Steps

# The effects a model may have beyond static power and linear work, in the order the
# selection tries them; each must predict held-out meter intervals better to be kept.
EFFECTS = ("curve", "step", "context", "position", "lag", "drift")
DEFAULT_EXPONENT = 1.0
# A lagging meter sees a step's spilled energy over these multiples of its time constant after
# the step, each part flat: finer where the response falls fastest (three parts to 4τ put a
# 40 ms lag's tail so coarsely over a 20 ms counter that the exact steps split 8-10% off)
LAG_TAIL = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)


@dataclass(frozen=True)
class Drift:
    """Static power that moves with a slow covariate: ``coef_w`` × h(t), h on ``t`` (ns).

    h is the device's temperature above its first reading where the meter reports one, else
    its measured power above static, low-passed over ``tau_s`` (how a die warms)."""

    t: np.ndarray
    h: np.ndarray
    coef_w: float
    covariate: str
    tau_s: float | None = None

    def at(self, t: np.ndarray) -> np.ndarray:
        return self.coef_w * np.interp(t, self.t, self.h)

    def integral(self, edges: np.ndarray) -> np.ndarray:
        """∫ h dt (s) between successive ``edges``."""
        area = np.concatenate(([0.0], np.cumsum((self.h[1:] + self.h[:-1]) / 2 * np.diff(self.t) / 1e9)))
        return np.diff(np.interp(edges, self.t, area, left=0.0, right=float(area[-1])))


@dataclass
class PowerModel:
    static_w: float
    scale_w: float
    prefill_weight: float
    exponent: float = DEFAULT_EXPONENT
    cap_w: float = float("inf")
    step_w: float = 0.0
    context_weight: float = 0.0  # a decode token's extra work per thousand tokens of context
    position_weight: float = 0.0  # a prompt token's extra work per thousand positions before it
    lag_ms: float = 0.0
    drift: Drift | None = None
    effects: tuple[str, ...] = ()
    r2: float | None = None
    intervals: int = 0
    notes: list[str] = field(default_factory=list)
    errors: dict[str, float] = field(default_factory=dict)  # standard errors of the fitted parameters
    selection: dict[str, Any] = field(default_factory=dict)

    @property
    def held_out_error(self) -> float:
        """Its error on meter intervals it was not fitted to, relative to a typical interval
        (0 where the run was too short to hold any out)."""
        return float((self.selection.get("held_out_error") or {}).get(self.name, 0.0))

    @property
    def name(self) -> str:
        return "+".join(self.effects) or "linear"

    def entry_work(self, steps: Steps) -> np.ndarray:
        """Each (request, step) entry's work, in decode tokens at no context."""
        work = steps.entry_decode + self.prefill_weight * steps.entry_prefill
        if self.context_weight and steps.entry_context.size:
            work = work + self.context_weight * steps.entry_context
        if self.position_weight and steps.entry_position.size:
            work = work + self.prefill_weight * self.position_weight * steps.entry_position
        return work

    def step_work(self, steps: Steps) -> np.ndarray:
        work = steps.decode + self.prefill_weight * steps.prefill
        if self.context_weight:
            work = work + self.context_weight * steps.context
        if self.position_weight:
            work = work + self.prefill_weight * self.position_weight * steps.position
        return work

    def dynamic_w(self, work: np.ndarray) -> np.ndarray:
        """Dynamic power (W) of steps of this work."""
        work = np.maximum(work, 0.0)
        curve = self.step_w * (work > 0) + self.scale_w * np.power(work, self.exponent)
        return np.minimum(self.cap_w, curve)

    def metered(
        self, start: np.ndarray, end: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Where the meter sees the energy of steps over [start, end]: (index of the step, start,
        end, share of its energy) per part. A first-order lag τ keeps ``τ(1 − e^(−d/τ))/d`` of a
        d-long step's energy out of its own time and spills it after, e-fold by e-fold."""
        index = np.arange(start.size)
        if not self.lag_ms:
            return index, start, end, np.ones(start.size)
        tau = self.lag_ms * 1e6
        duration = np.maximum(end - start, 1.0)
        spill = tau * (1.0 - np.exp(-duration / tau)) / duration
        parts = [(index, start, end, 1.0 - spill)]
        for a, b in itertools.pairwise(LAG_TAIL):
            share = np.exp(-a) - (np.exp(-b) if b < LAG_TAIL[-1] else 0.0)  # the last takes the rest
            parts.append((index, end + a * tau, end + b * tau, spill * share))
        return tuple(np.concatenate(column) for column in zip(*parts, strict=True))  # type: ignore[return-value]

    def static_at(self, t: np.ndarray) -> float | np.ndarray:
        """Static power (W) at device times ``t`` (a constant where it does not drift)."""
        return self.static_w if self.drift is None else self.static_w + self.drift.at(t)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "static_w": self.static_w,
            "scale_w": self.scale_w,
            "prefill_weight": self.prefill_weight,
            "exponent": self.exponent,
            "cap_w": self.cap_w if np.isfinite(self.cap_w) else None,
            "step_w": self.step_w,
            "context_weight_per_ktoken": self.context_weight,
            "position_weight_per_ktoken": self.position_weight,
            "lag_ms": self.lag_ms,
            "static_drift": None
            if self.drift is None
            else {"coef_w": self.drift.coef_w, "covariate": self.drift.covariate, "tau_s": self.drift.tau_s},
            "r2": self.r2,
            "intervals": self.intervals,
            "errors": {k: (v if np.isfinite(v) else None) for k, v in self.errors.items()},
            "selection": self.selection,
            "notes": self.notes,
        }
