"""Pareto frontiers: the points no other point beats on every objective at once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _dominates(a: Mapping[str, Any], b: Mapping[str, Any], objectives: Mapping[str, str]) -> bool:
    """a is at least as good as b everywhere and better somewhere."""
    better = False
    for key, direction in objectives.items():
        x, y = (a[key], b[key]) if direction == "max" else (-a[key], -b[key])
        if x < y:
            return False
        better |= x > y
    return better


def pareto_front(
    points: Sequence[Mapping[str, Any]], objectives: Mapping[str, str]
) -> list[Mapping[str, Any]]:
    """The non-dominated points, in input order; ``objectives`` maps a key to "max" or "min".

    A point with a null in any objective cannot be compared and is left out.
    """
    if any(d not in ("max", "min") for d in objectives.values()):
        raise ValueError("each objective is 'max' or 'min'")
    usable = [p for p in points if all(p.get(k) is not None for k in objectives)]
    return [p for p in usable if not any(_dominates(q, p, objectives) for q in usable if q is not p)]
