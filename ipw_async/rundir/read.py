"""Reading a run directory: the one reader every part of ipw-async uses (the finisher, resume,
the judge, analysis, exports).

A run writes ``measured.arrow`` as it goes and never rewrites it; ``finalize`` writes the
finished records (energy, the judge's verdicts) to ``records.arrow``. A directory written in
format 1 has ``records.arrow`` alone, as measured or as last finished: its measured columns are
read from it, here and nowhere else.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from ..records import RECORD_SCHEMA
from ..stats import measured
from ..telemetry.base import Meter, Quantity, power_quantity
from ..telemetry.grid import CounterGrid
from ..traces import QueryTrace
from . import files
from .manifest import Manifest, RunDirError, check_format

# A judged finalize keeps each record's own verdict (its scorer's, given as the request ended) in
# this column of the finished records, beside the judge's in ``correct``.
INLINE_CORRECT = "inline_correct"
FIRST_SPLIT_FORMAT = 2  # the first format with measured.arrow beside the finished records
HEADLINE = "headline"  # the name analyses give the run's headline energy (``energy_j``)


class RunDir:
    """One run directory, read lazily: every file is read once, when first asked for.

    ``manifest`` is None only for a run written before ``run.json`` existed (ipw-async < 0.2);
    ``summary`` is None for a run that has not been finished (:attr:`finished`)."""

    def __init__(self, path: Path, manifest: Manifest | None, summary: dict[str, Any] | None) -> None:
        self.path = path
        self.manifest = manifest
        self.summary = summary

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        """Open a run directory; :class:`RunDirError` when it is not one or a newer ipw-async wrote it."""
        path = Path(path)
        if not path.is_dir():
            raise RunDirError(f"{path} is not a directory")
        manifest = Manifest.read(path) if (path / files.RUN).is_file() else None
        if manifest is None and not (path / files.RECORDS).is_file():
            raise RunDirError(f"{path} holds no {files.RUN} and no {files.RECORDS}; is it a run directory?")
        summary_path = path / files.SUMMARY
        summary = files.read_json(summary_path) if summary_path.is_file() else None
        check_format(summary, summary_path)
        return cls(path, manifest, summary)

    @classmethod
    def open_finished(cls, run: RunDir | str | Path) -> RunDir:
        """A run to analyse or export: ``run`` itself or the run at that path, which must have
        been finished (``ipw_async.finished`` finishes one that was cut short, as the CLI does)."""
        run = run if isinstance(run, RunDir) else cls.open(run)
        if run.manifest is not None and not run.finished:
            raise RunDirError(
                f"{run.path} was cut short and is not finished: run `ipw-async recover {run.path}` first"
            )
        return run

    def require_manifest(self) -> Manifest:
        """``run.json``, which finishing, resuming and judging need."""
        if self.manifest is None:
            raise RunDirError(
                f"{self.path} holds no {files.RUN}: it is not a run directory, or an ipw-async older "
                "than 0.2 wrote it"
            )
        return self.manifest

    # --- what the run measured -------------------------------------------------------------

    @property
    def _split(self) -> bool:
        return self.manifest is not None and self.manifest.format >= FIRST_SPLIT_FORMAT

    def measured_records(self, partial_ok: bool = False) -> pl.DataFrame:
        """The records as measured, in this version's columns (a column the run's version did
        not record is null: unknown, not zero), by request id. ``partial_ok`` reads the whole
        batches of a file a killed run cut short."""
        path = self.path / (files.MEASURED if self._split else files.RECORDS)
        if not path.is_file():
            raise RunDirError(f"{self.path} holds no {path.name}; is it a run directory?")
        frame = files.read_arrow(path, partial_ok=partial_ok)
        if not self._split and INLINE_CORRECT in frame.columns:
            frame = frame.with_columns(pl.col(INLINE_CORRECT).alias("correct"))  # format 1, judged
        missing = [
            pl.lit(None, dtype).alias(name) for name, dtype in RECORD_SCHEMA.items() if name not in frame.columns
        ]
        return frame.with_columns(missing).select(list(RECORD_SCHEMA)).sort("request_id")

    def measured_telemetry(self, partial_ok: bool = False) -> pl.DataFrame | None:
        """The telemetry log; None for a run with no meters, an error where its meters lack it."""
        path = self.path / files.TELEMETRY
        if path.is_file():
            return files.read_arrow(path, partial_ok=partial_ok)
        meters = self.manifest.meters if self.manifest else []
        if meters:
            raise RunDirError(
                f"{self.path} holds no {files.TELEMETRY}, which its energy meters "
                f"({', '.join(m.channel for m in meters)}) need"
            )
        return None

    @cached_property
    def tasks(self) -> list[dict[str, Any]]:
        """Each task as the harness saw it end (``tasks.jsonl``); none for a single-turn run."""
        path = self.path / files.TASKS
        return files.read_jsonl(path) if path.is_file() else []

    def judge_lines(self) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """``judge.jsonl``'s header and verdict lines; None for a run no judge scored."""
        path = self.path / files.JUDGE
        if not path.is_file():
            return None
        header, *lines = files.read_jsonl(path) or [{}]
        if "judge" not in header:
            raise RunDirError(f"{path} does not start with its header line; judge the run again")
        return header["judge"], lines

    # --- the run as finished, or as far as it got ------------------------------------------

    @property
    def finished(self) -> bool:
        """``finalize`` has written the summary and the finished records."""
        return self.summary is not None and (self.path / files.RECORDS).is_file()

    @cached_property
    def records(self) -> pl.DataFrame:
        """The finished records (with energy) of a finished run; the measured ones of a run cut
        short, whose last batch may have died mid-write."""
        if self.finished:
            return files.read_arrow(self.path / files.RECORDS)
        return self.measured_records(partial_ok=True)

    @cached_property
    def telemetry(self) -> pl.DataFrame | None:
        """The telemetry log, None where the run has none."""
        path = self.path / files.TELEMETRY
        return files.read_arrow(path, partial_ok=not self.finished) if path.is_file() else None

    @cached_property
    def traces(self) -> list[QueryTrace] | None:
        """Each task's or request's trace, as ``finalize`` wrote them; None before it did."""
        path = self.path / files.TRACES
        return QueryTrace.load_jsonl(path) if path.is_file() else None

    @property
    def analysis_dir(self) -> Path:
        return self.path / "analysis"

    @property
    def complete(self) -> bool:
        return bool(self.summary and self.summary.get("complete"))

    @property
    def simulated(self) -> bool:
        if self.summary is not None:
            return bool(self.summary.get("simulated"))
        return bool(self.manifest and self.manifest.simulated)

    @cached_property
    def ok(self) -> pl.DataFrame:
        """Measured (non-warmup) requests that succeeded: the rows most figures are about."""
        return measured(self.records).filter(pl.col("status") == "ok")

    @property
    def energy_meters(self) -> list[str]:
        """Meters with a per-query energy column in the records (headline first, when present)."""
        names = [c.removesuffix(".energy_j") for c in self.records.columns if c.endswith(".energy_j")]
        return ([HEADLINE] if "energy_j" in self.records.columns else []) + names

    @property
    def session_starts_ns(self) -> tuple[int, ...]:
        """Where resumed sessions began (none for a run without run.json)."""
        return self.manifest.session_starts_ns if self.manifest else ()

    def meters(self) -> list[Meter]:
        """The energy meters of the telemetry log: as ``run.json`` describes them, else (a run
        written before run.json existed) rebuilt from the summary and the log's columns."""
        if self.telemetry is None:
            return []
        if self.manifest is not None:
            return self.manifest.meters
        return _meters_from_columns(self.telemetry.columns, self.summary or {})


def _meters_from_columns(columns: list[str], summary: dict[str, Any]) -> list[Meter]:
    """The log keeps each source's block of columns together (``<source>.t_ns`` first), so a
    channel's source is the nearest time column before its value columns. Without a summary (a
    run cut short) the kind is read off the columns: an energy column means a counter."""
    known = summary.get("energy", {}).get("meters", {})
    headline = set(summary.get("energy", {}).get("headline_meters", []))
    channels = known.keys() or {
        c.rsplit(".", 1)[0]
        for c in columns
        if c.endswith((f".{Quantity.ENERGY_J}", f".{Quantity.POWER_W}", f".{Quantity.AVG_POWER_W}"))
    }
    meters = []
    for channel in channels:
        value_columns = [i for i, c in enumerate(columns) if c.rsplit(".", 1)[0] == channel and not c.endswith("_ns")]
        if not value_columns:
            continue
        source = next((c.removesuffix(".t_ns") for c in reversed(columns[: value_columns[0]]) if c.endswith(".t_ns")), "")
        has_energy = f"{channel}.{Quantity.ENERGY_J}" in columns
        kind = known.get(channel, {}).get("kind") or ("counter" if has_energy else "power")
        grids = tuple(CounterGrid.from_dict(g) for g in known.get(channel, {}).get("counter_grids") or ())
        meters.append(Meter(channel, kind, channel in headline, power_quantity(channel, columns), source, grids))
    return sorted(meters, key=lambda m: (not m.accelerator, m.channel))

