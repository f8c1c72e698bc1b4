"""Sweep constraints: which load levels are acceptable, and the best of those that are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Constraint:
    metric: str  # a level statistic (mean over repeats)
    bound: str  # "max" or "min": the limit is an upper or a lower bound
    scale: float  # limit × scale is in the metric's unit (ms -> s)
    label: str


CONSTRAINTS: dict[str, Constraint] = {
    "max_ttft_ms": Constraint("ttft_p50_s", "max", 1e-3, "TTFT p50"),
    "max_tpot_ms": Constraint("tpot_p50_s", "max", 1e-3, "TPOT p50"),
    "max_j_per_query": Constraint("j_per_query", "max", 1.0, "J/query"),
    "min_accuracy": Constraint("accuracy", "min", 1.0, "accuracy"),
    "min_throughput": Constraint("throughput_tok_s", "min", 1.0, "output tok/s"),
}

# what "best" means among accepted levels: name -> (metric, "max" or "min")
BEST: dict[str, tuple[str, str]] = {
    "throughput": ("throughput_tok_s", "max"),
    "j_per_query": ("j_per_query", "min"),
    "ipj": ("ipj", "max"),
}


def validate(constraints: dict[str, float | None]) -> dict[str, float]:
    """The constraints that are set; raises ValueError for an unknown name."""
    unknown = [k for k in constraints if k not in CONSTRAINTS]
    if unknown:
        raise ValueError(f"unknown constraint {', '.join(unknown)}; known: {', '.join(CONSTRAINTS)}")
    return {k: float(v) for k, v in constraints.items() if v is not None}


def violations(means: dict[str, float | None], constraints: dict[str, float]) -> list[str]:
    """Why a level (its metric means) breaks the constraints; empty when it meets them all."""
    reasons = []
    for name, limit in constraints.items():
        c = CONSTRAINTS[name]
        value = means.get(c.metric)
        if value is None:
            reasons.append(f"{c.label} not measured")
        elif c.bound == "max" and value > limit * c.scale:
            reasons.append(f"{c.label} {value / c.scale:.4g} > {limit:g}")
        elif c.bound == "min" and value < limit * c.scale:
            reasons.append(f"{c.label} {value / c.scale:.4g} < {limit:g}")
    return reasons


def best_levels(levels: list[dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """Among accepted levels, the best by each criterion of :data:`BEST` (None when none qualifies)."""
    out: dict[str, dict[str, Any] | None] = {}
    for name, (metric, direction) in BEST.items():
        candidates = [lv for lv in levels if lv["accepted"] and lv["means"].get(metric) is not None]
        if not candidates:
            out[name] = None
            continue
        sign = 1 if direction == "max" else -1
        top = max(candidates, key=lambda lv: sign * lv["means"][metric])
        out[name] = {"level": top["level"], "value": top["value"], metric: top["means"][metric]}
    return out
