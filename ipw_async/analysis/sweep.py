"""A sweep's statistics: per level over its repeats, judged against constraints, with Pareto
frontiers and the knees of the load curves, written to ``<out_dir>/sweep/``. The runs
themselves are the harness's (:mod:`ipw_async.harness.sweep`).

A level fails when any repeat's run summary says it was over-saturated; a run whose summary
has no verdict (older runs, or one cut short) is not judged on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ..load import LoadSpec
from ..rundir import RunDir, files
from .constraints import BEST, best_levels, violations
from .headline import FIGURES
from .knee import FLAT, THRESHOLD, find_knee
from .pareto import pareto_front
from .plotting import PlotReport
from .repeats import mean_ci

# the statistics kept per level (mean, std, ci95 over repeats)
STAT_METRICS = (
    "throughput_rps",
    "throughput_tok_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "e2e_p50_s",
    "j_per_query",
    "j_per_token",
    "mean_power_w",
    "accuracy",
    "ipj",
    "tasks_per_s",
    "task_success",
    "j_per_task",
    "task_wall_p50_s",
)
# Pareto frontiers over level means: name -> objectives
FRONTIERS: dict[str, dict[str, str]] = {
    "latency": {"accuracy": "max", "e2e_p50_s": "min"},
    "energy": {"accuracy": "max", "j_per_query": "min"},
}
RUN_COLUMNS = (
    "level",
    "value",
    "repeat",
    "seed",
    "run_dir",
    "status",
    "complete",
    "simulated",
    "oversaturated",
    "error",
)
# knee name -> (metrics in order of preference, whether the metric falls with load)
KNEES: dict[str, tuple[tuple[str, ...], bool]] = {
    "throughput": (("throughput_tok_s", "throughput_rps"), False),
    "energy": (("j_per_token", "j_per_query"), True),
}
KNEE_METHOD = (
    "Kneedle over the level means: log2 load and log2 metric (linear where not all positive), "
    "each scaled to [0, 1], a falling metric flipped; the knee is the level furthest above the "
    f"chord, none when that is under {THRESHOLD:g} or the metric varies by under {FLAT:.0%}"
)


@dataclass
class Level:
    label: str  # c4 (concurrency) or rate2.5 (requests/s)
    value: float  # the concurrency or the rate
    concurrency: int | None
    rate: float | None


@dataclass
class SweepResult:
    out_dir: Path
    mode: str  # "concurrency" or "rate"
    runs: list[dict[str, Any]]  # one row of raw_runs.csv per run
    levels: list[dict[str, Any]]  # per level: counts, stats, verdict (summary_stats.json)
    summary: dict[str, Any]
    interrupted: bool = False
    plots: PlotReport = field(default_factory=PlotReport)

    @property
    def sweep_dir(self) -> Path:
        return self.out_dir / "sweep"


def levels_of(concurrency: list[int] | None, rates: list[float] | None) -> tuple[str, list[Level]]:
    """The levels to run and what they vary; raises ValueError unless exactly one list is given."""
    if bool(concurrency) == bool(rates):
        raise ValueError("give exactly one of --concurrency and --rate, as a comma-separated list")
    if concurrency:
        return "concurrency", [Level(LoadSpec(concurrency=c).label, c, c, None) for c in concurrency]
    assert rates is not None
    # "rate5", not the runner's "r5": run directories end in _r<repeat>
    return "rate", [Level(f"rate{LoadSpec(rate=r).rate:g}", r, None, r) for r in rates]


def oversaturated(row: dict[str, Any]) -> bool | None:
    """The run's own over-saturation verdict from its ``summary.json``; None when it has none.

    Only for a run whose figures were read: a run refused before it started may have found an
    older run's files in its directory.
    """
    if row["status"] != "ok" and row.get("requests_measured") is None:
        return None
    try:
        summary = RunDir.open(row["run_dir"]).summary or {}
    except (OSError, ValueError, TypeError):  # RunDirError is a ValueError
        return None
    verdict = (summary.get("saturation") or {}).get("oversaturated")
    return verdict if isinstance(verdict, bool) else None


def level_stats(levels: list[Level], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level: run counts, over-saturated repeats and mean/std/ci95 of each metric over its
    successful runs."""
    out = []
    for level in levels:
        runs = [r for r in rows if r["level"] == level.label]
        ok = [r for r in runs if r["status"] == "ok"]
        stats = {m: mean_ci(r[m] for r in ok) for m in STAT_METRICS}
        out.append(
            {
                "level": level.label,
                "value": level.value,
                "runs": len(runs),
                "ok_runs": len(ok),
                # over all repeats, failed ones too: a run stopped for over-saturation still says so
                "oversaturated_repeats": sum(r.get("oversaturated") is True for r in runs),
                "saturation_judged": sum(r.get("oversaturated") is not None for r in runs),
                "stats": stats,
                "means": {m: s["mean"] for m, s in stats.items()},
            }
        )
    return out


def judge(stats: list[dict[str, Any]], limits: dict[str, float]) -> None:
    """Mark each level accepted or rejected against the constraints, with the reasons."""
    for lv in stats:
        if lv["runs"] == 0:
            reasons = ["not run (the sweep was stopped)"]
        elif lv["ok_runs"] == 0:
            reasons = ["no successful run"]
        else:
            reasons = violations(lv["means"], limits)
        if over := lv.get("oversaturated_repeats", 0):
            reasons = [*reasons, f"over-saturated in {over} of {lv['runs']} repeats"]
        lv["accepted"], lv["reasons"] = not reasons, reasons


def knees(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The throughput and energy knees over the level means, each None with a reason when
    there is none (see :mod:`ipw_async.analysis.knee`)."""
    out: dict[str, Any] = {"method": KNEE_METHOD, "reasons": {}}
    for name, (metrics, decreasing) in KNEES.items():
        have = {m: [lv for lv in stats if lv["means"].get(m) is not None] for m in metrics}
        # the first metric measured at enough levels; J/query stands in where tokens are not counted
        metric = next((m for m in metrics if len(have[m]) >= 3), metrics[0])
        points = have[metric]
        found = find_knee(
            np.array([lv["value"] for lv in points], dtype=float),
            np.array([lv["means"][metric] for lv in points], dtype=float),
            decreasing=decreasing,
        )
        if not found.found:
            out[name], out["reasons"][name] = None, f"{metric}: {found.reason}"
            continue
        level = next(lv for lv in points if lv["value"] == found.load)
        out[name] = {
            "level": level["level"],
            "load": level["value"],
            "metric": metric,
            "value": found.value,
            "distance": found.distance,  # height above the chord, scaled: how sharp the knee is
            "scale": f"{'log2' if found.log_x else 'linear'} load, {'log2' if found.log_y else 'linear'} metric",
            "method": "kneedle",
        }
        out["reasons"][name] = None
    return out


def knee_lines(found: dict[str, Any]) -> list[str]:
    """One line per knee for a terminal: the level, or why there is none."""
    what = {
        "throughput": "throughput knee (stops growing with load)",
        "energy": "energy knee (J per unit stops falling)",
    }
    lines = []
    for name, label in what.items():
        knee = found.get(name)
        if knee is None:
            lines.append(f"{label}: none ({found['reasons'].get(name)})")
        else:
            lines.append(f"{label}: {knee['level']} ({knee['metric']} {knee['value']:.4g})")
    return lines


def frontiers(stats: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Both Pareto frontiers over the level means, as rows (level, value and the objectives)."""
    out = {}
    for name, objectives in FRONTIERS.items():
        points = [
            {"level": lv["level"], "value": lv["value"]} | {k: lv["means"][k] for k in objectives}
            for lv in stats
        ]
        out[name] = [dict(p) for p in pareto_front(points, objectives)]
    return out


def _stats_frame(stats: list[dict[str, Any]]) -> pl.DataFrame:
    rows = []
    for lv in stats:
        row: dict[str, Any] = {
            "level": lv["level"],
            "value": lv["value"],
            "runs": lv["runs"],
            "ok_runs": lv["ok_runs"],
        }
        for metric, s in lv["stats"].items():
            row |= {f"{metric}_{k}": s[k] for k in ("mean", "std", "ci95", "n")}
        rows.append(row)
    return pl.DataFrame(rows, infer_schema_length=None)


def _frame(rows: list[dict[str, Any]], columns: list[str]) -> pl.DataFrame:
    """Rows as a frame with these columns, typed even when a column is all null."""
    if not rows:
        return pl.DataFrame(schema=dict.fromkeys(columns, pl.String))
    return pl.DataFrame(rows, infer_schema_length=None).select(columns)


def write_sweep(
    out_dir: Path,
    mode: str,
    levels: list[Level],
    rows: list[dict[str, Any]],
    limits: dict[str, float],
    base_config: dict[str, Any],
    simulated: bool,
    repeats: int,
    interrupted: bool,
) -> SweepResult:
    """Write raw_runs, summary_stats, the frontiers, summary.json and the plots."""
    from .sweep_plots import plot_sweep  # matplotlib only once there is something to draw

    sweep_dir = out_dir / "sweep"
    sweep_dir.mkdir(parents=True, exist_ok=True)
    for row in rows:  # the harness may have set it already
        if "oversaturated" not in row:
            row["oversaturated"] = oversaturated(row)
    _frame(rows, [*RUN_COLUMNS, *FIGURES]).write_csv(sweep_dir / "raw_runs.csv")
    stats = level_stats(levels, rows)
    judge(stats, limits)
    _stats_frame(stats).write_csv(sweep_dir / "summary_stats.csv")
    files.write_json(sweep_dir / "summary_stats.json", {"mode": mode, "levels": stats})
    fronts = frontiers(stats)
    found = knees(stats)
    for name, front in fronts.items():
        _frame(front, ["level", "value", *FRONTIERS[name]]).write_csv(
            sweep_dir / f"pareto_frontier_{name}.csv"
        )
    accepted = [lv for lv in stats if lv["accepted"]]
    summary = {
        "mode": mode,
        "levels": [lv.label for lv in levels],
        "repeats": repeats,
        "simulated": simulated,
        "interrupted": interrupted,
        "complete": not interrupted and all(r["status"] == "ok" for r in rows),
        "constraints": limits,
        "constraint_metrics": "level means over successful repeats; TTFT and TPOT are each run's p50",
        "counts": {
            "runs": len(rows),
            "runs_planned": len(levels) * repeats,
            "runs_ok": sum(r["status"] == "ok" for r in rows),
            "runs_failed": sum(r["status"] == "failed" for r in rows),
            "levels": len(stats),
            "accepted": len(accepted),
            "rejected": len(stats) - len(accepted),
            "runs_oversaturated": sum(r["oversaturated"] is True for r in rows),
        },
        "judgement": [
            {
                k: lv[k]
                for k in ("level", "value", "accepted", "reasons", "runs", "ok_runs", "oversaturated_repeats")
            }
            for lv in stats
        ],
        "best": best_levels(stats),
        "best_criteria": {name: f"{d} {metric}" for name, (metric, d) in BEST.items()},
        "pareto": {
            name: {
                "objectives": FRONTIERS[name],
                "levels": [p["level"] for p in front],
                "reason": None if front else f"no level has all of {', '.join(FRONTIERS[name])}",
            }
            for name, front in fronts.items()
        },
        "knees": found,
        "base_config": base_config,
    }
    files.write_json(sweep_dir / "summary.json", summary)
    result = SweepResult(out_dir, mode, rows, stats, summary, interrupted)
    result.plots = plot_sweep(mode, stats, rows, fronts, sweep_dir / "plots", simulated, found)
    return result
