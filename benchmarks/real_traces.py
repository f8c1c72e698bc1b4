"""Per-query energy against real GPU runs: the benchmark for every attribution claim.

Each directory ``<traces>/<set>/<run>/`` that holds ``run/`` (a run directory as ``ipw-async run``
wrote it on real hardware) and ``reference_v2.csv`` (each request's energy under accounting
convention v2, built from the server's own step log and a probe of the GPU's physics; see the
set's README) is re-finalized here, on a copy, with each attribution rule, and scored as the
traces' own ``score.py`` scores: requests with status ``ok``, not warm-up, e2e ≥ 2 s, joined on
``request_id``; error = (energy − reference) / reference.

Printed per run and rule: scored requests, p50 and p95 of |error|, bias (mean signed error),
Σ energy / Σ reference, and for the band (``energy_low_j`` … ``energy_high_j``) the share of
requests whose reference it holds and its median half-width relative to the energy; then the
static power, the costs the default rule found (and those the BIC left out) and its held-out
interval error, and the decode graphs' padding it chose
(each candidate's RMS residual over the decode steps' times). A new real run joins by being put there.

**The static the reference assumed.** The shipped reference fits each run's static power beside
two scale factors. Where the load rises and falls with time that static is barely identified:
on the H100's Poisson run a fitted 99.5 W (98.2 W in the shipped reference) and the measured
idle 125.5 W explain the counter's intervals about equally (R² 0.815 and 0.812), yet move the
reference by 6.6% at p95 (the set's README). Where a
set has the server's step log (``steps.json``, or ``steps.json.gz``) and the probe (``physics.json``), the default
rule is also scored against the reference rebuilt here at both statics: the one fitted (which
shows how closely the rebuild reproduces ``reference_v2.csv``) and the rule's own, the run's
measured idle. The rebuild follows the set's README, and on purpose none of ipw-async's own
readings (its virtual counter, its slot replay): a reference that shared the tool's reading of
the counter would share its errors too.

1. the step log and a replay of the server's slot allocation (first free slot) give each
   decode step's padded batch (the power of two above its highest busy slot) and attention
   length (the power of two above its longest context, 128 at least);
2. the probe prices them, above its idle: a decode step a + b·rows + c·rows·length, a prefill
   chunk of T tokens ending at position e f + g·T + h·T·e, each fitted to the probe's rows;
3. the energy counter's intervals from ``telemetry.arrow`` (each new reading timed at the
   update grid point before it, the grids ``run.json`` learned), and a least-squares fit
   ``counter = static·dt + k_dec·decode + k_pre·prefill`` over a meter shift of −40…+40 ms;
4. each interval's energy above static spread over its steps by their priced energy (pro-rated
   by time overlap), each step's share split by convention v2 (a prefill chunk to its request,
   the decode graph equally to its decoders), static shared equally at every instant by the
   requests on the server (arrived, not yet finished); an interval with requests and no step
   gives its energy above static equally to them.

**Shorter runs.** ``--cuts 0.25,0.5`` also scores each run as if it had stopped sending at that
share of its sending span: a copy keeps the requests sent by then (whole) and the telemetry up
to then, is finalized on its own with the default rule (a fit from that much of the run alone),
and is scored on the requests that ended by then (warm-up included), beside the whole run's score on the same
requests. The held-out runs a claim is checked on differ in length and load; a cut is a run of
the same GPU the fit has less of.

**Without the counter.** ``--without-counter`` also scores each run read as a device without
an energy counter (or one whose counter was distrusted) reads: its energy column dropped, the
default rule integrates the power it logged beside, the device's 1 s average (placed a window
late) or, in a second copy, the instant field alone; and how far that instant field, integrated,
strays from the counter over 1 s and 10 s windows and over the run.

    python benchmarks/real_traces.py [--traces DIR]... [--rules steps,tokens,equal]
        [--cuts 0.25,0.5] [--without-counter]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import heapq
import json
import shutil
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parent.parent
# the sets beside the clone (the H100's) and those kept in this repository (runs from lent GPUs)
DEFAULT_TRACES = (ROOT.parent / "shared" / "traces", ROOT / "benchmarks" / "traces")
MIN_E2E_S = 2.0


@dataclass(frozen=True)
class Score:
    n: int
    p50: float
    p95: float
    bias: float
    sum_ratio: float
    coverage: float | None  # share of scored requests whose reference the band holds
    half_width: float | None  # median (high − low) / 2 / energy


def trace_runs(traces: Path) -> list[Path]:
    """Every ``<set>/<run>`` under ``traces`` that holds a run directory and its reference."""
    return sorted(p.parent for p in traces.glob("*/*/reference_v2.csv") if (p.parent / "run").is_dir())


def reference(run: Path, column: str = "reference_j") -> dict[int, float]:
    with open(run / "reference_v2.csv") as f:
        return {int(r["request_id"]): float(r[column]) for r in csv.DictReader(f)}


def score(records: pl.DataFrame, ref: dict[int, float], warmup: bool = False) -> Score:
    """The traces' scoring of a finished run's records against ``ref`` (the warm-up's requests
    too with ``warmup``)."""
    rows = records.filter(
        (pl.col("status") == "ok") & (warmup | ~pl.col("warmup")) & (pl.col("e2e_latency_s") >= MIN_E2E_S)
    ).filter(pl.col("request_id").is_in(list(ref)) & pl.col("energy_j").is_not_null())
    truth = np.array([ref[q] for q in rows.get_column("request_id").to_list()])
    energy = rows.get_column("energy_j").to_numpy()
    rel = (energy - truth) / truth
    low, high = (rows.get_column(c).to_numpy().astype(float) for c in ("energy_low_j", "energy_high_j"))
    banded = np.isfinite(low) & np.isfinite(high)
    coverage = float(np.mean((low <= truth) & (truth <= high))) if banded.all() else None
    half = float(np.median((high - low) / 2 / energy)) if banded.all() else None
    return Score(
        rel.size,
        float(np.percentile(np.abs(rel), 50)),
        float(np.percentile(np.abs(rel), 95)),
        float(rel.mean()),
        float(energy.sum() / truth.sum()),
        coverage,
        half,
    )


def copied(run: Path, workdir: Path, name: str) -> Path:
    """A writable copy of ``run``'s run directory in ``workdir`` (the traces are read-only)."""
    copy = workdir / f"{run.parent.name}-{run.name}-{name}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(run / "run", copy)
    for path in copy.rglob("*"):
        path.chmod(0o644 if path.is_file() else 0o755)
    return copy


def finalized(run: Path, workdir: Path, rule: str | None) -> tuple[pl.DataFrame, dict]:
    """A copy of ``run``'s directory finalized with ``rule`` (None: the rule the run recorded,
    ``fitted`` for these runs, the default before ``steps``): its records and summary."""
    from ipw_async import finalize
    from ipw_async.energy.settings import DEFAULT_CONTEXT_COST

    copy = copied(run, workdir, rule or "default")
    # the runs predate --context-cost and would keep the reading they had: today's default instead
    result = finalize(copy, attribution=rule, context_cost=DEFAULT_CONTEXT_COST)
    return result.records, result.summary


def cut(run: Path, workdir: Path, fraction: float) -> tuple[Path, int]:
    """A copy of ``run``'s directory as if it had stopped sending at ``fraction`` of its sending
    span, and that time (ns on the run's clock): the requests sent by then, whole, and the
    telemetry read by then (a request still in flight is imputed past it). Every request on the
    server before that time is in the copy, so a fit to its intervals knows all their work."""
    from ipw_async.rundir.files import read_arrow

    copy = copied(run, workdir, f"cut{fraction:g}")
    # a run of format 2 and later keeps its measured records apart from the finished ones
    kept = [copy / name for name in ("measured.arrow", "records.arrow") if (copy / name).is_file()]
    sent = read_arrow(kept[0]).get_column("sent_ns")
    until = int(sent.min() + fraction * (sent.max() - sent.min()))
    for path in kept:
        read_arrow(path).filter(pl.col("sent_ns") <= until).write_ipc_stream(path)
    telemetry = read_arrow(copy / "telemetry.arrow")
    read = pl.any_horizontal([pl.col(c) <= until for c in telemetry.columns if c.endswith(".t_ns")])
    telemetry.filter(read).write_ipc_stream(copy / "telemetry.arrow")
    (copy / "summary.json").unlink(missing_ok=True)
    return copy, until


def by_default(copy: Path) -> pl.DataFrame:
    """A changed copy of a run finalized with the default rule: its records."""
    from ipw_async import finalize
    from ipw_async.energy.settings import DEFAULT_CONTEXT_COST

    return finalize(copy, attribution="steps", context_cost=DEFAULT_CONTEXT_COST).records


def cut_scores(run: Path, workdir: Path, fraction: float, whole: pl.DataFrame) -> tuple[Score, Score]:
    """The default rule's score on a cut of ``run`` (:func:`cut`) over the requests that ended
    before it stopped sending, warm-up included (most of an early cut's), and the whole run's
    (``whole``: its finished records) on them."""
    copy, until = cut(run, workdir, fraction)
    records = by_default(copy)
    ended = records.filter(pl.col("closed_ns") <= until).get_column("request_id").to_list()
    ref = reference(run)
    scored = {q: ref[q] for q in ended if q in ref}
    return score(records, scored, warmup=True), score(whole, scored, warmup=True)


def without_counter(run: Path, workdir: Path, quantity: str) -> Path:
    """A copy of ``run``'s directory whose GPUs read only their power ``quantity``
    (``avg_power_w`` or ``power_w``): the energy column and the other power column dropped,
    each GPU meter in ``run.json`` a power meter of that quantity."""
    from ipw_async.rundir.files import read_arrow

    copy = copied(run, workdir, quantity)
    manifest = json.loads((copy / "run.json").read_text())
    gpus = [m for m in manifest["telemetry"]["meters"] if m["accelerator"]]
    other = "power_w" if quantity == "avg_power_w" else "avg_power_w"
    drop = [f"{m['channel']}.{c}" for m in gpus for c in ("energy_j", other)]
    telemetry = read_arrow(copy / "telemetry.arrow")
    telemetry.drop([c for c in drop if c in telemetry.columns]).write_ipc_stream(copy / "telemetry.arrow")
    for meter in gpus:
        meter.update(kind="power", power_quantity=quantity, grids=[])
    (copy / "run.json").write_text(json.dumps(manifest))
    (copy / "summary.json").unlink(missing_ok=True)
    return copy


def power_scores(run: Path, workdir: Path) -> list[tuple[str, Score]]:
    """The default rule's score on ``run`` read without its counter (:func:`without_counter`),
    from its GPU's average power and from its instant power (named with the stretches of
    readings its energy was kept over, where it was)."""
    ref = reference(run)
    out = []
    for quantity, name in (("avg_power_w", "its 1 s average"), ("power_w", "its instant field")):
        copy = without_counter(run, workdir, quantity)
        records = by_default(copy)
        summary = json.loads((copy / "summary.json").read_text())
        kept = summary["energy"]["meters"]["gpu0"].get("power_model", {}).get("conserved_over")
        if kept:
            length = kept["length_s"]
            name += f" (kept over {'the whole run' if length is None else f'{length:g} s'})"
        out.append((name, score(records, ref)))
    return out


def instant_against_counter(run: Path, windows_s: tuple[float, ...] = (1.0, 10.0)) -> dict[str, float]:
    """How far the GPU's instant power field, integrated by the trapezoid rule, strays from its
    energy counter: the standard deviation of their ratio over consecutive windows of each
    length (``"1 s"``, ``"10 s"``), and the ratio over the whole run (``"run"``)."""
    from ipw_async.rundir.files import read_arrow

    manifest = json.loads((run / "run" / "run.json").read_text())
    gpu = next(m for m in manifest["telemetry"]["meters"] if m["accelerator"])
    columns = [f"{gpu['source']}.t_ns", f"{gpu['channel']}.energy_j", f"{gpu['channel']}.power_w"]
    t, energy, power = read_arrow(run / "run" / "telemetry.arrow").select(columns).drop_nulls().to_numpy().T
    integral = np.concatenate(([0.0], np.cumsum((power[1:] + power[:-1]) / 2 * np.diff(t) / 1e9)))
    out = {"run": float(integral[-1] / (energy[-1] - energy[0]))}
    for window in windows_s:
        edges = np.searchsorted(t, np.arange(t[0], t[-1], window * 1e9))
        counted, integrated = np.diff(energy[edges]), np.diff(integral[edges])
        out[f"{window:g} s"] = float(np.std(integrated[counted > 0] / counted[counted > 0]))
    return out


SHIFTS_MS = range(-40, 45, 5)  # the meter shifts the rebuild tries, ms
FIRST_LENGTH = 128  # the server's shortest attention bucket
SLOTS = 128  # the server's KV slots


@dataclass(frozen=True)
class Probe:
    """Joules above the probe's idle: a decode step (per step, per padded row, per row and
    attention position) and a prefill chunk (per chunk, per token, per token and end position)."""

    decode: tuple[float, float, float]
    prefill: tuple[float, float, float]

    @classmethod
    def read(cls, path: Path) -> Probe:
        probe = json.loads(path.read_text())
        idle = probe["idle_w"]
        rows = probe["rows"]

        def above_idle(r: dict) -> float:
            return r["j_per_step"] - idle * r["step_ms"] / 1000

        graphs = [r for r in rows if r.get("mode") == "graph" and "batch" in r]
        x = np.array([[1.0, r["batch"], r["batch"] * _bucket(r["context"])] for r in graphs])
        decode = np.linalg.lstsq(x, np.array([above_idle(r) for r in graphs]), rcond=None)[0]
        chunks = [r for r in rows if "prefill_tokens" in r]
        x = np.array(
            [
                [1.0, r["prefill_tokens"], r["prefill_tokens"] * (r["start"] + r["prefill_tokens"])]
                for r in chunks
            ]
        )
        prefill = np.linalg.lstsq(x, np.array([above_idle(r) for r in chunks]), rcond=None)[0]
        a, b, c = (float(v) for v in decode)
        f, g, h = (float(v) for v in prefill)
        return cls((a, b, c), (f, g, h))


@dataclass(frozen=True)
class Rebuilt:
    reference: dict[int, float]  # request_id → joules
    static_w: float
    shift_ms: int
    k_decode: float
    k_prefill: float
    r2: float  # of the counter's intervals
    idle_j: float  # the counter's energy while no request was on the server: no one's


def _bucket(length: float) -> int:
    return max(FIRST_LENGTH, 1 << int(np.ceil(np.log2(max(length, 1)))))


@dataclass
class _Steps:
    start: np.ndarray  # ns on the run's clock
    end: np.ndarray
    decode: np.ndarray  # priced joules per step
    prefill: np.ndarray
    shares: list[dict[str, float]]  # per step: server rid → its priced joules, by convention v2


def _priced_steps(log: dict, probe: Probe, t0_ns: int) -> _Steps:
    """Every logged step priced by the probe, with each request's part of it."""
    steps = log["steps"]
    prompt = {r["rid"]: r["prompt_tokens"] for r in log["requests"]}
    last: dict[str, int] = {}
    for k, s in enumerate(steps):
        for rid in [*s["decode"], *s["prefill"]]:
            last[rid] = k
    free = list(range(SLOTS))
    slot: dict[str, int] = {}
    decoded: dict[str, int] = defaultdict(int)
    filled: dict[str, int] = defaultdict(int)
    a, b, c = probe.decode
    f, g, h = probe.prefill
    decode, prefill, shares = np.zeros(len(steps)), np.zeros(len(steps)), []
    for k, s in enumerate(steps):
        for rid in [*s["prefill"], *s["decode"]]:
            if rid not in slot:
                slot[rid] = heapq.heappop(free)
        share: dict[str, float] = defaultdict(float)
        if s["decode"]:
            rows = 1 << int(np.ceil(np.log2(max(slot[r] for r in s["decode"]) + 1)))
            length = _bucket(max(prompt[r] + 1 + decoded[r] for r in s["decode"]))
            decode[k] = a + b * rows + c * rows * length
            for rid in s["decode"]:
                share[rid] += decode[k] / len(s["decode"])
                decoded[rid] += 1
        for rid, tokens in s["prefill"].items():
            filled[rid] += tokens
            chunk = f + g * tokens + h * tokens * filled[rid]
            prefill[k] += chunk
            share[rid] += chunk
        shares.append(share)
        for rid in {*s["prefill"], *s["decode"]}:
            if last[rid] == k:
                heapq.heappush(free, slot.pop(rid))
    start = np.array([s["start"] * 1e9 - t0_ns for s in steps])
    end = np.array([s["end"] * 1e9 - t0_ns for s in steps])
    return _Steps(start, end, decode, prefill, shares)


def counter_intervals(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """The accelerator counter's update times (ns) and joules between them: each new reading
    timed at the last point of the update grid (``run.json``) before it was read."""
    meta = json.loads((run_dir / "run.json").read_text())
    meter = next(m for m in meta["telemetry"]["meters"] if m.get("accelerator") and m["kind"] == "counter")
    channel, grids = meter["channel"], meter["grids"]
    telemetry = pl.read_ipc_stream(run_dir / "telemetry.arrow")
    source = meter["source"]
    reads = telemetry.select(pl.col(f"{source}.t_ns"), pl.col(f"{channel}.energy_j")).drop_nulls()
    t = reads.get_column(f"{source}.t_ns").to_numpy().astype(float)
    e = reads.get_column(f"{channel}.energy_j").to_numpy()
    new = np.concatenate(([True], np.diff(e) != 0))
    t, e = t[new], e[new]
    learned = np.array([g["learned_at_ns"] for g in grids])
    which = np.clip(np.searchsorted(learned, t, side="right") - 1, 0, len(grids) - 1)
    period = np.array([grids[i]["period_ms"] * 1e6 for i in which])
    phase = np.array([grids[i]["phase_ns"] for i in which])
    knots = phase + np.floor((t - phase) / period) * period
    return knots, np.diff(e)


def _spread(knots: np.ndarray, start: np.ndarray, end: np.ndarray, joules: np.ndarray) -> np.ndarray:
    """intervals × steps: each step's joules spread evenly over its time."""
    seen = np.zeros((knots.size - 1, start.size))
    for k in np.flatnonzero((joules != 0) & (end > knots[0]) & (start < knots[-1])):
        first = max(int(np.searchsorted(knots, start[k], "right")) - 1, 0)
        last = min(int(np.searchsorted(knots, end[k], "left")) - 1, knots.size - 2)
        for i in range(first, last + 1):
            overlap = min(end[k], knots[i + 1]) - max(start[k], knots[i])
            if overlap > 0:
                seen[i, k] = joules[k] * overlap / max(end[k] - start[k], 1.0)
    return seen


def rebuild(run: Path, static_w: float | None) -> Rebuilt:
    """``run``'s reference (``<set>/<run>``, beside its set's ``steps.json`` and ``physics.json``)
    at ``static_w`` (None: fitted with the scale factors, as the shipped reference)."""
    run_dir = run / "run"
    t0 = json.loads((run_dir / "run.json").read_text())["clock"]["t0_monotonic_ns"]
    log = step_log(run.parent)
    steps = _priced_steps(log, Probe.read(run.parent / "physics.json"), t0)
    with open(run / "request_map.csv") as f:
        request_of = {r["server_rid"]: int(r["request_id"]) for r in csv.DictReader(f)}
    knots, energy = counter_intervals(run_dir)
    dt = np.diff(knots) / 1e9
    best = None
    for shift in SHIFTS_MS:
        s, e = steps.start + shift * 1e6, steps.end + shift * 1e6
        decode, prefill = _spread(knots, s, e, steps.decode), _spread(knots, s, e, steps.prefill)
        x = np.column_stack((decode.sum(1), prefill.sum(1)))
        if static_w is None:
            static, *k = np.linalg.lstsq(np.column_stack((dt, x)), energy, rcond=None)[0]
        else:
            static, k = static_w, list(np.linalg.lstsq(x, energy - static_w * dt, rcond=None)[0])
        residual = energy - static * dt - x @ np.array(k)
        r2 = 1 - residual.var() / energy.var()
        if best is None or r2 > best[0]:
            best = (r2, shift, float(static), float(k[0]), float(k[1]), decode + prefill)
    assert best is not None
    r2, shift, static, k_decode, k_prefill, seen = best
    # every request the server held shares its static, joined to a record or not (another
    # run's are outside this run's metered span)
    on_server = [(r["arrive"] * 1e9 - t0, r["last_write"] * 1e9 - t0, r["rid"]) for r in log["requests"]]
    joules: dict[str, float] = defaultdict(float)
    idle = 0.0
    for i in range(energy.size):
        above = energy[i] - static * dt[i]
        total = seen[i].sum()
        if total > 0:
            for k in np.flatnonzero(seen[i]):
                part = above * seen[i, k] / total
                step = steps.shares[k]
                priced = sum(step.values())
                for rid, j in step.items():
                    joules[rid] += part * j / priced
        else:
            present = [rid for a, b, rid in on_server if a < knots[i + 1] and b > knots[i]]
            for rid in present:
                joules[rid] += above / len(present)
            idle += 0.0 if present else above
    # static, equally at every instant among the requests on the server, within the metered span
    times = [knots[0], knots[-1], *(x for a, b, _ in on_server for x in (a, b))]
    for lo, hi in pairwise(np.unique(np.clip(times, knots[0], knots[-1]))):
        present = [rid for a, b, rid in on_server if a <= (lo + hi) / 2 < b]
        for rid in present:
            joules[rid] += static * (hi - lo) / 1e9 / len(present)
        idle += 0.0 if present else static * (hi - lo) / 1e9
    # a server request no record was joined to keeps its energy, and is scored against nothing
    reference = {request_of[rid]: j for rid, j in joules.items() if rid in request_of}
    return Rebuilt(reference, static, shift, k_decode, k_prefill, float(r2), idle)


def step_log(trace_set: Path) -> dict:
    """The server's step log of a set: ``steps.json``, or gzipped as sets kept in this repository are."""
    plain = trace_set / "steps.json"
    if plain.is_file():
        return json.loads(plain.read_text())
    with gzip.open(trace_set / "steps.json.gz", "rt") as f:
        return json.load(f)


def rebuildable(run: Path) -> bool:
    """Whether ``run``'s set has what :func:`rebuild` needs."""
    return (
        any((run.parent / name).is_file() for name in ("steps.json", "steps.json.gz"))
        and (run.parent / "physics.json").is_file()
        and (run / "request_map.csv").is_file()
    )


def between_steps(run: Path, margin_ns: float = 40e6) -> tuple[int, float | None]:
    """The counter's intervals inside ``run`` that no logged step comes within ``margin_ns``
    of, and their median power: the static the device draws while serving, seen directly."""
    t0 = json.loads((run / "run" / "run.json").read_text())["clock"]["t0_monotonic_ns"]
    steps = step_log(run.parent)["steps"]
    start = np.array([s["start"] * 1e9 - t0 for s in steps])
    end = np.array([s["end"] * 1e9 - t0 for s in steps])
    knots, energy = counter_intervals(run / "run")
    lo, hi = knots[:-1], knots[1:]
    first, last = np.searchsorted(start, lo - margin_ns), np.searchsorted(start, hi + margin_ns)
    # steps never overlap, so one ending within the margin is the one before ``first``
    clear = (first == last) & (end[np.maximum(first - 1, 0)] < lo - margin_ns)
    clear &= (lo > start.min()) & (hi < end.max())
    power = energy[clear] / (np.diff(knots)[clear] / 1e9)
    return int(clear.sum()), float(np.median(power)) if power.size else None


def against_rebuilt(run: Path, records: pl.DataFrame, static_w: float) -> str:
    """The records' p50 / p95 against the reference rebuilt at the fitted static and at
    ``static_w``, and how closely the fitted one reproduces the shipped reference."""
    shipped = reference(run)
    fitted, own = rebuild(run, None), rebuild(run, static_w)
    ids = sorted(shipped)
    drift = np.abs([fitted.reference[q] / shipped[q] - 1 for q in ids])
    at_fitted, at_own = score(records, fitted.reference), score(records, own.reference)
    clear, power = between_steps(run)
    return (
        f"between steps inside the run ({clear} counter intervals): "
        f"{'—' if power is None else f'{power:.1f} W'}; "
        f"rebuilt reference (reproduces the shipped one to p50 {np.median(drift):.1%} / "
        f"p95 {np.percentile(drift, 95):.1%}): static fitted {fitted.static_w:.1f} W "
        f"(R² {fitted.r2:.3f}): p50 {at_fitted.p50:.1%} p95 {at_fitted.p95:.1%}; "
        f"at the measured idle {own.static_w:.1f} W (R² {own.r2:.3f}): "
        f"p50 {at_own.p50:.1%} p95 {at_own.p95:.1%} bias {at_own.bias:+.1%}"
    )


def _band(s: Score) -> str:
    """The band's coverage and median half-width, "— ±—" where a request had none."""
    if s.coverage is None or s.half_width is None:
        return "— ±—"
    return f"{s.coverage:.0%} ±{s.half_width:.1%}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--traces",
        type=Path,
        action="append",
        help="a folder of trace sets; repeat for several (default: ../shared/traces and benchmarks/traces)",
    )
    ap.add_argument(
        "--rules", default="steps,fitted,tokens,equal", help="attribution rules to score, comma-separated"
    )
    ap.add_argument(
        "--cuts",
        default="",
        help="also score each run cut short at these shares of its sending span, comma-separated (e.g. 0.25,0.5)",
    )
    ap.add_argument(
        "--without-counter",
        action="store_true",
        help="also score each run read from its GPU's averaged power, and from its instant power, without its counter",
    )
    args = ap.parse_args()
    folders = args.traces or DEFAULT_TRACES
    runs = [run for folder in folders for run in trace_runs(folder)]
    if not runs:
        sys.exit(
            f"no real traces under {', '.join(map(str, folders))}: each run needs run/ and reference_v2.csv"
        )
    rules = args.rules.split(",")
    print(
        f"{'run':28s} {'rule':7s} {'n':>4s} {'p50':>6s} {'p95':>6s} {'bias':>7s} {'Σ/Σref':>7s} {'cover':>6s} {'±half':>6s}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            ref = reference(run)
            for rule in rules:
                records, summary = finalized(run, Path(tmp), rule)
                s = score(records, ref)
                cover, half = _band(s).split(" ±")
                print(
                    f"{run.parent.name + '/' + run.name:28s} {rule:7s} {s.n:4d} {s.p50:6.1%} {s.p95:6.1%} "
                    f"{s.bias:+7.1%} {s.sum_ratio:7.3f} {cover:>6s} {half:>6s}"
                )
                if rule == "steps":
                    meters = summary["energy"]["meters"]
                    model = next((m["power_model"] for m in meters.values() if "power_model" in m), None)
                    if model:
                        costs = {k: round(v, 5) for k, v in model["costs"].items() if v}
                        held = model.get("held_out_error")
                        print(
                            f"{'':28s} static {model['static_w']:.1f} W ({model['static_source']}), "
                            f"R² {model['r2']:.2f}, held-out interval error {'—' if held is None else f'{held:.1%}'}, "
                            f"costs {json.dumps(costs)} (each chosen in "
                            f"{json.dumps({k: round(v, 2) for k, v in model.get('chosen_in', {}).items()})} "
                            "of the resamplings they are the mean of); charged in none: "
                            f"{', '.join(model.get('unsupported', [])) or 'none'}"
                        )
                        graph = model.get("decode_graph") or {}
                        rms = ", ".join(
                            f"{k} {v:.2f}" for k, v in (graph.get("step_time_rms_ms") or {}).items()
                        )
                        print(
                            f"{'':28s} decode graphs: {graph.get('layout')} padded to "
                            f"{'|'.join([str(graph.get('capture_sizes')), *graph.get('alike', [])])} "
                            f"({graph.get('source')}); step-time RMS ms: {rms}"
                        )
                        if rebuildable(run):
                            print(f"{'':28s} {against_rebuilt(run, records, model['static_w'])}")
                    if args.without_counter:
                        spread = instant_against_counter(run)
                        print(
                            f"{'':28s} its instant field integrated against its counter: ratio "
                            f"{spread['run']:.3f} over the run, standard deviation "
                            + ", ".join(f"{v:.1%} over {k}" for k, v in spread.items() if k != "run")
                        )
                    for name, power in power_scores(run, Path(tmp)) if args.without_counter else []:
                        print(
                            f"{'':28s} without its counter, from {name}: p50 {power.p50:.1%} p95 {power.p95:.1%} "
                            f"bias {power.bias:+.1%} Σ/Σref {power.sum_ratio:.3f}, band {_band(power)}"
                        )
                    for fraction in (float(c) for c in args.cuts.split(",") if c):
                        short, same = cut_scores(run, Path(tmp), fraction, records)
                        print(
                            f"{'':28s} cut at {fraction:.0%} of its sends: {short.n} requests ended by then, "
                            f"p50 {short.p50:.1%} p95 {short.p95:.1%} bias {short.bias:+.1%}, band "
                            f"{_band(short)}; the whole run on them p95 {same.p95:.1%} bias {same.bias:+.1%}"
                        )


if __name__ == "__main__":
    main()
