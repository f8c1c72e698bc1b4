"""The search's figure: each SLO's margin and J/query against load, the boundary marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from .plotting import PlotReport, SkipPlot, new_figure, render, title_suffix


def _figure(summary: dict[str, Any], simulated: bool) -> Figure:
    probes = sorted((p for p in summary["probes"] if p["status"] == "ok"), key=lambda p: p["load"])
    if not probes:
        raise SkipPlot("no probe ran")
    fig = new_figure(7.0, 6.0)
    margin_ax, energy_ax = fig.subplots(2, 1, sharex=True)
    loads = [p["load"] for p in probes]
    for slo in summary["slos"]:
        values = [p["margins"].get(slo["name"]) for p in probes]
        shown = [(x, v) for x, v in zip(loads, values, strict=True) if v is not None]
        margin_ax.plot([x for x, _ in shown], [v for _, v in shown], "o-", label=slo["slo"])
    margin_ax.axhline(0.0, color="black", linewidth=0.8)
    margin_ax.set_ylabel("margin: (limit − value) / limit")
    margin_ax.legend(fontsize="small")
    energy = [(x, p["figures"].get("j_per_query")) for x, p in zip(loads, probes, strict=True)]
    energy = [(x, e) for x, e in energy if e is not None]
    if energy:
        energy_ax.plot([x for x, _ in energy], [e for _, e in energy], "o-", color="tab:green")
    energy_ax.set_ylabel("energy per query (J)")
    energy_ax.set_xlabel(f"{summary['mode']} (log scale)")
    energy_ax.set_xscale("log")
    found = summary["boundary"]
    for ax in (margin_ax, energy_ax):
        if found["estimate"] is not None:
            ax.axvline(found["estimate"], color="tab:red", linestyle="--", label="boundary")
        if found["interval95"]:
            ax.axvspan(*found["interval95"], color="tab:red", alpha=0.12)
    margin_ax.set_title("SLO margins and energy against load" + title_suffix(simulated))
    return fig


def plot_search(summary: dict[str, Any], out_dir: Path, simulated: bool) -> PlotReport:
    """``out_dir/search.png``; skipped with a reason where no probe ran."""
    report = PlotReport()
    render(report, out_dir, "search", lambda: _figure(summary, simulated))
    return report
