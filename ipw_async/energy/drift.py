"""Static power that drifts with a slow covariate (the die's temperature, or its warming)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
