"""Runs units of work for a workload: holds the client, the record writer and the live state."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .._clock import now_ns
from ..client import StreamingClient
from ..records import ErrorType, RequestRecord, Status
from ..rundir.files import JsonLines, RecordWriter
from ..scoring import score
from ..state import RunState
from ..workload import Query, TaskLog, Workload, WorkUnit

if TYPE_CHECKING:
    from .ray_pool import RayPool
    from .workers import WorkerPool


class Requests:
    """What the run's executor and a worker process's share: a record per request the
    workload makes, its body, and the request sent and scored. Subclasses say what happens as
    a request starts and once it is kept."""

    def __init__(
        self,
        workload: Workload,
        client: StreamingClient,
        model: str,
        *,
        scorer: str | None,
        session: int,
        ids: Iterator[int],
    ) -> None:
        self.workload = workload
        self.client = client
        self.model = model
        self.scorer = scorer
        self.session = session
        self._ids = ids

    @property
    def t0_ns(self) -> int:
        return self.client.t0_ns

    def new_record(
        self, unit: WorkUnit, scheduled_ns: int, prompt: str, turn: int | None = None
    ) -> RequestRecord:
        t0 = self.client.t0_ns
        return RequestRecord(
            request_id=next(self._ids),
            query_id=unit.query.id,
            dataset=self.workload.name,
            prompt=prompt,
            reference=unit.query.reference,
            warmup=unit.warmup,
            unit_id=unit.unit_id,
            session=self.session,
            task_id=None if turn is None else unit.unit_id,
            turn_index=turn,
            scheduled_ns=scheduled_ns - t0,
            dispatched_ns=now_ns() - t0,
        )

    def body(self, query: Query, stop: tuple[str, ...] = ()) -> bytes:
        return self.client.body(query, self.model, stop)

    def payload(self, fields: dict[str, Any], max_tokens: int | None = None) -> bytes:
        return self.client.payload(self.model, fields, max_tokens)

    async def request(
        self,
        record: RequestRecord,
        body: bytes,
        judge: Callable[[RequestRecord], bool | None] | None = None,
    ) -> None:
        self.started(record)
        try:
            await self.client.send(record, body)
        finally:
            if record.status is Status.OK:
                record.correct = (
                    judge(record) if judge else score(record.answer, record.reference, self.scorer)
                )
            await self.kept(record)

    def started(self, record: RequestRecord) -> None:
        raise NotImplementedError

    async def kept(self, record: RequestRecord) -> None:
        raise NotImplementedError


class Executor(Requests):
    """Performs each unit the load driver hands it, through its workload, here or in a
    worker process (``workers``).

    It keeps every record (the writer streams them to disk as they finish) and stops the run
    when the server refuses ``abort_after`` connections in a row: a server that is gone would
    otherwise fail every request that remains.
    """

    def __init__(
        self,
        workload: Workload,
        client: StreamingClient,
        model: str,
        writer: RecordWriter,
        tasks: JsonLines,
        state: RunState,
        *,
        scorer: str | None,
        server: str,
        abort_after: int,
        session: int = 0,
        first_request_id: int = 0,
        done_units: frozenset[int] = frozenset(),
    ) -> None:
        super().__init__(
            workload, client, model, scorer=scorer, session=session, ids=itertools.count(first_request_id)
        )
        self.writer = writer
        self.tasks = tasks
        self.state = state
        self.server = server
        self.abort_after = abort_after
        self.abort_reason: str | None = None
        self.aborted = asyncio.Event()
        self.done_units = done_units  # finished in an earlier session: not run again
        self.first_request_id = first_request_id
        self.workers: WorkerPool | RayPool | None = None
        self._sent = 0
        self._connect_errors = 0

    def units(self, count: int | None, warmup: bool) -> Iterator[WorkUnit]:
        """The workload's next units (less those an earlier session finished), until the run is
        aborted."""
        for unit in self.workload.units(count, warmup):
            if self.aborted.is_set():
                return
            if unit.unit_id not in self.done_units:
                yield unit

    async def execute(self, unit: WorkUnit, scheduled_ns: int) -> None:
        if self.workers is not None:
            await self.workers.execute(unit, scheduled_ns)
        else:
            await self.workload.perform(unit, self, scheduled_ns)

    def next_id(self) -> int:
        """The next request id of the run (a worker's request takes one as it starts)."""
        return next(self._ids)

    @property
    def dispatched(self) -> int:
        """Requests sent in the whole run, earlier sessions included."""
        return self.first_request_id + self._sent

    def started(self, record: RequestRecord | None) -> None:
        self._sent += 1
        self.state.started()

    async def kept(self, record: RequestRecord) -> None:
        self.state.finished(record)
        self._watch(record)
        if self.writer.add(record):
            await self.flush()

    async def flush(self) -> None:
        """Records to disk; a disk that refuses them stops the run (what is on disk is kept)."""
        try:
            await self.writer.flush()
        except OSError as exc:
            self.stop(f"cannot write {self.writer.path}: {exc.strerror or exc}")

    def task_started(self) -> None:
        self.state.task_started()

    def task_done(self, log: TaskLog) -> None:
        try:
            self.tasks.append(log.as_dict())
        except OSError as exc:
            self.stop(f"cannot write {self.tasks.path}: {exc.strerror or exc}")
        self.state.task_finished(log)

    def stop(self, reason: str) -> None:
        """End the run early for ``reason``: no new unit starts, and the run says why."""
        if not self.aborted.is_set():
            self.abort_reason = reason
            self.aborted.set()

    def _watch(self, record: RequestRecord) -> None:
        if record.error_type is ErrorType.CONNECT:
            self._connect_errors += 1
            if self._connect_errors >= self.abort_after:
                self.stop(
                    f"the server at {self.server} stopped accepting connections "
                    f"({self._connect_errors} in a row)"
                )
        elif record.status is Status.OK:
            self._connect_errors = 0
