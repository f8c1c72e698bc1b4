"""What every command shares: the consoles, one-line errors, and the --debug switch."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

err = Console(stderr=True, highlight=False, soft_wrap=True)  # an error is one line, however long
out = Console(highlight=False, soft_wrap=True)  # one line per message, even in a narrow log


class Debug:
    """Set by the --debug option: show tracebacks instead of one-line errors."""

    on = False


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a one-line error; raise the returned Exit to end the command with ``code``."""
    err.print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(code)


def fmt(value: float | None, spec: str = ".3g", unit: str = "") -> str:
    """A figure for display: '—' where it was not measured (never 0)."""
    return "—" if value is None else f"{value:{spec}}{unit}"
