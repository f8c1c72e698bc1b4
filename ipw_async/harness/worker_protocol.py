"""What a worker (a process or a Ray actor) and its coordinator say to each other.

Messages are small frozen classes, each handled in one ``match`` on each side: a kind no side
knows fails loudly instead of being skipped. A worker numbers its requests by itself; the
coordinator gives each its run-wide id as it hears of it starting (the order requests start
in, but for messages of two workers crossing) and renumbers its record and task log
(:class:`Renumbering`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..client import ClientConfig, StreamingClient
from ..records import RequestRecord
from ..workload import TaskLog, Workload, WorkUnit
from ..workload.body import BodyDefaults
from .ledger import Coordinator
from .requests import RequestSink, UnitRequests

CLOSE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker starts from (pickled to it); ``t0_ns`` is the run's start on its clock."""

    workload: Workload
    client: ClientConfig
    t0_ns: int
    body: BodyDefaults
    scorer: str | None
    session: int

    def requests(self, client: StreamingClient, sink: RequestSink) -> UnitRequests:
        return UnitRequests(self.workload, client, self.body, sink, scorer=self.scorer, session=self.session)


# coordinator -> worker
@dataclass(frozen=True)
class RunUnit:
    unit: WorkUnit
    scheduled_ns: int


@dataclass(frozen=True)
class CancelUnit:
    unit_id: int


@dataclass(frozen=True)
class Close:
    pass


Command = RunUnit | CancelUnit | Close


# worker -> coordinator: what the run's ledger would have seen ...
@dataclass(frozen=True)
class Started:
    unit_id: int | None
    number: int  # the worker's own


@dataclass(frozen=True)
class Kept:
    record: RequestRecord


@dataclass(frozen=True)
class TaskStarted:
    pass


@dataclass(frozen=True)
class TaskDone:
    log: TaskLog


Report = Started | Kept | TaskStarted | TaskDone


# ... and how units and the worker itself are doing
@dataclass(frozen=True)
class UnitDone:
    unit_id: int


@dataclass(frozen=True)
class UnitFailed:
    unit_id: int
    error: str


@dataclass(frozen=True)
class Ready:
    pass


@dataclass(frozen=True)
class NotReady:
    """The worker could not open the workload (its tool servers, say): the run cannot start."""

    error: str


@dataclass(frozen=True)
class Closed:
    pass


Message = Report | UnitDone | UnitFailed | Ready | NotReady | Closed


class WorkerSink:
    """A worker's requests, told to the coordinator. ``numbers``: one counter for every unit the
    worker runs, however many sinks it makes (the renumbering keys on them)."""

    def __init__(self, send: Callable[[Message], None], numbers: Iterator[int] | None = None) -> None:
        self.send = send
        self._numbers = itertools.count() if numbers is None else numbers

    def number(self) -> int:
        return next(self._numbers)

    def started(self, unit_id: int | None, number: int) -> None:
        self.send(Started(unit_id, number))

    async def kept(self, record: RequestRecord) -> None:
        self.send(Kept(record))

    def task_started(self) -> None:
        self.send(TaskStarted())

    def task_done(self, log: TaskLog) -> None:
        self.send(TaskDone(log))


async def run_unit(requests: UnitRequests, unit: WorkUnit, scheduled_ns: int) -> Message:
    """A unit through the workload, then how it ended: done (cancelled too: its records say
    so), or failed with the error, which the coordinator raises where it awaits the unit."""
    try:
        await requests.workload.perform(unit, requests, scheduled_ns)
    except asyncio.CancelledError:
        pass
    except Exception as exc:
        return UnitFailed(unit.unit_id, f"{type(exc).__name__}: {exc}")
    return UnitDone(unit.unit_id)


class Renumbering:
    """A worker's reports applied to the run's :class:`Coordinator`, its request numbers made
    the run's (given as requests start, so ids are dense and in about start order)."""

    def __init__(self, run: Coordinator) -> None:
        self.run = run
        # (worker, unit, the worker's number) -> the run's request id
        self._ids: dict[tuple[int, int | None, int], int] = {}

    async def apply(self, worker: int, report: Report) -> None:
        match report:
            case Started(unit_id, number):
                ours = self._ids[(worker, unit_id, number)] = self.run.number()
                self.run.started(unit_id, ours)
            case Kept(record):
                key = (worker, record.unit_id, record.request_id)
                # a task's calls keep their numbers until its log is renumbered too
                record.request_id = self._ids[key] if record.task_id is not None else self._ids.pop(key)
                await self.run.kept(record)
            case TaskStarted():
                self.run.task_started()
            case TaskDone(log):
                for turn in log.turns:
                    turn["request_id"] = self._ids.pop((worker, log.task_id, turn["request_id"]), None)
                self.run.task_done(log)
            case _:
                raise TypeError(f"not a worker's report: {report!r}")
