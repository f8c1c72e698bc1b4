"""A server in a child process of ours: started, found by its ready line, stopped for sure."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from types import TracebackType
from typing import Self


class ChildError(Exception):
    pass


class ChildServer:
    """A child that prints ``<ready_prefix> <host> <port>`` on stdout once it listens."""

    what = "the server"  # for the error when it does not start
    ready_prefix = ""

    def __init__(
        self, host: str = "127.0.0.1", start_timeout: float = 30.0, env: dict[str, str] | None = None
    ) -> None:
        self.host = host
        self.start_timeout = start_timeout
        self.env = env or {}  # added to ours
        self.port: int | None = None
        self._proc: subprocess.Popen[str] | None = None

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> Self:
        # Own process group: a Ctrl-C in the terminal reaches the harness, which then stops
        # the child itself, in order, after the last record is written.
        self._proc = subprocess.Popen(
            self.command(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )
        self.port = int(self._read_ready_line().split()[2])
        # Drain both pipes so a chatty child can never block on a full one.
        for pipe in (self._proc.stdout, self._proc.stderr):
            threading.Thread(target=pipe.read, daemon=True).start()  # type: ignore[union-attr]
        return self

    def _read_ready_line(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        stdout = self._proc.stdout
        result: list[str] = []

        def read() -> None:
            while line := stdout.readline():
                if line.startswith(self.ready_prefix):
                    result.append(line)
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(self.start_timeout)
        if not result:
            self.stop()
            err = self._proc.stderr.read() if self._proc.stderr else ""  # type: ignore[union-attr]
            last = err.strip().splitlines()[-1] if err.strip() else "no output"
            raise ChildError(f"{self.what} did not start: {last}")
        return result[0]

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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
