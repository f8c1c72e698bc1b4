"""The device's power model: what a step draws, and how its dynamic energy splits in it.

A step's work is the sum of its requests' work: a decode token is 1 plus ``context_weight``
per thousand tokens of context it read (attention reads the whole KV cache), plus
``padding_weight`` of its share of the rows a padded decode graph ran beyond its batch (a
graph over a captured batch size: a padded row is the step's, its decoders share it); a prompt
token ``prefill_weight`` times 1 plus ``position_weight`` per thousand positions before it. The step
draws ``min(cap, step_w + scale · work ** exponent)`` above static power: a cost per step
whatever its batch (weight streaming, launches), a curve that flattens as the device fills,
and a power limit (where clocks stretch the step rather than power rising). Static power may
drift with the die's temperature (``drift``), and the meter may trail the device (``lag_ms``).
Each request's share of a step is its work over the step's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .drift import Drift
from .lag import metered
from .parameters import DEFAULT_EXPONENT, PARAMETERS
from .steps import Steps


@dataclass
class PowerModel:
    """A device's power model: its fitted parameters are the rows of :data:`.parameters.PARAMETERS`."""

    static_w: float
    scale_w: float
    prefill_weight: float
    exponent: float = DEFAULT_EXPONENT
    cap_w: float = float("inf")
    step_w: float = 0.0
    padding_weight: float = 0.0  # how much of a decode row's work its padded graph sets (0-1)
    context_weight: float = 0.0  # a decode token's extra work per thousand tokens of context
    position_weight: float = 0.0  # a prompt token's extra work per thousand positions before it
    lag_ms: float = 0.0
    prefill_guessed: bool = False  # the default weight, where the run could not tell it (notes say why)
    drift: Drift | None = None
    effects: tuple[str, ...] = ()
    r2: float | None = None
    in_sample_error: float | None = None  # its error on the intervals it was fitted to, as held_out_error
    intervals: int = 0
    notes: list[str] = field(default_factory=list)
    errors: dict[str, float] = field(default_factory=dict)  # standard errors of the fitted parameters
    selection: dict[str, Any] = field(default_factory=dict)

    @property
    def held_out_error(self) -> float | None:
        """Its error on meter intervals it was not fitted to, relative to a typical interval
        (None where none was held out: its notes say why)."""
        held = self.selection.get("held_out_error") or {}
        return float(held[self.name]) if self.name in held else None

    @property
    def name(self) -> str:
        return "+".join(self.effects) or "linear"

    def entry_work(self, steps: Steps) -> np.ndarray:
        """Each (request, step) entry's work, in decode tokens at no context."""
        work = steps.entry_decode + self.prefill_weight * steps.entry_prefill
        if self.padding_weight:
            work = work + self.padding_weight * (steps.entry_padded - steps.entry_decode)
        if self.context_weight and steps.entry_context.size:
            work = work + self.context_weight * steps.entry_context
        if self.position_weight and steps.entry_position.size:
            work = work + self.prefill_weight * self.position_weight * steps.entry_position
        return work

    def step_work(self, steps: Steps) -> np.ndarray:
        work = steps.decode + self.prefill_weight * steps.prefill
        if self.padding_weight:
            work = work + self.padding_weight * (steps.padded_decode - steps.decode)
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
        return metered(start, end, self.lag_ms)

    def static_at(self, t: np.ndarray) -> float | np.ndarray:
        """Static power (W) at device times ``t`` (a constant where it does not drift)."""
        return self.static_w if self.drift is None else self.static_w + self.drift.at(t)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.name,
            # every parameter with a field, under its summary key (a cap no step reached: None)
            **{
                row.key or row.attribute: v if np.isfinite(v := getattr(self, row.attribute)) else None
                for row in PARAMETERS
                if row.attribute
            },
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
