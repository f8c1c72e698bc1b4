"""A finished run, or a sweep, as MLflow runs.

A run directory becomes one MLflow run: its config as params, its headline figures as metrics,
``summary.json``, ``run.json``, ``traces.jsonl``, its plots and ``report.html`` as artifacts.
A sweep directory becomes a parent run (the sweep's tables and plots, its counts and knees, and
each statistic's level means as a series stepped by the level's place in the sweep) with one
nested run per level and repeat.

Everything is read from finished run directories, which are never written (a run cut short is
refused: the CLI finishes it first, as ``ipw-async recover`` would). Reading and redacting are
``_mlflow_runs`` and ``_mlflow_values``; this module talks to MLflow. Nothing secret leaves: a URL's password and the value of a key named like a credential
(``api_key``, ``token``, ``password``, ...) become ``***`` in params, tags and text artifacts
(an artifact that holds one is logged from a redacted copy). The client is an explicit
``MlflowClient``, so nothing leaks into MLflow's global active run.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ipw_async.export import ExportError
from ipw_async.rundir import files
from ipw_async.telemetry.http import redact_url

from . import _mlflow_runs as runs
from . import _mlflow_values as clean

if TYPE_CHECKING:
    from mlflow import MlflowClient

MISSING_EXTRA = "MLflow export needs the mlflow extra: pip install 'ipw-async[mlflow]'"
MAX_PARAMS_PER_BATCH = 100  # log_batch's limits
MAX_METRICS_PER_BATCH = 1000
# the first call, and marking a run failed after an error: an unreachable server fails in a
# second, not after MLflow's minutes of retries with backoff
FAIL_FAST = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@dataclass(frozen=True)
class MlflowExport:
    """Where an export went."""

    tracking_uri: str  # credentials redacted
    experiment: str
    run_id: str  # the MLflow run id (the parent's for a sweep)
    children: int  # child runs (sweep levels and repeats); 0 for a single run




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
            run = runs.read_run(path, work, run_name or path.resolve().name)
        elif (root := runs.sweep_root(path)) is not None:
            run = runs.read_sweep(root, work, run_name or root.resolve().name)
        else:
            raise ExportError(
                f"{path} is neither a run directory (no {files.RUN}) nor a sweep directory "
                f"(no {runs.SWEEP_DIR}/{files.SUMMARY})"
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
        raise ExportError(f"MLflow cannot open the tracking store at {uri}: {clean.brief(str(exc))}") from None
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
        raise ExportError(f"MLflow at {uri} refused the export: {clean.brief(str(exc))}") from None


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


def _log(client: MlflowClient, experiment_id: str, run: runs.MlflowRun, parent_id: str | None) -> str:
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
