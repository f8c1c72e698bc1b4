"""``ipw-async agent``: serve this machine's telemetry to a harness on another machine."""

from __future__ import annotations

from typing import Annotated

import typer

from .._clock import NS
from .._loop import run as run_loop
from ..telemetry import open_sources
from ..telemetry_agent import describe, serve_agent
from ._common import err, fail

DEFAULT_PORT = 9180


def agent(
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on. 0.0.0.0 (every interface) lets the harness's machine reach it."
        ),
    ] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = DEFAULT_PORT,
    telemetry: Annotated[
        str,
        typer.Option(
            help="Sources to serve: auto (NVML, RAPL and psutil, whichever this machine has) or a comma list."
        ),
    ] = "auto",
    gpus: Annotated[
        str | None, typer.Option(help="GPUs to serve, by index or UUID, comma-separated (default: all).")
    ] = None,
    sim_url: Annotated[
        str | None,
        typer.Option(
            help="Serve the SIMULATED device of an `ipw-async sim` at this root URL instead of a GPU."
        ),
    ] = None,
    clock_shift_s: Annotated[
        float,
        typer.Option(
            hidden=True, help="Add this to every stamp (tests: a machine whose clock reads differently)."
        ),
    ] = 0.0,
) -> None:
    """Serve this machine's GPU and CPU telemetry over HTTP, for `ipw-async run --telemetry-url`.

    Run it on the GPU server's machine, then from the harness's machine:
    `ipw-async run --base-url http://gpu-host:8000/v1 --telemetry-url http://gpu-host:9180`.
    Each read is stamped on this machine's clock; the harness measures the clocks' offset itself.
    """
    try:
        setup = open_sources(telemetry, sim_root_url=sim_url, gpus=gpus.split(",") if gpus else None)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if not setup.opened:
        raise fail(
            f"no telemetry source opened here ({'; '.join(f'{k}: {v}' for k, v in setup.skipped.items())})"
        )
    err.print("ipw-async agent, serving:")
    for line in describe(setup, host):
        err.print(line)
    try:
        run_loop(serve_agent(setup, host, port, round(clock_shift_s * NS)))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def register(app: typer.Typer) -> None:
    app.command("agent")(agent)
