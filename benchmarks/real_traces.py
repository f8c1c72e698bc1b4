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

    python benchmarks/real_traces.py [--traces ../shared/traces] [--rules steps,tokens,equal]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"
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


def score(records: pl.DataFrame, ref: dict[int, float]) -> Score:
    """The traces' scoring of a finished run's records against ``ref``."""
    rows = records.filter(
        (pl.col("status") == "ok") & ~pl.col("warmup") & (pl.col("e2e_latency_s") >= MIN_E2E_S)
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


def finalized(run: Path, workdir: Path, rule: str | None) -> tuple[pl.DataFrame, dict]:
    """A copy of ``run``'s directory finalized with ``rule`` (None: the rule the run recorded,
    ``fitted`` for these runs, the default before ``steps``): its records and summary."""
    from ipw_async import finalize

    copy = workdir / f"{run.parent.name}-{run.name}-{rule or 'default'}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(run / "run", copy)
    for path in copy.rglob("*"):
        path.chmod(0o644 if path.is_file() else 0o755)
    result = finalize(copy, attribution=rule)
    return result.records, result.summary


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--traces", type=Path, default=DEFAULT_TRACES, help="the folder of trace sets (default: %(default)s)"
    )
    ap.add_argument(
        "--rules", default="steps,fitted,tokens,equal", help="attribution rules to score, comma-separated"
    )
    args = ap.parse_args()
    runs = trace_runs(args.traces)
    if not runs:
        sys.exit(f"no real traces under {args.traces}: each run needs run/ and reference_v2.csv")
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
                cover = "—" if s.coverage is None else f"{s.coverage:.0%}"
                half = "—" if s.half_width is None else f"{s.half_width:.1%}"
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


if __name__ == "__main__":
    main()
