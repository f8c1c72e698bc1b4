"""The run's ledger: request ids, records and task logs kept, the live state, the abort watch.

Where units run (in this loop, in worker processes, on Ray actors) is a dispatch's business
(:mod:`.dispatch`); whatever runs them reports back through :class:`Coordinator`, which the
ledger implements, so the ledger knows no pool and a pool knows no more of the run than this.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Protocol

from ..records import ErrorType, RequestRecord, Status
from ..rundir.writer import RunWriter
from ..state import RunState
from ..workload import TaskLog, Workload, WorkUnit
from .requests import RequestSink
from .watch import RunWatch


class Coordinator(RequestSink, Protocol):
    """What the run hears from wherever its units run: their requests, as a unit in this loop
    tells them (run-wide ids), and an early end."""

    def stop(self, reason: str) -> None:
        """End the run early for ``reason``."""
        ...


class Abort:
    """The run's early end: the first reason given, and an event the run waits on."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.event = asyncio.Event()

    def stop(self, reason: str) -> None:
        if not self.event.is_set():
            self.reason = reason
            self.event.set()


class RunLedger:
    """Keeps every record (the writer streams them to disk as they finish) and every task log,
    and stops the run when the server refuses ``abort_after`` connections in a row: a server
    that is gone would otherwise fail every request that remains."""

    def __init__(
        self,
        writer: RunWriter,
        state: RunState,
        abort: Abort,
        *,
        server: str,
        abort_after: int,
        first_request_id: int = 0,
        done_units: frozenset[int] = frozenset(),
    ) -> None:
        self.writer = writer
        self.state = state
        self.abort = abort
        self.server = server
        self.abort_after = abort_after
        self.done_units = done_units  # finished in an earlier session: not run again
        self.first_request_id = first_request_id
        self._ids = itertools.count(first_request_id)
        self._sent = 0
        self._connect_errors = 0
        self.stopped: str | None = None  # why the run sent no more, by its own rule
        self.watch: RunWatch | None = None  # set while the run measures

    def units(self, workload: Workload, count: int | None, warmup: bool) -> Iterator[WorkUnit]:
        """The workload's next units (less those an earlier session finished), until the run is
        aborted."""
        for unit in workload.units(count, warmup):
            if not self.sending:
                return
            if unit.unit_id not in self.done_units:
                yield unit

    @property
    def sending(self) -> bool:
        """Whether the run still sends: not aborted, and not stopped by its own rule."""
        return not (self.abort.event.is_set() or self.stopped)

    def number(self) -> int:
        return next(self._ids)

    @property
    def dispatched(self) -> int:
        """Requests sent in the whole run, earlier sessions included."""
        return self.first_request_id + self._sent

    def started(self, unit_id: int | None, number: int) -> None:
        self._sent += 1
        self.state.started()
        if self.watch is not None:
            self.watch.request_sent()

    async def kept(self, record: RequestRecord) -> None:
        self.state.finished(record)
        self._stop_on_refused_connections(record)
        if self.watch is not None and not record.warmup:
            self.watch.request_ended(record)
        if self.writer.add(record):
            await self.writer.flush_records()

    def task_started(self) -> None:
        self.state.task_started()

    def task_done(self, log: TaskLog) -> None:
        self.writer.add_task(log.as_dict())
        self.state.task_finished(log)

    def stop(self, reason: str) -> None:
        """No new unit starts, and the run says why (the first reason given is kept)."""
        self.abort.stop(reason)

    def end_early(self, reason: str) -> None:
        """No new unit starts: the run has what its own rule asked for (not an abort)."""
        self.stopped = self.stopped or reason

    def _stop_on_refused_connections(self, record: RequestRecord) -> None:
        if record.error_type is ErrorType.CONNECT:
            self._connect_errors += 1
            if self._connect_errors >= self.abort_after:
                self.stop(
                    f"the server at {self.server} stopped accepting connections "
                    f"({self._connect_errors} in a row)"
                )
        elif record.status is Status.OK:
            self._connect_errors = 0
