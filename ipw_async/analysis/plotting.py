"""What every plot shares: a figure without pyplot, saving, and skipping with a reason."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# Figure objects straight from matplotlib.figure need no pyplot and no GUI backend: safe in
# threads, on headless machines, and without touching the caller's backend choice.
from matplotlib.figure import Figure

DPI = 110


class SkipPlot(Exception):
    """A plot's data is missing; the message says what is missing."""


@dataclass
class PlotReport:
    written: list[Path] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # plot name -> why


def new_figure(width: float = 7.0, height: float = 4.5) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def render(report: PlotReport, out_dir: Path, name: str, draw: Callable[[], Figure]) -> None:
    """Draw one plot into ``out_dir/name.png``, or note in ``report`` why it was skipped."""
    try:
        fig = draw()
    except SkipPlot as exc:
        report.skipped[name] = str(exc)
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig.savefig(path, dpi=DPI)
    report.written.append(path)


def title_suffix(simulated: bool) -> str:
    return " [SIMULATED]" if simulated else ""
