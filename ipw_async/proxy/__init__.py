"""A recording proxy: any agent framework's OpenAI (chat, completions, Responses) or Anthropic
(Messages) calls, measured as a run measures its own.

    ipw-async proxy --upstream http://gpu-host:8000/v1 --port 8800

and point the agent at ``http://127.0.0.1:8800/v1`` (an Anthropic client at
``http://127.0.0.1:8800``: its SDK adds the ``/v1``). Ctrl-C (or ``--duration``) ends the run
and finishes its directory: per-call and per-task energy, traces and ``analyze`` as for any run.

Beyond loopback the proxy wants a token, which its callers send as their API key: the upstream
(and ``--api-key``, the operator's key for it) is the operator's, not whoever reaches the port.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from ..errors import RunError
from ..harness import RunConfig, run_benchmark
from ..harness.live import Display
from ..results import RunResult
from ..telemetry.http import is_loopback
from ..workload import Requests, WorkUnit
from .server import MAX_BODY, MAX_OPEN_TASKS, MAX_TASK_NAME, TASK_HEADER, RecordingProxy

MAKE_TOKEN = "umask 077; python -c 'import secrets; print(secrets.token_urlsafe(32))' > proxy.token"


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


def check_exposure(host: str, token: str | None, insecure: bool, api_key: str | None) -> None:
    """RunError unless serving ``host`` is safe: beyond loopback a token is wanted, or
    ``insecure`` and no ``api_key`` (that key would be anyone's who reaches the port)."""
    if token is not None or is_loopback(host):
        return
    if not insecure:
        raise RunError(
            f"refusing to serve {host} without a token: anyone who reaches it would use the "
            f"upstream through this proxy; make one with `{MAKE_TOKEN}`, give --token-file "
            "proxy.token and have the callers send it as their API key (or --host 127.0.0.1, or "
            "--insecure on a network you trust)"
        )
    if api_key:
        raise RunError(
            f"refusing to serve {host} with an API key (--api-key or OPENAI_API_KEY) and "
            "--insecure: anyone who reaches it would call the upstream with your key; give "
            "--token-file instead of --insecure"
        )


async def run_proxy(
    config: RunConfig,
    display: Display | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8800,
    max_connections: int = 256,
    ready: Callable[[str], None] | None = None,
    stream_usage: bool = True,
    token: str | None = None,
    insecure: bool = False,
) -> RunResult:
    """Serve the recording proxy in front of ``config.base_url`` (the built-in simulator when
    None) until ``config.duration`` or Ctrl-C, then finish the run directory; ``ready`` hears
    the proxy's base URL once it listens (after the idle baseline). ``stream_usage``: streamed
    calls that do not say otherwise ask the upstream for their token counts, so their energy
    is split by tokens as a run's own are (the usage event is kept from their callers).
    ``token``: what callers must send as ``Authorization: Bearer``; needed beyond loopback
    unless ``insecure`` (:func:`check_exposure` says why not, as a RunError, before anything
    starts)."""
    check_exposure(host, token, insecure, config.api_key)
    # the pool to the upstream is the run's "concurrency"; nothing is warmed up or scheduled
    config = dataclasses.replace(config, concurrency=max_connections, rate=None, warmup=0, workers="1")
    source = RecordingProxy(host, port, ready, stream_usage, token)
    return await run_benchmark(config, display, ProxyCalls(), source)


__all__ = [
    "MAX_BODY",
    "MAX_OPEN_TASKS",
    "MAX_TASK_NAME",
    "TASK_HEADER",
    "ProxyCalls",
    "RecordingProxy",
    "check_exposure",
    "run_proxy",
]
