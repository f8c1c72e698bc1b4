"""Command-line options built from the library's config dataclasses, so each option is defined
once: beside the field it sets (see :mod:`ipw_async._options`). ``run`` and ``sweep`` share the
run options through here."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.markup import escape

from .._options import options_of
from ..harness import RunConfig
from ..harness.panels import OUTPUT
from ._common import fail

DISPLAY_PARAMETERS = [
    inspect.Parameter(
        "no_dashboard",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[
            bool,
            typer.Option(
                "--no-dashboard",
                help="Plain progress lines instead of the live dashboard.",
                rich_help_panel=OUTPUT,
            ),
        ],
    ),
    inspect.Parameter(
        "quiet",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[
            bool,
            typer.Option("--quiet", "-q", help="No progress output; only errors.", rich_help_panel=OUTPUT),
        ],
    ),
]


def parameters(
    cls: type, only: tuple[str, ...] | None = None, unset: str | None = None
) -> list[inspect.Parameter]:
    """One keyword parameter per field of ``cls`` that has an option (those named in ``only``),
    typed for typer. With ``unset`` each defaults to None, its help ending with ``unset`` (what
    an option left out means: ``finalize``'s are the run's own)."""
    hints = typing.get_type_hints(cls)
    params = []
    for f, opt in options_of(cls):
        if only is not None and f.name not in only:
            continue
        kind = opt.cli_type if opt.cli_type is not None else hints[f.name]
        default = None if f.default is dataclasses.MISSING or unset is not None else f.default
        if unset is not None:
            kind = kind | None
            opt = dataclasses.replace(opt, help=f"{opt.help} {unset}", show_default=False)
        if opt.choices:  # an Enum is what typer validates, lists in --help and completes
            kind = enum.Enum(f.name, {c: c for c in opt.choices}, type=str)  # type: ignore[misc]
            kind = kind | None if default is None else kind
        info = typer.Option(
            *opt.flags,
            help=escape(opt.help),  # plain text: "ipw-async[mcp]" is not rich markup
            envvar=opt.envvar,
            show_default=opt.show_default,
            rich_help_panel=opt.panel,
        )
        params.append(
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, info]
            )
        )
    return params


def values_for(cls: type, options: dict[str, Any], only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The field values of ``cls`` from parsed options (those named in ``only``); a value that
    cannot be used is a one-line error."""
    values = {}
    for f, opt in options_of(cls):
        if only is not None and f.name not in only:
            continue
        value = options[f.name]
        if isinstance(value, enum.Enum):
            value = value.value
        if opt.parse is not None:
            try:
                value = opt.parse(value)
            except ValueError as exc:
                raise fail(str(exc)) from None
        values[f.name] = value
    return values


def with_parameters(func: Callable[..., Any], extra: list[inspect.Parameter]) -> Callable[..., Any]:
    """``func`` (taking ``**options``) with ``extra`` added to the parameters typer sees."""
    own = [p for p in inspect.signature(func).parameters.values() if p.kind is not p.VAR_KEYWORD]
    func.__signature__ = inspect.Signature([*own, *extra])  # type: ignore[attr-defined]
    func.__annotations__ = {p.name: p.annotation for p in [*own, *extra]}
    return func


RUN_PARAMETERS = parameters(RunConfig) + DISPLAY_PARAMETERS


def run_config(options: dict[str, Any]) -> RunConfig:
    """A RunConfig from the run options as parsed."""
    return RunConfig(**values_for(RunConfig, options))


def parse_run_args(args: list[str]) -> dict[str, Any]:
    """Parse run options given to another command (``sweep`` passes them through)."""

    def run_options(**options: Any) -> None: ...

    app = typer.Typer()
    app.command()(with_parameters(run_options, RUN_PARAMETERS))
    command = typer.main.get_command(app)
    with command.make_context("run", list(args)) as ctx:
        return dict(ctx.params)
