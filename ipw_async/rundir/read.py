"""Reading a run directory's data files: records, telemetry and tasks, as this version reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from ..records import RECORD_SCHEMA
from . import files
from .manifest import Manifest, RunDirError

# A judged finalize keeps each record's own verdict (its scorer's, given as the request ended) in
# this column, beside the judge's in ``correct``: reading it back, the run's own scoring returns,
# so finishing stays a function of the measured files and judge.jsonl (remove it: unjudged).
INLINE_CORRECT = "inline_correct"


def read_records(run_dir: Path, partial_ok: bool = False) -> pl.DataFrame:
    """The measured columns of a run's records (none of an earlier finalize's energy columns)."""
    path = run_dir / files.RECORDS
    if not path.is_file():
        raise RunDirError(f"{run_dir} holds no {files.RECORDS}; is it a run directory?")
    frame = files.read_arrow(path, partial_ok=partial_ok)
    if INLINE_CORRECT in frame.columns:
        frame = frame.with_columns(pl.col(INLINE_CORRECT).alias("correct"))
    # a column this version records that the run's version did not: unknown, not zero
    missing = [
        pl.lit(None, dtype).alias(name) for name, dtype in RECORD_SCHEMA.items() if name not in frame.columns
    ]
    # the measured columns only: energy columns of an earlier finalize are made anew
    return frame.with_columns(missing).select(list(RECORD_SCHEMA)).sort("request_id")


def read_telemetry(run_dir: Path, manifest: Manifest) -> pl.DataFrame | None:
    """The run's telemetry log; None for a run with no meters, an error where meters lack it."""
    path = run_dir / files.TELEMETRY
    if path.is_file():
        return files.read_arrow(path)
    if manifest.meters:
        raise RunDirError(
            f"{run_dir} holds no {files.TELEMETRY}, which its energy meters "
            f"({', '.join(m.channel for m in manifest.meters)}) need"
        )
    return None


def read_tasks(run_dir: Path) -> list[dict[str, Any]]:
    """Each task as the harness saw it end (``tasks.jsonl``); none for a single-turn run."""
    path = run_dir / files.TASKS
    return files.read_jsonl(path) if path.is_file() else []
