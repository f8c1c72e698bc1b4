"""``report.html`` for one run: headline, latency, energy, the power model and meters, tasks."""

from __future__ import annotations

import io
import json
from functools import partial
from pathlib import Path
from typing import Any

import polars as pl
from rich.console import Console
from rich.errors import MarkupError
from rich.table import Table
from rich.text import Text

from ..report import DASH, describe_model, ms, summary_table, term_label
from ..rundir.read import HEADLINE, RunDir
from ..stats import PERCENTILES, latency_stats, measured
from .accuracy import accuracy_counts, meter_report
from .html_figures import LATENCIES, energy_bands, energy_timeline, latency_percentiles
from .html_page import banner, cell, esc, html_table, missing_text, svg_figure, whole_page
from .plots import energy_histogram
from .tasks import task_report

TOP = 20  # the costliest queries and tasks listed: a page, not a dump of the records
PROMPT_CHARS = 80  # of a prompt shown beside its query
CANDIDATES = 6  # power models listed from the run's cross-validation, best first
PERCENTILE_NAMES = [f"p{p:g}" for p in PERCENTILES]


def run_page(run: RunDir | Path) -> str:
    """The page of one finished run."""
    run = RunDir.open_finished(run)
    path = run.path
    # a run from before run.json existed that died: what its records give
    summary = run.summary or {
        "complete": False,
        "aborted": "it left no summary.json, and no run.json to recover one from: the figures are its records'",
        **latency_stats(run.records),
    }
    load = run.manifest.load if run.manifest else {}
    what = " · ".join(esc(v) for v in (summary.get("model"), summary.get("dataset"), load.get("label")) if v)
    header = (
        f"<h1>ipw-async run: {what}</h1>"
        f'<p class="meta">{esc(path.name)} · started {esc(summary.get("started_at") or DASH)}'
        f" · run {esc(summary.get('run_id') or DASH)}</p>{_run_banners(summary)}"
    )
    sections = [
        ("headline", "Headline", _headline(run, summary)),
        ("latency", "Latency", _latency(summary)),
        ("energy", "Energy", _energy(run, summary)),
        ("meters", "Power model and meters", _meters(run, summary)),
        ("tasks", "Tasks", _tasks(run, summary)),
    ]
    details = {k: summary.get(k) for k in ("config", "versions", "host")}
    return whole_page(f"ipw-async run {path.name}", header, sections, details)


def _run_banners(summary: dict[str, Any]) -> str:
    out = []
    if summary.get("simulated"):
        out.append(
            banner(
                "sim",
                "SIMULATED",
                "the server and its device are ipw-async's simulator: these figures show the tool "
                "at work, not what a real model costs.",
            )
        )
    if summary.get("complete"):
        return "".join(out)
    if summary.get("aborted"):
        how = f"aborted: {esc(summary['aborted'])}"
    elif summary.get("interrupted"):
        how = "interrupted (Ctrl-C or a signal)"
    elif summary.get("stopped"):
        how = f"stopped: {esc(summary['stopped'])}"
    else:
        how = "it ended before its plan"
    loss = summary.get("loss")
    if loss:  # what finishing could tell was lost (older runs did not count it)
        how += (
            f". {cell(loss['requests_on_disk'], ',')} of {cell(loss['requests_dispatched'], ',')} dispatched "
            f"requests are on disk: {cell(loss['requests_not_recorded'], ',')} were in flight or not yet "
            f"flushed at the end, and {cell(loss['tasks_not_logged'], ',')} tasks had not logged their end. "
            f"The last record ended {cell(loss['last_record_end_s'], ',.2f', ' s')} and the last telemetry "
            f"was read {cell(loss['last_telemetry_s'], ',.2f', ' s')} into the run"
        )
    out.append(banner("partial", "PARTIAL RUN", f"{how}."))
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
    return html_table(("metric", "value"), rows, "headline-table", caption=str(table.title or ""))


# key in a meter report, label, unit
RATIOS = (("ipj", "IPJ (accuracy / J per query)", " /J"), ("ipw", "IPW (accuracy / W per query)", " /W"))


def _ratios(run: RunDir, accuracy: float) -> list[list[str]]:
    """IPJ and IPW over the headline meter (imputed as analyze does), or why there are none."""
    if HEADLINE not in run.energy_meters:
        return [[label, missing_text("the run has no per-query energy")] for _, label, _ in RATIOS]
    energy = meter_report(run.ok, HEADLINE, accuracy)
    return [
        [
            label,
            missing_text(energy[f"{key}_reason"]) if energy[key] is None else cell(energy[key], ".4g", unit),
        ]
        for key, label, unit in RATIOS
    ]


def _latency(summary: dict[str, Any]) -> str:
    latency = summary.get("latency_s") or {}
    labels = {**LATENCIES, "queue": "client queue (scheduled to dispatched)"}
    rows = [
        [esc(label), *(ms(dist.get(n)) for n in PERCENTILE_NAMES), cell(dist.get("count"), ",")]
        for key, label in labels.items()
        if (dist := latency.get(key))
    ]
    return html_table(("", *PERCENTILE_NAMES, "count"), rows, "latency-table", align="lrrrrrr") + svg_figure(
        "fig-latency",
        "Each latency's percentiles over the measured requests that succeeded (ms, log scale).",
        partial(latency_percentiles, latency, bool(summary.get("simulated"))),
    )


def _energy(run: RunDir, summary: dict[str, Any]) -> str:
    energy = summary.get("energy") or {}
    if energy.get("total_j") is None:
        skipped = "; ".join(f"{k}: {v}" for k, v in (energy.get("skipped") or {}).items())
        return f"<p>{missing_text('no energy was measured' + (f' ({skipped})' if skipped else ''))}</p>"
    per_query, band = energy.get("per_query_j") or {}, energy.get("band_half_width") or {}
    names = ["mean", *PERCENTILE_NAMES]
    rows = [
        ["J per query", *(cell(per_query.get(n), ",.3f") for n in names)],
        ["band half-width / estimate", *(cell(band.get(n), ".0%") for n in names)],
    ]
    caption = "headline meters, measured requests that succeeded"
    return (
        html_table(("", *names), rows, "energy-table", caption=caption, align="lrrrrrr")
        + svg_figure(
            "fig-timeline",
            "Power over the run: each meter's energy per interval of its counter, over the interval "
            "(what the attribution splits), a counter's own power field faint beside it, imputed "
            "stretches in orange and the idle baseline in green; below, each query from sent to end "
            "(blue ok, red failed, grey warm-up; a row per slot), or requests in flight for a long run.",
            partial(energy_timeline, run, energy.get("baseline_window_ns")),
        )
        + svg_figure(
            "fig-energy-band",
            "Each query's energy, cheapest first, with its band: the low and high figures the "
            "telemetry allows (energy_low_j, energy_high_j).",
            partial(energy_bands, run),
        )
        + svg_figure(
            "fig-energy-histogram",
            "Energy per query by provenance (as ipw-async plot draws it).",
            partial(energy_histogram, run),
        )
        + _costliest(run)
    )


def _excerpt(text: str | None) -> str:
    if text is None:
        return DASH
    return esc(text if len(text) <= PROMPT_CHARS else text[:PROMPT_CHARS] + "…")


def _costliest(run: RunDir) -> str:
    with_energy = measured(run.records).filter(pl.col("energy_j").is_not_null())
    rows = [
        [
            cell(r["request_id"], "d")
            + ("" if r["task_id"] is None else esc(f" (task {r['task_id']}, turn {r['turn_index']})")),
            esc(r["status"]),
            cell(r["output_tokens"], ","),
            ms(r["e2e_latency_s"]),
            cell(r["energy_j"], ",.3f"),
            f"{cell(r['energy_low_j'], ',.3f')}–{cell(r['energy_high_j'], ',.3f')}",
            esc(r["energy_provenance"] or "missing"),
            _excerpt(r["prompt"]),
        ]
        for r in with_energy.sort("energy_j", descending=True).head(TOP).iter_rows(named=True)
    ]
    header = ("request", "status", "output tokens", "e2e", "J", "band (J)", "provenance", "prompt")
    caption = f"the {len(rows)} costliest of {with_energy.height:,} measured requests with an energy figure"
    return html_table(header, rows, "costliest-table", caption=caption, align="rlrrrrl") if rows else ""


# (label, key in the power model, name of its standard error, unit)
PARAMETERS = (
    ("static power", "static_w", "static", " W"),
    ("per engine step", "step_w", "step", " W"),
    ("dynamic scale", "scale_w", "scale", " W"),
    ("work exponent", "exponent", "exponent", ""),
    ("power cap", "cap_w", "cap", " W"),
    ("prefill token / decode token", "prefill_weight", "prefill", ""),
    ("padded rows worked", "padding_weight", "padding", ""),
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
        return f"<p>{missing_text('the run has no energy meter')}</p>"
    totals = [
        [
            esc(name),
            *(
                cell(m.get(k), ",.1f", " J")
                for k in ("total_j", "measured_j", "imputed_j", "attributed_j", "idle_j")
            ),
            cell(m.get("conservation_error"), ".1e"),
            cell(m.get("window_overcount"), ".2f", "×"),
        ]
        for name, m in meters.items()
    ]
    header = ("meter", "total", "measured", "imputed", "to queries", "idle", "conservation error")
    out = [
        html_table(
            (*header, "window sum / total"),
            totals,
            "meters-table",
            caption="energy by meter; the window sum is what a sequential profiler would charge",
            align="lrrrrrrr",
        ),
        html_table(
            ("meter", "kind, provenance", "per query", "counter check", "largest gap", "counter timing"),
            [_how_read(run, name, m, telemetry) for name, m in meters.items()],
            "provenance-table",
            caption="how each meter was read",
        ),
    ]
    skipped = {**(telemetry.get("skipped") or {}), **(energy.get("skipped") or {})}
    if skipped:
        items = "".join(f"<li>{esc(k)}: {esc(v)}</li>" for k, v in skipped.items())
        out.append(f'<p>Sources not read:</p><ul id="skipped-sources">{items}</ul>')
    if telemetry.get("counter_events"):
        out.append(f"<p>Counter resets and wraps: {esc(json.dumps(telemetry['counter_events']))}</p>")
    models = [(name, m["power_model"]) for name, m in meters.items() if m.get("power_model")]
    return "".join(out + [_power_model(i, name, model) for i, (name, model) in enumerate(models)])


def _how_read(run: RunDir, name: str, meter: dict[str, Any], telemetry: dict[str, Any]) -> list[str]:
    """A meter's kind and provenance, its queries' provenance, its counter check and its gaps."""
    distrusted = meter.get("distrusted")
    kind = esc(f"{meter.get('kind')}, {meter.get('provenance')}") + (
        f' <span class="why">(distrusted: {esc(distrusted)})</span>' if distrusted else ""
    )
    per_query = (
        meter_report(run.ok, name, None)["provenance"] if f"{name}.energy_j" in run.records.columns else {}
    )
    check = (telemetry.get("counter_checks") or {}).get(name)
    if check:
        action = check.get("action")
        said = esc(f"{check['status']}: {check['reason']}" + (f"; {action}" if action else ""))
    else:
        said = missing_text(telemetry.get("counter_checks_skipped") or "no check for this meter")
    gap = ((telemetry.get("sampler") or {}).get("gaps") or {}).get(name) or {}
    period = gap.get("counter_period_ms")
    return [
        esc(name),
        kind,
        esc(", ".join(f"{k} {v:,}" for k, v in sorted(per_query.items()))) or DASH,
        said,
        cell(gap.get("largest_ms"), ",.0f", " ms")
        + ("" if period is None else esc(f" (counter every {period:,.0f} ms)")),
        esc(meter.get("counter_timing") or DASH),
    ]


def _power_model(index: int, meter: str, model: dict[str, Any]) -> str:
    """A fitted power model: its parameters with standard errors, and how it was chosen."""
    errors = model.get("errors") or {}
    values = {**model, "drift": (model.get("static_drift") or {}).get("coef_w")}
    rows = [
        [esc(label), cell(values[key], ",.4g", unit), cell(errors.get(err), ",.2g")]
        for label, key, err, unit in PARAMETERS
        if values.get(key) is not None
    ] + [  # a step-cost model's costs (convention v2)
        [esc(label), cell(value, ",.4g", f" {unit}"), cell(errors.get(name), ",.2g")]
        for name, value in (model.get("costs") or {}).items()
        for label, unit in [term_label(name)]
    ]
    selection = model.get("selection") or {}
    held_out: dict[str, float] = selection.get("held_out_error") or {}
    close = set(selection.get("indistinguishable") or ())
    how = "given" if selection.get("given") else "chosen"
    candidates = [
        [
            esc(
                name + (f" ({how})" if name == model.get("model") else " (as good)" if name in close else "")
            ),
            cell(err, ".1%"),
        ]
        for name, err in sorted(held_out.items(), key=lambda kv: kv[1])[:CANDIDATES]
    ]
    fit = (
        f"R² {cell(model.get('r2'), '.3f')} over {cell(model.get('intervals'), ',')} counter intervals, "
        f"{cell(model.get('steps'), ',')} engine steps inferred."
    )
    rule = f'<p class="why">{esc(selection["rule"])}</p>' if selection.get("rule") else ""
    notes = "".join(f"<li>{esc(n)}</li>" for n in model.get("notes") or ())
    table_id = f"power-model-{index}"
    return (
        f'<div class="power-model" id="{table_id}" data-meter="{esc(meter)}">'
        f"<h3>Power model of {esc(meter)}: {esc(model.get('model') or DASH)}</h3>"
        f"<p>{esc(describe_model(model))}. {fit}</p>"
        + html_table(("parameter", "value", "± standard error"), rows, f"{table_id}-parameters", align="lrr")
        + (
            html_table(
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
    if not summary.get("tasks") or run.traces is None:
        return ""
    traces = [t for t in run.traces if not t.warmup]
    traces.sort(key=lambda t: -1.0 if t.energy_j is None else t.energy_j, reverse=True)
    rows = [
        [
            cell(t.task_id, "d"),
            esc(t.status),
            esc(DASH if t.correct is None else "yes" if t.correct else "no"),
            cell(len(t.turns), ","),
            cell(sum(len(u.tools_called) for u in t.turns), ","),
            ms(t.total_wall_clock_s),
            ms(t.model_s),
            ms(t.tool_s),
            cell(t.energy_j, ",.2f", " J"),
            cell(t.tool_wait_device_j, ",.2f", " J"),
            _excerpt(t.prompt),
        ]
        for t in traces[:TOP]
    ]
    profile = [
        [
            cell(p["turn_index"], "d"),
            cell(p["calls"], ","),
            cell(p["input_tokens_mean"], ",.0f"),
            cell(p["cached_fraction_mean"], ".0%"),
            cell(p["energy_j_mean"], ",.3f", " J"),
            ms(p["ttft_s_mean"]),
        ]
        for p in task_report(run).get("by_turn_index") or ()
    ]
    header = ("task", "outcome", "correct", "turns", "tool calls", "wall", "model", "tools", "energy")
    return html_table(
        (*header, "device J in tool waits", "prompt"),
        rows,
        "tasks-table",
        caption=f"the {len(rows)} costliest of {len(traces):,} tasks; device energy during a task's "
        "tool waits is not charged to it",
        align="rllrrrrrrr",
    ) + html_table(
        ("turn", "calls", "input tokens", "cached", "energy", "TTFT"),
        profile,
        "turns-table",
        caption="the mean call by its turn index: what the growing history costs",
        align="rrrrrr",
    )
