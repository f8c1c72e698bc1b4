"""Load spread over worker processes: the coordinator schedules, the workers stream.

One event loop parses every SSE event of every stream, so one core caps the events a run can
take in. With ``--workers K`` the load driver, the sampler, the writer and the dashboard stay
in the coordinator, which hands each unit of work to the least busy of K worker processes.
Each worker has its own event loop and client, performs the unit through its own copy of the
workload (opened there: its MCP tool servers are the worker's own), and sends back what the run's ledger would have seen (:mod:`.worker_protocol`): a
request starting, a record kept, a task logged. Every stamp is on the machine's monotonic
clock, shared by all processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import os
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from .._loop import run as run_loop
from ..client import StreamingClient
from ..errors import RunError
from ..workload import WorkUnit, opened
from ..workload.mcp_tools import START_TIMEOUT_S
from .ledger import Coordinator
from .worker_protocol import (
    CLOSE_TIMEOUT_S,
    CancelUnit,
    Close,
    Closed,
    Command,
    Message,
    NotReady,
    Ready,
    Renumbering,
    RunUnit,
    UnitDone,
    UnitFailed,
    WorkerSetup,
    WorkerSink,
    run_unit,
)

# A worker opens its workload's MCP servers as it starts: it says why one did not start (within
# that server's own limit) before this limit says only that the workers did not
START_S = START_TIMEOUT_S + 30

STREAMS_PER_WORKER = 128  # ``auto``: about what one core streams before its loop lags


def auto_workers(pool_size: int, cores: int | None = None) -> int:
    """``--workers auto``: one per STREAMS_PER_WORKER streams the load can hold open, at most
    one per core but one (the coordinator's)."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(cores - 1, math.ceil(pool_size / STREAMS_PER_WORKER)))


class Sender:
    """Sends on a pipe from a thread of its own, in order: an event loop never blocks on a
    full pipe (two loops each blocked sending to the other would wait forever, and a stalled
    worker loop would stamp late). A pipe the other end closed drops what is left."""

    def __init__(self, conn: Connection) -> None:
        self._queue: queue.SimpleQueue[Message | Command | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, args=(conn,), daemon=True, name="ipw-async-sender")
        self._thread.start()

    def _run(self, conn: Connection) -> None:
        while (message := self._queue.get()) is not None:
            try:
                conn.send(message)
            except OSError:  # the other end is gone
                return

    def send(self, message: Message | Command) -> None:
        self._queue.put(message)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Send what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout)


def _call_on_message(
    loop: asyncio.AbstractEventLoop, conn: Connection, callback: Callable[..., None], *args: object
) -> None:
    """Call ``callback`` when ``conn`` has a message. uvloop's add_reader makes the descriptor
    non-blocking, and the Sender thread's blocking writes on it would then fail on a full pipe
    (the first large burst of records stalled a run); blocking again, it polls as asyncio's does."""
    loop.add_reader(conn.fileno(), callback, *args)
    os.set_blocking(conn.fileno(), True)


def _worker_main(setup: WorkerSetup, conn: Connection) -> None:
    # Ctrl-C and kill signals reach the whole process group: the coordinator decides when a
    # worker stops (and a coordinator that died closes the pipe, which ends the worker).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    run_loop(_serve(setup, conn), stop_signals=False)


async def _serve(setup: WorkerSetup, conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    client = StreamingClient(setup.client, t0_ns=setup.t0_ns)
    sender = Sender(conn)
    requests = setup.requests(client, WorkerSink(sender.send))
    running: dict[int, asyncio.Task[None]] = {}
    closing = asyncio.Event()

    async def perform(unit: WorkUnit, scheduled_ns: int) -> None:
        try:
            sender.send(await run_unit(requests, unit, scheduled_ns))
        finally:
            running.pop(unit.unit_id, None)

    def on_command() -> None:
        try:
            while conn.poll():
                command: Command = conn.recv()
                match command:
                    case RunUnit(unit, scheduled_ns):
                        running[unit.unit_id] = loop.create_task(perform(unit, scheduled_ns))
                    case CancelUnit(unit_id) if unit_id in running:
                        running[unit_id].cancel()
                    case CancelUnit():
                        pass  # it ended as the cancel crossed it
                    case Close():
                        closing.set()
        except EOFError:  # the coordinator is gone
            closing.set()

    _call_on_message(loop, conn, on_command)
    workload = contextlib.AsyncExitStack()  # open from before Ready until the worker closes
    try:
        try:
            await workload.enter_async_context(opened(setup.workload))
        except Exception as exc:  # RunError, mostly: its message is the run's
            sender.send(NotReady(str(exc) or type(exc).__name__))
            return
        sender.send(Ready())
        await closing.wait()
        for task in list(running.values()):
            task.cancel()
        await asyncio.gather(*running.values(), return_exceptions=True)
    finally:
        await workload.aclose()
        loop.remove_reader(conn.fileno())
        await client.aclose()
        sender.send(Closed())
        await asyncio.to_thread(sender.close)


class WorkerPool:
    """K worker processes reporting to the run's ledger (see the module docstring)."""

    def __init__(self, run: Coordinator, setup: WorkerSetup, count: int) -> None:
        self.run = run
        self.setup = setup
        self.count = count
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._senders: list[Sender] = []
        self._load: list[int] = []  # units in flight per worker
        self._pending: dict[int, tuple[int, asyncio.Future[None]]] = {}
        self._renumbering = Renumbering(run)
        self._messages: asyncio.Queue[tuple[int, Message]] = asyncio.Queue()
        self._ready = 0
        self._closed: set[int] = set()
        self._closing = False
        self._consumer: asyncio.Task[None] | None = None
        self._ready_event = asyncio.Event()
        self._closed_event = asyncio.Event()
        self._died_event = asyncio.Event()  # a worker ended (during start-up: it failed)
        self._not_ready: str | None = None  # why a worker could not open the workload

    async def start(self) -> None:
        # spawn, not fork: the harness already runs threads (the sampler's), which fork copies badly
        context = multiprocessing.get_context("spawn")
        client = self.setup.client
        setup = replace(
            self.setup, client=replace(client, max_connections=math.ceil(client.max_connections / self.count))
        )
        loop = asyncio.get_running_loop()
        for index in range(self.count):
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
            _call_on_message(loop, ours, self._on_message, index)
        self._consumer = loop.create_task(self._consume())
        ready = loop.create_task(self._ready_event.wait())
        died = loop.create_task(self._died_event.wait())
        await asyncio.wait({ready, died}, timeout=START_S, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        died.cancel()
        if not self._ready_event.is_set():
            if self._not_ready is not None:
                raise RunError(self._not_ready)
            dead = [(i, p.exitcode) for i, p in enumerate(self._procs) if i in self._closed]
            if dead:
                raise RunError(
                    f"worker process {dead[0][0]} exited while starting (exit code {dead[0][1]}); "
                    "run with --workers 1 to see why"
                )
            raise RunError(f"the worker processes did not start within {START_S:.0f} s")

    def _on_message(self, index: int) -> None:
        conn = self._conns[index]
        try:
            while conn.poll():
                self._messages.put_nowait((index, conn.recv()))
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(conn.fileno())
            self._messages.put_nowait((index, Closed()))

    async def _consume(self) -> None:
        try:
            await self._consume_messages()
        except Exception as exc:  # a message it could not apply: stop, and let no unit wait on it
            self.run.stop(f"worker messages could not be applied ({exc!r}); the run stops")
            for _, future in self._pending.values():
                if not future.done():
                    future.set_exception(RuntimeError("the worker pool stopped"))
            self._pending.clear()
            self._closed_event.set()
            raise

    async def _consume_messages(self) -> None:
        while True:
            index, message = await self._messages.get()
            match message:
                case UnitDone(unit_id) | UnitFailed(unit_id):
                    entry = self._pending.pop(unit_id, None)
                    if entry is None:
                        continue
                    self._load[entry[0]] -= 1
                    future = entry[1]
                    if not future.done():
                        if isinstance(message, UnitFailed):
                            future.set_exception(RuntimeError(f"worker {index}: {message.error}"))
                        else:
                            future.set_result(None)
                case Ready():
                    self._ready += 1
                    if self._ready == self.count:
                        self._ready_event.set()
                case NotReady(error):
                    self._not_ready = self._not_ready or error
                    self._died_event.set()
                case Closed():
                    await self._closed_one(index)
                case _:
                    await self._renumbering.apply(index, message)

    async def _closed_one(self, index: int) -> None:
        if index in self._closed:
            return  # its Closed, then its pipe's end
        self._closed.add(index)
        self._died_event.set()
        lost = [unit_id for unit_id, (worker, _) in self._pending.items() if worker == index]
        if not self._closing and self._ready_event.is_set():
            # it died: what it had in flight is lost, the run stops (no unit goes to it now)
            proc = self._procs[index]
            await asyncio.to_thread(proc.join, 1)
            self.run.stop(
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
        self._senders[index].send(RunUnit(unit, scheduled_ns))
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            self._senders[index].send(CancelUnit(unit.unit_id))
            raise

    async def close(self) -> None:
        """Cancel what runs, keep every record the workers send back, and end them."""
        self._closing = True
        for sender in self._senders:
            sender.send(Close())
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
