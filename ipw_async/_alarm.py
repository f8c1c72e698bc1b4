"""Wake-ups at an absolute time, without the event loop's whole-millisecond timers.

uvloop's timers (libuv's) count whole milliseconds of a clock read once per loop iteration: a
sleep wakes up to a millisecond early, and what is left is slept again, up to a millisecond
late. A replayed trace or a paced arrival leaves when its timer fires, so that millisecond is
its lateness (0.66-0.74 ms at p99 on an idle loop). One thread per process waits on a lock
with a timeout (the kernel's timer, to microseconds) for the earliest due time of every waiter
and wakes that waiter's loop through its thread-safe call, which cuts the loop's poll short
(0.34-0.51 ms at p99, about the same CPU per wait). The thread asks for real-time
scheduling, as the sampler's does: on cores busy with the simulator an ordinary thread whose
wait ended waited 1.3 ms at p99 for a core. ``benchmarks/trace_replay.py`` measures both, and
the lateness a replay gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import os
import threading

from ._clock import NS, now_ns
from ._realtime import ask_realtime


class _Alarm:
    """The process's alarm thread, started at the first wait and alive with the process."""

    def __init__(self) -> None:
        self._wake = threading.Condition()
        self._due: list[tuple[int, int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._order = itertools.count()  # ties fire in the order they were asked for
        self._thread: threading.Thread | None = None
        self.scheduling = "not started"  # the thread's, once it runs (:func:`ask_realtime`)

    async def until(self, due_ns: int) -> None:
        """Return at ``due_ns`` on the run clock (never before it)."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        with self._wake:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ipw-async-alarm", daemon=True)
                self._thread.start()
            heapq.heappush(self._due, (due_ns, next(self._order), loop, woken))
            if self._due[0][3] is woken:  # earlier than what the thread waits for
                self._wake.notify()
        await woken

    def _run(self) -> None:
        self.scheduling = ask_realtime()
        with self._wake:
            while True:
                if not self._due:
                    self._wake.wait()
                    continue
                left = self._due[0][0] - now_ns()
                if left > 0:
                    self._wake.wait(left / NS)
                    continue
                _, _, loop, woken = heapq.heappop(self._due)
                with contextlib.suppress(RuntimeError):  # its loop has closed: nobody to wake
                    loop.call_soon_threadsafe(_wake_up, woken)


def _wake_up(woken: asyncio.Future[None]) -> None:
    if not woken.done():  # a cancelled waiter's future is done already
        woken.set_result(None)


_alarm = _Alarm()


def _forked() -> None:
    # A forked child has none of its parent's threads: it starts an alarm of its own.
    global _alarm
    _alarm = _Alarm()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


async def sleep_until(due_ns: int) -> None:
    """Sleep to an absolute time (run clock), so lateness never accumulates into a schedule.

    Never wakes early. The cost is a thread's wake-up per wait (measured with the lateness in
    ``benchmarks/trace_replay.py``).
    """
    if due_ns > now_ns():
        await _alarm.until(due_ns)
