"""PNG figures of a sweep: load against energy, throughput against latency, accuracy trade-offs.

The knees (:func:`ipw_async.analysis.sweep.knees`) are marked where their metric is drawn:
the energy knee on the energy panels, the throughput knee on the throughput panel and, ringed,
at its level on the throughput-vs-latency plot.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .plotting import PlotReport, SkipPlot, new_figure, render, title_suffix

# metric -> (axis label, factor from its unit to the axis unit)
AXES: dict[str, tuple[str, float]] = {
    "j_per_query": ("energy per query (J)", 1.0),
    "j_per_token": ("energy per output token (J)", 1.0),
    "ttft_p50_s": ("TTFT p50 (ms)", 1000.0),
    "e2e_p50_s": ("e2e latency p50 (ms)", 1000.0),
    "throughput_tok_s": ("output throughput (tok/s)", 1.0),
    "accuracy": ("accuracy", 1.0),
    "j_per_task": ("energy per task (J)", 1.0),
    "task_wall_p50_s": ("task latency p50 (s)", 1.0),
    "tasks_per_s": ("task throughput (tasks/s)", 1.0),
    "task_success": ("task success rate", 1.0),
}
LOAD_PANELS = ("j_per_query", "j_per_token", "ttft_p50_s", "throughput_tok_s")
TASK_PANELS = ("j_per_task", "task_wall_p50_s", "tasks_per_s", "task_success")
# panel -> the knee marked on it
KNEE_PANELS = {"j_per_query": "energy", "j_per_token": "energy", "throughput_tok_s": "throughput"}
KNEE_COLORS = {"energy": "tab:green", "throughput": "tab:purple"}


def _mean(lv: dict[str, Any], metric: str) -> float | None:
    return lv["value"] if metric == "value" else lv["means"].get(metric)


def _ci(lv: dict[str, Any], metric: str) -> float:
    return 0.0 if metric == "value" else lv["stats"][metric]["ci95"] or 0.0


def _scale(metric: str) -> float:
    return AXES[metric][1] if metric in AXES else 1.0


def _has(stats: list[dict[str, Any]], *metrics: str) -> bool:
    return any(all(_mean(lv, m) is not None for m in metrics) for lv in stats)


def level_points(ax: Axes, stats: list[dict[str, Any]], x: str, y: str, annotate: bool = True) -> None:
    """Level means with 95% CI error bars (none where a level has one run)."""
    pts = [lv for lv in stats if _mean(lv, x) is not None and _mean(lv, y) is not None]
    sx, sy = _scale(x), _scale(y)
    ax.errorbar(
        [_mean(lv, x) * sx for lv in pts],  # type: ignore[operator]
        [_mean(lv, y) * sy for lv in pts],  # type: ignore[operator]
        xerr=[_ci(lv, x) * sx for lv in pts],
        yerr=[_ci(lv, y) * sy for lv in pts],
        fmt="o-" if x == "value" else "o",
        capsize=4,
        label="level mean ± 95% CI",
    )
    if annotate:
        for lv in pts:
            ax.annotate(
                lv["level"],
                (_mean(lv, x) * sx, _mean(lv, y) * sy),
                fontsize=8,
                xytext=(4, 4),
                textcoords="offset points",
            )  # type: ignore[operator]


def run_points(ax: Axes, rows: list[dict[str, Any]], x: str, y: str) -> None:
    """Every successful run as a faint dot behind the means."""
    ok = [r for r in rows if r["status"] == "ok" and r.get(x) is not None and r.get(y) is not None]
    if ok:
        ax.scatter(
            [r[x] * _scale(x) for r in ok],
            [r[y] * _scale(y) for r in ok],
            s=12,
            alpha=0.35,
            color="gray",
            label="runs",
        )


def _load_axis(ax: Axes, mode: str, stats: list[dict[str, Any]], tasks: bool = False) -> None:
    values = sorted({lv["value"] for lv in stats})
    if min(values) > 0 and max(values) / min(values) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.minorticks_off()
    unit = "tasks" if tasks else "requests"
    ax.set_xlabel(
        {
            "concurrency": f"concurrency ({unit} in flight)",
            "speedup": "trace speedup (× its own arrival times)",
        }.get(mode, f"arrival rate ({unit}/s)")
    )


def mark_knee(ax: Axes, name: str, knee: dict[str, Any]) -> None:
    """A dashed vertical line at the knee's load, labelled at the top of the axes."""
    color = KNEE_COLORS[name]
    ax.axvline(knee["load"], color=color, ls="--", lw=1.2, label=f"{name} knee")
    ax.annotate(
        f"{name} knee {knee['level']}",
        (knee["load"], 1.0),
        xycoords=ax.get_xaxis_transform(),  # x in load, y at the top of the axes
        xytext=(3, -10),
        textcoords="offset points",
        fontsize=8,
        color=color,
    )


def load_vs_energy(
    mode: str,
    stats: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    simulated: bool,
    panels: tuple[str, ...] = LOAD_PANELS,
    knees: dict[str, Any] | None = None,
) -> Figure:
    if not any(_has(stats, m) for m in panels):
        raise SkipPlot(f"no level has any of {', '.join(AXES[m][0] for m in panels)}")
    tasks = panels == TASK_PANELS
    fig = new_figure(10, 7)
    for i, metric in enumerate(panels):
        ax = fig.add_subplot(2, 2, i + 1)
        if _has(stats, metric):
            run_points(ax, rows, "value", metric)
            level_points(ax, stats, "value", metric, annotate=False)
            knee = (knees or {}).get(KNEE_PANELS.get(metric, ""))
            if knee is not None:
                mark_knee(ax, KNEE_PANELS[metric], knee)
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        _load_axis(ax, mode, stats, tasks)
        ax.set_ylabel(AXES[metric][0])
    fig.axes[0].legend(fontsize=8)
    what = "per task" if tasks else "energy and latency"
    fig.suptitle(f"load vs {what} (mean ± 95% CI over repeats){title_suffix(simulated)}")
    return fig


def trade_off(
    x: str,
    y: str,
    stats: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    simulated: bool,
    knee: dict[str, Any] | None = None,
) -> Figure:
    """One metric against another: every run, and the level means with their CIs; ``knee``
    (a knee of :func:`~ipw_async.analysis.sweep.knees`) rings its level."""
    if not _has(stats, x, y):
        raise SkipPlot(f"no level has both {AXES[x][0]} and {AXES[y][0]}")
    fig = new_figure()
    ax = fig.add_subplot()
    run_points(ax, rows, x, y)
    level_points(ax, stats, x, y)
    at = next((lv for lv in stats if knee and lv["level"] == knee["level"]), None)
    if at is not None and _mean(at, x) is not None and _mean(at, y) is not None:
        ax.scatter(
            [_mean(at, x) * _scale(x)],  # type: ignore[operator]
            [_mean(at, y) * _scale(y)],  # type: ignore[operator]
            s=260,
            facecolors="none",
            edgecolors=KNEE_COLORS["throughput"],
            linewidths=1.8,
            label=f"throughput knee ({at['level']})",
        )
    ax.set_xlabel(AXES[x][0])
    ax.set_ylabel(AXES[y][0])
    ax.legend(fontsize=8)
    fig.suptitle(f"{AXES[y][0]} vs {AXES[x][0]}{title_suffix(simulated)}")
    return fig


def pareto_plot(
    stats: list[dict[str, Any]], fronts: dict[str, list[dict[str, Any]]], simulated: bool
) -> Figure:
    if not _has(stats, "accuracy"):
        raise SkipPlot("no level has an accuracy figure (does the dataset have reference answers?)")
    fig = new_figure(10, 4.5)
    for i, (name, x) in enumerate((("latency", "e2e_p50_s"), ("energy", "j_per_query"))):
        ax = fig.add_subplot(1, 2, i + 1)
        level_points(ax, stats, x, "accuracy")
        front = sorted(fronts[name], key=lambda p: p[x])
        if front:
            ax.plot(
                [p[x] * _scale(x) for p in front],
                [p["accuracy"] for p in front],
                "o-",
                color="tab:red",
                markersize=12,
                markerfacecolor="none",
                lw=2,
                label="Pareto frontier",
            )
        ax.set_xlabel(AXES[x][0])
        ax.set_ylabel("accuracy")
        ax.legend(fontsize=8)
    fig.suptitle(f"Pareto frontiers: accuracy up, latency / energy down{title_suffix(simulated)}")
    return fig


def plot_sweep(
    mode: str,
    stats: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    fronts: dict[str, list[dict[str, Any]]],
    out_dir: Path,
    simulated: bool,
    knees: dict[str, Any] | None = None,
) -> PlotReport:
    """Write the sweep's plots into ``out_dir``; a plot whose data is missing is skipped."""
    report = PlotReport()
    knees = knees or {}
    render(
        report,
        out_dir,
        "load_vs_energy",
        partial(load_vs_energy, mode, stats, rows, simulated, LOAD_PANELS, knees),
    )
    if _has(stats, "j_per_task"):  # an agentic or multi-turn sweep: the same curves per task
        render(
            report,
            out_dir,
            "load_vs_task",
            partial(load_vs_energy, mode, stats, rows, simulated, TASK_PANELS),
        )
    render(
        report,
        out_dir,
        "throughput_vs_latency",
        partial(trade_off, "e2e_p50_s", "throughput_tok_s", stats, rows, simulated, knees.get("throughput")),
    )
    render(
        report,
        out_dir,
        "accuracy_vs_energy",
        partial(trade_off, "j_per_query", "accuracy", stats, rows, simulated),
    )
    render(
        report,
        out_dir,
        "accuracy_vs_latency",
        partial(trade_off, "e2e_p50_s", "accuracy", stats, rows, simulated),
    )
    render(report, out_dir, "pareto_frontier", partial(pareto_plot, stats, fronts, simulated))
    return report
