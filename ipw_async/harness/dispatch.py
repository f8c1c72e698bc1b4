"""Where a run's units run: a dispatch takes each unit the load driver schedules and performs it
here (:class:`LocalDispatch`), in worker processes (:mod:`.workers`) or on Ray actors
(:mod:`.ray_pool`), reporting to the run's :class:`~.ledger.Coordinator`."""

from __future__ import annotations

from typing import Any, Protocol

from ..client import StreamingClient
from ..workload import WorkUnit
from .ledger import RunLedger
from .worker_protocol import WorkerSetup


class Dispatch(Protocol):
    count: int  # units run in parallel places (1: this event loop)

    async def execute(self, unit: WorkUnit, scheduled_ns: int) -> None:
        """Perform ``unit`` (due at ``scheduled_ns``) and return when it has ended."""
        ...

    @property
    def pids(self) -> list[int]:
        """Processes on this machine whose CPU is the harness's too."""
        ...

    def report(self) -> dict[str, Any] | None:
        """Where units ran, for the run's summary."""
        ...


class Pool(Dispatch, Protocol):
    """Places of their own (worker processes, Ray actors), each opening the workload."""

    async def start(self) -> None:
        """Start the places units run in, each with the workload opened; RunError if one cannot."""
        ...

    async def close(self) -> None:
        """Cancel what runs, keep every record that comes back, and end the workers."""
        ...


class LocalDispatch:
    """Units performed in this event loop, with the workload its run opened; their requests go
    straight to the ledger."""

    count = 1

    def __init__(self, ledger: RunLedger, setup: WorkerSetup, client: StreamingClient) -> None:
        self.ledger = ledger
        self.requests = setup.requests(client, ledger)  # the ledger hears its requests itself

    async def execute(self, unit: WorkUnit, scheduled_ns: int) -> None:
        await self.requests.workload.perform(unit, self.requests, scheduled_ns)

    @property
    def pids(self) -> list[int]:
        return []

    def report(self) -> None:
        return None
