"""What a run sends. A workload yields units of work; the load driver schedules units and knows
nothing of what they do; where the unit runs (here, a worker process, a Ray actor), the
workload's :meth:`Workload.perform` makes its requests through :class:`Requests`.

A unit is data with an id, not a closure, so a unit can later be resumed or handed to another
process. Single-turn dataset requests are the first workload.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .datasets import Dataset, DatasetError, Query, resolve
from .tasklog import Outcome, TaskLog

if TYPE_CHECKING:  # the simulator reads tasks and datasets here, and needs no polars
    from ..records import RequestRecord


@dataclass(frozen=True)
class WorkUnit:
    """One schedulable piece of work: unit ``unit_id`` of the run, about ``query``."""

    unit_id: int
    query: Query
    warmup: bool = False
    # a replayed trace's: when the unit is due, ns after the trace's first entry (load.Timed)
    at_ns: int | None = None


class UnitCycle:
    """Units drawn round-robin from a workload's queries, as many as the run needs, numbered
    across calls (warm-up units first, then measured ones)."""

    def __init__(self, queries: Iterable[Query]) -> None:
        items = list(queries)  # a finite list: cycle() keeps a copy of what it has yielded
        if not items:
            raise DatasetError("the dataset has no queries")
        self._queries = itertools.cycle(items)
        self._ids = itertools.count()

    def units(self, count: int | None, warmup: bool) -> Iterator[WorkUnit]:
        drawn = self._queries if count is None else itertools.islice(self._queries, count)
        for query in drawn:
            yield WorkUnit(next(self._ids), query, warmup)


class Requests(Protocol):
    """What a workload may ask of the run while it performs a unit: records, bodies, requests
    sent and kept, and task logs."""

    @property
    def t0_ns(self) -> int:
        """The run clock's origin (absolute monotonic ns)."""
        ...

    def new_record(
        self, unit: WorkUnit, scheduled_ns: int, prompt: str, turn: int | None = None
    ) -> RequestRecord:
        """A record for one request of ``unit``, due at ``scheduled_ns`` (absolute, run clock)
        and dispatched now; ``turn`` numbers the calls of a multi-turn task."""
        ...

    def payload(self, fields: dict[str, Any], max_tokens: int | None = None) -> bytes:
        """A request body from ``fields`` (messages or prompt, tools, stop) and the run's options."""
        ...

    async def request(
        self,
        record: RequestRecord,
        body: bytes,
        judge: Callable[[RequestRecord], bool | None] | None = None,
    ) -> None:
        """Send one streaming request, fill ``record``, score it (by ``judge`` when given, else
        against the query's reference) and keep it."""
        ...

    def task(self, log: TaskLog) -> AbstractContextManager[TaskLog]:
        """A multi-turn task around its turns: counted as it starts, and its ``log`` (ended as
        cancelled if the body did not end it) goes to ``tasks.jsonl`` however it ends."""
        ...


class Workload(Protocol):
    """Yields units and knows how to perform one. A workload that needs something running while
    its units are performed (the agentic workload's MCP tool servers) also has an ``opened()``
    context: see :class:`Opens`."""

    name: str  # what the records' ``dataset`` column says
    scorer: str | None  # how answers are scored unless the run names a scorer

    def size(self) -> int:
        """Units in one pass over the workload."""
        ...

    def units(self, count: int | None, warmup: bool) -> Iterator[WorkUnit]:
        """The next ``count`` units (None: without end); successive calls continue."""
        ...

    async def perform(self, unit: WorkUnit, requests: Requests, scheduled_ns: int) -> None:
        """Do the unit's work through ``requests``; the driver scheduled it for ``scheduled_ns``."""
        ...


@runtime_checkable
class Opens(Protocol):
    """A workload's lifecycle: ``opened()`` is entered before its units are performed where they
    are performed (this process, each worker process, each Ray actor) and left after. It may be
    left from another task than the one that entered it (a Ray actor's calls are tasks)."""

    def opened(self) -> AbstractAsyncContextManager[None]: ...


def opened(workload: Workload) -> AbstractAsyncContextManager[None]:
    """The workload's lifecycle (:class:`Opens`), or nothing for a workload without one."""
    return workload.opened() if isinstance(workload, Opens) else contextlib.nullcontext()


__all__ = [
    "Dataset",
    "DatasetError",
    "Opens",
    "Outcome",
    "Query",
    "Requests",
    "TaskLog",
    "UnitCycle",
    "WorkUnit",
    "Workload",
    "opened",
    "resolve",
]
