"""Run the simulator in its own process on a free loopback port, and stop it reliably."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Self

import httpx

from .._child import ChildError, ChildServer
from .config import SimConfig
from .server import READY_PREFIX

SimulatorError = ChildError  # the simulator did not start, or not healthy


class SimulatorProcess(ChildServer):
    """``with SimulatorProcess(config) as sim: sim.base_url`` — a live simulator, cleaned up on exit.

    If the harness dies without stopping it (kill -9), the simulator sees its parent gone and exits.
    """

    what = "the simulator"
    ready_prefix = READY_PREFIX

    def __init__(
        self,
        config: SimConfig | None = None,
        host: str = "127.0.0.1",
        start_timeout: float = 30.0,
        cpus: set[int] | None = None,
    ):
        super().__init__(host, start_timeout)
        self.config = config or SimConfig()
        # the cores it may run on (Linux), where a benchmark keeps it off the client's: on a
        # GPU host the server does not take the client's cores
        self.cpus = cpus

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "ipw_async.sim",
            "--host",
            self.host,
            "--config-json",
            self.config.to_json(),
            "--parent-pid",
            str(os.getpid()),
            *(["--cpus", ",".join(map(str, sorted(self.cpus)))] if self.cpus else []),
        ]

    def start(self) -> Self:
        super().start()
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.root_url}/health", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.02)
        self.stop()
        raise SimulatorError(
            f"the simulator at {self.root_url} did not become healthy in {self.start_timeout:.0f} s"
        )


@contextlib.contextmanager
def simulator_apart(config: SimConfig | None = None) -> Iterator[SimulatorProcess]:
    """A simulator on this machine's last core and this process on the others until exit, to
    measure a client as it runs on a GPU host, where the server does not take its cores (Linux)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SimulatorError("a simulator on a core of its own needs a machine of at least 2 cores")
    with SimulatorProcess(config, cpus={cores[-1]}) as sim:
        os.sched_setaffinity(0, set(cores[:-1]))
        try:
            yield sim
        finally:
            os.sched_setaffinity(0, set(cores))
