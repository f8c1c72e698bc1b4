"""What a run sends. A workload yields units of work; the load driver schedules units and knows
nothing of what they do; an executor (the run's, holding client, writer and live state) runs
each one through the workload's :meth:`Workload.perform`.

A unit is data with an id, not a closure, so a unit can later be resumed or handed to another
process. Single-turn dataset requests are the first workload.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from ..records import RequestRecord
from .datasets import Dataset, DatasetError, Query, resolve


@dataclass(frozen=True)
class WorkUnit:
    """One schedulable piece of work: unit ``unit_id`` of the run, about ``query``."""

    unit_id: int
    query: Query
    warmup: bool = False


class Executor(Protocol):
    """What a workload may ask of the run while it performs a unit."""

    def new_record(self, unit: WorkUnit, scheduled_ns: int, prompt: str) -> RequestRecord:
        """A record for one request of ``unit``, due at ``scheduled_ns`` (absolute, run clock)
        and dispatched now."""
        ...

    def body(self, query: Query, stop: tuple[str, ...] = ()) -> bytes:
        """The request body for ``query`` under the run's options."""
        ...

    async def request(self, record: RequestRecord, body: bytes) -> None:
        """Send one streaming request, fill ``record``, score and keep it."""
        ...


class Workload(Protocol):
    """Yields units and knows how to perform one."""

    name: str  # what the records' ``dataset`` column says
    scorer: str | None  # how answers are scored unless the run names a scorer

    def size(self) -> int:
        """Units in one pass over the workload."""
        ...

    def units(self, count: int | None, warmup: bool) -> Iterator[WorkUnit]:
        """The next ``count`` units (None: without end); successive calls continue."""
        ...

    async def perform(self, unit: WorkUnit, executor: Executor, scheduled_ns: int) -> None:
        """Do the unit's work through ``executor``; the driver scheduled it for ``scheduled_ns``."""
        ...


__all__ = [
    "Dataset",
    "DatasetError",
    "Executor",
    "Query",
    "WorkUnit",
    "Workload",
    "resolve",
]
