"""A run directory as the analyses see it: records always, summary and telemetry when present."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from ..rundir import files
from ..rundir.manifest import Manifest, RunDirError, check_format
from ..stats import measured
from ..telemetry.base import Meter, Quantity
from ..telemetry.cadence import CounterGrid

HEADLINE = "headline"  # the name analyses give the run's headline energy (``energy_j``)


@dataclass
class RunDir:
    """The files of one run. ``summary`` and ``telemetry`` are None for a run cut short."""

    path: Path
    records: pl.DataFrame
    summary: dict[str, Any] | None
    telemetry: pl.DataFrame | None

    @property
    def analysis_dir(self) -> Path:
        return self.path / "analysis"

    @property
    def complete(self) -> bool:
        return bool(self.summary and self.summary.get("complete"))

    @property
    def simulated(self) -> bool:
        return bool(self.summary and self.summary.get("simulated"))

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
        if (self.path / files.RUN).is_file():
            return Manifest.read(self.path).session_starts_ns
        return ()

    def meters(self) -> list[Meter]:
        """The energy meters of the telemetry log: as ``run.json`` describes them, else (a run
        written before run.json existed) rebuilt from the summary and the log's columns.

        The log keeps each source's block of columns together (``<source>.t_ns`` first), so a
        channel's source is the nearest time column before its value columns. Without a summary
        (a run cut short) the kind is read off the columns: an energy column means a counter.
        """
        if self.telemetry is None:
            return []
        if (self.path / files.RUN).is_file():
            return Manifest.read(self.path).meters
        columns = self.telemetry.columns
        known = (self.summary or {}).get("energy", {}).get("meters", {})
        headline = set((self.summary or {}).get("energy", {}).get("headline_meters", []))
        channels = known.keys() or {
            c.rsplit(".", 1)[0]
            for c in columns
            if c.endswith((f".{Quantity.ENERGY_J}", f".{Quantity.POWER_W}", f".{Quantity.AVG_POWER_W}"))
        }
        meters = []
        for channel in channels:
            value_columns = [
                i for i, c in enumerate(columns) if c.rsplit(".", 1)[0] == channel and not c.endswith("_ns")
            ]
            if not value_columns:
                continue
            source = _source_before(columns, value_columns[0])
            has_energy = f"{channel}.{Quantity.ENERGY_J}" in columns
            kind = known.get(channel, {}).get("kind") or ("counter" if has_energy else "power")
            power_quantity = (
                Quantity.POWER_W if f"{channel}.{Quantity.POWER_W}" in columns else Quantity.AVG_POWER_W
            )
            grids = tuple(CounterGrid.from_dict(g) for g in known.get(channel, {}).get("counter_grids") or ())
            meters.append(Meter(channel, kind, channel in headline, power_quantity, source, grids))
        return sorted(meters, key=lambda m: (not m.accelerator, m.channel))


def _source_before(columns: list[str], index: int) -> str:
    for name in reversed(columns[:index]):
        if name.endswith(".t_ns"):
            return name.removesuffix(".t_ns")
    return ""


def load_run(path: str | Path) -> RunDir:
    """Read a run directory; raises :class:`RunDirError` when it has no ``records.arrow``."""
    path = Path(path)
    if not path.is_dir():
        raise RunDirError(f"{path} is not a directory")
    records_path = path / files.RECORDS
    if not records_path.is_file():
        raise RunDirError(f"{path} holds no {files.RECORDS}; is it a run directory?")
    summary_path = path / files.SUMMARY
    telemetry_path = path / files.TELEMETRY
    finished = summary_path.is_file()
    summary = files.read_json(summary_path) if finished else None
    check_format(summary, summary_path)
    if (path / files.RUN).is_file():
        check_format(files.read_json(path / files.RUN), path / files.RUN)
    # a run cut short may have died mid-write: its whole batches are what it measured
    return RunDir(
        path=path,
        records=files.read_arrow(records_path, partial_ok=not finished),
        summary=summary,
        telemetry=files.read_arrow(telemetry_path, partial_ok=not finished)
        if telemetry_path.is_file()
        else None,
    )


def column(frame: pl.DataFrame, name: str) -> pl.Series:
    """A float column, or all-null when the run never wrote it (missing, not zero)."""
    if name in frame.columns:
        return frame.get_column(name).cast(pl.Float64)
    return pl.Series(name, [None] * frame.height, dtype=pl.Float64)


def energy_columns(meter: str) -> tuple[str, str, str]:
    """The energy, power and provenance columns of a meter (or of the headline)."""
    if meter == HEADLINE:
        return "energy_j", "power_w", "energy_provenance"
    return f"{meter}.energy_j", f"{meter}.power_w", f"{meter}.provenance"
