"""``compare``: the headline figures of several runs side by side."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from ..rundir.read import RunDir
from .headline import FIGURES, headline_figures


def format_figure(key: str, value: Any) -> str:
    """A figure for a table: '—' when it was not measured (never 0)."""
    if value is None:
        return "—"
    unit = FIGURES[key][1]
    if unit == "s":
        return f"{value * 1000:,.1f} ms"
    if key in ("accuracy", "task_success"):
        return f"{value:.1%}"
    if isinstance(value, int):
        return f"{value:,}"
    if unit in ("J", "1/J") or abs(value) < 10:
        return f"{value:,.3g} {unit}".rstrip()
    return f"{value:,.1f} {unit}".rstrip()


def _title(run: RunDir, name: str) -> str:
    tags = [t for t, on in (("sim", run.simulated), ("partial", not run.complete)) if on]
    return name + (f" [{', '.join(tags)}]" if tags else "")


def compare_runs(run_dirs: Sequence[RunDir | str | Path]) -> list[tuple[str, dict[str, Any]]]:
    """(column title, headline figures) per finished run; raises RunDirError for a directory
    with no run, or one cut short and not finished."""
    runs = [RunDir.open_finished(d) for d in run_dirs]
    names = [run.path.name for run in runs]
    if len(set(names)) < len(names):  # sweeps name their runs alike: show the parent too
        names = [f"{run.path.parent.name}/{run.path.name}" for run in runs]
    return [(_title(run, name), headline_figures(run)) for run, name in zip(runs, names, strict=True)]


def compare_table(compared: list[tuple[str, dict[str, Any]]]) -> Table:
    """A rich table: one row per figure, one column per run."""
    table = Table(title="ipw-async compare", header_style="bold", title_justify="left")
    table.add_column("metric")
    for title, _ in compared:
        table.add_column(escape(title), justify="right", overflow="fold")
    for key, (label, _unit) in FIGURES.items():
        table.add_row(label, *(format_figure(key, figures[key]) for _, figures in compared))
    return table
