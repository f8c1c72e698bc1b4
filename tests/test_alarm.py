"""The alarm that wakes replayed and paced arrivals: never early, in time order, and unharmed by
waiters that went away."""

from __future__ import annotations

import asyncio
import multiprocessing
import os

import pytest

from ipw_async._alarm import _Alarm, sleep_until
from ipw_async._clock import now_ns
from ipw_async._loop import run

MS = 1_000_000


def test_waiters_wake_at_their_time_in_time_order_never_early() -> None:
    async def main() -> list[tuple[int, int]]:
        base = now_ns() + 5 * MS
        # asked for latest first: each new earlier time must cut the thread's wait short
        dues = [base + k * MS for k in (12, 9, 6, 3, 0)]
        woke: list[tuple[int, int]] = []

        async def wait(due: int) -> None:
            await sleep_until(due)
            woke.append((due, now_ns()))

        await asyncio.gather(*(wait(d) for d in dues))
        return woke

    woke = run(main())
    assert [due for due, _ in woke] == sorted(due for due, _ in woke)
    assert all(at >= due for due, at in woke)


def test_a_cancelled_waiter_leaves_the_others_on_time() -> None:
    async def main() -> int:
        start = now_ns()
        doomed = asyncio.ensure_future(sleep_until(start + 3 * MS))
        await asyncio.sleep(0)
        doomed.cancel()
        await sleep_until(start + 6 * MS)
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return now_ns() - start

    assert run(main()) >= 6 * MS


def test_a_waiter_whose_loop_closed_does_not_stop_the_alarm() -> None:
    async def abandon() -> None:
        # the loop ends with this wait still pending: the alarm later finds the loop closed
        pending.append(asyncio.ensure_future(sleep_until(now_ns() + 5 * MS)))
        await asyncio.sleep(0)

    pending: list[asyncio.Future[None]] = []
    run(abandon())

    async def later() -> int:
        due = now_ns() + 20 * MS  # past the abandoned waiter's time
        await asyncio.wait_for(sleep_until(due), 5)  # a dead alarm thread would never wake it
        return now_ns() - due

    assert run(later()) >= 0


def _wait_in_child(queue: multiprocessing.Queue[int]) -> None:
    async def main() -> int:
        due = now_ns() + 2 * MS
        await sleep_until(due)
        return now_ns() - due

    queue.put(run(main()))


def test_a_forked_process_gets_an_alarm_of_its_own() -> None:
    async def wait() -> None:  # so the parent's alarm thread runs before the fork
        await asyncio.wait_for(sleep_until(now_ns() + MS), 5)

    run(wait())
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[int] = context.Queue()
    child = context.Process(target=_wait_in_child, args=(queue,))
    child.start()
    late = queue.get(timeout=10)  # the child's wait would hang on its parent's dead thread
    child.join(10)
    assert late >= 0 and child.exitcode == 0


def test_an_alarm_refused_real_time_still_wakes_its_waiters_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    alarm = _Alarm()  # a thread of its own, started at its first wait
    assert alarm.scheduling == "not started"

    async def main() -> int:
        due = now_ns() + 3 * MS
        await alarm.until(due)
        return now_ns() - due

    assert run(main()) >= 0
    assert alarm.scheduling.startswith("normal (real-time refused: Operation not permitted")
