"""``proxy``: a thin shell over :func:`ipw_async.proxy.run_proxy`."""

from __future__ import annotations

import functools
import inspect
from typing import Annotated, Any

import typer

from ..harness.config import TARGET
from ..proxy import TASK_HEADER, run_proxy
from ..telemetry.http import redact_url
from ._common import out
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
    "realtime_sampler",
    "counter_probe_s",
    "baseline_s",
    "baseline_w",
    "attribution",
    "prefill_weight",
    "context_cost",
    "power_model",
    "output_dir",
    "overwrite",
    "price",
}


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
    _option("host", "127.0.0.1", str, "Address the proxy listens on (loopback by default).", "--host"),
    _option("port", 8800, int, "Port the proxy listens on (0: any free port).", "--port"),
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

    Point the agent at the printed URL. A call with the header x-ipw-task: NAME is a turn of
    task NAME; POST /ipw/tasks/NAME/end (JSON: answer, reference) ends it and scores its answer.
    Ctrl-C or --duration ends the run and finishes its directory: per-call and per-task energy,
    traces and `ipw-async analyze`, as for any run.
    """
    values = {name: options[name] for name in _KEPT} | {"base_url": options["upstream"]}
    defaults = {p.name: p.default for p in RUN_PARAMETERS if p.name not in values}
    config = run_config(defaults | values)
    upstream = redact_url(options["upstream"]) if options["upstream"] else "the built-in simulator"

    def ready(url: str) -> None:
        out.print(f"proxy listening on {url} → {upstream} (calls with {TASK_HEADER}: NAME are tasks)")

    start = functools.partial(
        run_proxy,
        host=options["host"],
        port=options["port"],
        max_connections=options["max_connections"],
        ready=ready,
        stream_usage=options["stream_usage"],
    )
    display = display_for(not options["no_dashboard"], options["quiet"])
    exports, judging = Exports.from_options(options), Judging.from_options(options)
    raise typer.Exit(execute(config, display, exports, judging, start=start))


def register(app: typer.Typer) -> None:
    app.command("proxy")(with_parameters(proxy, PROXY_PARAMETERS + JUDGE_PARAMETERS + EXPORT_PARAMETERS))
