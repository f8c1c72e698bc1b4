"""A unit's requests, wherever it runs: records numbered and stamped, bodies built, each request
sent, scored and handed to a :class:`RequestSink` (the run's ledger here, a pipe to the
coordinator in a worker)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from .._clock import now_ns
from ..client import StreamingClient
from ..records import RequestRecord, Status
from ..scoring import score
from ..workload import Outcome, TaskLog, Workload, WorkUnit
from ..workload.body import BodyDefaults


class RequestSink(Protocol):
    """Where requests and task logs go as they happen: the run's ledger itself, or a worker's
    messages to it (renumbered there, :class:`~.worker_protocol.Renumbering`)."""

    def number(self) -> int:
        """An id for a new record (the run's, or a worker's own until the coordinator renumbers)."""
        ...

    def started(self, unit_id: int | None, number: int) -> None:
        """Request ``number`` (of unit ``unit_id``, where it has one) was sent."""
        ...

    async def kept(self, record: RequestRecord) -> None: ...

    def task_started(self) -> None: ...

    def task_done(self, log: TaskLog) -> None: ...


class UnitRequests:
    """What a workload asks of the run while it performs a unit (:class:`ipw_async.workload.Requests`)."""

    def __init__(
        self,
        workload: Workload,
        client: StreamingClient,
        defaults: BodyDefaults,
        sink: RequestSink,
        *,
        scorer: str | None,
        session: int,
    ) -> None:
        self.workload = workload
        self.client = client
        self.defaults = defaults
        self.sink = sink
        self.scorer = scorer
        self.session = session

    @property
    def t0_ns(self) -> int:
        return self.client.t0_ns

    def new_record(
        self, unit: WorkUnit, scheduled_ns: int, prompt: str, turn: int | None = None
    ) -> RequestRecord:
        t0 = self.client.t0_ns
        return RequestRecord(
            request_id=self.sink.number(),
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

    def payload(self, fields: dict[str, Any], max_tokens: int | None = None) -> bytes:
        return self.defaults.encode(fields, max_tokens)

    async def request(
        self,
        record: RequestRecord,
        body: bytes,
        judge: Callable[[RequestRecord], bool | None] | None = None,
    ) -> None:
        self.sink.started(record.unit_id, record.request_id)
        try:
            await self.client.send(record, body)
        finally:
            if record.status is Status.OK:
                record.correct = (
                    judge(record) if judge else score(record.answer, record.reference, self.scorer)
                )
            await self.sink.kept(record)

    @contextlib.contextmanager
    def task(self, log: TaskLog) -> Iterator[TaskLog]:
        self.sink.task_started()
        try:
            yield log
        finally:
            if log.outcome is None:  # cancelled mid-task: what it did so far still counts
                log.end(Outcome.CANCELLED, self.t0_ns)
            self.sink.task_done(log)
