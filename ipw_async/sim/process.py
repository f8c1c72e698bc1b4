"""Run the simulator in its own process on a free loopback port, and stop it reliably."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from types import TracebackType

import httpx

from .engine import EngineConfig
from .server import READY_PREFIX, Faults, SimConfig


class SimulatorError(Exception):
    pass


def config_to_json(config: SimConfig) -> str:
    return json.dumps(dataclasses.asdict(config))


def config_from_json(text: str) -> SimConfig:
    raw = json.loads(text)
    return SimConfig(
        engine=EngineConfig(**raw.pop("engine")),
        faults=Faults(**raw.pop("faults")),
        **raw,
    )


class SimulatorProcess:
    """``with SimulatorProcess(config) as sim: sim.base_url`` — a live simulator, cleaned up on exit."""

    def __init__(self, config: SimConfig | None = None, host: str = "127.0.0.1", start_timeout: float = 30.0):
        self.config = config or SimConfig()
        self.host = host
        self.start_timeout = start_timeout
        self.port: int | None = None
        self._proc: subprocess.Popen[str] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> SimulatorProcess:
        cmd = [
            sys.executable,
            "-m",
            "ipw_async.sim",
            "--host",
            self.host,
            "--config-json",
            config_to_json(self.config),
            "--parent-pid",
            str(os.getpid()),
        ]
        # Own process group: a Ctrl-C in the terminal reaches the harness, which then stops
        # the simulator itself, in order, after the last record is written. If the harness dies
        # without stopping it (kill -9), the simulator sees its parent gone and exits.
        self._proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        line = self._read_ready_line()
        parts = line.split()
        self.port = int(parts[2])
        # Drain stderr so a chatty simulator can never block on a full pipe.
        threading.Thread(target=self._proc.stderr.read, daemon=True).start()  # type: ignore[union-attr]
        self._wait_healthy()
        return self

    def _read_ready_line(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self._proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(self.start_timeout)
        if not result or not result[0].startswith(READY_PREFIX):
            self.stop()
            err = self._proc.stderr.read() if self._proc.stderr else ""  # type: ignore[union-attr]
            last = err.strip().splitlines()[-1] if err.strip() else "no output"
            raise SimulatorError(f"the simulator did not start: {last}")
        return result[0]

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

    def stop(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def __enter__(self) -> SimulatorProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
