"""A run directory being written: ``run.json``, records, task logs and telemetry, each appended
off the event loop and flushed on a timer of its own, so a ``kill -9`` loses at most one
period of each.

A write the disk refuses (full, removed) is not raised into the run: ``refused`` hears one
sentence and the run decides (it stops; what is on disk is kept).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import anyio
import polars as pl

from ..errors import RunError
from ..records import RequestRecord
from . import files
from .manifest import Manifest

FLUSH_S = 0.5  # records and telemetry reach the disk at least this often: what a kill -9 can lose


class TelemetryRows(Protocol):
    """The sampler's log as the writer reads it: a fixed schema, rows appended."""

    @property
    def schema(self) -> dict[str, pl.DataType]: ...

    def frame(self, start: int = 0) -> pl.DataFrame:
        """Rows from ``start`` on."""
        ...


class _TelemetryFile:
    """``telemetry.arrow``, appended from the sampler's log (after an earlier session's rows,
    when the run is resumed)."""

    def __init__(self, path: Path, rows: TelemetryRows, earlier: pl.DataFrame | None) -> None:
        self.rows = rows
        self.written = 0  # rows of this session's log on disk
        schema = files.to_arrow(pl.DataFrame(schema=rows.schema)).schema
        kept = files.to_arrow(earlier).cast(schema) if earlier is not None and earlier.height else None
        self.stream = files.StreamWriter(path, schema, kept)

    def flush(self) -> None:
        frame = self.rows.frame(self.written)
        self.stream.write(files.to_arrow(frame))
        self.written += frame.height


class RunWriter:
    """Writes one run directory (an async context manager): enters with ``run.json`` on disk
    and the data files open (an earlier session's rows first, when resuming), flushes every
    ``every_s``, and on exit writes what is left, closes every file and writes ``run.json``
    with how the run ended.

    :meth:`follow` says where ``run.json``'s live fields come from, :meth:`end` how the run
    ended.
    """

    def __init__(
        self,
        run_dir: Path,
        manifest: Manifest,
        refused: Callable[[str], None],
        *,
        telemetry: TelemetryRows | None = None,
        earlier_records: pl.DataFrame | None = None,
        earlier_telemetry: pl.DataFrame | None = None,
        every_s: float = FLUSH_S,
    ) -> None:
        self.run_dir = run_dir
        self.manifest = manifest
        self.refused = refused
        self.current: Callable[[], dict[str, Any]] = dict
        self.every_s = every_s
        earlier = earlier_telemetry
        if telemetry and earlier is not None and earlier.height and earlier.columns != list(telemetry.schema):
            raise RunError(
                f"cannot resume: the telemetry sources differ from the run's ({', '.join(earlier.columns)})"
            )
        self._telemetry_rows = telemetry
        self._earlier = (earlier_records, earlier_telemetry)
        self._tasks: list[dict[str, Any]] = []
        self._dirty = False  # run.json differs from what is on disk
        self._outcome: Callable[[], dict[str, Any]] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self.cpu = files.ThreadCpu()  # what writing the files cost, off the event loop

    async def __aenter__(self) -> RunWriter:
        records, telemetry = self._earlier
        await anyio.to_thread.run_sync(self.cpu.timed, self.manifest.write, self.run_dir)
        self.records = files.RecordWriter(self.run_dir / files.MEASURED, initial=records, cpu=self.cpu)
        self.tasks = files.JsonLines(self.run_dir / files.TASKS)
        self.telemetry = (
            None
            if self._telemetry_rows is None
            else _TelemetryFile(self.run_dir / files.TELEMETRY, self._telemetry_rows, telemetry)
        )
        self._flusher = asyncio.get_running_loop().create_task(self._flush_every())
        return self

    def add(self, record: RequestRecord) -> bool:
        """Queue a record; True when a batch is due (:meth:`flush_records`)."""
        return self.records.add(record)

    async def flush_records(self) -> None:
        with self._refused(self.records.path):
            await self.records.flush()

    def add_task(self, log: dict[str, Any]) -> None:
        """Queue a task's log for ``tasks.jsonl`` (written with the next flush)."""
        self._tasks.append(log)

    def update(self, **fields: Any) -> None:
        """Set manifest fields (``run.json`` is rewritten with the next flush if one changed)."""
        for name, value in fields.items():
            if getattr(self.manifest, name) != value:
                setattr(self.manifest, name, value)
                self._dirty = True

    def follow(self, current: Callable[[], dict[str, Any]]) -> None:
        """What ``run.json`` should hold now (manifest fields: meters and their grids, counter
        events, requests dispatched), asked at each flush; rewritten when it changed."""
        self.current = current

    def end(self, outcome: Callable[[], dict[str, Any]]) -> None:
        """How the run ended, asked on exit once the data files are closed (a write refused
        while closing is part of it)."""
        self._outcome = outcome

    async def flush(self) -> None:
        """Records, task logs and telemetry to disk, and ``run.json`` when it changed."""
        await self.flush_records()
        await self._flush_tasks()
        await self._flush_telemetry()
        self.update(**self.current())
        if self._dirty:
            await self._write_manifest()

    async def _flush_every(self) -> None:
        # ended by the closing event, never cancelled: a cancel landing in a write that the
        # disk refuses would be taken for the refusal, and the loop would never end
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.every_s)
                return
            if not self.run_dir.is_dir():  # writes to its open files would vanish with it
                self.refused(f"the run directory {self.run_dir} was removed while the run was writing to it")
                return
            await self.flush()

    async def _flush_tasks(self) -> None:
        logs, self._tasks = self._tasks, []
        if logs:
            with self._refused(self.tasks.path):
                await files.write_in_thread(self._append_tasks, logs, cpu=self.cpu)

    async def _flush_telemetry(self) -> None:
        if self.telemetry is not None:
            with self._refused(self.telemetry.stream.path):
                await files.write_in_thread(self.telemetry.flush, cpu=self.cpu)

    def _append_tasks(self, logs: list[dict[str, Any]]) -> None:
        for log in logs:
            self.tasks.append(log)

    async def _write_manifest(self) -> None:
        self._dirty = False
        # built on the loop, written off it: the loop should not wait on disk
        with self._refused(self.run_dir / files.RUN):
            await anyio.to_thread.run_sync(
                self.cpu.timed, files.write_json, self.run_dir / files.RUN, self.manifest.as_dict()
            )

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closing.set()
        try:
            if self._flusher is not None:
                await self._flusher
        finally:  # each file is closed even when the flusher failed or the disk refuses what is left
            try:
                await self._flush_tasks()
                await self._flush_telemetry()
                if self.telemetry is not None:
                    with self._refused(self.telemetry.stream.path):
                        self.telemetry.stream.close()
                with self._refused(self.records.path):
                    await self.records.close()
            finally:
                self.tasks.close()
        self.update(**self.current())
        if self._outcome is not None:
            self.manifest.end = self._outcome()
        await self._write_manifest()

    @contextlib.contextmanager
    def _refused(self, path: Path) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            self.refused(f"cannot write {path}: {exc.strerror or exc}")
