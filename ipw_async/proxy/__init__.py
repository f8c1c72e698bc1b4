"""A recording proxy: any agent framework's OpenAI calls, measured as a run measures its own.

    ipw-async proxy --upstream http://gpu-host:8000/v1 --port 8800

and point the agent at ``http://127.0.0.1:8800/v1``. Ctrl-C (or ``--duration``) ends the run
and finishes its directory: per-call and per-task energy, traces and ``analyze`` as for any run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from ..harness import RunConfig, run_benchmark
from ..harness.live import Display
from ..results import RunResult
from ..workload import Requests, WorkUnit
from .server import TASK_HEADER, RecordingProxy


class ProxyCalls:
    """The workload of a proxy run: whatever its callers send. Nothing is scheduled."""

    name = "proxy"
    scorer = None

    def size(self) -> int:
        return 0

    def units(self, count: int | None, warmup: bool) -> Iterator[WorkUnit]:
        return iter(())

    async def perform(self, unit: WorkUnit, requests: Requests, scheduled_ns: int) -> None:
        raise RuntimeError("a proxy run's calls come from its callers, not from units")


async def run_proxy(
    config: RunConfig,
    display: Display | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8800,
    max_connections: int = 256,
    ready: Callable[[str], None] | None = None,
    stream_usage: bool = True,
) -> RunResult:
    """Serve the recording proxy in front of ``config.base_url`` (the built-in simulator when
    None) until ``config.duration`` or Ctrl-C, then finish the run directory; ``ready`` hears
    the proxy's base URL once it listens (after the idle baseline). ``stream_usage``: streamed
    calls that do not say otherwise ask the upstream for their token counts, so their energy
    is split by tokens as a run's own are (the usage event is kept from their callers)."""
    # the pool to the upstream is the run's "concurrency"; nothing is warmed up or scheduled
    config = dataclasses.replace(config, concurrency=max_connections, rate=None, warmup=0, workers="1")
    return await run_benchmark(config, display, ProxyCalls(), RecordingProxy(host, port, ready, stream_usage))


__all__ = ["TASK_HEADER", "ProxyCalls", "RecordingProxy", "run_proxy"]
