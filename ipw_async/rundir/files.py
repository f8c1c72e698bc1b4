"""The files of a run directory: Arrow IPC streams readable at every moment, and JSON.

``measured.arrow`` and ``telemetry.arrow`` are Arrow IPC *streams*, written batch by batch as a
run goes: plain pyarrow (``ipc.open_stream``), polars (``read_ipc_stream``) and HF datasets
(``Dataset.from_file``) read them while the run is live and after it died. Each batch reaches
the file in one ``write`` call, so a killed process leaves whole batches behind.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from ..records import RECORD_ARROW_SCHEMA, RequestRecord, records_table

T = TypeVar("T")

RUN = "run.json"
MEASURED = "measured.arrow"  # the records as the run measured them, written as it goes and never rewritten
RECORDS = "records.arrow"  # the records as finalize finished them: energy, the judge's verdicts
TELEMETRY = "telemetry.arrow"
TRACES = "traces.jsonl"
TASKS = "tasks.jsonl"  # agentic and multi-turn runs: each task as the harness saw it end
SUMMARY = "summary.json"
JUDGE = "judge.jsonl"  # written by `ipw-async judge` after the run: a header, then one line per verdict
# written by finalize beside the streams: the interchange format every data tool reads
RECORDS_PARQUET = "records.parquet"
TELEMETRY_PARQUET = "telemetry.parquet"
REPORT = "report.html"  # `export html`, or `analyze`: the run on one page
DATASET = "dataset"  # `export ipw`: the run as a Hugging Face dataset, in IPW's layout

WRITE_BUFFER = 1 << 20  # bytes a whole frame's writer gathers before a system call
_FILE_MAGIC = b"ARROW1"  # an Arrow IPC *file* (footer and all): what earlier versions wrote


def to_arrow(frame: pl.DataFrame) -> pa.Table:
    # Oldest compat level: large_string/large_list rather than view types, so every Arrow
    # reader (pyarrow, DuckDB, R arrow, older polars, HF datasets) opens the file.
    return frame.to_arrow(compat_level=pl.CompatLevel.oldest())


class _Chunks:
    """A write-only file object that keeps what pyarrow writes until it is taken."""

    closed = False

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


class StreamWriter:
    """Appends tables to an Arrow IPC stream file; the schema is on disk from the start."""

    def __init__(self, path: Path, schema: pa.Schema, initial: pa.Table | None = None) -> None:
        """A new stream at ``path``; with ``initial`` (a resumed run's earlier rows) it starts
        with those, and replaces the old file only once they are on disk."""
        self.path = path
        self.schema = schema
        self.rows = 0
        self._chunks = _Chunks()
        self._writer = ipc.new_stream(pa.PythonFile(self._chunks, mode="w"), schema)
        # Written aside and renamed into place: the file never exists without its schema (a
        # reader never finds it empty), and a resumed run's old file is replaced only once its
        # rows are in the new one.
        target = path.with_suffix(path.suffix + ".tmp")
        self._fd: int | None = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._size = 0  # bytes of whole batches on disk
        self._writer.write_batch(pa.RecordBatch.from_pylist([], schema=schema))
        self._emit()
        if initial is not None:
            self.write(initial)
        os.replace(target, path)

    def _emit(self) -> None:
        data = self._chunks.take()
        assert self._fd is not None, "write after close"
        size = len(data)
        try:
            _write_all(self._fd, data)
        except OSError:
            # disk full (or a file-size limit) mid-batch: cut back to the last whole batch so
            # the file stays a readable stream, then let the caller say what happened
            os.ftruncate(self._fd, self._size)
            raise
        self._size += size

    def write(self, table: pa.Table) -> None:
        if table.num_rows:
            # a table built to the schema is written as it is: a cast walks every column even
            # where nothing changes (0.56 ms for 32 records, more than writing them)
            self._writer.write_table(table if table.schema.equals(self.schema) else table.cast(self.schema))
            self._emit()
            self.rows += table.num_rows

    def close(self) -> None:
        if self._fd is None:
            return
        try:
            self._writer.close()  # the end-of-stream marker
            self._emit()
        finally:
            os.close(self._fd)
            self._fd = None


def _write_all(fd: int, data: Any) -> None:
    """All of ``data`` to ``fd`` (a write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _FileSink:
    """A write-only file object for pyarrow: what it is handed goes straight to the file (and
    into ``digest``); a whole frame needs no batch kept back."""

    closed = False

    def __init__(self, fd: int, digest: Any = None) -> None:
        self._fd = fd
        self.digest = digest

    def write(self, data: Any) -> int:
        if self.closed:  # a buffer let go of after a failed write: its descriptor may be another file's now
            return memoryview(data).nbytes
        if self.digest is not None:
            self.digest.update(data)
        _write_all(self._fd, data)
        return memoryview(data).nbytes

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True  # the descriptor is its caller's to close


def write_frame(frame: pl.DataFrame, path: Path, digest: Any = None) -> None:
    """Write a whole frame as an Arrow IPC stream (an empty first batch, as a run's streams
    start), atomically: readers never see half of it. ``digest`` (a ``hashlib`` object) takes
    the bytes as they go out, rather than by reading the file back."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    table = to_arrow(frame)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    raw = _FileSink(fd, digest)
    # a column's buffers are handed over one by one: coalesced here, not a system call each
    sink = pa.BufferedOutputStream(pa.PythonFile(raw, mode="w"), WRITE_BUFFER)
    try:
        with ipc.new_stream(sink, table.schema) as writer:
            writer.write_batch(pa.RecordBatch.from_pylist([], schema=table.schema))
            writer.write_table(table)
        sink.close()
    except BaseException:
        raw.close()  # what the buffer still holds goes nowhere when it is collected
        os.close(fd)
        tmp.unlink(missing_ok=True)  # half a frame is no file to leave behind
        raise
    os.close(fd)
    os.replace(tmp, path)


def write_parquet(frame: pl.DataFrame, path: Path) -> None:
    """Write a whole frame as Parquet, atomically (zstd, with column statistics)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    frame.write_parquet(tmp, compression="zstd", statistics=True)
    os.replace(tmp, path)


class PartialFileError(ValueError):
    """An Arrow file that ends inside a batch: written by a process that died mid-write."""


def read_arrow(path: str | Path, partial_ok: bool = False) -> pl.DataFrame:
    """Read a run's Arrow file (stream, or the IPC file format of earlier versions).

    A stream that ends inside a batch raises :class:`PartialFileError`, unless ``partial_ok``
    (recovering a run that died), where the whole batches before it are returned.
    """
    path = Path(path)
    with path.open("rb") as f:
        if f.read(len(_FILE_MAGIC)) == _FILE_MAGIC:
            return pl.read_ipc(path, memory_map=False)
    reader = ipc.open_stream(pa.OSFile(str(path), "rb"))
    batches = []
    try:
        for batch in reader:
            batches.append(batch)
    except (pa.ArrowInvalid, OSError) as exc:
        if not partial_ok:
            raise PartialFileError(
                f"{path} ends inside a batch ({len(batches)} whole batches before it): "
                "its writer died mid-write"
            ) from exc
    return pl.from_arrow(pa.Table.from_batches(batches, schema=reader.schema))  # type: ignore[return-value]


RECORDS_SCHEMA = RECORD_ARROW_SCHEMA


class ThreadCpu:
    """The CPU time (s) that writes run off the event loop took, each measured on its own
    thread: what writing the run's files cost, apart from the client's loop and the sampler."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()

    def timed(self, write: Callable[..., T], *args: Any) -> T:
        start = time.thread_time()
        try:
            return write(*args)
        finally:
            spent = time.thread_time() - start
            with self._lock:
                self.seconds += spent


async def write_in_thread(write: Callable[..., None], *args: Any, cpu: ThreadCpu | None = None) -> None:
    """Run a blocking write in a worker thread (its CPU time added to ``cpu``) and wait for it
    to end, even when the waiting task is cancelled (the run ending): a write left running
    could land after the file's end-of-stream marker, where no reader looks, and its rows would
    be silently lost."""
    call = functools.partial(cpu.timed, write) if cpu is not None else write
    done = asyncio.ensure_future(anyio.to_thread.run_sync(call, *args))
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        # the cancel wins over the write's own error: swallowing it would leave a task that
        # was told to end running on (the next write to the file meets that error again)
        await asyncio.wait({done})
        if not done.cancelled():
            done.exception()  # retrieved, so asyncio does not report it as lost
        raise


class RecordWriter:
    """Appends records to ``records.arrow`` in batches, off the event loop.

    :meth:`add` asks for a flush every ``batch_size`` records; the run's session also flushes
    on a timer, so records finished during a long stall reach the disk too.
    """

    # Converting a column of Python values holds the GIL for the whole C call, so records are
    # converted a slice at a time, each about this many token stamps' worth (32 records of 128
    # tokens: about 0.1 ms a column, records_table), and the event loop is never locked out
    # long. A prompt's, an answer's or a reasoning's characters count a stamp per SLICE_CHARS.
    # Sliced by count instead, 32 records of 2 tokens cost 63 µs each to convert and write,
    # most of it each column's fixed 10 µs a call and each batch's framing; 256 to a slice, 19.
    SLICE_STAMPS = 4096
    SLICE_CHARS = 128

    def __init__(
        self,
        path: Path,
        batch_size: int = 256,
        initial: pl.DataFrame | None = None,
        cpu: ThreadCpu | None = None,
    ) -> None:
        self.path = path
        self.batch_size = batch_size
        self.cpu = cpu
        kept = None if initial is None else to_arrow(initial)
        self._stream = StreamWriter(path, RECORDS_SCHEMA, kept)
        self._pending: list[RequestRecord] = []
        self._lock = anyio.Lock()

    @property
    def written(self) -> int:
        return self._stream.rows

    def add(self, record: RequestRecord) -> bool:
        """Queue a record; True when a flush is due."""
        self._pending.append(record)
        return len(self._pending) >= self.batch_size

    def _write(self, records: list[RequestRecord]) -> None:
        # each slice a batch of its own: a batch is copied whole while pyarrow hands it to the
        # file, and one of 256 long-prompt records would hold the GIL that much longer
        for part in self._slices(records):
            self._stream.write(records_table(part))

    @classmethod
    def _slices(cls, records: list[RequestRecord]) -> Iterator[list[RequestRecord]]:
        start, stamps = 0, 0
        for end, r in enumerate(records, 1):
            stamps += (
                1 + len(r.chunk_ns) + (len(r.prompt) + len(r.answer) + len(r.reasoning)) // cls.SLICE_CHARS
            )
            if stamps >= cls.SLICE_STAMPS:
                yield records[start:end]
                start, stamps = end, 0
        if start < len(records):
            yield records[start:]

    async def flush(self) -> None:
        async with self._lock:
            records, self._pending = self._pending, []
            if records:
                await write_in_thread(self._write, records, cpu=self.cpu)

    async def close(self) -> None:
        try:
            await self.flush()
        finally:
            async with self._lock:
                self._stream.close()


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


class JsonLines:
    """Appends one JSON object per line, each in a single ``write``: a killed process leaves
    whole lines behind. The file is created by the first line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def append(self, payload: dict[str, Any]) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(self._fd, (json.dumps(_clean(payload), default=str) + "\n").encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write a whole JSON-lines file, atomically: readers never see half of it."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(_clean(row), default=str) + "\n" for row in rows))
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every whole line of a JSON-lines file; a last line cut short by a crash is left out."""
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    if line.endswith("\n"):
                        raise
    return out
