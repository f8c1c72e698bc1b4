"""``ipw-async agent``: serve this machine's telemetry to a harness on another machine."""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .._clock import NS
from .._loop import run as run_loop
from ..telemetry.http import AGENT_TOKEN_ENV, MAX_STREAMS, is_loopback, read_token
from ._common import err, fail

if TYPE_CHECKING:
    from ..telemetry import TelemetrySetup

DEFAULT_PORT = 9180
MAKE_TOKEN = "umask 077; python -c 'import secrets; print(secrets.token_urlsafe(32))' > agent.token"


def _token(token_file: Path | None) -> str | None:
    if token_file is not None:
        return read_token(token_file)
    return os.environ.get(AGENT_TOKEN_ENV, "").strip() or None


def _tls(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("give both --tls-cert and --tls-key, or neither")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the certificate {cert} with key {key}: {exc}") from None
    return context


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
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="File holding the token a harness must send (its --telemetry-token-file); default: "
            f"the {AGENT_TOKEN_ENV} environment variable. Needed to listen beyond loopback.",
            show_default=False,
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            help="Listen beyond loopback without a token: anyone who reaches the port reads this "
            "host's power and load. Only on a network you trust."
        ),
    ] = False,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            help="Serve https with this certificate (PEM); give --tls-key with it.", show_default=False
        ),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option(help="The certificate's private key (PEM).", show_default=False)
    ] = None,
    max_streams: Annotated[
        int, typer.Option(help="Streams served at once; more are refused until one ends.")
    ] = MAX_STREAMS,
    clock_shift_s: Annotated[
        float,
        typer.Option(
            hidden=True, help="Add this to every stamp (tests: a machine whose clock reads differently)."
        ),
    ] = 0.0,
) -> None:
    """Serve this machine's GPU and CPU telemetry over HTTP, for `ipw-async run --telemetry-url`.

    Run it on the GPU server's machine with a token, then from the harness's machine:
    `ipw-async run --base-url http://gpu-host:8000/v1 --telemetry-url http://gpu-host:9180
    --telemetry-token-file agent.token`. The agent reads its sources on its own schedule and
    stamps each reading on this machine's clock; the harness measures the clocks' offset itself.
    Ctrl-C, SIGTERM or SIGHUP is its normal end (exit 0).
    """
    try:
        token = _token(token_file)
        tls = _tls(tls_cert, tls_key)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if token is None and not insecure and not is_loopback(host):
        raise fail(
            f"refusing to serve {host} without a token: make one with `{MAKE_TOKEN}`, give it as "
            "--token-file agent.token here and --telemetry-token-file to the harness (or --host "
            "127.0.0.1, or --insecure on a network you trust)"
        )
    # the agent's side (its sampler, the counter probes' solver) loads once the options hold
    from ..telemetry_agent import describe, serve_agent

    setup = _opened(telemetry, sim_url, gpus)
    err.print("ipw-async agent, serving:")
    for line in describe(setup, host):
        err.print(line)
    if token is None and not is_loopback(host):
        err.print("  [yellow]no token: anyone who reaches this port reads this host's telemetry[/]")
    serving = serve_agent(
        setup, host, port, token=token, tls=tls, max_streams=max_streams, shift_ns=round(clock_shift_s * NS)
    )
    try:
        run_loop(serving)
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _opened(telemetry: str, sim_url: str | None, gpus: str | None) -> TelemetrySetup:
    """The sources asked for, opened here; a clear error where none opens."""
    from ..telemetry import open_sources

    try:
        setup = open_sources(telemetry, sim_root_url=sim_url, gpus=gpus.split(",") if gpus else None)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if not setup.opened:
        raise fail(
            f"no telemetry source opened here ({'; '.join(f'{k}: {v}' for k, v in setup.skipped.items())})"
        )
    return setup


def register(app: typer.Typer) -> None:
    app.command("agent")(agent)
