"""The power model's parameters as a table: a row each, with the term it moves the model by.

The fit's parameter vector is :data:`PARAMETERS` in order, and everything about it is read from
the rows: its start and bounds, which parameters a set of effects frees (a row whose effect is
off is fixed at its ``off`` value, the model without that effect), the names of their standard
errors in the summary, and the :class:`.model.PowerModel` fields they set. A row's term is its
column of the fit's Jacobian, how each meter interval's modelled energy moves with it (for a
parameter the model is linear in, the column it multiplies); :meth:`Evaluation.at` is where it
enters the modelled power. tests/test_power_model.py checks every term against that prediction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
from scipy import sparse

from .settings import EFFECTS

if TYPE_CHECKING:
    from .problem import Features, Problem

# The effects a model may have beyond static power and linear work, in the order the
# selection tries them; each must predict held-out meter intervals better to be kept.
# effects fitted over a grid of the design rather than by a row: the meter's lag behind the device
GRIDDED = frozenset({"lag"})
DEFAULT_EXPONENT = 1.0
# How far static power can drift, per unit of its covariate: leakage grows with the die's
# temperature (about doubling every 20-30 °C, and it is only part of idle power), so static
# gains at most 5% of itself per °C; a die warmed by P watts of work adds at most P/4 to its
# static. Unbounded, a short run's drift fits the meter's lag and the curve instead: a 2.6 s
# run's static "rose" 24 W per °C, 20 times what a die does, and its queries' energy was off 12%.
DRIFT_PER_C = 0.05
DRIFT_PER_W = 0.25


@dataclass(frozen=True)
class Scales:
    """The run's own scales, which some rows' start and upper bound are set by."""

    static_w: float  # static power: measured, else that of the run's quietest intervals
    prefill_weight: float  # the stated weight of a prompt token
    peak_w: float  # the most power a meter interval drew
    drift_per_unit: float  # how far static may drift per unit of its covariate

    @classmethod
    def of(cls, problem: Problem, peak_w: float) -> Scales:
        usable = problem.usable
        static = (
            problem.static_w
            if problem.static_w is not None
            else float(np.percentile(problem.energy[usable] / np.maximum(problem.dt[usable], 1e-9), 5))
        )
        drift = DRIFT_PER_C * static if problem.temperature is not None else DRIFT_PER_W
        return cls(static, problem.default_prefill_weight, peak_w, drift)


@dataclass(frozen=True)
class Evaluation:
    """The model at one parameter vector over a problem's meter intervals: their energy, and
    the parts every row's term is made of."""

    values: Mapping[str, float]  # every parameter, by its row's name
    problem: Problem
    design: sparse.csr_matrix  # seconds of each step's power each meter interval sees
    h: np.ndarray  # the drift covariate integrated over each interval
    work: np.ndarray  # each step's work, in decode tokens
    powered: np.ndarray  # work ** exponent
    below: np.ndarray  # the steps below the cap
    power: np.ndarray  # each step's power above static (W)

    @classmethod
    def at(cls, theta: np.ndarray, problem: Problem, design: sparse.csr_matrix, h: np.ndarray) -> Evaluation:
        v = dict(zip(NAMES, theta, strict=True))
        f = problem.features
        prompt = f.prefill + v["position"] * f.position
        rows = f.decode + v["padding"] * (f.padded - f.decode)
        work = np.maximum(rows + v["context"] * f.context + v["prefill"] * prompt, 1e-9)
        powered = work ** v["exponent"]
        raw = v["step"] + v["scale"] * powered
        below = raw < v["cap"]
        return cls(v, problem, design, h, work, powered, below, np.where(below, raw, v["cap"]))

    @property
    def energy(self) -> np.ndarray:
        """Each meter interval's modelled energy (J)."""
        v = self.values
        return v["static"] * self.problem.dt + v["drift"] * self.h + self.design @ self.power

    def jacobian(self, free: np.ndarray) -> np.ndarray:
        """The terms of the rows ``free`` marks, as columns."""
        return np.column_stack([row.term(self) for row, f in zip(PARAMETERS, free, strict=True) if f])

    @property
    def features(self) -> Features:
        return self.problem.features

    @cached_property
    def d_work(self) -> np.ndarray:
        """How each step's power moves with its work (none at the cap)."""
        scale, gamma = self.values["scale"], self.values["exponent"]
        return np.where(self.below, scale * gamma * self.work ** (gamma - 1), 0.0)

    def seen(self, per_step: np.ndarray) -> np.ndarray:
        """A per-step quantity as each meter interval sees it (its power's seconds there)."""
        return self.design @ per_step


def _always(_: Problem) -> bool:
    return True


@dataclass(frozen=True)
class Parameter:
    """One parameter of the power model: a row of :data:`PARAMETERS`."""

    name: str  # the fit's name for it, and its standard error's key in the summary
    doc: str  # what it is, in what unit
    term: Callable[[Evaluation], np.ndarray]  # ∂(each interval's energy, J)/∂(it)
    # where the fit starts it, and holds it where the data cannot tell it
    start: float | Callable[[Scales], float]
    lower: float
    upper: float | Callable[[Scales], float]
    effect: str | None = None  # the effect (EFFECTS) that frees it; None: every model fits it
    off: float | None = None  # its value in a model without its effect, where that is not its start
    needs: Callable[[Problem], bool] = _always  # whether the run's data can tell it
    attribute: str | None = None  # the PowerModel field it sets (None: the drift's coefficient)
    key: str | None = None  # its key in the summary's model, where not its attribute's name
    in_work: bool = False  # a weight within a step's work: it moves each request's share of the step

    def at(self, scales: Scales, effects: frozenset[str]) -> tuple[float, float, float]:
        """Its start, lower and upper bound in a run of these ``scales``, in a model of ``effects``."""
        upper = self.upper(scales) if callable(self.upper) else self.upper
        if self.effect is not None and self.effect not in effects and self.off is not None:
            return self.off, self.lower, upper
        return (self.start(scales) if callable(self.start) else self.start), self.lower, upper

    def free(self, problem: Problem, effects: frozenset[str]) -> bool:
        """Whether a model of ``effects`` fits it to ``problem`` (else it is held where :meth:`at`
        starts it)."""
        return (self.effect is None or self.effect in effects) and self.needs(problem)


PARAMETERS = (
    Parameter(
        "static",
        "static power (W): what the device draws computing nothing",
        lambda e: e.problem.dt,
        start=lambda s: s.static_w,
        lower=0.0,
        upper=np.inf,
        needs=lambda p: p.static_w is None,  # measured idle power anchors it
        attribute="static_w",
    ),
    Parameter(
        "drift",
        "static power's drift (W per °C of the die, or per W of work low-passed)",
        lambda e: e.h,
        start=0.0,
        lower=0.0,
        upper=lambda s: s.drift_per_unit,
        effect="drift",
    ),
    Parameter(
        "step",
        "a busy step's own power (W), whatever its work: weight streaming, launches",
        lambda e: e.seen(e.below.astype(float)),
        start=0.0,
        lower=0.0,
        upper=np.inf,
        effect="step",
        attribute="step_w",
    ),
    Parameter(
        "scale",
        "the power (W) of one decode token's work a step",
        lambda e: e.seen(np.where(e.below, e.powered, 0.0)),
        start=1.0,
        lower=0.0,
        upper=np.inf,
        attribute="scale_w",
    ),
    Parameter(
        "prefill",
        "a prompt token's work, in decode tokens",
        lambda e: e.seen(e.d_work * (e.features.prefill + e.values["position"] * e.features.position)),
        start=lambda s: s.prefill_weight,
        lower=0.01,
        upper=10.0,
        needs=lambda p: p.has_prefill,
        attribute="prefill_weight",
        in_work=True,
    ),
    Parameter(
        "exponent",
        "how the power curve flattens as the device fills (1: linear in work)",
        lambda e: e.seen(np.where(e.below, e.values["scale"] * e.powered * np.log(e.work), 0.0)),
        start=0.8,
        lower=0.2,
        upper=1.5,
        effect="curve",
        off=DEFAULT_EXPONENT,
        attribute="exponent",
    ),
    Parameter(
        "cap",
        "the power limit above static (W), where clocks stretch a step rather than power rise",
        lambda e: e.seen((~e.below).astype(float)),
        start=lambda s: 2 * max(s.peak_w, 1.0),
        lower=0.0,
        upper=np.inf,
        effect="curve",
        off=np.inf,
        attribute="cap_w",
    ),
    Parameter(
        "padding",
        "how much of a decode step's row work its padded graph sets (0: its decoders, 1: every "
        "row it ran)",
        lambda e: e.seen(e.d_work * (e.features.padded - e.features.decode)),
        start=1.0,
        lower=0.0,
        upper=1.0,
        effect="padding",
        off=0.0,
        needs=lambda p: p.has_padding,
        attribute="padding_weight",
        in_work=True,
    ),
    Parameter(
        "context",
        "a decode token's extra work per thousand tokens of context it read",
        lambda e: e.seen(e.d_work * e.features.context),
        start=0.0,
        lower=0.0,
        upper=20.0,
        effect="context",
        needs=lambda p: p.has_context,
        attribute="context_weight",
        key="context_weight_per_ktoken",
        in_work=True,
    ),
    Parameter(
        "position",
        "a prompt token's extra work (at the prefill weight) per thousand positions before it",
        lambda e: e.seen(e.d_work * e.values["prefill"] * e.features.position),
        start=0.0,
        lower=0.0,
        upper=20.0,
        effect="position",
        needs=lambda p: p.has_prefill,
        attribute="position_weight",
        key="position_weight_per_ktoken",
        in_work=True,
    ),
)
NAMES = tuple(row.name for row in PARAMETERS)


def bounds(
    problem: Problem, effects: frozenset[str], peak_w: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start, lower and upper bound of every parameter; equal bounds fix it."""
    scales = Scales.of(problem, peak_w)
    rows = [row.at(scales, effects) for row in PARAMETERS]
    start, lo, hi = (np.array(column) for column in zip(*rows, strict=True))
    fixed = ~np.array([row.free(problem, effects) for row in PARAMETERS])
    lo[fixed] = hi[fixed] = start[fixed]
    return start, lo, hi


def applicable_effects(problem: Problem) -> list[str]:
    """The effects the run's data can tell, in :data:`EFFECTS` order: those with a row it can
    free, and the gridded ones."""
    tellable = {row.effect for row in PARAMETERS if row.needs(problem)}
    return [e for e in EFFECTS if e in GRIDDED or e in tellable]
