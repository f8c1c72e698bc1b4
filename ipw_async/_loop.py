"""The event loop every ipw-async process runs on: uvloop where it is installed.

Measured on the client's hot path (``benchmarks/client_overhead.py``): uvloop takes about
2 µs of CPU off each SSE event against asyncio's own loop, a fifth of the client's cost.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .errors import Stopped

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # Windows, or a platform without a wheel: asyncio's own loop
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], *, stop_signals: bool = True) -> T:
    """``asyncio.run`` on the fastest loop here.

    On the main thread SIGINT, SIGTERM and SIGHUP cancel ``main``, whatever this process
    inherited for them: a background job of a script starts with SIGINT ignored, and asyncio's
    own runner then leaves Ctrl-C (and anything that forwards to it) unheard. ``main`` unwinds
    as it does on any cancellation; if it ends cancelled, :class:`Stopped` (a KeyboardInterrupt)
    names the signal. A second signal while it unwinds kills the process by that signal.
    ``stop_signals=False``: the process's own dispositions stand (worker processes, which the
    coordinator stops).
    """
    with asyncio.Runner(loop_factory=_factory()) as runner:
        if not stop_signals or threading.current_thread() is not threading.main_thread():
            return runner.run(main)
        stop = _Stop()
        try:
            return runner.run(stop.guard(main))
        except asyncio.CancelledError:
            if stop.signum is None:
                raise
            raise Stopped(stop.signum) from None


class _Stop:
    """The stop signals' handlers on the running loop, for as long as ``main`` runs."""

    def __init__(self) -> None:
        self.signum: int | None = None

    async def guard(self, main: Coroutine[Any, Any, T]) -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        for sig in STOP_SIGNALS:
            # through the loop, not signal.signal: the handler runs between callbacks, so the
            # cancellation lands at an await as any other does
            loop.add_signal_handler(sig, self._received, sig, task)
        try:
            return await main
        finally:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)  # leaves SIG_DFL (SIGINT: Python's own handler)
                if handler is not None:  # None: set outside Python; cannot be put back
                    signal.signal(sig, handler)

    def _received(self, signum: int, task: asyncio.Task[Any]) -> None:
        if self.signum is not None:
            # asked twice: the unwinding is taking too long for whoever is waiting; what the
            # writer flushed stays on disk, and `ipw-async recover` finishes the directory
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        self.signum = signum
        task.cancel()


class BetweenRuns:
    """The stop signals while a command that runs many loops (a sweep, a search) is between two
    of them: each is remembered and raised as :class:`Stopped` at the command's next
    :meth:`check`, never in the middle of what it writes between runs. During a run the loop's
    own handlers (:func:`run`) take over and give these back after it. A second signal kills
    the process by that signal, as during a run."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> BetweenRuns:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._received)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            if handler is not None:
                signal.signal(sig, handler)

    def _received(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        self.signum = signum

    def check(self) -> None:
        """Raise :class:`Stopped` for a stop signal received since the last run ended."""
        if self.signum is not None:
            raise Stopped(self.signum)


def loop_name() -> str:
    """The running loop's implementation: ``uvloop`` or ``asyncio``."""
    return type(asyncio.get_running_loop()).__module__.split(".")[0]
