"""A finished run, or a sweep, as MLflow runs.

A run directory becomes one MLflow run: its config as params, its headline figures as metrics,
``summary.json``, ``run.json``, ``traces.jsonl``, its plots and ``report.html`` as artifacts.
A sweep directory becomes a parent run (the sweep's tables and plots, its counts and knees, and
each statistic's level means as a series stepped by the level's place in the sweep) with one
nested run per level and repeat.

Everything is read from the directories, which are never written: a run killed before its
summary is finished in a temporary copy, as ``ipw-async recover`` would finish it in place.
Nothing secret leaves: a URL's password and the value of a key named like a credential
(``api_key``, ``token``, ``password``, ...) become ``***`` in params, tags and text artifacts
(an artifact that holds one is logged from a redacted copy). The client is an explicit
``MlflowClient``, so nothing leaks into MLflow's global active run.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ipw_async.export import ExportError
from ipw_async.rundir import files
from ipw_async.rundir.manifest import Manifest, RunDirError
from ipw_async.rundir.read import HEADLINE, RunDir
from ipw_async.telemetry.http import redact_url, redact_urls

if TYPE_CHECKING:
    from mlflow import MlflowClient

MISSING_EXTRA = "MLflow export needs the mlflow extra: pip install 'ipw-async[mlflow]'"
MAX_ARTIFACT_BYTES = 50 * 1024 * 1024  # a longer traces.jsonl stays in the run directory
# every MLflow server takes 500 characters (2.x and later take 6000); the whole config is in
# summary.json, logged beside
MAX_PARAM_CHARS = 500
MAX_TAG_CHARS = 5000  # older servers' limit
MAX_KEY_CHARS = 250
MAX_PARAMS_PER_BATCH = 100  # log_batch's limits
MAX_METRICS_PER_BATCH = 1000
# the first call, and marking a run failed after an error: an unreachable server fails in a
# second, not after MLflow's minutes of retries with backoff
FAIL_FAST = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
SWEEP_DIR = "sweep"
SWEEP_RUNS = "raw_runs.csv"
SWEEP_STATS = "summary_stats.json"
TEXT_SUFFIXES = {".json", ".jsonl", ".csv", ".html", ".txt"}

# key names whose string value is a credential, also after a prefix ("hf_token", "x-api-key")
_SECRET_NAMES = ("api_key", "api-key", "apikey", "token", "secret", "password", "passwd", "authorization")
_SECRET_KEY = re.compile(rf"(?i)^(?:.*[_-])?(?:{'|'.join(map(re.escape, _SECRET_NAMES))})$")
_JSON_PAIR = re.compile(r'"((?:[^"\\]|\\.)*)"(\s*:\s*)"((?:[^"\\]|\\.)*)"')
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_\-. ]")  # MLflow also allows "/", which names files


@dataclass(frozen=True)
class MlflowExport:
    """Where an export went."""

    tracking_uri: str  # credentials redacted
    experiment: str
    run_id: str  # the MLflow run id (the parent's for a sweep)
    children: int  # child runs (sweep levels and repeats); 0 for a single run


@dataclass
class _Run:
    """One MLflow run to be: read, redacted and made valid before MLflow is contacted."""

    name: str
    params: dict[str, str]
    metrics: list[tuple[str, float, int]]  # key, value, step
    tags: dict[str, str]
    artifacts: list[tuple[Path, str | None]]  # local file, directory among the run's artifacts
    start_ms: int | None
    end_ms: int | None
    status: str  # FINISHED, KILLED or FAILED
    children: list[_Run]


def export_mlflow(
    path: str | Path,
    *,
    tracking_uri: str | None = None,
    experiment: str = "ipw-async",
    run_name: str | None = None,
) -> MlflowExport:
    """Log a run directory, or a sweep directory (its runs and ``sweep/``), to MLflow.

    ``tracking_uri`` None is MLflow's own (``MLFLOW_TRACKING_URI``, else its default); the
    experiment is created when missing; ``run_name`` defaults to the directory's name. Raises
    :class:`ExportError` (one line) when mlflow is not installed, the directory is neither a run
    nor a sweep, or the tracking store cannot be reached or refuses.
    """
    path = Path(path)
    client, uri = _client(tracking_uri)
    with tempfile.TemporaryDirectory(prefix="ipw-async-mlflow-") as tmp:
        work = Path(tmp)
        # all read before MLflow is contacted: a bad directory leaves no half-logged run
        if (path / files.RUN).is_file():
            run = _read_run(path, work, run_name or path.resolve().name)
        elif (root := _sweep_root(path)) is not None:
            run = _read_sweep(root, work, run_name or root.resolve().name)
        else:
            raise ExportError(
                f"{path} is neither a run directory (no {files.RUN}) nor a sweep directory "
                f"(no {SWEEP_DIR}/{files.SUMMARY})"
            )
        with _mlflow_errors(uri):
            with _fail_fast():
                experiment_id = _experiment_id(client, experiment)
            run_id = _log(client, experiment_id, run, None)
    return MlflowExport(uri, experiment, run_id, len(run.children))


# --- MLflow ------------------------------------------------------------------------------------


def _client(tracking_uri: str | None) -> tuple[MlflowClient, str]:
    """A client for the store, and its URI as shown (credentials redacted)."""
    try:
        import mlflow
        from mlflow.exceptions import MlflowException
    except ImportError:
        raise ExportError(MISSING_EXTRA) from None
    try:
        client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    except (MlflowException, ImportError) as exc:  # a store scheme whose packages are missing
        uri = redact_url(tracking_uri or mlflow.get_tracking_uri())
        if "MLFLOW_ALLOW_FILE_STORE" in str(exc):
            raise ExportError(
                f"MLflow refuses its file store at {uri} unless MLFLOW_ALLOW_FILE_STORE=true is set: "
                "set it, or give a tracking server or database URI"
            ) from None
        raise ExportError(f"MLflow cannot open the tracking store at {uri}: {_brief(str(exc))}") from None
    return client, redact_url(client.tracking_uri)


@contextlib.contextmanager
def _fail_fast() -> Iterator[None]:
    """No retries and a short timeout for MLflow's HTTP calls within (process-wide meanwhile:
    MLflow reads them from the environment on every request)."""
    saved = {key: os.environ.get(key) for key in FAIL_FAST}
    os.environ.update(FAIL_FAST)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _mlflow_errors(uri: str) -> Iterator[None]:
    """MLflow's errors as one-line ExportErrors naming the (redacted) tracking URI."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except (MlflowException, OSError) as exc:
        why = _unreachable(exc)
        if why is not None:
            raise ExportError(f"the MLflow tracking server at {uri} cannot be reached ({why})") from None
        raise ExportError(f"MLflow at {uri} refused the export: {_brief(str(exc))}") from None


def _unreachable(exc: BaseException) -> str | None:
    """Why a connection failed ("Connection refused", "no answer in time"); None if it did not."""
    import requests

    link: BaseException | None = exc
    failed, why = False, None
    while link is not None:
        if isinstance(link, requests.exceptions.Timeout):
            return "no answer in time"
        failed = failed or isinstance(link, requests.exceptions.ConnectionError)
        if isinstance(link, OSError) and link.errno:
            why = link.strerror or os.strerror(link.errno)
        link = link.__cause__ or link.__context__
    return (why or "no connection") if failed else None


def _experiment_id(client: MlflowClient, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is None:
        return client.create_experiment(name)
    if found.lifecycle_stage == "deleted":
        raise ExportError(f"the MLflow experiment {name!r} is deleted: restore it, or name another")
    return found.experiment_id


def _log(client: MlflowClient, experiment_id: str, run: _Run, parent_id: str | None) -> str:
    """Create the run (and its children, nested), log everything, and end it as the run ended;
    a run cut short by an error is marked FAILED, not left RUNNING."""
    from mlflow.entities import Metric, Param

    tags = run.tags | ({"mlflow.parentRunId": parent_id} if parent_id else {})
    run_id = client.create_run(
        experiment_id, start_time=run.start_ms, tags=tags, run_name=run.name
    ).info.run_id
    try:
        params = [Param(key, value) for key, value in run.params.items()]
        for i in range(0, len(params), MAX_PARAMS_PER_BATCH):
            client.log_batch(run_id, params=params[i : i + MAX_PARAMS_PER_BATCH])
        stamp = run.end_ms or int(time.time() * 1000)
        metrics = [Metric(key, value, stamp, step) for key, value, step in run.metrics]
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=metrics[i : i + MAX_METRICS_PER_BATCH])
        for local, where in run.artifacts:
            client.log_artifact(run_id, str(local), where)
        for child in run.children:
            _log(client, experiment_id, child, run_id)
    except BaseException:
        with contextlib.suppress(Exception), _fail_fast():
            client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, run.status, end_time=run.end_ms)
    return run_id


# --- one run -----------------------------------------------------------------------------------


def _read_run(path: Path, work: Path, name: str, extra_tags: dict[str, str] | None = None) -> _Run:
    """A finished run directory as an MLflow run (with ``extra_tags``, e.g. its sweep level)."""
    try:
        run = RunDir.open_finished(path)
        manifest = run.require_manifest()
    except (RunDirError, OSError) as exc:
        raise ExportError(_brief(str(exc))) from None
    summary = run.summary
    assert summary is not None  # a finished run with a run.json has its summary
    values, reasons = _run_metrics(summary)
    more, more_reasons = _intelligence(run)
    values |= more
    reasons |= more_reasons
    metrics, missing = _present(values, reasons)
    found = [
        (path / n, None) for n in (files.SUMMARY, files.RUN, files.TRACES) if (path / n).is_file()
    ]
    if (path / files.REPORT).is_file():
        found.append((path / files.REPORT, None))
    found += [(png, _folder(png, path)) for png in sorted(path.rglob("*.png"))]
    artifacts, skipped = _artifacts(found, work)
    params, truncated = _limited(_run_params(summary, manifest), MAX_PARAM_CHARS)
    notes = {
        "ipw_async.run_id": manifest.run_id,
        "ipw_async.simulated": _flag(summary.get("simulated", manifest.simulated)),
        "ipw_async.complete": _flag(summary.get("complete")),
        "ipw_async.run_dir": str(path.resolve()),
        "ipw_async.missing_metrics": json.dumps(missing) if missing else None,
        "ipw_async.skipped_artifacts": json.dumps(skipped) if skipped else None,
        "ipw_async.truncated_params": ", ".join(truncated) or None,
    }
    start_ms, end_ms = _times(manifest, summary)
    return _Run(
        name=name,
        params=params,
        metrics=metrics,
        tags=_tags(notes | (extra_tags or {})),
        artifacts=artifacts,
        start_ms=start_ms,
        end_ms=end_ms,
        status=_status(summary),
        children=[],
    )


def _run_params(summary: dict[str, Any], manifest: Manifest) -> dict[str, str]:
    """The run's config flattened, and what the run resolved: its model, dataset and server (the
    config has what was asked, e.g. no model for "the server's first")."""
    params = _flatten(summary.get("config") or manifest.config)
    resolved = {
        "model": summary.get("model", manifest.model),
        "dataset": summary.get("dataset", manifest.workload.get("dataset")),
        "base_url": summary.get("base_url", manifest.base_url),
        "simulated": summary.get("simulated", manifest.simulated),
        "run_id": manifest.run_id,
        "version": (summary.get("versions") or manifest.versions).get("ipw-async"),
    }
    return params | {key: _text(key, value) for key, value in resolved.items()}


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
            energy_values[f"meter.{_name(meter)}.{key}"] = figures.get(key)
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
        raise ExportError(f"{run.path} cannot be read: {_brief(str(exc))}") from None
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


def _sweep_root(path: Path) -> Path | None:
    """The directory holding a sweep's runs and ``sweep/``, given it or its ``sweep/``."""
    for root in (path, path.parent) if path.name == SWEEP_DIR else (path,):
        if (root / SWEEP_DIR / files.SUMMARY).is_file() and (root / SWEEP_DIR / SWEEP_RUNS).is_file():
            return root
    return None


def _read_sweep(root: Path, work: Path, name: str) -> _Run:
    """A sweep as a parent run with a child per run directory its ``raw_runs.csv`` lists."""
    sweep_dir = root / SWEEP_DIR
    summary = _read_json(sweep_dir / files.SUMMARY)
    levels = (
        _read_json(sweep_dir / SWEEP_STATS).get("levels", []) if (sweep_dir / SWEEP_STATS).is_file() else []
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
            _read_run(run_dir, work, run_dir.name, level | {"ipw_async.sweep_status": row["status"]})
        )
    values, reasons = _sweep_metrics(summary)
    metrics, missing = _present(values, reasons)
    series, series_missing = _level_series(levels)
    found = [(f, _folder(f, sweep_dir)) for f in sorted(sweep_dir.rglob("*")) if f.is_file()]
    artifacts, skipped = _artifacts(found, work)
    sweep = {key: summary.get(key) for key in ("mode", "levels", "repeats", "simulated", "constraints")}
    params, truncated = _limited(
        _flatten(summary.get("base_config") or {}) | _flatten(sweep, "sweep."), MAX_PARAM_CHARS
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
        "ipw_async.simulated": _flag(summary.get("simulated")),
        "ipw_async.complete": _flag(summary.get("complete")),
        "ipw_async.sweep_dir": str(root.resolve()),
        "ipw_async.judgement": json.dumps(judgement) if judgement else None,
        "ipw_async.missing_metrics": json.dumps(missing) if missing else None,
        "ipw_async.skipped_runs": json.dumps(skipped_runs) if skipped_runs else None,
        "ipw_async.skipped_artifacts": json.dumps(skipped) if skipped else None,
        "ipw_async.truncated_params": ", ".join(truncated) or None,
    }
    starts = [c.start_ms for c in children if c.start_ms is not None]
    ends = [c.end_ms for c in children if c.end_ms is not None]
    return _Run(
        name=name,
        params=params,
        metrics=metrics + series,
        tags=_tags(notes | best),
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
            name = f"levels/{_name(key)}"
            if _number(value):
                series.append((name, float(value), step))
            else:
                null_at.setdefault(name, []).append(str(level.get("level")))
    return series, {name: f"null at {', '.join(at)}" for name, at in null_at.items()}


# --- values, names, files ----------------------------------------------------------------------


def _present(
    values: dict[str, Any], reasons: dict[str, str | None]
) -> tuple[list[tuple[str, float, int]], dict[str, str]]:
    """The metrics that have a value (missing is not zero), and why each other one is missing."""
    metrics, missing = [], {}
    for key, value in values.items():
        if _number(value):
            metrics.append((_name(key), float(value), 0))
        else:
            missing[_name(key)] = reasons.get(key) or f"null in {files.SUMMARY}"
    return metrics, missing


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested keys joined with dots, each value as text (see :func:`_text`)."""
    out: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out |= _flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = _text(str(key), value)
    return out


def _text(key: str, value: Any) -> str:
    """A value as a param or tag: strings as they are, the rest as JSON; credentials redacted."""
    if _SECRET_KEY.match(key) and value not in (None, "") and not isinstance(value, bool):
        return "***"
    return _scrub(value if isinstance(value, str) else json.dumps(value, default=str))


def _scrub(text: str) -> str:
    """``text`` with each URL's secrets (:func:`redact_url`), and each JSON value under a
    credential's name, ``***``."""
    # each pattern costs about a second per 50 MB of traces, which rarely hold either: a URL
    # needs a "://", a credential's value a key ending in its name
    text = redact_urls(text)
    lower = text.lower()
    if any(f'{name}"' in lower for name in _SECRET_NAMES):
        text = _JSON_PAIR.sub(_redact_pair, text)
    return text


def _redact_pair(match: re.Match[str]) -> str:
    key, colon, value = match.groups()
    return f'"{key}"{colon}"***"' if value and _SECRET_KEY.match(key) else match.group()


def _name(key: str) -> str:
    """``key`` as a valid MLflow param, metric or tag name."""
    return _NOT_IN_NAME.sub("_", key)[:MAX_KEY_CHARS]


def _limited(entries: dict[str, str], limit: int) -> tuple[dict[str, str], list[str]]:
    """Entries with valid names and values cut to ``limit`` characters; the names that were cut."""
    out, cut = {}, []
    for key, value in entries.items():
        if len(value) > limit:
            value = value[: limit - 3] + "..."
            cut.append(_name(key))
        out[_name(key)] = value
    return out, cut


def _tags(notes: dict[str, str | None]) -> dict[str, str]:
    """The notes that have a value, redacted and within every server's tag limit."""
    present = {key: _scrub(value) for key, value in notes.items() if value is not None}
    return _limited(present, MAX_TAG_CHARS)[0]


def _flag(value: Any) -> str:
    return "true" if value else "false"


def _folder(file: Path, root: Path) -> str | None:
    """The artifact directory mirroring ``file``'s place under ``root`` (None at the top)."""
    parent = file.parent.relative_to(root)
    return parent.as_posix() if parent.parts else None


def _artifacts(
    found: list[tuple[Path, str | None]], work: Path
) -> tuple[list[tuple[Path, str | None]], dict[str, str]]:
    """The files to log, each text file from a redacted copy where it holds a credential; and
    those left out, with why."""
    out, skipped = [], {}
    for local, folder in found:
        size = local.stat().st_size
        if size > MAX_ARTIFACT_BYTES:
            label = f"{folder}/{local.name}" if folder else local.name
            skipped[label] = f"{size / 2**20:.0f} MiB, over the {MAX_ARTIFACT_BYTES // 2**20} MiB limit"
            continue
        out.append((_redacted(local, work), folder))
    return out, skipped


def _redacted(local: Path, work: Path) -> Path:
    """``local``, or a redacted copy of the same name where it holds a credential."""
    if local.suffix not in TEXT_SUFFIXES:
        return local
    text = local.read_text(encoding="utf-8", errors="surrogateescape")
    clean = _scrub(text)
    if clean == text:
        return local
    copy = Path(tempfile.mkdtemp(dir=work, prefix="redacted-")) / local.name
    copy.write_text(clean, encoding="utf-8", errors="surrogateescape")
    return copy


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = files.read_json(path)
    except (OSError, ValueError) as exc:
        raise ExportError(f"{path} cannot be read: {_brief(str(exc))}") from None
    if not isinstance(data, dict):
        raise ExportError(f"{path} is not a JSON object")
    return data


def _brief(text: str) -> str:
    """The first line of a message, redacted and at most 300 characters."""
    line = _scrub(text.strip().splitlines()[0] if text.strip() else "no message")
    return line if len(line) <= 300 else line[:297] + "..."
