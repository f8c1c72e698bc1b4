"""Real-time scheduling for the harness's timing threads (the sampler's, the alarm's).

On a machine whose cores are all busy (the server or the simulator beside the harness) an
ordinary thread whose timer fired can wait milliseconds for a core: the alarm thread that
wakes a replayed request did so 1.3 ms late at p99 in ``benchmarks/trace_replay.py`` on two
cores shared with the simulator, 0.35 ms under FIFO scheduling.
"""

from __future__ import annotations

import os
import threading


def ask_realtime() -> str:
    """Ask for FIFO real-time scheduling of the calling thread at the lowest priority, so that
    it runs the moment its timer fires even with every core busy; returns the scheduling it
    has. The threads that ask for it sleep almost all the time."""
    if not hasattr(os, "sched_setscheduler"):
        return "normal (this platform has no real-time scheduling)"
    try:
        priority = os.sched_param(os.sched_get_priority_min(os.SCHED_FIFO))
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_FIFO, priority)
    except OSError as exc:
        return f"normal (real-time refused: {exc.strerror}; it needs root or CAP_SYS_NICE)"
    return "real-time"
