"""The same workers as Ray actors, on a Ray cluster's nodes (``run --ray ADDRESS``).

Ray places the actors (``SPREAD``: one node after another); nothing here manages the cluster.
Each actor streams the units the coordinator hands it, as a worker process does, and returns
what the run's ledger would have seen (:mod:`.worker_protocol`) when the unit ends. A node's monotonic clock is not
the coordinator's: each actor's offset is measured from round trips to it (the midpoint
method, best of many) before it gets work, and it stamps on its own clock from the run's
start as that clock reads it, so its records come back on the coordinator's timeline.
Request ids are given as a unit's records come back, so with Ray they follow the units' ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from .._clock import now_ns
from ..client import StreamingClient
from ..clock_sync import OPEN_PINGS, ClockSync
from ..errors import RunError
from ..workload import WorkUnit, opened
from .ledger import Coordinator
from .worker_protocol import (
    CLOSE_TIMEOUT_S,
    Message,
    Renumbering,
    UnitDone,
    UnitFailed,
    WorkerSetup,
    WorkerSink,
    run_unit,
)


class RayWorker:
    """One actor: a client and a copy of the workload on some node (an async actor)."""

    def __init__(self, setup: WorkerSetup) -> None:
        self.setup = setup
        self.client: StreamingClient | None = None
        self.running: dict[int, asyncio.Task[Message]] = {}
        self.numbers = itertools.count()  # one numbering for every unit it runs
        self.workload = contextlib.AsyncExitStack()  # open from start to close (two calls, two tasks)

    async def clock(self) -> int:
        return now_ns()

    async def where(self) -> tuple[str, str, int]:
        """Its host, Ray node and process."""
        import ray

        return platform.node(), ray.get_runtime_context().get_node_id()[:12], os.getpid()

    async def start(self, t0_ns: int) -> str | None:
        """The run's start on this node's clock (every stamp here is taken from it), and the
        workload opened; why it could not be, if not (Ray would wrap the error in its own)."""
        self.setup = replace(self.setup, t0_ns=t0_ns)
        self.client = StreamingClient(self.setup.client, t0_ns=t0_ns)
        try:
            await self.workload.enter_async_context(opened(self.setup.workload))
        except Exception as exc:  # RunError, mostly: its message is the run's
            return str(exc) or type(exc).__name__
        return None

    async def perform(self, unit: WorkUnit, scheduled_ns: int) -> list[Message]:
        assert self.client is not None
        messages: list[Message] = []
        requests = self.setup.requests(self.client, WorkerSink(messages.append, self.numbers))
        task = asyncio.get_running_loop().create_task(run_unit(requests, unit, scheduled_ns))
        self.running[unit.unit_id] = task  # for cancel(): the task ends with its records
        try:
            messages.append(await task)
        finally:
            self.running.pop(unit.unit_id, None)
        return messages

    async def cancel(self, unit_id: int) -> None:
        task = self.running.get(unit_id)
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        await self.workload.aclose()
        if self.client is not None:
            await self.client.aclose()


async def _reachable(address: str, timeout_s: float = 3.0) -> None:
    """A ``host:port`` that nothing answers fails now: Ray itself retries for minutes."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return  # "auto", ray://…: Ray's to resolve
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout_s)
    except (OSError, TimeoutError) as exc:
        raise RunError(
            f"cannot join the Ray cluster at {address} ({exc or 'no answer'}); is `ray start` running there?"
        ) from None
    writer.close()


class RayPool:
    """K actors reporting to the run's ledger."""

    def __init__(self, run: Coordinator, setup: WorkerSetup, count: int, address: str) -> None:
        self.run = run
        self.setup = setup
        self.count = count
        self.address = address
        self._ray: Any = None
        self._actors: list[Any] = []
        self._offsets: list[int] = []
        self._syncs: list[ClockSync] = []
        self._nodes: list[str] = []
        self._local_pids: list[int] = []
        self._load: list[int] = []
        self._collecting: set[asyncio.Task[None]] = set()
        self._renumbering = Renumbering(run)

    async def start(self) -> None:
        try:
            import ray
        except ImportError:
            raise RunError("--ray needs Ray: pip install 'ipw-async[ray]'") from None
        self._ray = ray
        await _reachable(self.address)
        try:
            await asyncio.to_thread(
                ray.init,
                address=self.address,
                logging_level="ERROR",
                log_to_driver=False,
                ignore_reinit_error=True,
            )
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError, …
            raise RunError(
                f"cannot join the Ray cluster at {self.address} ({exc}); is `ray start` running there?"
            ) from None
        if self.count == 0:  # auto: one actor per node that has a CPU to give
            self.count = max(
                1, sum(1 for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU"))
            )
        client = self.setup.client
        per_actor = replace(client, max_connections=math.ceil(client.max_connections / self.count))
        setup = replace(self.setup, client=per_actor)
        actor = ray.remote(num_cpus=1, max_concurrency=max(per_actor.max_connections, 1) + 8)(RayWorker)
        for _ in range(self.count):
            handle = actor.options(scheduling_strategy="SPREAD", name=None).remote(setup)
            self._actors.append(handle)
            self._load.append(0)
        for handle in self._actors:
            sync = ClockSync()
            for _ in range(OPEN_PINGS):
                sent = now_ns()
                remote = await handle.clock.remote()
                sync.add(sent, remote, now_ns())
            offset = sync.best().offset_ns
            if error := await handle.start.remote(self.setup.t0_ns + offset):
                raise RunError(error)
            self._syncs.append(sync)
            self._offsets.append(offset)
            host, node, pid = await handle.where.remote()
            self._nodes.append(f"{host} (Ray node {node})")
            if host == platform.node():
                self._local_pids.append(pid)

    @property
    def pids(self) -> list[int]:
        """The actors on this machine: their CPU is the harness's too (others' is not seen)."""
        return self._local_pids

    def report(self) -> dict[str, Any]:
        """Where each actor ran and how its clock was aligned, for the run's summary."""
        return {
            "ray": self.address,
            "actors": [
                {"node": node} | sync.report() for node, sync in zip(self._nodes, self._syncs, strict=True)
            ],
        }

    async def execute(self, unit: WorkUnit, scheduled_ns: int) -> None:
        index = min(range(self.count), key=self._load.__getitem__)
        self._load[index] += 1
        ref = self._actors[index].perform.remote(unit, scheduled_ns + self._offsets[index])
        collect = asyncio.get_running_loop().create_task(self._collect(index, ref))
        self._collecting.add(collect)
        collect.add_done_callback(self._collecting.discard)
        try:
            await asyncio.shield(collect)
        except asyncio.CancelledError:
            self._actors[index].cancel.remote(unit.unit_id)
            raise

    async def _collect(self, index: int, ref: Any) -> None:
        try:
            messages = await ref
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the actor died (RayActorError) or its node went away
            self.run.stop(
                f"Ray worker {index} failed ({type(exc).__name__}); the unit it was running is lost"
            )
            return
        finally:
            self._load[index] -= 1
        for message in messages:
            match message:
                case UnitFailed(_, error):
                    raise RuntimeError(f"Ray worker {index}: {error}")
                case UnitDone():
                    pass
                case _:
                    await self._renumbering.apply(index, message)

    async def close(self) -> None:
        """Let the cancelled units come back with their records, then end the actors."""
        if self._collecting:
            await asyncio.wait(set(self._collecting), timeout=CLOSE_TIMEOUT_S)
        for handle in self._actors:
            with contextlib.suppress(Exception):
                await handle.close.remote()
                self._ray.kill(handle)
        if self._ray is not None:
            await asyncio.to_thread(self._ray.shutdown)


@contextlib.contextmanager
def local_cluster(nodes: int = 2, cpus_per_node: int = 1) -> Iterator[str]:
    """A Ray cluster on loopback (a head and ``nodes - 1`` worker nodes), stopped on exit; its
    address. For trying ``--ray`` on one machine (the tests and benchmarks do).

    Its processes are found by its own temp directory and stopped alone: ``ray stop`` would
    stop every Ray cluster on the machine, a user's own included."""
    ray = str(Path(sys.executable).parent / "ray")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    temp = f"/tmp/ipwray{port}"  # short: Ray's socket paths live under it
    common = [f"--num-cpus={cpus_per_node}", "--disable-usage-stats"]
    head = [
        ray,
        "start",
        "--head",
        f"--port={port}",
        f"--temp-dir={temp}",
        "--include-dashboard=false",
        *common,
    ]
    try:
        subprocess.run(head, check=True, capture_output=True)
        for _ in range(nodes - 1):
            subprocess.run([ray, "start", f"--address={address}", *common], check=True, capture_output=True)
        yield address
    finally:
        ours = [
            p for p in psutil.process_iter(["cmdline"]) if _belongs(p.info["cmdline"] or [], temp, address)
        ]
        for proc in ours:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(ours, timeout=3)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        shutil.rmtree(temp, ignore_errors=True)


def _belongs(cmdline: list[str], temp: str, address: str) -> bool:
    text = " ".join(cmdline)
    return temp in text or f"={address}" in text
