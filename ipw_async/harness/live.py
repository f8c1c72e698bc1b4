"""One benchmark run: opened whole into one exit stack, its phases run, its directory finished.

The simulator, telemetry sources, client, files and background tasks enter one exit stack
(:mod:`.opening`), so every way out (the end, an error, Ctrl-C, a dead server) unwinds the
same path: tasks stop, the last telemetry is sampled and written, the records file is closed,
``run.json`` says how the run ended, the sources close and the simulator stops. The phases
between are :mod:`.measuring`'s. Then :func:`finalize` turns the directory into attributed
records, traces and a summary.
"""

from __future__ import annotations

import contextlib

import anyio

from .._loop import run as run_loop
from ..errors import RunAborted
from ..results import RunResult, finalize
from ..rundir.manifest import RunDirError
from ..workload import Workload
from .config import RunConfig
from .display import Display
from .measuring import CallSource
from .opening import RunOpening
from .resume import resume_from
from .workloads import workload_of

__all__ = ["CallSource", "Display", "run", "run_benchmark"]


async def run_benchmark(
    config: RunConfig,
    display: Display | None = None,
    workload: Workload | None = None,
    source: CallSource | None = None,
) -> RunResult:
    """Run one benchmark and write its directory; raises RunError when it cannot start.

    ``workload`` replaces the one the config describes (its dataset). Interruption (Ctrl-C,
    cancellation) and a server that goes away still leave every record measured so far on
    disk, with ``complete: false`` in the summary. With a ``source`` the calls come from it
    rather than from the load driver, and Ctrl-C is its normal end.
    """
    spec = config.validate()
    resume = None
    if config.resume is not None:
        config, resume = resume_from(config)
        spec = config.validate()
    workload = workload or workload_of(config)
    async with contextlib.AsyncExitStack() as stack:
        live = await RunOpening(stack, config, spec, workload, display, resume, source).open()
        await live.measure()
    ending = live.ending
    try:
        result = await anyio.to_thread.run_sync(finalize, live.run_dir)
    except (OSError, RunDirError) as exc:
        if ending.abort.reason is None:
            raise
        raise RunAborted(f"{ending.abort.reason}; the run could not be finished ({exc})") from None
    if display is not None:
        display.finish(result)
    if ending.interrupted is not None:
        raise ending.interrupted
    if ending.abort.reason:
        count = result.records.height
        raise RunAborted(f"{ending.abort.reason}; {count} records kept in {live.run_dir}")
    return result


def run(config: RunConfig, display: Display | None = None, workload: Workload | None = None) -> RunResult:
    """Blocking form of :func:`run_benchmark`, for scripts and notebooks without a loop."""
    return run_loop(run_benchmark(config, display, workload))
