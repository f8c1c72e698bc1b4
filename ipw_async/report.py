"""The end-of-run summary table, from a run's summary.json contents."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from .energy.parameters import PARAMETERS

DASH = "—"  # a figure that was not measured: never 0


def ms(seconds: float | None) -> str:
    """Seconds as milliseconds for a table; a dash when not measured."""
    return DASH if seconds is None else f"{seconds * 1000:,.1f} ms"


def _num(value: float | None, fmt: str = ",.1f", unit: str = "") -> str:
    return DASH if value is None else f"{value:{fmt}}{unit}"


# a step-cost summary's terms, as the run table says them
_COST_LABELS = {
    "per_decode_step_j": "{:.3g} J a decode step",
    "per_decode_second_w": "{:.3g} W while decoding",
    "per_padded_row_j": "{:.3g} J a padded row",
    "per_padded_row_ktoken_j": "{:.3g} J per padded row·k length",
    "per_decode_token_j": "{:.3g} J a token",
    "per_context_ktoken_j": "{:.3g} J per k context",
    "per_prefill_forward_j": "{:.3g} J a prefill",
    "per_prompt_token_j": "{:.3g} J a prompt token",
    "per_prompt_position_ktoken_j": "{:.3g} J per prompt token·k position",
}


def term_label(name: str) -> tuple[str, str]:
    """A step cost as a reader says it, and its unit: ``per_decode_second_w`` → per decode second, W."""
    words, unit = name.rsplit("_", 1)
    return words.replace("_", " "), unit.upper()


def describe_step_costs(model: dict[str, Any]) -> str:
    """Step costs in one line: static power and where it came from, the costs the run found
    (those it found none of left out), convention and fit."""
    if model.get("r2") is None:  # too few intervals: the costs are token weights, not a fit
        return (
            f"step costs (v2): static {model['static_w']:,.1f} W ({model['static_source']}); "
            "too few meter intervals to fit: shared by token work"
        )
    shared = set(model.get("shared_equally", ()))
    costs = ", ".join(
        _COST_LABELS[k].format(v) + (" (shared)" if k in shared and k != "per_decode_step_j" else "")
        for k, v in model["costs"].items()
        if v > 0
    )
    fit = f", R² {model['r2']:.3f}" if model.get("r2") is not None else ""
    placed = model.get("prefill_placement") or {}
    if placed.get("by") == "token budget":  # read from first tokens: say what was found
        fit += f"; prompts placed by a {placed['budget_tokens']:,}-token step budget"
    return f"step costs (v2): static {model['static_w']:,.1f} W ({model['static_source']}); {costs or 'none found'}{fit}"


def describe_model(model: dict[str, Any]) -> str:
    """A fitted model in one line: step costs (:func:`describe_step_costs`), or a power model
    (:func:`_describe_power_model`), and the stretches an instant power field was kept over."""
    described = describe_step_costs(model) if "costs" in model else _describe_power_model(model)
    kept = model.get("conserved_over")
    if not kept:
        return described
    stretch = "the whole run" if kept["length_s"] is None else f"{kept['length_s']:g} s stretches"
    return f"{described}; its instant power kept over {stretch}"


def _describe_power_model(model: dict[str, Any]) -> str:
    """A power model in one line: which effects the run chose, static + per-step + scale ·
    work^exponent, its cap, lag, drift and fit."""
    cap = f", cap {model['cap_w']:,.0f} W" if model.get("cap_w") is not None else ""
    fit = f", R² {model['r2']:.3f}" if model.get("r2") is not None else ""
    step = f" + {model['step_w']:.3g} W a step" if model.get("step_w") else ""
    context = (
        f", +{model['context_weight_per_ktoken']:.2g}/k context"
        if model.get("context_weight_per_ktoken")
        else ""
    )
    padding = f", {model['padding_weight']:.0%} of padded rows worked" if model.get("padding_weight") else ""
    lag = f", meter lag {model['lag_ms']:.0f} ms" if model.get("lag_ms") else ""
    drift = (model.get("static_drift") or {}).get("coef_w")
    drifting = ", static drifts" if drift else ""
    name = f"{model['model']}: " if model.get("model") else ""
    choice = model.get("chosen_by") or {}
    chosen = (
        f"; explains the meter better than step costs (R² {choice['step_costs_r2']:.3f}), so the steps rule split by it"
        if choice.get("chosen") == "power model" and choice.get("step_costs_r2") is not None
        else ""
    )
    return (
        f"{name}{model['static_w']:,.1f} W{step} + {model['scale_w']:.3g}·work^{model['exponent']:.2f} W{cap}"
        f"{padding}{context}; prefill token = {model['prefill_weight']:.2f} decode{lag}{drifting}{fit}{chosen}"
    )


# each fitted parameter's key in the summary's model, as the parameters' table names it
_PARAM_KEYS = {row.name: row.key or row.attribute for row in PARAMETERS if row.attribute}


def _describe_cost_fit(model: dict[str, Any]) -> list[str]:
    """How well the step costs are known: each one ± its standard error, the meter's lag and
    the fit's error on intervals it was not fitted to."""
    errors = model.get("errors") or {}
    known = [
        f"{label} {value:.3g} ± {errors[name]:.2g} {unit}"
        for name, value in model["costs"].items()
        for label, unit in [term_label(name)]
        if errors.get(name) is not None and (value > 0 or errors[name] > 0)
    ]
    held = model.get("held_out_error")
    fit = [
        f"meter lag {model.get('lag_ms', 0):g} ms; interval error "
        + (f"{held:.1%} held out" if held is not None else "not held out (too few intervals)")
    ]
    graph = model.get("decode_graph") or {}
    alike = f", the same here as {' and '.join(graph['alike'])}" if graph.get("alike") else ""
    padding = (
        [
            f"decode graphs: {graph['layout']} batch padded to {graph['capture_sizes']} sizes{alike} ({graph['source']})"
        ]
        if graph
        else []
    )
    known_costs = ["costs ± standard error: " + ", ".join(known)] if known else []
    return known_costs + fit + padding + list(model.get("notes") or [])


def describe_selection(model: dict[str, Any]) -> list[str]:
    """How the run chose its power model: each candidate's held-out error, and the chosen
    model's parameters with their standard errors."""
    if "costs" in model:
        return _describe_cost_fit(model)
    selection = model.get("selection") or {}
    errors = selection.get("held_out_error") or {}
    lines = []
    if errors:
        ranked = sorted(errors.items(), key=lambda kv: kv[1])
        mark = " (given)" if selection.get("given") else " (chosen)"
        shown = ", ".join(
            f"{name} {err:.1%}{mark if name == model.get('model') else ''}" for name, err in ranked
        )
        lines.append(f"held-out error by candidate: {shown}")
    values = {**model, "drift": (model.get("static_drift") or {}).get("coef_w")}
    params = [
        f"{name} {values[key]:.3g} ± {error:.2g}"
        for name, error in (model.get("errors") or {}).items()
        if error is not None and isinstance(values.get(key := _PARAM_KEYS.get(name, name)), int | float)
    ]
    if params:
        lines.append("parameters ± standard error: " + ", ".join(params))
    return lines


def _task_rows(table: Table, tasks: dict[str, Any]) -> None:
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(tasks["outcomes"].items()))
    table.add_row("tasks", f"{tasks['count']} ({outcomes})")
    if tasks.get("success_rate") is not None:
        table.add_row("task success", f"{tasks['success_rate']:.1%} ({tasks['correct']} correct)")
    table.add_row("tasks/s", _num(tasks.get("tasks_per_s"), ",.2f"))
    turns, wall = tasks["turns"], tasks["wall_s"]
    table.add_row(
        "turns per task p50 (mean)", f"{_num(turns.get('p50'), ',.0f')} ({_num(turns.get('mean'), ',.1f')})"
    )
    split = " · ".join(
        f"{name} {_num(tasks[key].get('mean'), ',.2f', ' s')}"
        for name, key in (
            ("model", "model_s"),
            ("tools", "tool_s"),
            ("think", "think_s"),
            ("queue", "queue_s"),
        )
        if tasks[key].get("mean")
    )
    table.add_row(
        "task wall p50 / p99",
        f"{_num(wall.get('p50'), ',.2f', ' s')} / {_num(wall.get('p99'), ',.2f', ' s')}",
    )
    if split:
        table.add_row("task time (mean)", split)
    if tasks.get("j_per_task") is not None:
        per_success = _num(tasks.get("j_per_successful_task"), ",.1f", " J")
        table.add_row("J/task (per success)", f"{tasks['j_per_task']:,.1f} J ({per_success})")
        waits = tasks["tool_wait_device_j"].get("mean")
        if waits:
            table.add_row("device J during tool waits", f"{waits:,.1f} J per task (not charged)")


def _telemetry_rows(table: Table, telemetry: dict[str, Any], energy: dict[str, Any]) -> None:
    """The counters that failed their check, and how well the sampler kept its ticks: late,
    skipped, and meters that went longer without a reading than their counter's period."""
    failed = [
        f"{name} {check['status']}: {check['reason']}; {check.get('action') or 'nothing done'}"
        for name, check in (telemetry.get("counter_checks") or {}).items()
        if check.get("status") in ("stuck", "backwards", "disagrees")
    ]
    if failed:
        table.add_row("counter check", f"[yellow]{'; '.join(failed)}[/]")
    sampler = telemetry.get("sampler") or {}
    late = (sampler.get("lateness_ms") or {}).get("p99")
    if late is None:
        return
    said = [f"sampler p99 {late:.1f} ms late"]
    if sampler.get("cpu_share") is not None:
        said[0] += f", {sampler['cpu_share']:.1%} of a core"
    if sampler.get("runs_in") == "process":
        said[0] += " in its own process"
    if sampler.get("failure"):
        said.append(f"[yellow]{sampler['failure']}[/]")
    if sampler.get("skipped_ticks"):
        skipped = sampler["skipped_ticks"]
        said.append(f"[yellow]{skipped:,} {'tick' if skipped == 1 else 'ticks'} skipped[/]")
    said += [
        f"{name} counter: {m['counter_timing']}"
        for name, m in energy.get("meters", {}).items()
        if m.get("counter_timing")
    ]
    for name, gap in (sampler.get("gaps") or {}).items():
        largest, period = gap.get("largest_ms"), gap.get("counter_period_ms")
        if largest is not None and period is not None and largest > period:
            said.append(
                f"[yellow]{name} went {largest:,.0f} ms without a reading "
                f"(its counter updates every {period:,.0f} ms)[/]"
            )
    table.add_row("telemetry", "; ".join(said))


def _validity_rows(table: Table, summary: dict[str, Any]) -> None:
    """Was the run valid: stopped early, over-saturated, steady, and how precise its means are."""
    if summary.get("stopped"):
        table.add_row("stopped", str(summary["stopped"]))
    saturation = summary.get("saturation")
    if saturation:
        if saturation["oversaturated"]:
            began, share = saturation.get("began_s"), saturation.get("share_of_run")
            since = "" if began is None else f"from {began:.0f} s ({share:.0%} of the run): "
            said = f"[bold red]yes, {since}{saturation['reason']}[/]"
        else:
            said = "no" if saturation["oversaturated"] is False else f"{DASH} ({saturation['reason']})"
        table.add_row("over-saturated", said)
    steady = summary.get("steady")
    if steady and steady.get("steady") is not None:
        said = (
            f"{steady['start_s']:.1f}–{steady['end_s']:.1f} s by issue time "
            f"({steady['warmup_cropped_requests']} warm-up requests cropped, "
            f"{steady['drain_requests']} in the drain)"
        )
        if steady.get("j_per_query") is not None:
            said += f", {steady['j_per_query']:,.2f} J/query with its idle"
        if not steady["steady"]:
            said += f" [yellow]— not steady: {steady['reason']}[/]"
        table.add_row("steady window", said)
    metrics = (summary.get("precision") or {}).get("metrics") or {}
    shown = [f"{name} ±{m['relative']:.1%}" for name, m in metrics.items() if m is not None]
    if shown:
        table.add_row("precision (95%)", ", ".join(shown))
    validity = summary.get("validity")
    if validity:
        verdict = validity["verdict"]
        said = {
            "valid": "[green]yes[/]: every check passed",
            "not valid": f"[yellow]no[/]: {escape('; '.join(validity['reasons']))}",
            "unknown": f"cannot tell: {escape('; '.join(validity['unknown']))}",
        }[verdict]
        table.add_row("publishable", said)


def summary_table(summary: dict[str, Any], run_dir: str | None = None) -> Table:
    """Headline figures of a run; a figure that was not measured shows as — (never 0)."""
    title = "ipw-async run" + (" [SIMULATED]" if summary.get("simulated") else "")
    status = "complete" if summary.get("complete") else "PARTIAL"
    table = Table(title=f"{title} — {status}", show_header=True, header_style="bold", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    req = summary.get("requests", {})
    thr = summary.get("throughput", {})
    lat = summary.get("latency_s", {})
    acc = summary.get("accuracy", {})
    table.add_row("model", escape(str(summary.get("model"))))  # the server's name: not markup
    unit = "calls" if summary.get("tasks") else "requests"  # a task's LLM calls are its requests
    table.add_row(f"{unit} ok / measured", f"{req.get('ok', 0)} / {req.get('measured', 0)}")
    errors = req.get("errors_by_type") or {}
    if errors:
        table.add_row("errors", ", ".join(f"{k} {v}" for k, v in errors.items()))
    table.add_row("window", _num(summary.get("window_s"), ",.2f", " s"))
    table.add_row(f"{unit}/s", _num(thr.get("requests_per_s"), ",.2f"))
    table.add_row("output tokens/s", _num(thr.get("output_tokens_per_s"), ",.0f"))
    for name in ("ttft", "tpot", "e2e"):
        dist = lat.get(name, {})
        table.add_row(f"{name} p50 / p99", f"{ms(dist.get('p50'))} / {ms(dist.get('p99'))}")
    tasks = summary.get("tasks")
    if tasks:
        _task_rows(table, tasks)
    elif acc.get("scored"):
        table.add_row("accuracy", f"{acc['accuracy']:.1%} of {acc['scored']}")
    energy = summary.get("energy", {})
    _energy_rows(table, energy, "call" if tasks else "query")
    _telemetry_rows(table, summary.get("telemetry") or {}, energy)
    _client_rows(table, summary.get("client") or {})
    _validity_rows(table, summary)
    _clock_rows(table, summary.get("telemetry", {}).get("clocks") or {})
    if run_dir:
        table.add_row("run directory", escape(run_dir))
    return table


def _energy_rows(table: Table, energy: dict[str, Any], unit: str) -> None:
    """The run's energy, to queries and idle, per ``unit`` (a query, or a task's call), and
    the model each meter was split by."""
    if energy.get("total_j") is None:
        if energy.get("skipped") is not None:
            table.add_row("energy", "not measured (no energy source)")
        return
    total, idle = energy["total_j"], energy.get("idle_j") or 0.0
    headline = energy.get("headline_meters", [])
    meters = energy.get("meters", {})
    table.add_row(
        f"energy ({', '.join(headline)})",
        f"{total:,.1f} J: {energy.get('attributed_j', 0):,.1f} J to queries, {idle:,.1f} J idle"
        f" ({idle / total:.0%})"
        if total
        else DASH,
    )
    if headline and all(meters.get(m, {}).get("kind") == "estimate" for m in headline):
        # against a remote server with no meter here, the only figure is this host's CPU model
        table.add_row(
            "",
            "[bold yellow]an ESTIMATE of this machine's CPU, not a measurement of the server: "
            "give --telemetry-url or --prometheus-url for its GPUs[/]",
        )
    per_query = energy.get("per_query_j", {})
    band = (energy.get("band_half_width") or {}).get("p50")
    table.add_row(
        f"J/{unit} p50 (mean)",
        f"{_num(per_query.get('p50'), ',.2f')} ({_num(per_query.get('mean'), ',.2f')})"
        + ("" if band is None else f", band ±{band:.0%} (median)"),
    )
    table.add_row("J/output token", _num(energy.get("j_per_output_token"), ",.3f"))
    for name, meter in meters.items():
        if meter.get("power_model"):
            table.add_row(f"energy model ({name})", describe_model(meter["power_model"]))
    errs = [abs(e) for m in meters.values() if (e := m.get("conservation_error")) is not None]
    if errs:
        table.add_row("conservation error", f"{max(errs):.2e}")


def _client_rows(table: Table, client: dict[str, Any]) -> None:
    """What the client cost per event (its event loop's, and the whole process's), its rate
    and lag, and whether it was the limit."""
    if client.get("cpu_us_per_event") is None and client.get("process_cpu_us_per_event") is None:
        return
    writer = client.get("writer_cpu_us_per_event")
    written = f", of which writing files {writer:.1f} µs" if writer is not None else ""
    said = (
        f"{_num(client.get('cpu_us_per_event'), '.1f', ' µs')} CPU per event on its event loop "
        f"({_num(client.get('process_cpu_us_per_event'), '.1f', ' µs')} the whole process{written}), "
        f"{_num(client['events_per_s'], ',.0f')} "
        f"events/s, loop lag p99 {_num(client['loop_lag_p99_ms'], '.1f', ' ms')}"
    )
    if client.get("client_limited"):
        said += f" [bold yellow]— the client was the limit: {client['client_limited']}[/]"
    table.add_row("client", said)


def _clock_rows(table: Table, clocks: dict[str, dict[str, Any]]) -> None:
    """Each telemetry agent's clock against ours (one per agent, whatever its sources)."""
    agents: dict[str, dict[str, Any]] = {}
    for clock in clocks.values():
        agents.setdefault(clock.get("agent", "?"), clock)
    for agent, clock in agents.items():
        if clock.get("offset_ms") is not None:
            table.add_row(
                f"clock of {agent}",
                f"{clock['offset_ms']:+,.3f} ms from ours ± {clock['uncertainty_ms']:.3f} ms "
                f"({clock['pings']:,} round trips)",
            )
