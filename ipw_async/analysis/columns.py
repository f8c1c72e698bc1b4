"""The records' columns as the analyses read them: missing is null, and each meter's names."""

from __future__ import annotations

import polars as pl

from ..rundir.read import HEADLINE


def column(frame: pl.DataFrame, name: str) -> pl.Series:
    """A float column, or all-null when the run never wrote it (missing, not zero)."""
    if name in frame.columns:
        return frame.get_column(name).cast(pl.Float64)
    return pl.Series(name, [None] * frame.height, dtype=pl.Float64)


def energy_columns(meter: str) -> tuple[str, str, str]:
    """The energy, power and provenance columns of a meter (or of the headline)."""
    if meter == HEADLINE:
        return "energy_j", "power_w", "energy_provenance"
    return f"{meter}.energy_j", f"{meter}.power_w", f"{meter}.provenance"
