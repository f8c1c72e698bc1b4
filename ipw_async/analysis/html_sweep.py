"""``report.html`` for a sweep: levels, knees, load-vs-energy and the runs."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import polars as pl

from ..rundir import files
from .compare import format_figure
from .headline import FIGURES
from .html_page import REPORT, banner, cell, esc, html_table, svg_figure, whole_page
from .sweep import frontiers, knee_lines
from .sweep_plots import LOAD_PANELS, TASK_PANELS, load_vs_energy, pareto_plot, trade_off


def sweep_page(sweep_dir: Path) -> str:
    """The page of a sweep's ``sweep/`` directory."""
    summary = files.read_json(sweep_dir / files.SUMMARY)
    stats = files.read_json(sweep_dir / "summary_stats.json")["levels"]
    rows = pl.read_csv(sweep_dir / "raw_runs.csv", infer_schema_length=None).to_dicts()
    mode, simulated, knees = summary["mode"], bool(summary.get("simulated")), summary.get("knees") or {}
    tasks = any(lv["means"].get("j_per_task") is not None for lv in stats)
    figures = svg_figure(
        "fig-load-vs-energy",
        "J per query, J per output token, TTFT and throughput against load: each run faint, the "
        "level means with 95% CIs over repeats, the knees dashed.",
        partial(load_vs_energy, mode, stats, rows, simulated, LOAD_PANELS, knees),
    )
    if tasks:
        figures += svg_figure(
            "fig-load-vs-task",
            "Per task: J, latency, throughput and success against load.",
            partial(load_vs_energy, mode, stats, rows, simulated, TASK_PANELS),
        )
    figures += svg_figure(
        "fig-throughput-vs-latency",
        "Output throughput against e2e latency; the throughput knee ringed.",
        partial(trade_off, "e2e_p50_s", "throughput_tok_s", stats, rows, simulated, knees.get("throughput")),
    ) + svg_figure(
        "fig-pareto",
        "Pareto frontiers: accuracy against latency and against energy.",
        partial(pareto_plot, stats, frontiers(stats), simulated),
    )
    levels = ", ".join(str(v) for v in summary.get("levels") or ())
    header = (
        f"<h1>ipw-async sweep: {esc(mode)} {esc(levels)}</h1>"
        f'<p class="meta">{esc(sweep_dir)}</p>{_sweep_banners(summary)}'
    )
    sections = [
        ("levels", "Levels", _levels(stats, summary, tasks)),
        ("figures", "Load against energy", figures),
        ("runs", "Runs", _runs(rows, sweep_dir)),
    ]
    details = {k: summary.get(k) for k in ("base_config", "constraints")}
    return whole_page(f"ipw-async sweep {sweep_dir.parent.name}", header, sections, details)


def _sweep_banners(summary: dict[str, Any]) -> str:
    out = []
    if summary.get("simulated"):
        out.append(banner("sim", "SIMULATED", "every run of this sweep ran against ipw-async's simulator."))
    if not summary.get("complete"):
        counts = summary.get("counts") or {}
        how = "interrupted (Ctrl-C)" if summary.get("interrupted") else "not every run succeeded"
        out.append(
            banner(
                "partial",
                "PARTIAL SWEEP",
                f"{how}: {cell(counts.get('runs_ok'), ',')} of {cell(counts.get('runs_planned'), ',')} "
                f"planned runs succeeded, {cell(counts.get('runs_failed'), ',')} failed.",
            )
        )
    return "".join(out)


def _mean_ci(level: dict[str, Any], key: str) -> str:
    stat = level["stats"].get(key) or {}
    ci = f" ± {format_figure(key, stat['ci95'])}" if stat.get("ci95") else ""
    return esc(format_figure(key, stat.get("mean")) + ci)


def _levels(stats: list[dict[str, Any]], summary: dict[str, Any], tasks: bool) -> str:
    keys = (
        ("j_per_task", "tasks_per_s", "task_wall_p50_s", "task_success", "ttft_p50_s")
        if tasks
        else ("j_per_query", "j_per_token", "throughput_tok_s", "ttft_p50_s", "accuracy", "ipj")
    )
    rows = [
        [
            esc(lv["level"]),
            esc(f"{lv['ok_runs']}/{lv['runs']}"),
            *(_mean_ci(lv, k) for k in keys),
            "accepted" if lv.get("accepted") else esc("rejected: " + "; ".join(lv.get("reasons") or ())),
        ]
        for lv in stats
    ]
    header = ("level", "runs ok", *(FIGURES[k][0] for k in keys), "verdict")
    levels = html_table(
        header,
        rows,
        "levels-table",
        caption="level means ± 95% CI over repeats",
        align="lr" + "r" * len(keys),
    )
    knees = (
        "".join(f"<li>{esc(line)}</li>" for line in knee_lines(summary["knees"]))
        if "knees" in summary
        else ""
    )
    best = "".join(
        f"<li>{esc(name)}: {esc(b['level'])}</li>" for name, b in (summary.get("best") or {}).items() if b
    )
    return (
        levels
        + (f'<h3>Knees</h3><ul id="knees">{knees}</ul>' if knees else "")
        + (f'<h3>Best accepted levels</h3><ul id="best">{best}</ul>' if best else "")
    )


def _runs(rows: list[dict[str, Any]], sweep_dir: Path) -> str:
    def name(row: dict[str, Any]) -> str:
        # a sweep's runs sit beside its sweep/ folder; the path it recorded is stale once it moved
        run = Path(str(row["run_dir"])).name
        if not (sweep_dir.parent / run / REPORT).is_file():
            return esc(run)
        return f'<a href="../{esc(quote(run))}/{REPORT}">{esc(run)}</a>'

    cells = [
        [
            name(r),
            esc(r["level"]),
            cell(r["repeat"], "d"),
            cell(r["seed"], "d"),
            esc(r["status"]) + (f' <span class="why">({esc(r["error"])})</span>' if r.get("error") else ""),
            *(esc(format_figure(k, r.get(k))) for k in ("j_per_query", "throughput_tok_s", "ttft_p50_s")),
        ]
        for r in rows
    ]
    header = ("run", "level", "repeat", "seed", "status", "J/query", "tok/s", "TTFT p50")
    return html_table(header, cells, "runs-table", align="llrrlrrr")
