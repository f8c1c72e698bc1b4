"""The event loop every ipw-async process runs on: uvloop where it is installed.

Measured on the client's hot path (``benchmarks/client_overhead.py``): uvloop takes about
2 µs of CPU off each SSE event against asyncio's own loop, a fifth of the client's cost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def _factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # Windows, or a platform without a wheel: asyncio's own loop
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the fastest loop here; Ctrl-C cancels ``main`` as asyncio.run does."""
    with asyncio.Runner(loop_factory=_factory()) as runner:
        return runner.run(main)


def loop_name() -> str:
    """The running loop's implementation: ``uvloop`` or ``asyncio``."""
    return type(asyncio.get_running_loop()).__module__.split(".")[0]
