"""The ``ipw-async`` command line: a thin layer over the library functions."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

from .._version import __version__
from . import agent, analysis, export, judge, proxy, run, search
from ._common import Debug, err, out

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Benchmark LLM inference cost under concurrent load: latency, throughput and per-query energy.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(asked: bool) -> None:
    if asked:
        out.print(f"ipw-async {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show full tracebacks instead of one-line errors.")
    ] = False,
    _: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    Debug.on = debug


run.register(app)
analysis.register(app)
agent.register(app)
search.register(app)
export.register(app)
judge.register(app)
proxy.register(app)


def main() -> None:
    try:
        app()
    except Exception as exc:  # the last line of defence: one sentence, not a traceback
        if Debug.on:
            raise
        err.print(f"[bold red]error:[/] {escape(str(exc))} (rerun with --debug for the traceback)")
        sys.exit(2)
