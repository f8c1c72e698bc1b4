"""Statistics over repeated runs of one load level: mean, sample std and a normal 95% CI."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

Z95 = 1.96


def mean_ci(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """n, mean, std (sample, ddof=1) and ci95 = 1.96·std/√n over the values that are not null.

    std and ci95 are null for fewer than two values: one run says nothing about spread.
    """
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = int(arr.size)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "ci95": None}
    if n == 1:
        return {"n": 1, "mean": float(arr[0]), "std": None, "ci95": None}
    std = float(arr.std(ddof=1))
    return {"n": n, "mean": float(arr.mean()), "std": std, "ci95": Z95 * std / math.sqrt(n)}
