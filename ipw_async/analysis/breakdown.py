"""Each meter's energy split by what the server was doing: prefill, decode, or idle.

Every request that reached the server (warmup and failed ones too: they loaded the device)
is in prefill from sent to its first token, and in decode from its first token until its
stream closed (a request that never produced a token is in prefill until it ended). The
meter's timeline is cut at every telemetry knot and phase edge; an interval in which any
request is prefilling counts as prefill (prefill dominates a step's cost), else one in which
any request is decoding counts as decode, else idle. As in the attribution, the meter's
virtual counter is extended (imputed, at its mean power) to cover requests outside the
telemetry span, so the parts add up to the summary's total; the deviation checks that.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from .._clock import NS
from ..energy import AttributionConfig, request_windows, virtual_counter
from ..energy.counter import covering
from ..energy.split import Timeline, density, equal_segments
from ..rundir.read import RunDir
from ..telemetry.base import Meter

PHASES = ("prefill", "decode", "idle")
RULE = (
    "prefill: any request between sent and first token; decode: otherwise any request between "
    "first token and stream closed; idle: no request in flight"
)


def phase_spans(records: pl.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Start and end (ns since run start) of every request's prefill and decode phases."""
    req = request_windows(records)
    sent = req.get_column("sent_ns").cast(pl.Float64).to_numpy()
    end = req.get_column("end_ns").cast(pl.Float64).to_numpy()
    first = req.get_column("first_token_ns").cast(pl.Float64).fill_null(np.nan).to_numpy()
    has_token = np.isfinite(first)
    return {
        "prefill": (sent, np.where(has_token, first, end)),
        "decode": (first[has_token], end[has_token]),
    }


def meter_breakdown(
    telemetry: pl.DataFrame,
    meter: Meter,
    records: pl.DataFrame,
    reference_j: float | None = None,
    breaks: tuple[int, ...] = (),
) -> dict[str, Any]:
    """Energy, time and mean power per phase for one meter, and the check against the total."""
    vc = virtual_counter(telemetry, meter, AttributionConfig().gap_factor, breaks)
    if vc is None:
        return {"kind": meter.kind, "reason": "the meter has fewer than two usable readings"}
    spans = phase_spans(records)
    sent, end = spans["prefill"][0], np.concatenate([spans["prefill"][1], spans["decode"][1]])
    # as the attribution does: requests outside the telemetry span get imputed energy
    vc = covering(vc, sent, end)
    prefilling, decoding = equal_segments(*spans["prefill"]), equal_segments(*spans["decode"])
    # the attribution's own cut of the meter: the parts add up as its split does
    timeline = Timeline(vc, prefilling, [decoding], sent.size)
    prefill = density(timeline.bounds, prefilling)[0] > 0
    decode = density(timeline.bounds, decoding)[0] > 0
    phase = np.where(prefill, 0, np.where(decode, 1, 2))
    energy = np.bincount(phase, weights=timeline.d_e, minlength=3)
    seconds = np.bincount(phase, weights=timeline.dt / NS, minlength=3)
    imputed = np.bincount(phase, weights=timeline.d_e * timeline.imputed, minlength=3)
    parts = float(energy.sum())
    total = reference_j if reference_j is not None else float(vc.e[-1] - vc.e[0])
    return {
        "kind": meter.kind,
        "phases": {
            name: {
                "energy_j": float(energy[i]),
                "share": float(energy[i] / parts) if parts else None,
                "time_s": float(seconds[i]),
                "mean_power_w": float(energy[i] / seconds[i]) if seconds[i] > 0 else None,
                "imputed_j": float(imputed[i]),
            }
            for i, name in enumerate(PHASES)
        },
        "sum_of_parts_j": parts,
        "total_j": total,
        "total_source": "summary" if reference_j is not None else "telemetry span",
        "deviation": (parts - total) / total if total else None,
        "reason": None,
    }


def energy_report(run: RunDir) -> dict[str, Any]:
    """The contents of ``analysis/energy.json``."""
    if run.telemetry is None:
        return {"rule": RULE, "meters": {}, "reason": "the run has no telemetry.arrow"}
    meters = run.meters()
    if not meters:
        return {"rule": RULE, "meters": {}, "reason": "the telemetry log has no energy or power meter"}
    known = (run.summary or {}).get("energy", {}).get("meters", {})
    return {
        "rule": RULE,
        "meters": {
            m.channel: meter_breakdown(
                run.telemetry, m, run.records, known.get(m.channel, {}).get("total_j"), run.session_starts_ns
            )
            | {"power_model": known.get(m.channel, {}).get("power_model")}
            for m in meters
        },
        "reason": None,
    }
