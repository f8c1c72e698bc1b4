"""Load spread over worker processes: the coordinator schedules, the workers stream.

One event loop parses every SSE event of every stream, so one core caps the events a run can
take in. With ``--workers K`` the load driver, the sampler, the writer and the dashboard stay
in the coordinator, which hands each unit of work to the least busy of K worker processes.
Each worker has its own event loop and client, performs the unit through its own copy of the
workload, and sends back what the run's executor would have seen: a request starting, a record
kept, a task logged. Every stamp is on the machine's monotonic clock, shared by all processes.

A worker numbers its requests by itself; the coordinator gives each its run-wide id as it
hears of it starting (the order requests start in, but for messages of two workers crossing)
and renumbers its record and task log.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import multiprocessing
import os
import queue
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from ..client import ClientConfig, StreamingClient
from ..errors import RunError
from ..records import RequestRecord
from ..workload import TaskLog, Workload, WorkUnit
from .executor import Executor, Requests

CLOSE_TIMEOUT_S = 10.0
STREAMS_PER_WORKER = 128  # ``auto``: about what one core streams before its loop lags


def auto_workers(pool_size: int, cores: int | None = None) -> int:
    """``--workers auto``: one per STREAMS_PER_WORKER streams the load can hold open, at most
    one per core but one (the coordinator's)."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(cores - 1, math.ceil(pool_size / STREAMS_PER_WORKER)))


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker starts from (pickled to it); ``t0_ns`` is the run's start on its clock."""

    index: int
    workload: Workload
    client: ClientConfig
    t0_ns: int
    model: str
    scorer: str | None
    session: int


Message = tuple[Any, ...]


class Sender:
    """Sends on a pipe from a thread of its own, in order: an event loop never blocks on a
    full pipe (two loops each blocked sending to the other would wait forever, and a stalled
    worker loop would stamp late). A pipe the other end closed drops what is left."""

    def __init__(self, conn: Connection) -> None:
        self._queue: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, args=(conn,), daemon=True, name="ipw-async-sender")
        self._thread.start()

    def _run(self, conn: Connection) -> None:
        while (message := self._queue.get()) is not None:
            try:
                conn.send(message)
            except OSError:  # the other end is gone
                return

    def send(self, message: Message) -> None:
        self._queue.put(message)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Send what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout)


class WorkerRequests(Requests):
    """A worker's side of the executor: what the run's would do, sent to the coordinator."""

    def __init__(
        self,
        setup: WorkerSetup,
        client: StreamingClient,
        send: Callable[[Message], None],
        ids: Iterator[int],
    ) -> None:
        # ``ids``: this worker's own numbers, one counter for all it runs (the coordinator renumbers)
        super().__init__(
            setup.workload, client, setup.model, scorer=setup.scorer, session=setup.session, ids=ids
        )
        self.send = send

    def started(self, record: RequestRecord) -> None:
        self.send(("started", record.unit_id, record.request_id))

    async def kept(self, record: RequestRecord) -> None:
        self.send(("kept", record))

    def task_started(self) -> None:
        self.send(("task_started",))

    def task_done(self, log: TaskLog) -> None:
        self.send(("task_done", log))


class Ledger:
    """The coordinator's side: a worker's messages applied to the run's executor, its request
    numbers made the run's (given as requests start, so ids are dense and in about start order)."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        # (worker, unit, the worker's number) -> the run's request id
        self._ids: dict[tuple[int, int | None, int], int] = {}

    async def apply(self, worker: int, message: Message) -> None:
        ex = self.executor
        kind = message[0]
        if kind == "started":
            self._ids[(worker, message[1], message[2])] = ex.next_id()
            ex.started(None)
        elif kind == "kept":
            record: RequestRecord = message[1]
            key = (worker, record.unit_id, record.request_id)
            # a task's calls keep their numbers until its log is renumbered too
            record.request_id = self._ids[key] if record.task_id is not None else self._ids.pop(key)
            await ex.kept(record)
        elif kind == "task_started":
            ex.task_started()
        elif kind == "task_done":
            log: TaskLog = message[1]
            for turn in log.turns:
                turn["request_id"] = self._ids.pop((worker, log.task_id, turn["request_id"]), None)
            ex.task_done(log)


async def run_unit(
    workload: Workload,
    side: WorkerRequests,
    unit: WorkUnit,
    scheduled_ns: int,
    send: Callable[[Message], None],
) -> None:
    """A unit through the workload, then how it ended: ``done`` (cancelled too: its records
    say so), or ``failed`` with the error, which the coordinator raises where it awaits it."""
    try:
        await workload.perform(unit, side, scheduled_ns)
    except asyncio.CancelledError:
        pass
    except Exception as exc:
        send(("failed", unit.unit_id, f"{type(exc).__name__}: {exc}"))
        return
    send(("done", unit.unit_id))


def _worker_main(setup: WorkerSetup, conn: Connection) -> None:
    # Ctrl-C and kill signals reach the whole process group: the coordinator decides when a
    # worker stops (and a coordinator that died closes the pipe, which ends the worker).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    asyncio.run(_serve(setup, conn))


async def _serve(setup: WorkerSetup, conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    client = StreamingClient(setup.client, t0_ns=setup.t0_ns)
    sender = Sender(conn)
    side = WorkerRequests(setup, client, sender.send, itertools.count())
    running: dict[int, asyncio.Task[None]] = {}
    closing = asyncio.Event()

    async def perform(unit: WorkUnit, scheduled_ns: int) -> None:
        try:
            await run_unit(setup.workload, side, unit, scheduled_ns, sender.send)
        finally:
            running.pop(unit.unit_id, None)

    def on_command() -> None:
        try:
            while conn.poll():
                command = conn.recv()
                if command[0] == "unit":
                    _, unit, scheduled_ns = command
                    running[unit.unit_id] = loop.create_task(perform(unit, scheduled_ns))
                elif command[0] == "cancel" and command[1] in running:
                    running[command[1]].cancel()
                elif command[0] == "close":
                    closing.set()
        except EOFError:  # the coordinator is gone
            closing.set()

    loop.add_reader(conn.fileno(), on_command)
    sender.send(("ready",))
    try:
        await closing.wait()
        for task in list(running.values()):
            task.cancel()
        await asyncio.gather(*running.values(), return_exceptions=True)
    finally:
        loop.remove_reader(conn.fileno())
        await client.aclose()
        sender.send(("closed",))
        await asyncio.to_thread(sender.close)


class WorkerPool:
    """K worker processes behind the run's :class:`Executor` (see the module docstring)."""

    def __init__(self, executor: Executor, count: int, client: ClientConfig) -> None:
        self.executor = executor
        self.count = count
        self.client = client
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._senders: list[Sender] = []
        self._load: list[int] = []  # units in flight per worker
        self._pending: dict[int, tuple[int, asyncio.Future[None]]] = {}
        self._ledger = Ledger(executor)
        self._messages: asyncio.Queue[tuple[int, tuple[Any, ...]]] = asyncio.Queue()
        self._ready = 0
        self._closed: set[int] = set()
        self._closing = False
        self._consumer: asyncio.Task[None] | None = None
        self._ready_event = asyncio.Event()
        self._closed_event = asyncio.Event()
        self._died_event = asyncio.Event()  # a worker ended (during start-up: it failed)

    async def start(self) -> None:
        ex = self.executor
        # spawn, not fork: the harness already runs threads (the sampler's), which fork copies badly
        context = multiprocessing.get_context("spawn")
        per_worker = replace(self.client, max_connections=math.ceil(self.client.max_connections / self.count))
        loop = asyncio.get_running_loop()
        for index in range(self.count):
            setup = WorkerSetup(
                index,
                ex.workload,
                per_worker,
                ex.t0_ns,
                ex.model,
                ex.scorer,
                ex.session,
            )
            ours, theirs = context.Pipe()
            proc = context.Process(
                target=_worker_main, args=(setup, theirs), daemon=True, name=f"ipw-async-worker-{index}"
            )
            try:
                proc.start()
            except Exception as exc:  # pickling the workload, mostly
                raise RunError(
                    f"cannot start worker processes ({type(exc).__name__}: {exc}); run with --workers 1"
                ) from None
            theirs.close()
            self._procs.append(proc)
            self._conns.append(ours)
            self._senders.append(Sender(ours))
            self._load.append(0)
            loop.add_reader(ours.fileno(), self._on_message, index)
        self._consumer = loop.create_task(self._consume())
        ready = loop.create_task(self._ready_event.wait())
        died = loop.create_task(self._died_event.wait())
        await asyncio.wait({ready, died}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        died.cancel()
        if not self._ready_event.is_set():
            dead = [(i, p.exitcode) for i, p in enumerate(self._procs) if i in self._closed]
            if dead:
                raise RunError(
                    f"worker process {dead[0][0]} exited while starting (exit code {dead[0][1]}); "
                    "run with --workers 1 to see why"
                )
            raise RunError("the worker processes did not start within 60 s")

    def _on_message(self, index: int) -> None:
        conn = self._conns[index]
        try:
            while conn.poll():
                self._messages.put_nowait((index, conn.recv()))
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(conn.fileno())
            self._messages.put_nowait((index, ("closed",)))

    async def _consume(self) -> None:
        try:
            await self._consume_messages()
        except Exception as exc:  # a message it could not apply: stop, and let no unit wait on it
            self.executor.stop(f"worker messages could not be applied ({exc!r}); the run stops")
            for _, future in self._pending.values():
                if not future.done():
                    future.set_exception(RuntimeError("the worker pool stopped"))
            self._pending.clear()
            self._closed_event.set()
            raise

    async def _consume_messages(self) -> None:
        ex = self.executor
        while True:
            index, message = await self._messages.get()
            kind = message[0]
            if kind in ("started", "kept", "task_started", "task_done"):
                await self._ledger.apply(index, message)
            elif kind in ("done", "failed"):
                entry = self._pending.pop(message[1], None)
                if entry is not None:
                    self._load[entry[0]] -= 1
                    if not entry[1].done():
                        if kind == "done":
                            entry[1].set_result(None)
                        else:
                            entry[1].set_exception(RuntimeError(f"worker {index}: {message[2]}"))
            elif kind == "ready":
                self._ready += 1
                if self._ready == self.count:
                    self._ready_event.set()
            elif kind == "closed":
                if index in self._closed:
                    continue  # its "closed", then its pipe's end
                self._closed.add(index)
                self._died_event.set()
                lost = [unit_id for unit_id, (worker, _) in self._pending.items() if worker == index]
                if not self._closing and self._ready_event.is_set():
                    # it died: what it had in flight is lost, the run stops (no unit goes to it now)
                    proc = self._procs[index]
                    await asyncio.to_thread(proc.join, 1)
                    ex.stop(
                        f"worker process {index} ended unexpectedly (exit code {proc.exitcode}); "
                        f"{len(lost)} unit(s) it was running are lost"
                    )
                for unit_id in lost:  # it will never answer for these
                    future = self._pending.pop(unit_id)[1]
                    if not future.done():
                        future.set_result(None)
                if len(self._closed) >= len(self._procs):
                    self._closed_event.set()

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def report(self) -> dict[str, Any]:
        return {"processes": self.count}

    async def execute(self, unit: WorkUnit, scheduled_ns: int) -> None:
        alive = [i for i in range(self.count) if i not in self._closed]
        if not alive:
            return  # every worker is gone: the run is stopping
        index = min(alive, key=self._load.__getitem__)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[unit.unit_id] = (index, future)
        self._load[index] += 1
        self._senders[index].send(("unit", unit, scheduled_ns))
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            self._senders[index].send(("cancel", unit.unit_id))
            raise

    async def close(self) -> None:
        """Cancel what runs, keep every record the workers send back, and end them."""
        self._closing = True
        for sender in self._senders:
            sender.send(("close",))
        if self._consumer is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed_event.wait(), CLOSE_TIMEOUT_S)
        # what came with the last "closed" (while something still takes it off the queue)
        while not self._messages.empty() and self._consumer is not None and not self._consumer.done():
            await asyncio.sleep(0)
        if self._consumer is not None:
            self._consumer.cancel()
            await asyncio.gather(self._consumer, return_exceptions=True)
        loop = asyncio.get_running_loop()
        for conn, proc, sender in zip(self._conns, self._procs, self._senders, strict=True):
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(conn.fileno())
            await asyncio.to_thread(sender.close, 1.0)
            conn.close()
            await asyncio.to_thread(proc.join, 5)
            if proc.is_alive():
                proc.kill()
