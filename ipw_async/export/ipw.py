"""A run as IPW's users load it: ``dataset/``, a Hugging Face ``datasets`` directory.

IPW (Intelligence Per Watt) keeps results as ``Dataset.save_to_disk`` leaves them: an Arrow
IPC stream ``data-00000-of-00001.arrow`` beside ``dataset_info.json`` and ``state.json``, one
row per query with ``problem``, ``answer``, ``subject``, ``dataset_metadata``,
``model_answers`` and a ``model_metrics`` struct keyed by model, so that
``load_from_disk(run / "dataset")[0]["model_metrics"][MODEL]["energy_metrics"]["per_query_joules"]``
is the query's energy. That layout is three files, written here with pyarrow alone.

How our figures fill IPW's fields:

- ``energy_metrics.per_query_joules``: the query's attributed energy (``energy_j``: its share
  of the headline meters, adding up with idle to what they measured); ``total_joules``: what
  the headline meters measured over its window, shared with every query running beside it
  (IPW's "raw" window energy; summed over queries it counts the same joule many times).
- ``power_metrics.gpu.per_query_watts``: attributed energy over the query's e2e latency (avg
  only); ``total_watts``: the meters' power samples in the window (avg from the window's
  energy, so it agrees with ``total_joules``; min, median, max from the samples).
- ``latency_metrics``: TTFT, e2e latency, TPOT in ms, and output tokens over e2e latency.
- ``temperature_metrics``, ``memory_metrics``: the samples in the query's window (device
  temperature and memory, host memory), null where no sample fell in it.
- ``compute_metrics`` stays null: nothing here counts FLOPs.
- ``subject`` is the dataset's name (our datasets carry no topic); ``lm_correctness`` is null
  for an unscored query (IPW's default False would read as wrong).

Our own measurements ride beside them in an ``ipw_async`` struct per row: ids (run, request,
query, task, turn, session), status and error, the energy band, provenance and meters, TTFT,
TPOT, queueing and the server's own timings. Warm-up requests are left out: they are not part
of the measurement.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ..records import end_ns
from ..rundir import files
from ..rundir.manifest import RunDirError
from ..rundir.read import RunDir
from ..telemetry.base import Meter, Quantity, time_column
from . import ExportError

DATA_FILE = "data-00000-of-00001.arrow"

_HOST_MEMORY = ("mem.used_mb", "psutil")  # host memory in use, and the source that reads it
_STATS = ("avg", "max", "median", "min")
_CONSTANT_TYPES: dict[type, pl.DataType] = {str: pl.String(), int: pl.Int64(), type(None): pl.Float64()}


def ipw_table(
    records: pl.DataFrame,
    summary: dict[str, Any],
    telemetry: pl.DataFrame | None,
    meters: Sequence[Meter],
) -> pl.DataFrame:
    """One row per measured query in IPW's field names and nesting (attributed records in)."""
    rows = records.filter(~pl.col("warmup")).sort("request_id")
    model = summary.get("model") or "unknown"
    headline = [m for m in meters if m.channel in (summary.get("energy") or {}).get("headline_meters", ())]
    starts = rows.get_column("sent_ns").to_numpy()
    ends = rows.select(end_ns()).to_series().to_numpy()
    windows = _Windows(telemetry, starts, ends)
    e2e = _column(rows, "e2e_latency_s")
    energy = _column(rows, "energy_j")
    window_j = _sum_columns(rows, [f"{m.channel}.window_j" for m in headline])
    output = _column(rows, "output_tokens")
    duration_s = (ends - starts) / 1e9 if len(rows) else np.zeros(0)
    metrics = {
        "compute_metrics": {"flops_per_request": None, "macs_per_request": None},
        "energy_metrics": {"per_query_joules": energy, "total_joules": window_j},
        "latency_metrics": {
            "per_token_ms": _column(rows, "tpot_s") * 1e3,
            "throughput_tokens_per_sec": _ratio(output, e2e),
            "time_to_first_token_seconds": _column(rows, "ttft_s"),
            "total_query_seconds": e2e,
        },
        "memory_metrics": {
            "cpu_mb": windows.stats(_HOST_MEMORY),
            "gpu_mb": windows.stats(*[(f"{m.channel}.{Quantity.MEM_USED_MB}", m.source) for m in headline]),
        },
        "power_metrics": {
            "gpu": {
                "per_query_watts": {"avg": _ratio(energy, e2e), "max": None, "median": None, "min": None},
                "total_watts": windows.stats(
                    *[(m.power_column, m.source) for m in headline], avg=_ratio(window_j, duration_s)
                ),
            }
        },
        "temperature_metrics": windows.stats(*[(m.temperature_column, m.source) for m in headline]),
        "token_metrics": {
            "input": rows.get_column("prompt_tokens"),
            "output": rows.get_column("output_tokens"),
        },
        "gpu_info": _gpu_info(summary, headline),
        "system_info": _system_info(summary),
        "lm_correctness": rows.get_column("correct"),
        "lm_response": rows.get_column("answer"),
    }
    return pl.DataFrame(
        {
            "problem": rows.get_column("prompt"),
            "answer": rows.get_column("reference").fill_null(""),
            "subject": rows.get_column("dataset"),
            "dataset_metadata": rows.select(
                pl.struct(pl.col("dataset"), pl.col("query_id")).alias("dataset_metadata")
            ).to_series(),
            "model_answers": rows.select(pl.struct(pl.col("answer").alias(model))).to_series(),
            "model_metrics": pl.DataFrame({model: _struct(metrics, rows.height)})
            .select(pl.struct(pl.all()))
            .to_series(),
            "ipw_async": _ours(rows, summary, headline).to_series(),
        }
    )


def write_ipw_dataset(run_dir: Path, table: pl.DataFrame) -> Path:
    """Write ``table`` as ``run_dir/dataset``, replacing an earlier one; returns the directory."""
    out = run_dir / files.DATASET
    out.mkdir(exist_ok=True)
    fingerprint = hashlib.sha256()
    files.write_frame(table, out / DATA_FILE, fingerprint)
    files.write_json(
        out / "dataset_info.json",
        {
            "description": "An ipw-async run in IPW's layout: one row per measured query.",
            "citation": "",
            "homepage": "https://github.com/HazyResearch/intelligence-per-watt",
            "license": "",
        },
    )
    files.write_json(
        out / "state.json",
        {
            "_data_files": [{"filename": DATA_FILE}],
            # datasets caches transforms by fingerprint: the data's own hash keeps it honest
            "_fingerprint": fingerprint.hexdigest()[:16],
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": None,
            "_output_all_columns": False,
            "_split": None,
        },
    )
    return out


def export_ipw(run_dir: RunDir | str | Path) -> Path:
    """``dataset/`` for a finished run from its files (a run finished before finalize wrote it)."""
    try:
        run = RunDir.open_finished(run_dir)
        manifest = run.require_manifest()
    except RunDirError as exc:
        raise ExportError(str(exc)) from None
    if run.summary is None or "energy_j" not in run.records.columns:
        raise ExportError(f"{run.path} has no attributed energy yet: run `ipw-async finalize {run.path}`")
    table = ipw_table(run.records, run.summary, run.telemetry, manifest.meters)
    return write_ipw_dataset(run.path, table)


class _Windows:
    """Telemetry samples inside each query's window [sent, end]."""

    def __init__(self, telemetry: pl.DataFrame | None, starts: np.ndarray, ends: np.ndarray) -> None:
        self._telemetry = telemetry
        self._starts = starts
        self._ends = ends
        self._samples: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def stats(self, *columns: tuple[str, str], avg: np.ndarray | None = None) -> dict[str, Any]:
        """avg, max, median, min of the first of ``columns`` (a column and the source reading
        it) the log has; nulls where it has none, or no sample fell in a window."""
        n = len(self._starts)
        out: dict[str, Any] = {k: np.full(n, np.nan) for k in _STATS}
        log = self._telemetry
        found = next(((c, s) for c, s in columns if log is not None and c in log.columns), None)
        if found is not None and log is not None and n:
            column, source = found
            times = time_column(source) if time_column(source) in log.columns else "t_ns"
            # nulls kept (the aggregates skip them) and a stable sort: the same rows in the same
            # order for every column on one clock, so their windows are found once
            samples = (
                log.select(times, column).filter(pl.col(times).is_not_null()).sort(times, maintain_order=True)
            )
            query, position = self._in_windows(times, samples.get_column(times).to_numpy())
            # every window's samples at once, one row per (query, sample): a loop over the
            # queries cost 2 s a statistic at 100,000 of them
            by_query = (
                pl.DataFrame({"q": query, "v": samples.get_column(column).cast(pl.Float64).gather(position)})
                .group_by("q")
                .agg(
                    pl.col("v").mean().alias("avg"),
                    pl.col("v").max().alias("max"),
                    pl.col("v").median().alias("median"),
                    pl.col("v").min().alias("min"),
                )
            )
            rows = by_query.get_column("q").to_numpy()
            for name in _STATS:
                out[name][rows] = by_query.get_column(name).to_numpy()
        if avg is not None:
            out["avg"] = avg
        return out

    def _in_windows(self, times: str, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each (query, sample index) pair with the sample inside the query's window, for the
        sample times ``t`` of the ``times`` column (the same for every statistic it gives)."""
        if times not in self._samples:
            lo = np.searchsorted(t, self._starts, "left")
            counts = np.searchsorted(t, self._ends, "right") - lo
            query = np.flatnonzero(counts > 0)
            counts = counts[query]
            first = np.repeat(lo[query] - (np.cumsum(counts) - counts), counts)
            self._samples[times] = (np.repeat(query, counts), np.arange(counts.sum()) + first)
        return self._samples[times]


def _column(rows: pl.DataFrame, name: str) -> np.ndarray:
    """A float column as numpy with nulls as NaN (all NaN when the run never wrote it)."""
    if name not in rows.columns:
        return np.full(rows.height, np.nan)
    return rows.get_column(name).cast(pl.Float64).fill_null(np.nan).to_numpy()


def _sum_columns(rows: pl.DataFrame, names: list[str]) -> np.ndarray:
    if not names:
        return np.full(rows.height, np.nan)
    return np.sum([_column(rows, n) for n in names], axis=0)


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, numerator / denominator, np.nan)


def _struct(fields: dict[str, Any], height: int) -> pl.Series:
    """Nested dicts of per-row arrays (or constants) as one polars struct column; NaN is null.

    Built by one ``select`` over every leaf at once, constants without a Python list per row:
    a frame and a select per nested dict were an eighth of ``ipw_table`` at 1,000 queries."""
    leaves: list[pl.Series] = []
    struct = _struct_of(fields, height, leaves)
    return pl.DataFrame(leaves).select(struct).to_series()


def _struct_of(fields: dict[str, Any], height: int, leaves: list[pl.Series]) -> pl.Expr:
    """The struct of ``fields``, its leaves added to ``leaves`` under names of their own."""
    parts = []
    for name, value in fields.items():
        if isinstance(value, dict):
            parts.append(_struct_of(value, height, leaves).alias(name))
            continue
        leaf = f"_{len(leaves)}"
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            leaves.append(pl.Series(leaf, value, dtype=pl.Float64, nan_to_null=True))
        elif isinstance(value, pl.Series):
            leaves.append(value.alias(leaf))
        elif isinstance(value, _Unknown):  # null, in the type the field has where it is known
            leaves.append(pl.Series(leaf, [None], dtype=value.dtype).new_from_index(0, height))
        else:  # one value for every row (a field nothing here measures, the host's)
            one = pl.Series(leaf, [value], dtype=_CONSTANT_TYPES.get(type(value)))
            leaves.append(one.new_from_index(0, height))
        parts.append(pl.col(leaf).alias(name))
    return pl.struct(parts)


@dataclass(frozen=True)
class _Unknown:
    """A field the run does not know (missing is not zero): null, of this type."""

    dtype: pl.DataType


def _gpu_info(summary: dict[str, Any], headline: Sequence[Meter]) -> dict[str, Any]:
    """The first headline meter's device as its source described it (name, backend, and its
    index where the meter is an NVML or AMD SMI device, ``gpu<index>``)."""
    sources = (summary.get("telemetry") or {}).get("sources") or {}
    meter = headline[0] if headline else None
    index = re.fullmatch(r"gpu(\d+)", meter.channel) if meter else None
    return {
        "name": sources.get(meter.source, "") if meter else "",
        "vendor": "",
        "device_id": int(index.group(1)) if index else _Unknown(pl.Int64()),
        "device_type": "simulated" if summary.get("simulated") else "",
        "backend": meter.source if meter else "",
    }


def _system_info(summary: dict[str, Any]) -> dict[str, Any]:
    host = summary.get("host") or {}
    platform = str(host.get("platform") or "")
    return {
        "os_name": platform.split("-", 1)[0],
        "os_version": platform,
        "kernel_version": platform.split("-")[1] if platform.count("-") else "",
        "host_name": host.get("hostname") or "",
        "cpu_count": int(host["cpu_count"]) if host.get("cpu_count") else _Unknown(pl.Int64()),
        "cpu_brand": host.get("machine") or "",
    }


def _ours(rows: pl.DataFrame, summary: dict[str, Any], headline: Sequence[Meter]) -> pl.DataFrame:
    def maybe(name: str, dtype: pl.DataType) -> pl.Expr:
        return pl.col(name) if name in rows.columns else pl.lit(None, dtype).alias(name)

    return rows.select(
        pl.struct(
            pl.lit(summary.get("run_id")).alias("run_id"),
            pl.lit(bool(summary.get("simulated"))).alias("simulated"),
            "request_id",
            "query_id",
            "task_id",
            "turn_index",
            "session",
            "status",
            "error_type",
            maybe("energy_low_j", pl.Float64()),
            maybe("energy_high_j", pl.Float64()),
            maybe("energy_provenance", pl.String()),
            pl.lit(",".join(m.channel for m in headline) or None, pl.String()).alias("energy_meters"),
            "queue_s",
            "ttft_s",
            "tpot_s",
            "e2e_latency_s",
            "server_prompt_ms",
            "server_tpot_ms",
            "cached_prompt_tokens",
            "output_tokens_source",
        ).alias("ipw_async")
    )
