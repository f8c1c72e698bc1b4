"""The sampler in a process of its own, off the client's interpreter.

In the run's process the sampler's reads share the interpreter with the event loop: psutil's,
sysfs's and a scrape's Python hold the GIL, an NVML read costs milliseconds of a CPU on a GPU
host, and the counter probes read back to back for a second every 20 s. Here a child process
(:mod:`.sampler_child`) opens the same sources again (:attr:`.base.TelemetrySource.recipe`),
runs the same ticks and probes (:class:`.sampler.Sampler`) on the same monotonic clock
(``CLOCK_MONOTONIC`` is one clock for every process of a machine), and sends each row as a line
of JSON on its stdout, with the skipped ticks, the counters' learned grids and their resets as
they change. The run's own sampler keeps its face (the log, the grids, the quality figures) and
appends what comes.

The parent ends it by closing its stdin: the child takes one last reading (the run's last), says
what it cost, and exits. A parent that dies closes that pipe too, so a child never outlives it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import IO, Any

from .base import OpenSource
from .grid import CounterGrid

START_TIMEOUT_S = 30.0  # importing and opening NVML on a loaded host can take seconds
STDERR_KEPT = 4096  # of the child's stderr, the last this many characters (twice) are kept
SAMPLER_PLACES = ("auto", "thread", "process")
# sources whose every read costs a millisecond or more of a CPU, by default read in a process
# of their own: a driver's call and its Python (NVML: about 3 ms on an H100 host), or a scrape
# parsed in Python (about 1 ms for an 8-GPU DCGM exporter's 37 kB, all of it holding the GIL)
_COSTLY = frozenset({"nvml", "amdsmi", "prometheus"})


class SamplerProcessError(RuntimeError):
    pass


def sampler_place(asked: str, sources: list[OpenSource]) -> tuple[bool, str]:
    """Whether the sampler runs in a process of its own, as ``asked`` (:data:`SAMPLER_PLACES`)
    and as its sources allow, and why."""
    recipes = [s.source.recipe for s in sources]
    if not sources:
        return False, "no telemetry source"
    if None in recipes:
        fixed = [s.source.name for s in sources if s.source.recipe is None]
        return False, f"{', '.join(fixed)} cannot be opened again in another process"
    if asked == "process":
        return True, "asked for"
    if asked == "thread":
        return False, "asked for"
    costly = sorted({r["name"] for r in recipes if r is not None and r["name"] in _COSTLY})
    if costly:
        return True, f"{', '.join(costly)} reads cost a millisecond or more of a CPU each"
    return False, "its sources read in microseconds"


class SamplerProcess:
    """The child, seen from the run: started with the run's sources' recipes and schedule,
    followed by a thread that hands each message to ``on_message``."""

    def __init__(
        self, sources: list[OpenSource], period_s: float, t0_ns: int, realtime: bool, probe_s: float
    ) -> None:
        self.spec = {
            "recipes": [s.source.recipe for s in sources],
            "columns": [s.info.columns for s in sources],
            "period_s": period_s,
            "t0_ns": t0_ns,
            "realtime": realtime,
            "probe_s": probe_s,
        }
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: deque[str] = deque(maxlen=2)  # its stderr's last chunks

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the child and wait until its sources are open (raises why they are not)."""
        # its own session: a Ctrl-C in the terminal reaches the run, which ends the child in
        # order, after the run's last reading
        self._proc = proc = subprocess.Popen(
            [sys.executable, "-m", "ipw_async.telemetry.sampler_child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        # drained, never to block it on a full pipe, and its last lines kept to say why it ended
        threading.Thread(target=self._keep_stderr, args=(proc.stderr,), daemon=True).start()
        try:
            proc.stdin.write(json.dumps(self.spec) + "\n")
            proc.stdin.flush()
        except OSError:
            pass  # it died at once: its output ends, and its stderr says why
        first: list[dict[str, Any]] = []
        waiter = threading.Thread(target=lambda: first.append(_message(proc.stdout)), daemon=True)
        waiter.start()
        waiter.join(START_TIMEOUT_S)
        ready = first[0] if first else None
        if ready is None or "ready" not in ready:
            self.stop()
            why = ready.get("error") if ready else None
            said = f" ({self.said()})" if self.said() else ""
            raise SamplerProcessError(
                why or f"the sampler's process did not start{said}: run with --sampler thread"
            )

    def follow(self, on_message: Callable[[dict[str, Any]], None]) -> None:
        """Hand every message to ``on_message`` until the child's output ends (blocking)."""
        assert self._proc is not None and self._proc.stdout is not None
        while (message := _message(self._proc.stdout)) is not None:
            on_message(message)

    def ended(self) -> str:
        """How the child ended, in words (once its output has)."""
        assert self._proc is not None
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "its output closed"
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"{how}: {self.said()}" if self.said() else how

    def said(self) -> str:
        """The last line the child wrote on its stderr ('' for none): a traceback's last."""
        lines = "".join(self._stderr).strip().splitlines()
        return lines[-1] if lines else ""

    def _keep_stderr(self, stream: IO[str]) -> None:
        while chunk := stream.read(STDERR_KEPT):
            self._stderr.append(chunk)

    def end(self) -> None:
        """Ask the child to take its last reading and exit: its output ends after both."""
        proc = self._proc
        if proc is not None and proc.stdin is not None and not proc.stdin.closed:
            with contextlib.suppress(OSError):  # it is gone already
                proc.stdin.close()

    def stop(self) -> None:
        """Make sure the child is gone (after :meth:`end`, or without it)."""
        proc = self._proc
        if proc is None:
            return
        self.end()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _message(stream: IO[str]) -> dict[str, Any] | None:
    line = stream.readline()
    return json.loads(line) if line else None


def grids_of(message: dict[str, Any]) -> dict[str, list[CounterGrid]]:
    """A message's newly learned counter grids, by channel."""
    return {ch: [CounterGrid.from_dict(g) for g in new] for ch, new in message.get("grids", {}).items()}
