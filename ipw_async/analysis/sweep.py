"""``sweep``: the same benchmark at several load levels, repeated, with statistics over repeats.

Each level (a concurrency or an arrival rate) runs ``repeats`` times with seed = seed + r,
each into its own run directory ``<out_dir>/<level>_r<r>``; the sweep's own files go to
``<out_dir>/sweep/``. A run that fails is recorded as failed and the sweep goes on; Ctrl-C
stops it and the files are still written from the runs that finished.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from .. import files
from ..harness import Display, Manifest, RunConfig, RunDirError, RunError, run_benchmark
from ..harness.directory import slug
from ..load import LoadSpec
from .constraints import BEST, best_levels, validate, violations
from .headline import FIGURES, headline_figures
from .pareto import pareto_front
from .plotting import PlotReport
from .repeats import mean_ci
from .rundir import load_run

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
RUN_COLUMNS = ("level", "value", "repeat", "seed", "run_dir", "status", "complete", "simulated", "error")


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


def default_sweep_dir(base: RunConfig) -> Path:
    """``<runs root>/sweep_<UTC time>_<model or sim>``."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = base.model or ("sim" if base.base_url is None else "server")
    return base.runs_root / f"sweep_{stamp}_{slug(name)}"


def level_config(base: RunConfig, level: Level, repeat: int, out_dir: Path) -> RunConfig:
    """The base config at this level and repeat: same dataset slice, seed + repeat."""
    seed = base.seed + repeat
    return dataclasses.replace(
        base,
        concurrency=level.concurrency,
        rate=level.rate,
        seed=seed,
        dataset_seed=base.seed if base.dataset_seed is None else base.dataset_seed,
        output_dir=out_dir / f"{level.label}_r{repeat}",
    )


def run_row(level: Level, repeat: int, config: RunConfig) -> dict[str, Any]:
    """A raw_runs row before the run: figures all null until it finishes."""
    return {
        "level": level.label,
        "value": level.value,
        "repeat": repeat,
        "seed": config.seed,
        "run_dir": str(config.output_dir),
        "status": "failed",
        "complete": False,
        "simulated": config.base_url is None,
        "error": None,
    } | dict.fromkeys(FIGURES)


def _run_id(run_dir: Path) -> str | None:
    try:
        return Manifest.read(run_dir).run_id
    except RunDirError:
        return None


def _fill(row: dict[str, Any], run_dir: Path, previous_id: str | None) -> None:
    """Figures from whatever this run left on disk (an interrupted run leaves records).

    A run refused before it started may have found an older run there: that one is not read.
    """
    run_id = _run_id(run_dir)
    if run_id is None or run_id == previous_id or not (run_dir / files.RECORDS).is_file():
        return
    try:
        run = load_run(run_dir)
    except ValueError:
        return
    row |= headline_figures(run) | {"complete": run.complete}


def run_sweep(
    base: RunConfig,
    concurrency: list[int] | None,
    rates: list[float] | None,
    repeats: int,
    out_dir: Path,
    constraints: dict[str, float | None],
    display: Display | None = None,
    progress: Callable[[dict[str, Any], int, int], None] | None = None,
) -> SweepResult:
    """Run every level ``repeats`` times and write ``<out_dir>/sweep/``; blocking.

    ``display`` shows each run's progress (None: nothing); ``progress(row, done, total)`` is
    called after each run. Raises ValueError for bad arguments before running anything.
    """
    mode, levels = levels_of(concurrency, rates)
    if repeats < 1:
        raise ValueError("--repeats must be at least 1")
    limits = validate(constraints)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    total = len(levels) * repeats
    interrupted = False
    for level in levels:
        for repeat in range(repeats):
            config = level_config(base, level, repeat, out_dir)
            row = run_row(level, repeat, config)
            rows.append(row)
            assert config.output_dir is not None
            previous = _run_id(config.output_dir)
            try:
                asyncio.run(run_benchmark(config, display))
                row["status"] = "ok"
            except RunError as exc:
                row["error"] = str(exc)
            except Exception as exc:  # one broken run must not lose a long sweep
                row["error"] = f"{type(exc).__name__}: {exc}"
            except KeyboardInterrupt:
                row["status"], row["error"] = "interrupted", "stopped by Ctrl-C"
                interrupted = True
            _fill(row, config.output_dir, previous)
            if progress is not None:
                progress(row, len(rows), total)
            if interrupted:
                break
        if interrupted:
            break
    return write_sweep(out_dir, mode, levels, rows, limits, base, repeats, interrupted)


def level_stats(levels: list[Level], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level: run counts and mean/std/ci95 of each metric over its successful runs."""
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
        lv["accepted"], lv["reasons"] = not reasons, reasons


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
    base: RunConfig,
    repeats: int,
    interrupted: bool,
) -> SweepResult:
    """Write raw_runs, summary_stats, the frontiers, summary.json and the plots."""
    from .sweep_plots import plot_sweep  # matplotlib only once there is something to draw

    sweep_dir = out_dir / "sweep"
    sweep_dir.mkdir(parents=True, exist_ok=True)
    _frame(rows, [*RUN_COLUMNS, *FIGURES]).write_csv(sweep_dir / "raw_runs.csv")
    stats = level_stats(levels, rows)
    judge(stats, limits)
    _stats_frame(stats).write_csv(sweep_dir / "summary_stats.csv")
    files.write_json(sweep_dir / "summary_stats.json", {"mode": mode, "levels": stats})
    fronts = frontiers(stats)
    for name, front in fronts.items():
        _frame(front, ["level", "value", *FRONTIERS[name]]).write_csv(
            sweep_dir / f"pareto_frontier_{name}.csv"
        )
    accepted = [lv for lv in stats if lv["accepted"]]
    summary = {
        "mode": mode,
        "levels": [lv.label for lv in levels],
        "repeats": repeats,
        "simulated": base.base_url is None,
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
        },
        "judgement": [
            {k: lv[k] for k in ("level", "value", "accepted", "reasons", "runs", "ok_runs")} for lv in stats
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
        "base_config": base.public(),
    }
    files.write_json(sweep_dir / "summary.json", summary)
    result = SweepResult(out_dir, mode, rows, stats, summary, interrupted)
    result.plots = plot_sweep(mode, stats, rows, fronts, sweep_dir / "plots", base.base_url is None)
    return result
