"""Accuracy, energy and power per query, and intelligence per joule (IPJ) and per watt (IPW).

IPJ = accuracy / mean energy per query; IPW = accuracy / mean power per query, over the
measured requests that succeeded. A query whose energy is null or not positive gets
power × latency instead (its own attributed power, else the meter's mean over the run; its
e2e latency, else its stream time), and is counted as imputed. A figure that cannot be
computed is null with a reason: missing is not zero.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from ..rundir.read import RunDir
from ..scoring import SCORERS, score
from ..stats import measured
from .columns import column, energy_columns


@dataclass
class Imputed:
    """Per-query energy after imputation, with which rows were imputed and how."""

    energy_j: np.ndarray  # NaN where nothing could be imputed either
    power_w: np.ndarray  # the query's own attributed power; NaN where it has none
    imputed: np.ndarray  # energy was null or ≤ 0 and power × latency stands in
    from_mean_power: np.ndarray  # ... using the meter's mean power (the query had none)

    @property
    def missing(self) -> np.ndarray:
        return ~np.isfinite(self.energy_j)


def impute_energy(energy: np.ndarray, power: np.ndarray, latency: np.ndarray) -> Imputed:
    """Fill null or non-positive energies with power × latency; leave the rest untouched."""
    energy = np.asarray(energy, dtype=float)
    power = np.asarray(power, dtype=float)
    latency = np.asarray(latency, dtype=float)
    has_energy = np.isfinite(energy) & (energy > 0)
    has_power = np.isfinite(power) & (power > 0)
    mean_power = float(power[has_power].mean()) if has_power.any() else np.nan
    stand_in = np.where(has_power, power, mean_power) * latency
    imputed = ~has_energy & np.isfinite(stand_in) & (stand_in > 0)
    filled = np.where(has_energy, energy, np.where(imputed, stand_in, np.nan))
    return Imputed(filled, np.where(has_power, power, np.nan), imputed, imputed & ~has_power)


def ratio(numerator: float | None, denominator: float | None, what: str) -> tuple[float | None, str | None]:
    """numerator / denominator, or None with the reason it cannot be computed."""
    if numerator is None:
        return None, "no scored answers, so no accuracy"
    if denominator is None or not np.isfinite(denominator):
        return None, f"no {what} for any query"
    if denominator <= 0:
        return None, f"mean {what} is not positive"
    return numerator / denominator, None


def correctness(frame: pl.DataFrame, scorer: str | None = None) -> pl.Series:
    """Each request's verdict: rescored with ``scorer`` when given, else the ``correct`` column.

    Failed requests and requests without a reference stay unscored (null).
    """
    if scorer is None:
        return frame.get_column("correct")
    if scorer not in SCORERS:
        raise ValueError(f"unknown scorer {scorer!r}; choose one of {', '.join(SCORERS)}")
    verdicts = [
        score(answer or "", reference, scorer) if status == "ok" else None
        for answer, reference, status in frame.select("answer", "reference", "status").iter_rows()
    ]
    return pl.Series("correct", verdicts, dtype=pl.Boolean)


def _stats(values: np.ndarray) -> dict[str, float | int | None]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return {"n": 0, "mean": None, "median": None}
    return {"n": int(finite.size), "mean": float(finite.mean()), "median": float(np.median(finite))}


def latency_for_imputation(frame: pl.DataFrame) -> np.ndarray:
    """Each query's e2e latency, else its stream time (seconds)."""
    return frame.select(pl.coalesce("e2e_latency_s", "stream_time_s")).to_series().cast(pl.Float64).to_numpy()


def meter_energy(ok: pl.DataFrame, meter: str) -> Imputed:
    """One meter's per-query energy over ``ok`` rows, imputed where it is null or ≤ 0."""
    energy_col, power_col, _ = energy_columns(meter)
    return impute_energy(
        column(ok, energy_col).to_numpy(), column(ok, power_col).to_numpy(), latency_for_imputation(ok)
    )


def meter_report(ok: pl.DataFrame, meter: str, accuracy: float | None) -> dict[str, Any]:
    """Energy and power per query for one meter, with IPJ and IPW."""
    _, _, provenance_col = energy_columns(meter)
    filled = meter_energy(ok, meter)
    energy, power = _stats(filled.energy_j), _stats(filled.power_w)
    ipj, ipj_reason = ratio(accuracy, energy["mean"], "energy")  # type: ignore[arg-type]
    ipw, ipw_reason = ratio(accuracy, power["mean"], "power")  # type: ignore[arg-type]
    provenance = ok.get_column(provenance_col).to_list() if provenance_col in ok.columns else []
    return {
        "queries": ok.height,
        "energy_j": energy
        | {
            "imputed": int(filled.imputed.sum()),
            "imputed_from_mean_power": int(filled.from_mean_power.sum()),
            "missing": int(filled.missing.sum()),
        },
        "power_w": power,
        "provenance": dict(Counter(p or "missing" for p in provenance)),
        "ipj": ipj,
        "ipj_reason": ipj_reason,
        "ipw": ipw,
        "ipw_reason": ipw_reason,
    }


def accuracy_counts(frame: pl.DataFrame, scorer: str | None = None) -> dict[str, Any]:
    """correct, incorrect, unscored (failed requests included) and accuracy = correct / scored."""
    m = measured(frame)
    verdicts = correctness(m, scorer)
    correct = int(verdicts.sum() or 0)
    scored = int(verdicts.is_not_null().sum())
    return {
        "measured": m.height,
        "ok": int((m.get_column("status") == "ok").sum()),
        "correct": correct,
        "incorrect": scored - correct,
        "unscored": m.height - scored,
        "scored": scored,
        "accuracy": correct / scored if scored else None,
    }


def accuracy_report(run: RunDir, scorer: str | None = None) -> dict[str, Any]:
    """The contents of ``analysis/accuracy.json``."""
    counts = accuracy_counts(run.records, scorer)
    return {
        "scorer": scorer or "as recorded (the run's correct column)",
        **counts,
        "energy": {meter: meter_report(run.ok, meter, counts["accuracy"]) for meter in run.energy_meters},
        "energy_reason": None if run.energy_meters else "the run has no per-query energy columns",
        "notes": (
            "energy and power are over measured requests that succeeded; a null or non-positive "
            "energy is imputed as power × e2e latency (else stream time), with the query's own "
            "power or else the meter's mean"
        ),
    }
