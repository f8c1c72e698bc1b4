"""A run directory's life around its files: its default name, an empty one for a new run, and
the files of a run that measured nothing taken away again."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import shutil
from pathlib import Path

from ..errors import RunError
from . import files


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-")[:40] or "x"


def default_run_dir(root: Path, model: str, dataset: str, label: str) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return root / f"{stamp}_{slug(model)}_{slug(dataset)}_{label}"


def prepare(path: Path, overwrite: bool) -> None:
    """An empty directory for a new run; with ``overwrite``, an old run's files go first."""
    if path.exists() and any(path.iterdir()):
        if not overwrite:
            raise RunError(f"{path} already holds a run; choose another --output-dir or pass --overwrite")
        _remove_run(path)
    path.mkdir(parents=True, exist_ok=True)


def discard(path: Path, created: bool) -> None:
    """The files of a run that stopped before it measured anything, and its directory when the
    run ``created`` it and nothing else is in it: the same command, once fixed, runs again."""
    _remove_run(path)
    if created:
        with contextlib.suppress(OSError):
            path.rmdir()


# a run's files, and what is made from them (stale beside another run: an old judge.jsonl's
# verdicts would be joined to the new run's requests by id)
_RUN_FILES = (
    files.RUN,
    files.MEASURED,
    files.RECORDS,
    files.TELEMETRY,
    files.TASKS,
    files.TRACES,
    files.SUMMARY,
    files.JUDGE,
    files.RECORDS_PARQUET,
    files.TELEMETRY_PARQUET,
    files.REPORT,
)
_DERIVED = ("analysis", "plots", files.DATASET)


def _remove_run(path: Path) -> None:
    for name in _RUN_FILES:
        (path / name).unlink(missing_ok=True)
        (path / f"{name}.tmp").unlink(missing_ok=True)
    for derived in _DERIVED:
        shutil.rmtree(path / derived, ignore_errors=True)
