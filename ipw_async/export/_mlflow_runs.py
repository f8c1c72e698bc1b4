"""A finished run directory, or a sweep's, read into the MLflow runs it becomes: params, metrics,
tags and artifacts, all read (and redacted) before MLflow is contacted."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipw_async.export import ExportError
from ipw_async.rundir import files
from ipw_async.rundir.manifest import Manifest, RunDirError
from ipw_async.rundir.read import HEADLINE, RunDir

from . import _mlflow_values as clean

# every MLflow server takes 500 characters (2.x and later take 6000); the whole config is in
# summary.json, logged beside
MAX_PARAM_CHARS = 500
SWEEP_DIR = "sweep"
SWEEP_RUNS = "raw_runs.csv"
SWEEP_STATS = "summary_stats.json"


@dataclass
class MlflowRun:
    """One MLflow run to be: read, redacted and made valid before MLflow is contacted."""

    name: str
    params: dict[str, str]
    metrics: list[tuple[str, float, int]]  # key, value, step
    tags: dict[str, str]
    artifacts: list[tuple[Path, str | None]]  # local file, directory among the run's artifacts
    start_ms: int | None
    end_ms: int | None
    status: str  # FINISHED, KILLED or FAILED
    children: list[MlflowRun]


# --- one run -----------------------------------------------------------------------------------


def read_run(path: Path, work: Path, name: str, extra_tags: dict[str, str] | None = None) -> MlflowRun:
    """A finished run directory as an MLflow run (with ``extra_tags``, e.g. its sweep level)."""
    try:
        run = RunDir.open_finished(path)
        manifest = run.require_manifest()
    except (RunDirError, OSError) as exc:
        raise ExportError(clean.brief(str(exc))) from None
    summary = run.summary
    assert summary is not None  # a finished run with a run.json has its summary
    values, reasons = _run_metrics(summary)
    more, more_reasons = _intelligence(run)
    values |= more
    reasons |= more_reasons
    metrics, missing = clean.present(values, reasons)
    found = [
        (path / n, None) for n in (files.SUMMARY, files.RUN, files.TRACES) if (path / n).is_file()
    ]
    if (path / files.REPORT).is_file():
        found.append((path / files.REPORT, None))
    found += [(png, clean.folder(png, path)) for png in sorted(path.rglob("*.png"))]
    artifacts, skipped = clean.artifacts(found, work)
    params, truncated = clean.limited(_run_params(summary, manifest), MAX_PARAM_CHARS)
    notes = {
        "ipw_async.run_id": manifest.run_id,
        "ipw_async.simulated": clean.flag(summary.get("simulated", manifest.simulated)),
        "ipw_async.complete": clean.flag(summary.get("complete")),
        "ipw_async.run_dir": str(path.resolve()),
        "ipw_async.missing_metrics": json.dumps(missing) if missing else None,
        "ipw_async.skipped_artifacts": json.dumps(skipped) if skipped else None,
        "ipw_async.truncated_params": ", ".join(truncated) or None,
    }
    start_ms, end_ms = _times(manifest, summary)
    return MlflowRun(
        name=name,
        params=params,
        metrics=metrics,
        tags=clean.tags(notes | (extra_tags or {})),
        artifacts=artifacts,
        start_ms=start_ms,
        end_ms=end_ms,
        status=_status(summary),
        children=[],
    )


def _run_params(summary: dict[str, Any], manifest: Manifest) -> dict[str, str]:
    """The run's config flattened, and what the run resolved: its model, dataset and server (the
    config has what was asked, e.g. no model for "the server's first")."""
    params = clean.flatten(summary.get("config") or manifest.config)
    resolved = {
        "model": summary.get("model", manifest.model),
        "dataset": summary.get("dataset", manifest.workload.get("dataset")),
        "base_url": summary.get("base_url", manifest.base_url),
        "simulated": summary.get("simulated", manifest.simulated),
        "run_id": manifest.run_id,
        "version": (summary.get("versions") or manifest.versions).get("ipw-async"),
    }
    return params | {key: clean.text(key, value) for key, value in resolved.items()}


def _run_metrics(summary: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The run's figures from its summary (None where missing), and why a missing one is."""
    requests = summary.get("requests") or {}
    throughput = summary.get("throughput") or {}
    energy = summary.get("energy") or {}
    per_query = energy.get("per_query_j") or {}
    band = energy.get("band_half_width") or {}
    measured, failed = requests.get("measured"), requests.get("failed")
    values: dict[str, Any] = {
        "requests_measured": measured,
        "requests_ok": requests.get("ok"),
        "requests_failed": failed,
        "error_rate": failed / measured if measured and failed is not None else None,
        "window_s": summary.get("window_s"),
        "requests_per_s": throughput.get("requests_per_s"),
        "output_tokens_per_s": throughput.get("output_tokens_per_s"),
        "accuracy": (summary.get("accuracy") or {}).get("accuracy"),
    }
    reasons = {
        "error_rate": "no measured requests",
        "window_s": "no measured requests",
        "requests_per_s": "no measured window",
        "output_tokens_per_s": "no output tokens counted",
        "accuracy": "no scored answers",
    }
    for name, dist in (summary.get("latency_s") or {}).items():
        for stat, value in dist.items():
            if stat != "count":
                values[f"{name}_{stat}_s"] = value
                reasons[f"{name}_{stat}_s"] = f"no request has a {name}"
    energy_values = {
        "j_per_query_p50": per_query.get("p50"),
        "j_per_query_mean": per_query.get("mean"),
        "j_per_output_token": energy.get("j_per_output_token"),
        "energy_total_j": energy.get("total_j"),
        "energy_idle_j": energy.get("idle_j"),
        "conservation_error": _conservation(energy),
        "band_half_width_p50": band.get("p50"),
        "band_half_width_mean": band.get("mean"),
    }
    for meter, figures in (energy.get("meters") or {}).items():
        for key in ("total_j", "idle_j", "conservation_error"):
            energy_values[f"meter.{clean.valid_name(meter)}.{key}"] = figures.get(key)
    skipped = "; ".join(f"{source}: {why}" for source, why in (energy.get("skipped") or {}).items())
    no_energy = (
        "no query has an energy figure"
        if per_query
        else f"no energy meter ({skipped})"
        if skipped
        else "no energy meter"
    )
    return values | energy_values, reasons | dict.fromkeys(energy_values, no_energy)


def _conservation(energy: dict[str, Any]) -> float | None:
    """The headline meters' conservation error: the largest in size where there are several."""
    headline = set(energy.get("headline_meters") or ())
    meters = energy.get("meters") or {}
    errors = [m.get("conservation_error") for name, m in meters.items() if name in headline]
    present = [e for e in errors if e is not None]
    return max(present, key=abs) if present else None


def _intelligence(run: RunDir) -> tuple[dict[str, Any], dict[str, str]]:
    """IPJ and IPW as ``analyze`` gives them: accuracy over the headline meter's mean energy and
    power per query, imputed where a query has none."""
    from ipw_async.analysis.accuracy import accuracy_counts, meter_report

    try:
        records = run.records
    except (ValueError, OSError) as exc:
        raise ExportError(f"{run.path} cannot be read: {clean.brief(str(exc))}") from None
    if HEADLINE not in run.energy_meters:
        why = "the run has no per-query energy"
        return {"ipj": None, "ipw": None}, {"ipj": why, "ipw": why}
    report = meter_report(run.ok, HEADLINE, accuracy_counts(records)["accuracy"])
    return (
        {"ipj": report["ipj"], "ipw": report["ipw"]},
        {"ipj": report["ipj_reason"], "ipw": report["ipw_reason"]},
    )


def _times(manifest: Manifest, summary: dict[str, Any]) -> tuple[int, int | None]:
    """Start (the run's clock anchor) and end (its last record or sample) in ms since the epoch."""
    start_ms = manifest.anchor.unix_ns // 1_000_000
    loss = summary.get("loss") or {}
    ends = [s for s in (loss.get("last_record_end_s"), loss.get("last_telemetry_s")) if s is not None]
    return start_ms, start_ms + round(max(ends) * 1000) if ends else None


def _status(summary: dict[str, Any]) -> str:
    if summary.get("complete"):
        return "FINISHED"
    return "KILLED" if summary.get("interrupted") else "FAILED"


# --- a sweep -----------------------------------------------------------------------------------


def sweep_root(path: Path) -> Path | None:
    """The directory holding a sweep's runs and ``sweep/``, given it or its ``sweep/``."""
    for root in (path, path.parent) if path.name == SWEEP_DIR else (path,):
        if (root / SWEEP_DIR / files.SUMMARY).is_file() and (root / SWEEP_DIR / SWEEP_RUNS).is_file():
            return root
    return None


def read_sweep(root: Path, work: Path, name: str) -> MlflowRun:
    """A sweep as a parent run with a child per run directory its ``raw_runs.csv`` lists."""
    sweep_dir = root / SWEEP_DIR
    summary = clean.read_json(sweep_dir / files.SUMMARY)
    levels = (
        clean.read_json(sweep_dir / SWEEP_STATS).get("levels", []) if (sweep_dir / SWEEP_STATS).is_file() else []
    )
    with (sweep_dir / SWEEP_RUNS).open(newline="") as f:
        rows = list(csv.DictReader(f))
    children, skipped_runs = [], {}
    for row in rows:
        run_dir = root / Path(row["run_dir"]).name  # the sweep's own layout, wherever it was moved
        if not (run_dir / files.RUN).is_file():
            skipped_runs[run_dir.name] = f"{row['status']}: no {files.RUN}" + (
                f" ({row['error']})" if row.get("error") else ""
            )
            continue
        level = {"ipw_async.level": row["level"], "ipw_async.repeat": row["repeat"]}
        children.append(
            read_run(run_dir, work, run_dir.name, level | {"ipw_async.sweep_status": row["status"]})
        )
    values, reasons = _sweep_metrics(summary)
    metrics, missing = clean.present(values, reasons)
    series, series_missing = _level_series(levels)
    found = [(f, clean.folder(f, sweep_dir)) for f in sorted(sweep_dir.rglob("*")) if f.is_file()]
    artifacts, skipped = clean.artifacts(found, work)
    sweep = {key: summary.get(key) for key in ("mode", "levels", "repeats", "simulated", "constraints")}
    params, truncated = clean.limited(
        clean.flatten(summary.get("base_config") or {}) | clean.flatten(sweep, "sweep."), MAX_PARAM_CHARS
    )
    judgement = {
        j["level"]: "accepted" if j.get("accepted") else "; ".join(j.get("reasons") or ["rejected"])
        for j in summary.get("judgement") or []
    }
    best = {
        f"ipw_async.best.{criterion}": level["level"] if level else "none"
        for criterion, level in (summary.get("best") or {}).items()
    }
    missing |= series_missing
    notes = {
        "ipw_async.sweep": "true",
        "ipw_async.simulated": clean.flag(summary.get("simulated")),
        "ipw_async.complete": clean.flag(summary.get("complete")),
        "ipw_async.sweep_dir": str(root.resolve()),
        "ipw_async.judgement": json.dumps(judgement) if judgement else None,
        "ipw_async.missing_metrics": json.dumps(missing) if missing else None,
        "ipw_async.skipped_runs": json.dumps(skipped_runs) if skipped_runs else None,
        "ipw_async.skipped_artifacts": json.dumps(skipped) if skipped else None,
        "ipw_async.truncated_params": ", ".join(truncated) or None,
    }
    starts = [c.start_ms for c in children if c.start_ms is not None]
    ends = [c.end_ms for c in children if c.end_ms is not None]
    return MlflowRun(
        name=name,
        params=params,
        metrics=metrics + series,
        tags=clean.tags(notes | best),
        artifacts=artifacts,
        start_ms=min(starts) if starts else None,
        end_ms=max(ends) if ends else None,
        status="KILLED" if summary.get("interrupted") else "FINISHED",
        children=children,
    )


def _sweep_metrics(summary: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The sweep's counts and its knees' loads and values."""
    values: dict[str, Any] = {f"sweep.{key}": n for key, n in (summary.get("counts") or {}).items()}
    reasons: dict[str, str] = {}
    knees = summary.get("knees") or {}
    for knee in ("throughput", "energy"):
        found = knees.get(knee) or {}
        for key in ("load", "value"):
            values[f"knee.{knee}.{key}"] = found.get(key)
            reasons[f"knee.{knee}.{key}"] = (knees.get("reasons") or {}).get(knee) or "no knee"
    return values, reasons


def _level_series(levels: list[dict[str, Any]]) -> tuple[list[tuple[str, float, int]], dict[str, str]]:
    """Each statistic's mean over repeats as ``levels/<statistic>``, step = the level's place in
    the sweep, with ``levels/load`` (its concurrency or rate) at the same steps."""
    series: list[tuple[str, float, int]] = []
    null_at: dict[str, list[str]] = {}
    for step, level in enumerate(levels):
        for key, value in ({"load": level.get("value")} | (level.get("means") or {})).items():
            name = f"levels/{clean.valid_name(key)}"
            if clean.is_number(value):
                series.append((name, float(value), step))
            else:
                null_at.setdefault(name, []).append(str(level.get("level")))
    return series, {name: f"null at {', '.join(at)}" for name, at in null_at.items()}


