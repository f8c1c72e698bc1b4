"""``report.html``: one self-contained page for a run or a sweep.

The page is made from the directory's files alone (a run that died is recovered first, as
``analyze`` does) and says what the terminal and the analyses say: the run table, latency and
energy percentiles, the energy timeline, J per query with its band, the power model the run
fitted and how each meter's energy was measured or imputed, an agentic run's tasks; a sweep's
levels, knees and load-vs-energy plots. Figures are inline SVG and the style sheet is inline,
so nothing is fetched to view it. Every string from the run is escaped: prompts and model
names are user data.
"""

from __future__ import annotations

import html
import io
import json
import os
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import polars as pl
from matplotlib.figure import Figure
from rich.console import Console
from rich.errors import MarkupError
from rich.table import Table
from rich.text import Text

from .. import __version__
from ..report import DASH, describe_model, ms, summary_table
from ..results import finalize
from ..rundir import files
from ..rundir.manifest import Manifest
from ..stats import PERCENTILES, latency_stats, measured
from ..traces import QueryTrace
from .accuracy import accuracy_counts, meter_report
from .compare import format_figure
from .headline import FIGURES
from .html_figures import LATENCIES, energy_bands, energy_timeline, latency_percentiles, svg
from .plots import energy_histogram
from .plotting import SkipPlot
from .rundir import HEADLINE, RunDir, load_run
from .sweep import frontiers, knee_lines
from .sweep_plots import LOAD_PANELS, TASK_PANELS, load_vs_energy, pareto_plot, trade_off
from .tasks import task_report

REPORT = "report.html"
TOP = 20  # the costliest queries and tasks listed: a page, not a dump of the records
PROMPT_CHARS = 80  # of a prompt shown beside its query
CANDIDATES = 6  # power models listed from the run's cross-validation, best first
PERCENTILE_NAMES = [f"p{p:g}" for p in PERCENTILES]
STYLE = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;background:#fff;
max-width:1100px;margin:2rem auto;padding:0 1rem}
h1{font-size:1.45rem;margin-bottom:.2rem}
h2{font-size:1.15rem;border-bottom:1px solid #d1d9e0;padding-bottom:.2rem;margin-top:2.2rem}
h3{font-size:1rem;margin:1.4rem 0 .3rem}
nav a{margin-right:1rem}
table{border-collapse:collapse;font:13px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;margin:.4rem 0 1rem}
caption{text-align:left;font-weight:600;padding:.2rem 0}
th,td{border:1px solid #d1d9e0;padding:.2rem .6rem;vertical-align:top;text-align:left}
th{background:#f6f8fa}
td.r{text-align:right;white-space:nowrap}
#headline-table td:first-child{white-space:nowrap}
.banner{padding:.6rem 1rem;border:1px solid;border-radius:6px;margin:.6rem 0}
.banner.sim{background:#ddf4ff;border-color:#54aeff}
.banner.partial{background:#fff8c5;border-color:#d4a72c}
.meta,.why,figcaption,footer{color:#59636e}
figure{margin:1.2rem 0}
figure svg{max-width:100%;height:auto}
figure p.missing{border:1px dashed #d1d9e0;padding:1rem;margin:0}
pre{background:#f6f8fa;padding:.8rem;overflow-x:auto;font-size:12px}
"""


def write_report(path: str | Path, out: str | Path | None = None) -> Path:
    """report.html for a run directory or a sweep directory (default: inside it); returns its path.

    A sweep is a directory holding ``sweep/summary_stats.json``, or that ``sweep/`` folder
    itself; its page goes into ``sweep/``. ``out`` may name a file or a directory. Raises
    :class:`~ipw_async.rundir.manifest.RunDirError` for a directory that is neither.
    """
    path = Path(path)
    sweep_dir = next((d for d in (path / "sweep", path) if (d / "summary_stats.json").is_file()), None)
    page, home = (sweep_page(sweep_dir), sweep_dir) if sweep_dir else (run_page(path), path)
    target = Path(out) if out is not None else home / REPORT
    if target.is_dir():
        target = target / REPORT
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, target)
    return target


def _esc(value: object) -> str:
    return html.escape(str(value))


def _fig(value: float | None, spec: str = ",.4g", unit: str = "") -> str:
    """A figure as page text; a dash when it was not measured (never 0)."""
    return DASH if value is None else _esc(f"{value:{spec}}{unit}")


def _missing(reason: str | None) -> str:
    return DASH + (f' <span class="why">({_esc(reason)})</span>' if reason else "")


def _table(
    header: Sequence[str], rows: Iterable[Sequence[str]], table_id: str, caption: str = "", align: str = ""
) -> str:
    """A table of cells that are already HTML (what came from the run escaped before).

    ``align`` has an ``r`` for each column of figures (right-aligned, not wrapped).
    """
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="r">{c}</td>' if align[i : i + 1] == "r" else f"<td>{c}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    title = f"<caption>{_esc(caption)}</caption>" if caption else ""
    return f'<table id="{table_id}">{title}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _figure(fig_id: str, caption: str, draw: Callable[[], Figure]) -> str:
    """A figure as inline SVG, or a dash with the reason its data is missing."""
    try:
        body = svg(draw())
    except SkipPlot as exc:
        body = f'<p class="missing">{_missing(str(exc))}</p>'
    return f'<figure id="{fig_id}">{body}<figcaption>{_esc(caption)}</figcaption></figure>'


def _banner(kind: str, head: str, text: str) -> str:
    return f'<div class="banner {kind}" id="banner-{kind}"><strong>{_esc(head)}</strong> {text}</div>'


def _page(title: str, header: str, sections: list[tuple[str, str, str]], details: dict[str, Any]) -> str:
    """The whole page: ``sections`` are (id, heading, body); empty bodies are left out."""
    shown = [(sid, heading, body) for sid, heading, body in sections if body]
    nav = "".join(f'<a href="#{sid}">{_esc(heading)}</a>' for sid, heading, _ in shown)
    parts = "".join(
        f'<section id="{sid}"><h2>{_esc(heading)}</h2>{body}</section>' for sid, heading, body in shown
    )
    settings = _esc(json.dumps(details, indent=2, default=str))
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(title)}</title><style>{STYLE}</style></head><body>"
        f"<header>{header}</header><nav>{nav}</nav>{parts}"
        f'<section id="settings"><h2>Settings</h2><details><summary>configuration, versions and host'
        f"</summary><pre>{settings}</pre></details></section>"
        f"<footer><p>Written by ipw-async {_esc(__version__)} from the directory's own files; "
        f"nothing on this page is fetched from elsewhere.</p></footer></body></html>"
    )


# --- one run ---------------------------------------------------------------------------------


def run_page(path: Path) -> str:
    """The page of one run directory; a run that died without a summary is recovered first."""
    recovered = not (path / files.SUMMARY).is_file() and (path / files.RUN).is_file()
    if recovered:
        finalize(path)  # as analyze does with a run that died
    run = load_run(path)
    # a run from before run.json existed that died: what its records give
    summary = run.summary or {
        "complete": False,
        "aborted": "it left no summary.json, and no run.json to recover one from: the figures are its records'",
        **latency_stats(run.records),
    }
    load = Manifest.read(path).load if (path / files.RUN).is_file() else {}
    what = " · ".join(_esc(v) for v in (summary.get("model"), summary.get("dataset"), load.get("label")) if v)
    header = (
        f"<h1>ipw-async run: {what}</h1>"
        f'<p class="meta">{_esc(path.name)} · started {_esc(summary.get("started_at") or DASH)}'
        f" · run {_esc(summary.get('run_id') or DASH)}</p>{_run_banners(summary, recovered)}"
    )
    sections = [
        ("headline", "Headline", _headline(run, summary)),
        ("latency", "Latency", _latency(summary)),
        ("energy", "Energy", _energy(run, summary)),
        ("meters", "Power model and meters", _meters(run, summary)),
        ("tasks", "Tasks", _tasks(run, summary)),
    ]
    details = {k: summary.get(k) for k in ("config", "versions", "host")}
    return _page(f"ipw-async run {path.name}", header, sections, details)


def _run_banners(summary: dict[str, Any], recovered: bool) -> str:
    out = []
    if summary.get("simulated"):
        out.append(
            _banner(
                "sim",
                "SIMULATED",
                "the server and its device are ipw-async's simulator: these figures show the tool "
                "at work, not what a real model costs.",
            )
        )
    if summary.get("complete"):
        return "".join(out)
    if summary.get("aborted"):
        how = f"aborted: {_esc(summary['aborted'])}"
    elif summary.get("interrupted"):
        how = "interrupted (Ctrl-C or a signal)"
    elif summary.get("stopped"):
        how = f"stopped: {_esc(summary['stopped'])}"
    else:
        how = "it ended before its plan"
    loss = summary.get("loss")
    if loss:  # what finishing could tell was lost (older runs did not count it)
        how += (
            f". {_fig(loss['requests_on_disk'], ',')} of {_fig(loss['requests_dispatched'], ',')} dispatched "
            f"requests are on disk: {_fig(loss['requests_not_recorded'], ',')} were in flight or not yet "
            f"flushed at the end, and {_fig(loss['tasks_not_logged'], ',')} tasks had not logged their end. "
            f"The last record ended {_fig(loss['last_record_end_s'], ',.2f', ' s')} and the last telemetry "
            f"was read {_fig(loss['last_telemetry_s'], ',.2f', ' s')} into the run"
        )
    note = " Recovered from its files for this page, as ipw-async recover does." if recovered else ""
    out.append(_banner("partial", "PARTIAL RUN", f"{how}.{note}"))
    return "".join(out)


def _rich_cells(table: Table) -> list[list[str]]:
    """A rich table's rows as HTML cells: rich escapes the text and keeps its colours."""
    console = Console(record=True, file=io.StringIO(), width=10_000)

    def cell(value: object) -> str:
        try:
            text = Text.from_markup(str(value))
        except MarkupError:  # a user string with brackets in it: shown as it is
            text = Text(str(value))
        console.print(text, soft_wrap=True, end="")
        return console.export_html(inline_styles=True, code_format="{code}")

    return [[cell(v) for v in row] for row in zip(*(c.cells for c in table.columns), strict=True)]


def _headline(run: RunDir, summary: dict[str, Any]) -> str:
    """The terminal's run table, with IPJ and IPW after the accuracy where answers were scored."""
    table = summary_table(summary)
    rows = _rich_cells(table)
    counts = accuracy_counts(run.records)
    if counts["scored"]:
        at = next((i + 1 for i, r in enumerate(rows) if r[0] in ("accuracy", "task success")), len(rows))
        rows[at:at] = _ratios(run, counts["accuracy"])
    return _table(("metric", "value"), rows, "headline-table", caption=str(table.title or ""))


# key in a meter report, label, unit
RATIOS = (("ipj", "IPJ (accuracy / J per query)", " /J"), ("ipw", "IPW (accuracy / W per query)", " /W"))


def _ratios(run: RunDir, accuracy: float) -> list[list[str]]:
    """IPJ and IPW over the headline meter (imputed as analyze does), or why there are none."""
    if HEADLINE not in run.energy_meters:
        return [[label, _missing("the run has no per-query energy")] for _, label, _ in RATIOS]
    energy = meter_report(run.ok, HEADLINE, accuracy)
    return [
        [label, _missing(energy[f"{key}_reason"]) if energy[key] is None else _fig(energy[key], ".4g", unit)]
        for key, label, unit in RATIOS
    ]


def _latency(summary: dict[str, Any]) -> str:
    latency = summary.get("latency_s") or {}
    labels = {**LATENCIES, "queue": "client queue (scheduled to dispatched)"}
    rows = [
        [_esc(label), *(ms(dist.get(n)) for n in PERCENTILE_NAMES), _fig(dist.get("count"), ",")]
        for key, label in labels.items()
        if (dist := latency.get(key))
    ]
    return _table(("", *PERCENTILE_NAMES, "count"), rows, "latency-table", align="lrrrrrr") + _figure(
        "fig-latency",
        "Each latency's percentiles over the measured requests that succeeded (ms, log scale).",
        partial(latency_percentiles, latency, bool(summary.get("simulated"))),
    )


def _energy(run: RunDir, summary: dict[str, Any]) -> str:
    energy = summary.get("energy") or {}
    if energy.get("total_j") is None:
        skipped = "; ".join(f"{k}: {v}" for k, v in (energy.get("skipped") or {}).items())
        return f"<p>{_missing('no energy was measured' + (f' ({skipped})' if skipped else ''))}</p>"
    per_query, band = energy.get("per_query_j") or {}, energy.get("band_half_width") or {}
    names = ["mean", *PERCENTILE_NAMES]
    rows = [
        ["J per query", *(_fig(per_query.get(n), ",.3f") for n in names)],
        ["band half-width / estimate", *(_fig(band.get(n), ".0%") for n in names)],
    ]
    caption = "headline meters, measured requests that succeeded"
    return (
        _table(("", *names), rows, "energy-table", caption=caption, align="lrrrrrr")
        + _figure(
            "fig-timeline",
            "Power over the run: each meter's energy per interval of its counter, over the interval "
            "(what the attribution splits), a counter's own power field faint beside it, imputed "
            "stretches in orange and the idle baseline in green; below, each query from sent to end "
            "(blue ok, red failed, grey warm-up; a row per slot), or requests in flight for a long run.",
            partial(energy_timeline, run, energy.get("baseline_window_ns")),
        )
        + _figure(
            "fig-energy-band",
            "Each query's energy, cheapest first, with its band: the low and high figures the "
            "telemetry allows (energy_low_j, energy_high_j).",
            partial(energy_bands, run),
        )
        + _figure(
            "fig-energy-histogram",
            "Energy per query by provenance (as ipw-async plot draws it).",
            partial(energy_histogram, run),
        )
        + _costliest(run)
    )


def _excerpt(text: str | None) -> str:
    if text is None:
        return DASH
    return _esc(text if len(text) <= PROMPT_CHARS else text[:PROMPT_CHARS] + "…")


def _costliest(run: RunDir) -> str:
    with_energy = measured(run.records).filter(pl.col("energy_j").is_not_null())
    rows = [
        [
            _fig(r["request_id"], "d")
            + ("" if r["task_id"] is None else _esc(f" (task {r['task_id']}, turn {r['turn_index']})")),
            _esc(r["status"]),
            _fig(r["output_tokens"], ","),
            ms(r["e2e_latency_s"]),
            _fig(r["energy_j"], ",.3f"),
            f"{_fig(r['energy_low_j'], ',.3f')}–{_fig(r['energy_high_j'], ',.3f')}",
            _esc(r["energy_provenance"] or "missing"),
            _excerpt(r["prompt"]),
        ]
        for r in with_energy.sort("energy_j", descending=True).head(TOP).iter_rows(named=True)
    ]
    header = ("request", "status", "output tokens", "e2e", "J", "band (J)", "provenance", "prompt")
    caption = f"the {len(rows)} costliest of {with_energy.height:,} measured requests with an energy figure"
    return _table(header, rows, "costliest-table", caption=caption, align="rlrrrrl") if rows else ""


# (label, key in the power model, name of its standard error, unit)
PARAMETERS = (
    ("static power", "static_w", "static", " W"),
    ("per engine step", "step_w", "step", " W"),
    ("dynamic scale", "scale_w", "scale", " W"),
    ("work exponent", "exponent", "exponent", ""),
    ("power cap", "cap_w", "cap", " W"),
    ("prefill token / decode token", "prefill_weight", "prefill", ""),
    ("context weight", "context_weight_per_ktoken", "context", " per 1k tokens"),
    ("position weight", "position_weight_per_ktoken", "position", " per 1k tokens"),
    ("meter lag", "lag_ms", "lag", " ms"),
    ("static drift", "drift", "drift", " W"),
)


def _meters(run: RunDir, summary: dict[str, Any]) -> str:
    """Per meter: its energy and how it was read (provenance, imputation, counter check, gaps),
    the sources not read, and each fitted power model."""
    energy = summary.get("energy") or {}
    telemetry = summary.get("telemetry") or {}
    meters: dict[str, Any] = energy.get("meters") or {}
    if not meters:
        return f"<p>{_missing('the run has no energy meter')}</p>"
    totals = [
        [
            _esc(name),
            *(
                _fig(m.get(k), ",.1f", " J")
                for k in ("total_j", "measured_j", "imputed_j", "attributed_j", "idle_j")
            ),
            _fig(m.get("conservation_error"), ".1e"),
            _fig(m.get("window_overcount"), ".2f", "×"),
        ]
        for name, m in meters.items()
    ]
    header = ("meter", "total", "measured", "imputed", "to queries", "idle", "conservation error")
    out = [
        _table(
            (*header, "window sum / total"),
            totals,
            "meters-table",
            caption="energy by meter; the window sum is what a sequential profiler would charge",
            align="lrrrrrrr",
        ),
        _table(
            ("meter", "kind, provenance", "per query", "counter check", "largest gap", "counter timing"),
            [_how_read(run, name, m, telemetry) for name, m in meters.items()],
            "provenance-table",
            caption="how each meter was read",
        ),
    ]
    skipped = {**(telemetry.get("skipped") or {}), **(energy.get("skipped") or {})}
    if skipped:
        items = "".join(f"<li>{_esc(k)}: {_esc(v)}</li>" for k, v in skipped.items())
        out.append(f'<p>Sources not read:</p><ul id="skipped-sources">{items}</ul>')
    if telemetry.get("counter_events"):
        out.append(f"<p>Counter resets and wraps: {_esc(json.dumps(telemetry['counter_events']))}</p>")
    models = [(name, m["power_model"]) for name, m in meters.items() if m.get("power_model")]
    return "".join(out + [_power_model(i, name, model) for i, (name, model) in enumerate(models)])


def _how_read(run: RunDir, name: str, meter: dict[str, Any], telemetry: dict[str, Any]) -> list[str]:
    """A meter's kind and provenance, its queries' provenance, its counter check and its gaps."""
    distrusted = meter.get("distrusted")
    kind = _esc(f"{meter.get('kind')}, {meter.get('provenance')}") + (
        f' <span class="why">(distrusted: {_esc(distrusted)})</span>' if distrusted else ""
    )
    per_query = (
        meter_report(run.ok, name, None)["provenance"] if f"{name}.energy_j" in run.records.columns else {}
    )
    check = (telemetry.get("counter_checks") or {}).get(name)
    if check:
        action = check.get("action")
        said = _esc(f"{check['status']}: {check['reason']}" + (f"; {action}" if action else ""))
    else:
        said = _missing(telemetry.get("counter_checks_skipped") or "no check for this meter")
    gap = ((telemetry.get("sampler") or {}).get("gaps") or {}).get(name) or {}
    period = gap.get("counter_period_ms")
    return [
        _esc(name),
        kind,
        _esc(", ".join(f"{k} {v:,}" for k, v in sorted(per_query.items()))) or DASH,
        said,
        _fig(gap.get("largest_ms"), ",.0f", " ms")
        + ("" if period is None else _esc(f" (counter every {period:,.0f} ms)")),
        _esc(meter.get("counter_timing") or DASH),
    ]


def _power_model(index: int, meter: str, model: dict[str, Any]) -> str:
    """A fitted power model: its parameters with standard errors, and how it was chosen."""
    errors = model.get("errors") or {}
    values = {**model, "drift": (model.get("static_drift") or {}).get("coef_w")}
    rows = [
        [_esc(label), _fig(values[key], ",.4g", unit), _fig(errors.get(err), ",.2g")]
        for label, key, err, unit in PARAMETERS
        if values.get(key) is not None
    ]
    selection = model.get("selection") or {}
    held_out: dict[str, float] = selection.get("held_out_error") or {}
    close = set(selection.get("indistinguishable") or ())
    how = "given" if selection.get("given") else "chosen"
    candidates = [
        [
            _esc(
                name + (f" ({how})" if name == model.get("model") else " (as good)" if name in close else "")
            ),
            _fig(err, ".1%"),
        ]
        for name, err in sorted(held_out.items(), key=lambda kv: kv[1])[:CANDIDATES]
    ]
    fit = (
        f"R² {_fig(model.get('r2'), '.3f')} over {_fig(model.get('intervals'), ',')} counter intervals, "
        f"{_fig(model.get('steps'), ',')} engine steps inferred."
    )
    rule = f'<p class="why">{_esc(selection["rule"])}</p>' if selection.get("rule") else ""
    notes = "".join(f"<li>{_esc(n)}</li>" for n in model.get("notes") or ())
    table_id = f"power-model-{index}"
    return (
        f'<div class="power-model" id="{table_id}" data-meter="{_esc(meter)}">'
        f"<h3>Power model of {_esc(meter)}: {_esc(model.get('model') or DASH)}</h3>"
        f"<p>{_esc(describe_model(model))}. {fit}</p>"
        + _table(("parameter", "value", "± standard error"), rows, f"{table_id}-parameters", align="lrr")
        + (
            _table(
                ("candidate", "held-out error"),
                candidates,
                f"{table_id}-candidates",
                caption=f"the best {len(candidates)} of {len(held_out)} candidates by held-out error",
                align="lr",
            )
            + rule
            if candidates
            else ""
        )
        + (f"<ul>{notes}</ul>" if notes else "")
        + "</div>"
    )


def _tasks(run: RunDir, summary: dict[str, Any]) -> str:
    """An agentic or multi-turn run's tasks: the costliest, and the cost of a call by turn index."""
    if not summary.get("tasks") or not (run.path / files.TRACES).is_file():
        return ""
    traces = [t for t in QueryTrace.load_jsonl(run.path / files.TRACES) if not t.warmup]
    traces.sort(key=lambda t: -1.0 if t.energy_j is None else t.energy_j, reverse=True)
    rows = [
        [
            _fig(t.task_id, "d"),
            _esc(t.status),
            _esc(DASH if t.correct is None else "yes" if t.correct else "no"),
            _fig(len(t.turns), ","),
            _fig(sum(len(u.tools_called) for u in t.turns), ","),
            ms(t.total_wall_clock_s),
            ms(t.model_s),
            ms(t.tool_s),
            _fig(t.energy_j, ",.2f", " J"),
            _fig(t.tool_wait_device_j, ",.2f", " J"),
            _excerpt(t.prompt),
        ]
        for t in traces[:TOP]
    ]
    profile = [
        [
            _fig(p["turn_index"], "d"),
            _fig(p["calls"], ","),
            _fig(p["input_tokens_mean"], ",.0f"),
            _fig(p["cached_fraction_mean"], ".0%"),
            _fig(p["energy_j_mean"], ",.3f", " J"),
            ms(p["ttft_s_mean"]),
        ]
        for p in task_report(run).get("by_turn_index") or ()
    ]
    header = ("task", "outcome", "correct", "turns", "tool calls", "wall", "model", "tools", "energy")
    return _table(
        (*header, "device J in tool waits", "prompt"),
        rows,
        "tasks-table",
        caption=f"the {len(rows)} costliest of {len(traces):,} tasks; device energy during a task's "
        "tool waits is not charged to it",
        align="rllrrrrrrr",
    ) + _table(
        ("turn", "calls", "input tokens", "cached", "energy", "TTFT"),
        profile,
        "turns-table",
        caption="the mean call by its turn index: what the growing history costs",
        align="rrrrrr",
    )


# --- a sweep ---------------------------------------------------------------------------------


def sweep_page(sweep_dir: Path) -> str:
    """The page of a sweep's ``sweep/`` directory."""
    summary = files.read_json(sweep_dir / files.SUMMARY)
    stats = files.read_json(sweep_dir / "summary_stats.json")["levels"]
    rows = pl.read_csv(sweep_dir / "raw_runs.csv", infer_schema_length=None).to_dicts()
    mode, simulated, knees = summary["mode"], bool(summary.get("simulated")), summary.get("knees") or {}
    tasks = any(lv["means"].get("j_per_task") is not None for lv in stats)
    figures = _figure(
        "fig-load-vs-energy",
        "J per query, J per output token, TTFT and throughput against load: each run faint, the "
        "level means with 95% CIs over repeats, the knees dashed.",
        partial(load_vs_energy, mode, stats, rows, simulated, LOAD_PANELS, knees),
    )
    if tasks:
        figures += _figure(
            "fig-load-vs-task",
            "Per task: J, latency, throughput and success against load.",
            partial(load_vs_energy, mode, stats, rows, simulated, TASK_PANELS),
        )
    figures += _figure(
        "fig-throughput-vs-latency",
        "Output throughput against e2e latency; the throughput knee ringed.",
        partial(trade_off, "e2e_p50_s", "throughput_tok_s", stats, rows, simulated, knees.get("throughput")),
    ) + _figure(
        "fig-pareto",
        "Pareto frontiers: accuracy against latency and against energy.",
        partial(pareto_plot, stats, frontiers(stats), simulated),
    )
    levels = ", ".join(str(v) for v in summary.get("levels") or ())
    header = (
        f"<h1>ipw-async sweep: {_esc(mode)} {_esc(levels)}</h1>"
        f'<p class="meta">{_esc(sweep_dir)}</p>{_sweep_banners(summary)}'
    )
    sections = [
        ("levels", "Levels", _levels(stats, summary, tasks)),
        ("figures", "Load against energy", figures),
        ("runs", "Runs", _runs(rows, sweep_dir)),
    ]
    details = {k: summary.get(k) for k in ("base_config", "constraints")}
    return _page(f"ipw-async sweep {sweep_dir.parent.name}", header, sections, details)


def _sweep_banners(summary: dict[str, Any]) -> str:
    out = []
    if summary.get("simulated"):
        out.append(_banner("sim", "SIMULATED", "every run of this sweep ran against ipw-async's simulator."))
    if not summary.get("complete"):
        counts = summary.get("counts") or {}
        how = "interrupted (Ctrl-C)" if summary.get("interrupted") else "not every run succeeded"
        out.append(
            _banner(
                "partial",
                "PARTIAL SWEEP",
                f"{how}: {_fig(counts.get('runs_ok'), ',')} of {_fig(counts.get('runs_planned'), ',')} "
                f"planned runs succeeded, {_fig(counts.get('runs_failed'), ',')} failed.",
            )
        )
    return "".join(out)


def _mean_ci(level: dict[str, Any], key: str) -> str:
    stat = level["stats"].get(key) or {}
    ci = f" ± {format_figure(key, stat['ci95'])}" if stat.get("ci95") else ""
    return _esc(format_figure(key, stat.get("mean")) + ci)


def _levels(stats: list[dict[str, Any]], summary: dict[str, Any], tasks: bool) -> str:
    keys = (
        ("j_per_task", "tasks_per_s", "task_wall_p50_s", "task_success", "ttft_p50_s")
        if tasks
        else ("j_per_query", "j_per_token", "throughput_tok_s", "ttft_p50_s", "accuracy", "ipj")
    )
    rows = [
        [
            _esc(lv["level"]),
            _esc(f"{lv['ok_runs']}/{lv['runs']}"),
            *(_mean_ci(lv, k) for k in keys),
            "accepted" if lv.get("accepted") else _esc("rejected: " + "; ".join(lv.get("reasons") or ())),
        ]
        for lv in stats
    ]
    header = ("level", "runs ok", *(FIGURES[k][0] for k in keys), "verdict")
    table = _table(
        header,
        rows,
        "levels-table",
        caption="level means ± 95% CI over repeats",
        align="lr" + "r" * len(keys),
    )
    knees = (
        "".join(f"<li>{_esc(line)}</li>" for line in knee_lines(summary["knees"]))
        if "knees" in summary
        else ""
    )
    best = "".join(
        f"<li>{_esc(name)}: {_esc(b['level'])}</li>" for name, b in (summary.get("best") or {}).items() if b
    )
    return (
        table
        + (f'<h3>Knees</h3><ul id="knees">{knees}</ul>' if knees else "")
        + (f'<h3>Best accepted levels</h3><ul id="best">{best}</ul>' if best else "")
    )


def _runs(rows: list[dict[str, Any]], sweep_dir: Path) -> str:
    def name(row: dict[str, Any]) -> str:
        # a sweep's runs sit beside its sweep/ folder; the path it recorded is stale once it moved
        run = Path(str(row["run_dir"])).name
        if not (sweep_dir.parent / run / REPORT).is_file():
            return _esc(run)
        return f'<a href="../{_esc(quote(run))}/{REPORT}">{_esc(run)}</a>'

    cells = [
        [
            name(r),
            _esc(r["level"]),
            _fig(r["repeat"], "d"),
            _fig(r["seed"], "d"),
            _esc(r["status"]) + (f' <span class="why">({_esc(r["error"])})</span>' if r.get("error") else ""),
            *(_esc(format_figure(k, r.get(k))) for k in ("j_per_query", "throughput_tok_s", "ttft_p50_s")),
        ]
        for r in rows
    ]
    header = ("run", "level", "repeat", "seed", "status", "J/query", "tok/s", "TTFT p50")
    return _table(header, cells, "runs-table", align="llrrlrrr")
