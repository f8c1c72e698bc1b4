"""Run-directory files: records written incrementally, read back even after a crash."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import anyio
import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from .records import RequestRecord, records_frame

RECORDS = "records.arrow"
TELEMETRY = "telemetry.arrow"
TRACES = "traces.jsonl"
SUMMARY = "summary.json"

_ARROW_MAGIC = b"ARROW1"


def to_arrow(frame: pl.DataFrame) -> pa.Table:
    # Oldest compat level: large_string/large_list rather than view types, so every Arrow
    # reader (pyarrow, DuckDB, R arrow, older polars) opens the file.
    return frame.to_arrow(compat_level=pl.CompatLevel.oldest())


def write_frame(frame: pl.DataFrame, path: Path) -> None:
    """Write an Arrow IPC file atomically: readers never see a half-written file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    table = to_arrow(frame)
    with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(tmp, path)


def read_arrow(path: str | Path) -> pl.DataFrame:
    """Read an Arrow IPC file; one cut short by a crash (no footer) yields its complete batches."""
    path = Path(path)
    try:
        return pl.read_ipc(path)
    except Exception:
        data = path.read_bytes()
        if not data.startswith(_ARROW_MAGIC):
            raise
        # An IPC file is magic + padding + an IPC stream + footer: without the footer, the
        # stream part still holds every batch written before the crash.
        reader = ipc.open_stream(pa.py_buffer(data[8:]))
        batches = []
        try:
            for batch in reader:
                batches.append(batch)
        except (pa.ArrowInvalid, OSError):
            pass  # the batch being written when the process died
        return pl.from_arrow(pa.Table.from_batches(batches, schema=reader.schema))  # type: ignore[return-value]


class RecordWriter:
    """Appends records to ``records.arrow`` in batches, off the event loop.

    A flush happens every ``batch_size`` records or ``interval_s`` seconds, so a crash loses
    at most that much; :func:`read_arrow` recovers a file whose writer never closed.
    """

    def __init__(self, path: Path, batch_size: int = 256, interval_s: float = 2.0) -> None:
        self.path = path
        self.batch_size = batch_size
        self.interval_s = interval_s
        self.written = 0
        self._pending: list[RequestRecord] = []
        self._last_flush = time.monotonic()
        self._sink: pa.OSFile | None = None
        self._writer: ipc.RecordBatchFileWriter | None = None
        self._schema: pa.Schema | None = None
        self._lock = anyio.Lock()

    def add(self, record: RequestRecord) -> bool:
        """Queue a record; True when a flush is due."""
        self._pending.append(record)
        return len(self._pending) >= self.batch_size or time.monotonic() - self._last_flush >= self.interval_s

    # Building a frame from Python rows holds the GIL for the whole C call: slices keep each
    # hold to a few ms, so the event loop's thread is never locked out for long.
    SLICE = 32

    def _write(self, records: list[RequestRecord]) -> None:
        for start in range(0, max(len(records), 1), self.SLICE):
            table = to_arrow(records_frame(records[start : start + self.SLICE]))
            if self._writer is None:
                self._schema = table.schema
                self._sink = pa.OSFile(str(self.path), "wb")
                self._writer = ipc.new_file(self._sink, self._schema)
            self._writer.write_table(table.cast(self._schema))
        self.written += len(records)

    async def flush(self) -> None:
        async with self._lock:
            records, self._pending = self._pending, []
            self._last_flush = time.monotonic()
            if records:
                await anyio.to_thread.run_sync(self._write, records)

    async def close(self) -> None:
        await self.flush()
        async with self._lock:
            if self._writer is None:  # nothing measured: still leave a readable, empty file
                self._write([])
            assert self._writer is not None and self._sink is not None
            self._writer.close()
            self._sink.close()


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: a figure that is not a number is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_clean(payload), indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
