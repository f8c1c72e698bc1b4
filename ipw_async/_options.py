"""Options described once, beside the config fields they set; the CLI builds its flags from them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    """How a config field appears on the command line."""

    help: str
    flags: tuple[str, ...] = ()  # default: --field-name
    cli_type: Any = None  # what the command line parses, when it differs from the field's type
    parse: Callable[[Any], Any] | None = None  # the command line's value to the field's
    envvar: str | None = None
    show_default: bool = True
    panel: str | None = None  # the group it is listed in by --help
    choices: tuple[str, ...] = ()  # the values it takes (validated, listed, completed by the shell)


def option(
    help: str,
    *flags: str,
    cli_type: Any = None,
    parse: Callable[[Any], Any] | None = None,
    envvar: str | None = None,
    show_default: bool = True,
    panel: str | None = None,
    choices: tuple[str, ...] = (),
) -> dict[str, Option]:
    """Field metadata: ``field(default=..., metadata=option("What it does.", "--flag", "-f"))``."""
    return {"option": Option(help, flags, cli_type, parse, envvar, show_default, panel, choices)}


def options_of(cls: type) -> list[tuple[dataclasses.Field[Any], Option]]:
    """The fields of a dataclass that have a command-line option, in declaration order."""
    return [(f, f.metadata["option"]) for f in dataclasses.fields(cls) if "option" in f.metadata]
