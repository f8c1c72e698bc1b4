"""What every command shares: the consoles, one-line errors, and the --debug switch."""

from __future__ import annotations

from pathlib import Path

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


def finish_first(path: Path) -> None:
    """Before a command reads ``path`` (a run, or a folder of runs): finish each run that was
    cut short, in place, as ``ipw-async recover`` would, and say so. The one policy for an
    unfinished run; a path that holds no run is left for the command to refuse."""
    from ..results import finish_all
    from ..rundir import RunDirError

    try:
        done = finish_all(path)
    except (RunDirError, OSError) as exc:
        raise fail(f"cannot finish {path}, which was cut short: {exc}") from None
    for run in done:
        err.print(f"[yellow]finished {escape(str(run))} first:[/] it was cut short (as `ipw-async recover` would)")


def fmt(value: float | None, spec: str = ".3g", unit: str = "") -> str:
    """A figure for display: '—' where it was not measured (never 0)."""
    return "—" if value is None else f"{value:{spec}}{unit}"
