"""``proxy``: a thin shell over :func:`ipw_async.proxy.run_proxy`."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import RunError
from ..harness.display import Display
from ..harness.panels import TARGET
from ..telemetry.http import is_loopback, read_token, redact_url
from ._common import err, fail, out
from .export import EXPORT_PARAMETERS, Exports
from .judge import JUDGE_PARAMETERS, Judging
from .options import DISPLAY_PARAMETERS, RUN_PARAMETERS, run_config, with_parameters
from .run import display_for, execute

# the run options a proxy has: where the calls go, the meters, energy and output (what is sent,
# and how much, is the callers' business)
_KEPT = {
    "api_key",
    "connect_timeout",
    "read_timeout",
    "duration",
    "telemetry",
    "telemetry_url",
    "prometheus_url",
    "telemetry_token_file",
    "prometheus_token_file",
    "telemetry_ca_file",
    "trust_counter",
    "gpus",
    "sample_ms",
    "sampler",
    "realtime_sampler",
    "counter_probe_s",
    "baseline_s",
    "baseline_w",
    "attribution",
    "prefill_weight",
    "context_cost",
    "capture_sizes",
    "power_model",
    "output_dir",
    "overwrite",
    "price",
}
PROXY_TOKEN_ENV = "IPW_ASYNC_PROXY_TOKEN"


def _option(name: str, default: Any, kind: Any, help: str, *flags: str) -> inspect.Parameter:
    info = typer.Option(*flags, help=help, rich_help_panel=TARGET)
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, info]
    )


PROXY_PARAMETERS = [
    _option(
        "upstream",
        None,
        str | None,
        "The OpenAI-compatible server the calls go to, e.g. http://gpu-host:8000/v1. "
        "Omit to forward to the built-in simulator.",
        "--upstream",
    ),
    _option(
        "host",
        "127.0.0.1",
        str,
        "Address the proxy listens on (loopback by default). Beyond loopback it wants --token-file.",
        "--host",
    ),
    _option("port", 8800, int, "Port the proxy listens on (0: any free port).", "--port"),
    _option(
        "token_file",
        None,
        Path | None,
        "File holding the token every caller must send as Authorization: Bearer TOKEN (an OpenAI "
        f"client's API key); default: the {PROXY_TOKEN_ENV} environment variable. Needed to "
        "listen beyond loopback.",
        "--token-file",
    ),
    _option(
        "insecure",
        False,
        bool,
        "Listen beyond loopback without a token: anyone who reaches the port calls the upstream "
        "through this proxy (and is recorded). Only on a network you trust; not with --api-key.",
        "--insecure",
    ),
    _option(
        "max_connections", 256, int, "Connections the proxy may open to the upstream.", "--max-connections"
    ),
    _option(
        "stream_usage",
        True,
        bool,
        "Ask the upstream for each streamed call's token counts when the caller did not say "
        "(stream_options.include_usage): its energy is then split by tokens. The usage event this "
        "brings is kept from the caller. --no-stream-usage forwards bodies as sent.",
        "--stream-usage/--no-stream-usage",
    ),
    *(p for p in RUN_PARAMETERS if p.name in _KEPT and p not in DISPLAY_PARAMETERS),
    *DISPLAY_PARAMETERS,
]


def proxy(**options: Any) -> None:
    """Record any agent framework: serve an OpenAI-compatible endpoint that forwards every call
    to the upstream server and measures it as a run measures its own requests.

    Point the agent at the printed URL. Beyond loopback give --token-file, and the agent the
    token as its API key. A call with the header x-ipw-task: NAME is a turn of task NAME;
    POST /ipw/tasks/NAME/end (JSON: answer, reference) ends it and scores its answer.
    Ctrl-C or --duration ends the run and finishes its directory: per-call and per-task energy,
    traces and `ipw-async analyze`, as for any run.
    """
    from ..proxy import check_exposure, run_proxy

    values = {name: options[name] for name in _KEPT} | {"base_url": options["upstream"]}
    defaults = {p.name: p.default for p in RUN_PARAMETERS if p.name not in values}
    config = run_config(defaults | values)
    upstream = redact_url(options["upstream"]) if options["upstream"] else "the built-in simulator"
    host = options["host"]
    try:
        token = _token(options["token_file"])
        check_exposure(host, token, options["insecure"], config.api_key)
    except (ValueError, RunError) as exc:
        raise fail(str(exc)) from None
    if not is_loopback(host):
        err.print(
            "[yellow]"
            + ("the token and " if token else "no token: anyone who reaches the port calls the upstream; ")
            + "the calls travel in clear over plain http: beyond a network you trust, reach the "
            "proxy through an SSH tunnel[/]"
        )
    display = display_for(not options["no_dashboard"], options["quiet"])
    start = functools.partial(
        run_proxy,
        host=host,
        port=options["port"],
        max_connections=options["max_connections"],
        ready=announcer(display, upstream),
        stream_usage=options["stream_usage"],
        token=token,
        insecure=options["insecure"],
    )
    exports, judging = Exports.from_options(options), Judging.from_options(options)
    raise typer.Exit(execute(config, display, exports, judging, start=start))


def _token(token_file: Path | None) -> str | None:
    if token_file is not None:
        return read_token(token_file)
    return os.environ.get(PROXY_TOKEN_ENV, "").strip() or None


def announcer(display: Display, upstream: str) -> Callable[[str], None]:
    """What prints the proxy's URL once it listens. A live dashboard's panel is redrawn over
    any line written beside it, so there the line goes above the panel, and on stdout too when
    that is not the terminal (a log, a script reading the port of --port 0)."""
    from ..dashboard import Dashboard
    from ..proxy import TASK_HEADER

    def ready(url: str) -> None:
        line = f"proxy listening on {url} → {upstream} (calls with {TASK_HEADER}: NAME are tasks)"
        if isinstance(display, Dashboard):
            display.note(line)
            if out.is_terminal:
                return
        out.print(line)

    return ready


def register(app: typer.Typer) -> None:
    app.command("proxy")(with_parameters(proxy, PROXY_PARAMETERS + JUDGE_PARAMETERS + EXPORT_PARAMETERS))
