"""Attribution given what only the simulator knows: its engine steps and its device physics.

A run's attribution infers the steps from token arrivals and fits the power model to the
meter. Splitting the same meter with the simulator's own steps and physics instead says how
much of an error is the meter's resolution (nothing could do better from it), how much the
inferred steps, and how much the fitted model: the decomposition behind
``benchmarks/attribution_accuracy.py``. Needs a simulator run with ``record_steps``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from scipy import sparse

from ..energy import AttributionConfig, request_windows, split_with_known
from ..energy.attribution import attribute_meter
from ..energy.drift import Drift
from ..energy.model import PowerModel
from ..energy.split import StepShares
from ..energy.steps import Steps, steps_of
from ..energy.work import Work
from ..rundir.read import RunDir
from .physics import EngineConfig


def physics(engine: EngineConfig) -> PowerModel:
    """The simulated device's power model, in the shape the run fits (over logged steps the
    context and position terms are in each entry's work already, and the steps carry none)."""
    return PowerModel(
        static_w=engine.static_w,
        scale_w=engine.dynamic_w,
        prefill_weight=engine.prefill_work,
        exponent=engine.work_exponent,
        cap_w=engine.max_w - engine.static_w,
        step_w=engine.step_w,
        context_weight=engine.context_work,
        position_weight=engine.prefill_position_work,
        lag_ms=engine.meter_lag_ms,
    )


def logged_steps(requests: pl.DataFrame, truth: dict[str, Any], t0_ns: int, prefill_work: float) -> Steps:
    """The engine's steps as it logged them, on the run's clock (``t0_ns``: the run's start on
    the shared monotonic clock), with each request's logged work (``requests``: request
    windows): a prompt chunk's work as ``prefill_work`` per token, so the model weighs it back."""
    index = {str(r): i for i, r in enumerate(requests.get_column("request_id").to_list())}
    start, end, decode, prefill = [], [], [], []
    req, step, entry_decode, entry_prefill = [], [], [], []
    for a, b, chunks, decoders, *_ in truth["steps"]:
        k = len(start)
        start.append(a - t0_ns)
        end.append(b - t0_ns)
        decode.append(sum(w for _, w in decoders))
        prefill.append(sum(w for _, _, w in chunks) / prefill_work)
        for key, _tokens, work in chunks:
            if key in index:
                req.append(index[key])
                step.append(k)
                entry_decode.append(0.0)
                entry_prefill.append(work / prefill_work)
        for key, work in decoders:
            if key in index:
                req.append(index[key])
                step.append(k)
                entry_decode.append(float(work))
                entry_prefill.append(0.0)
    floats = [np.asarray(v, dtype=float) for v in (start, end, decode, prefill)]
    ints = [np.asarray(v, dtype=int) for v in (req, step)]
    zeros = np.zeros(len(req))
    return Steps(*floats, *ints, np.asarray(entry_decode), np.asarray(entry_prefill), zeros, zeros)


def caused_shares(
    truth: dict[str, Any], requests: pl.DataFrame
) -> Callable[[sparse.csr_matrix], StepShares] | None:
    """The logged steps' exact split: each step's power above static as the device drew it,
    and each request's share of the step as it caused it (the simulator's truth, step by step);
    None for a run whose simulator did not log them (one recorded before it did)."""
    rows = truth["steps"]
    if not rows or len(rows[0]) < 8:
        return None
    index = {str(r): i for i, r in enumerate(requests.get_column("request_id").to_list())}
    dynamic_w = np.array([row[6] for row in rows], dtype=float)
    req, step, share = [], [], []
    for k, row in enumerate(rows):
        total = sum(j for _, j in row[7])
        for key, joules in row[7]:
            if key in index and total > 0:
                req.append(index[key])
                step.append(k)
                share.append(joules / total)

    def shares(seconds_seen: sparse.csr_matrix) -> StepShares:
        seen = (seconds_seen @ sparse.diags(dynamic_w)).tocsr()
        return StepShares(seen, np.asarray(req, dtype=int), np.asarray(step, dtype=int), np.asarray(share))

    return shares


def logged_static(truth: dict[str, Any], t0_ns: int, static_w: float) -> Drift | None:
    """Static power as the engine logged it step by step, where it drifted (a warming die)."""
    t = np.array([(a + b) / 2 - t0_ns for a, b, *_ in truth["steps"]], dtype=float)
    static = np.array([row[5] for row in truth["steps"]], dtype=float)
    if t.size < 2 or np.ptp(static) == 0:
        return None
    return Drift(t, static - static_w, 1.0, "logged static")


def known_energy(
    run_dir: str | Path, truth: dict[str, Any], engine: EngineConfig
) -> dict[str, dict[int, float]]:
    """Per request id, its energy split over the logged steps as the simulator split them
    (``"logged steps"``: the meter's floor; by its power model where the run's simulator did not
    log each step's split), by its power model over the logged steps (``"logged steps, power
    model"``: the model has no term for graph, forward or per-token joules, and errs where the
    device has them) and over the steps the run infers (``"inferred steps"``), and by the
    default rule over the logged steps (``"logged steps, default rule"``: its step costs, or the
    power model where that explains the meter better, fitted with the engine's true steps in
    place of the ones it infers)."""
    if "steps" not in truth:
        raise ValueError("the simulator kept no steps: run it with record_steps")
    run = RunDir.open(run_dir)
    manifest = run.require_manifest()
    telemetry = run.measured_telemetry()
    if telemetry is None:
        raise ValueError(f"{run_dir} has no telemetry")
    meter = next((m for m in manifest.meters if m.accelerator), None)
    if meter is None:
        raise ValueError(f"{run_dir} has no accelerator meter: was it a simulator run?")
    requests = request_windows(run.measured_records())
    config = AttributionConfig(session_starts_ns=manifest.session_starts_ns)
    t0 = manifest.anchor.monotonic_ns
    model = replace(physics(engine), drift=logged_static(truth, t0, engine.static_w))
    ids = requests.get_column("request_id").to_list()
    out = {}
    logged = logged_steps(requests, truth, t0, engine.prefill_work)
    for name, steps, exact in (
        ("logged steps", logged, caused_shares(truth, requests)),
        ("logged steps, power model", logged, None),
        ("inferred steps", steps_of(requests), None),
    ):
        energy = split_with_known(telemetry, meter, requests, steps, model, config, exact)
        out[name] = dict(zip(ids, energy.tolist(), strict=True))
    own = manifest.finishing
    default = AttributionConfig(
        baseline_w=own.baseline_w,
        context_cost=own.context_cost,
        baseline_window_ns=manifest.baseline_window_ns,
        session_starts_ns=manifest.session_starts_ns,
    )
    costed = attribute_meter(telemetry, meter, requests, default, Work.over(requests, logged)).energy_j
    out["logged steps, default rule"] = dict(zip(ids, costed.tolist(), strict=True))
    return out
