"""``analyze``, ``plot``, ``sweep`` and ``compare``: thin shells over the analysis library."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ._common import err, fail, finish_first, fmt, out
from .export import Exports, report_page
from .options import parse_run_args, run_config

if TYPE_CHECKING:
    from ..analysis.sweep import SweepResult

RunDirArg = Annotated[
    Path,
    typer.Argument(
        help="A run directory written by `ipw-async run` (one that was cut short is finished first, "
        "as `ipw-async recover` would).",
        show_default=False,
    ),
]


def analyze(
    run_dir: RunDirArg,
    analysis: Annotated[
        str,
        typer.Option(
            help="Which analysis to write: accuracy (IPJ/IPW), regression (cost per token), latency "
            "(distributions and goodput), energy (prefill/decode/idle split, fitted power model), "
            "tasks (agentic and multi-turn runs: success, J/task, time split, cost by turn), cache "
            "(TTFT and energy by prefix-cache hit, J per cached and uncached input token) or all."
        ),
    ] = "all",
    scorer: Annotated[
        str | None,
        typer.Option(
            help="Rescore every answer against its reference with exact, contains, numeric or choice. "
            "Default: keep the verdicts recorded during the run."
        ),
    ] = None,
    slo: Annotated[
        str | None,
        typer.Option(
            help="Service-level objectives for goodput, in milliseconds, e.g. ttft_ms=200,tpot_ms=50,e2e_ms=2000. "
            "A request counts toward goodput only if it meets every one given.",
        ),
    ] = None,
) -> None:
    """Analyse a run: accuracy per joule and per watt, regressions, latency and goodput, energy by phase, the prefix cache.

    Writes RUN_DIR/analysis/<name>.json. Works on partial runs too: a figure that needs a missing file is null, with the reason beside it.
    """
    from ..analysis.analyses import analyze as analyze_run
    from ..analysis.latency import parse_slo

    finish_first(run_dir)
    try:  # RunDirError (no run there) is a ValueError too
        results = analyze_run(run_dir, analysis, scorer=scorer, slo=parse_slo(slo))
    except ValueError as exc:
        raise fail(str(exc)) from None
    _print_analysis(results)
    out.print(f"written: {', '.join(f'analysis/{n}.json' for n in results)} in {run_dir}")
    report_page(run_dir)


def _print_analysis(results: dict[str, dict[str, Any]]) -> None:
    from ..report import describe_model, describe_selection

    if "accuracy" in results:
        acc = results["accuracy"]
        out.print(
            f"accuracy {fmt(acc['accuracy'], '.1%')} ({acc['correct']} of {acc['scored']} scored, "
            f"{acc['unscored']} unscored)"
        )
        for meter, rep in acc["energy"].items():
            out.print(
                f"  {meter}: {fmt(rep['energy_j']['mean'], ',.3g', ' J')}/query, "
                f"{fmt(rep['power_w']['mean'], ',.3g', ' W')}, IPJ {fmt(rep['ipj'])}, IPW {fmt(rep['ipw'])}"
                + (f" ({rep['energy_j']['imputed']} imputed)" if rep["energy_j"]["imputed"] else "")
            )
    good = results.get("latency", {}).get("goodput")
    if good:
        out.print(
            f"goodput {fmt(good['goodput_rps'], ',.3g', ' req/s')}: {good['met']} of {good['measured']} "
            f"requests ({fmt(good['fraction'], '.1%')}) meet every SLO"
        )
    for meter, rep in results.get("energy", {}).get("meters", {}).items():
        if rep.get("phases"):
            split = ", ".join(f"{k} {v['energy_j']:,.1f} J" for k, v in rep["phases"].items())
            out.print(f"  {meter} by phase: {split} (deviation from total {fmt(rep['deviation'], '.1e')})")
        if rep.get("power_model"):
            out.print(f"  {meter} energy model: {describe_model(rep['power_model'])}")
            for line in describe_selection(rep["power_model"]):
                out.print(f"    {line}")
    tasks = results.get("tasks", {}).get("tasks")
    if tasks:
        out.print(
            f"tasks {tasks['count']}: success {fmt(tasks['success_rate'], '.1%')}, "
            f"{fmt(tasks['j_per_task'], ',.1f', ' J')}/task ({fmt(tasks['j_per_successful_task'], ',.1f', ' J')} "
            f"per success), IPJ {fmt(tasks['ipj'], '.3g')}, {fmt(tasks['turns']['mean'], '.1f')} turns/task, "
            f"wall p50 {fmt(tasks['wall_s']['p50'], ',.2f', ' s')}"
        )
    if "cache" in results:
        _print_cache(results["cache"])


def _print_cache(cache: dict[str, Any]) -> None:
    if cache["groups"] is None:
        out.print(f"cache: {cache['reason']}")
        return
    parts = [
        f"{g['requests']} {name}{'es' if name == 'miss' else 's'} (TTFT p50 {fmt(g['ttft_p50_s'], ',.3g', ' s')}, "
        f"{fmt(g['energy_j_mean'], ',.3g', ' J')} each)"
        for name, g in cache["groups"].items()
    ]
    out.print(f"cache: {', '.join(parts)}")
    for meter, costs in cache["per_token"].items():
        saved = costs["j_saved_per_cached_token"]
        if saved is None:
            out.print(f"  {meter} per input token: {costs['reason']}")
            continue
        line = f"  {meter} per input token: caching saves {_band(saved, ' J')}"
        if costs["j_per_uncached_token"] is None:
            out.print(f"{line}; {costs['reason']}")
            continue
        figures = [f"{kind} {_band(costs[f'j_per_{kind}_token'], ' J')}" for kind in ("uncached", "cached")]
        ratio = costs["cached_over_uncached"]["estimate"]
        out.print(f"{line}: {', '.join(figures)} (cached/uncached {fmt(ratio, '.2f')})")


def _band(figure: dict[str, float], unit: str) -> str:
    return f"{fmt(figure['estimate'], ',.3g', unit)} [{fmt(figure['low'], ',.3g')}, {fmt(figure['high'], ',.3g')}]"


def plot(
    run_dir: RunDirArg,
    output: Annotated[
        Path | None,
        typer.Option(help="Folder for the PNG files (default: RUN_DIR/plots).", show_default=False),
    ] = None,
) -> None:
    """Draw a run's plots as PNG: regressions, output-length density, power timeline, energy, TTFT CDF.

    A plot whose data the run does not have is skipped, with the reason printed.
    """
    from ..analysis.plots import plot_run
    from ..rundir import RunDirError

    finish_first(run_dir)
    try:
        report = plot_run(run_dir, output)
    except RunDirError as exc:
        raise fail(str(exc)) from None
    for path in report.written:
        out.print(f"wrote {path}")
    for name, reason in report.skipped.items():
        out.print(f"[yellow]skipped[/] {name}: {reason}")


def _numbers(text: str | None, kind: type, flag: str) -> list[Any] | None:
    if text is None:
        return None
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise fail(f"{flag} takes a comma-separated list of numbers, e.g. 1,2,4,8") from None


def sweep(
    ctx: typer.Context,
    concurrency: Annotated[
        str | None,
        typer.Option(
            "--concurrency",
            "-c",
            help="Concurrency levels to run, comma-separated, e.g. 1,2,4,8.",
            show_default=False,
        ),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(
            help="Arrival rates (requests/s) to run instead, comma-separated, e.g. 1,2,5.", show_default=False
        ),
    ] = None,
    speedup: Annotated[
        str | None,
        typer.Option(
            help="With --trace: the speeds to replay it at, comma-separated, e.g. 0.5,1,2,4 (each level "
            "one replay, its times over the speedup).",
            show_default=False,
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(help="Runs per level; repeat r uses seed + r.")] = 3,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir",
            "-o",
            help="Sweep directory: one run directory per level and repeat, and sweep/ with the results "
            "(default ./runs/sweep_<UTC time>_<model or sim>).",
            show_default=False,
        ),
    ] = None,
    max_ttft_ms: Annotated[
        float | None,
        typer.Option(help="Reject levels whose median TTFT (mean over repeats) exceeds this many ms."),
    ] = None,
    max_tpot_ms: Annotated[
        float | None,
        typer.Option(help="Reject levels whose median TPOT (mean over repeats) exceeds this many ms."),
    ] = None,
    max_j_per_query: Annotated[
        float | None,
        typer.Option(help="Reject levels using more joules per query than this (mean over repeats)."),
    ] = None,
    min_accuracy: Annotated[
        float | None, typer.Option(help="Reject levels less accurate than this fraction, e.g. 0.8.")
    ] = None,
    min_throughput: Annotated[
        float | None, typer.Option(help="Reject levels producing fewer output tokens per second than this.")
    ] = None,
    mlflow: Annotated[
        bool,
        typer.Option(
            "--mlflow",
            help="Log the sweep to MLflow when it ends: a parent run with a child per level and repeat "
            "(the tracking URI from MLFLOW_TRACKING_URI).",
        ),
    ] = False,
    mlflow_experiment: Annotated[
        str, typer.Option(help="MLflow experiment to log to (made if missing).")
    ] = "ipw-async",
    reset_prefix_cache: Annotated[
        bool,
        typer.Option(
            "--reset-prefix-cache/--keep-prefix-cache",
            help="Before each run against --base-url, empty the server's prefix cache (POST "
            "<server root>/reset_prefix_cache, vLLM's endpoint) so no point hits what an earlier one "
            "cached; a server without the endpoint is noted once, and the sweep goes on.",
        ),
    ] = True,
) -> None:
    """Run the benchmark at several concurrency levels (or rates, or a --trace's speedups), repeated, with statistics and plots.

    Any `ipw-async run` option may follow (e.g. -n 100 --dataset synthetic --base-url URL); every run draws the same queries (same dataset and --max-queries); repeat r runs with seed + r (arrivals and the simulator), while synthetic lengths keep the base seed so every repeat sends the same queries. With --trace FILE the levels are its speedups (--speedup 0.5,1,2,4), each one replay of the trace; the table gives the rate each offers.

    Writes raw_runs.csv, summary_stats.csv/.json, the Pareto frontiers, summary.json (levels accepted or rejected by the constraints or for over-saturation, the best, and the throughput and energy knees), plots and report.html under OUTPUT_DIR/sweep/. Ctrl-C, SIGTERM or SIGHUP stops the sweep (exit 130, 143, 129) and still writes the results of the runs that finished.
    """
    from ..analysis.sweep import knee_lines
    from ..harness.sweep import default_sweep_dir, run_sweep, stop_code

    try:
        options = parse_run_args(ctx.args)
    except typer.TyperException as exc:  # typer's own click: a bad or unknown run option
        raise fail(f"{exc.format_message()} (in the run options passed through to each run)") from None
    base = run_config(options)
    out_dir = output_dir or default_sweep_dir(base)
    constraints = {
        "max_ttft_ms": max_ttft_ms,
        "max_tpot_ms": max_tpot_ms,
        "max_j_per_query": max_j_per_query,
        "min_accuracy": min_accuracy,
        "min_throughput": min_throughput,
    }
    quiet = bool(options.get("quiet"))
    try:
        result = run_sweep(
            base,
            _numbers(concurrency, int, "--concurrency"),
            _numbers(rate, float, "--rate"),
            repeats,
            out_dir,
            constraints,
            display=None,
            progress=None if quiet else _progress_line,
            reset_prefix_cache=reset_prefix_cache,
            note=lambda line: err.print(f"[yellow]note:[/] {escape(line)}"),
            speedups=_numbers(speedup, float, "--speedup"),
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    if not quiet:
        out.print(_sweep_table(result))
        for line in knee_lines(result.summary["knees"]):
            out.print(line, markup=False)
        for name, reason in result.plots.skipped.items():
            out.print(f"[yellow]plot skipped[/] {name}: {reason}")
    report_page(result.sweep_dir)
    if mlflow:  # after the page, so the parent run carries it
        Exports(mlflow=True, mlflow_experiment=mlflow_experiment)(result.sweep_dir)
    if result.interrupted:
        err.print(f"[yellow]interrupted:[/] results of the runs that finished are in {result.sweep_dir}")
        raise typer.Exit(stop_code(result))
    raise typer.Exit(0 if result.summary["counts"]["runs_failed"] == 0 else 1)


def _progress_line(row: dict[str, Any], done: int, total: int) -> None:
    from ..analysis.compare import format_figure

    head = f"{'[simulated] ' if row['simulated'] else ''}[{done}/{total}] {row['level']} r{row['repeat']} seed {row['seed']}"
    if row["status"] != "ok":
        err.print(f"{escape(head)}: [red]{row['status']}[/] {escape(row['error'] or '')}", soft_wrap=True)
        return
    figures = " · ".join(
        f"{format_figure(k, row[k])}{suffix}"
        for k, suffix in (
            ("throughput_rps", ""),
            ("ttft_p50_s", " TTFT p50"),
            ("j_per_query", "/query"),
            ("j_per_token", "/token"),
            *((("j_per_task", "/task"),) if row.get("j_per_task") is not None else ()),
        )
    )
    err.print(f"{head}: {figures} → {row['run_dir']}", markup=False, soft_wrap=True)


def _sweep_table(result: SweepResult) -> Table:
    table = Table(title=f"ipw-async sweep → {result.sweep_dir}", header_style="bold", title_justify="left")
    tasks = any(lv["means"].get("j_per_task") is not None for lv in result.levels)
    columns = (
        ("level", "runs ok", "J/task ± CI", "tasks/s", "task p50", "success", "TTFT p50", "verdict")
        if tasks
        else ("level", "runs ok", "J/query ± CI", "J/token ± CI", "tok/s", "TTFT p50", "verdict")
    )
    trace = result.summary.get("trace")
    if trace is not None:  # a speedup's load in the trace's own units a second
        columns = (columns[0], f"offered {trace['unit']}/s", *columns[1:])
    for col in columns:
        table.add_column(col, justify="left" if col in ("level", "verdict") else "right")
    for lv in result.levels:
        s = lv["stats"]
        offered = () if trace is None else (fmt(trace["offered_per_s"][lv["level"]], ",.3g"),)
        if tasks:
            figures = (
                f"{fmt(s['j_per_task']['mean'], ',.3g')} ± {fmt(s['j_per_task']['ci95'], '.2g')}",
                fmt(s["tasks_per_s"]["mean"], ",.2f"),
                fmt(s["task_wall_p50_s"]["mean"], ",.2f", " s"),
                fmt(s["task_success"]["mean"], ".1%"),
            )
        else:
            figures = (
                f"{fmt(s['j_per_query']['mean'], ',.3g')} ± {fmt(s['j_per_query']['ci95'], '.2g')}",
                f"{fmt(s['j_per_token']['mean'], ',.3g')} ± {fmt(s['j_per_token']['ci95'], '.2g')}",
                fmt(s["throughput_tok_s"]["mean"], ",.0f"),
            )
        table.add_row(
            lv["level"],
            *offered,
            f"{lv['ok_runs']}/{lv['runs']}",
            *figures,
            fmt(s["ttft_p50_s"]["mean"] and s["ttft_p50_s"]["mean"] * 1000, ",.1f", " ms"),
            "accepted" if lv["accepted"] else "rejected: " + "; ".join(lv["reasons"]),
        )
    return table


def compare(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(help="Two or more run directories to put side by side.", show_default=False),
    ],
) -> None:
    """Show the headline figures of several runs side by side ('—' where a run did not measure one)."""
    from ..analysis.compare import compare_runs, compare_table
    from ..rundir import RunDirError

    for run_dir in run_dirs:
        finish_first(run_dir)
    try:
        compared = compare_runs(run_dirs)
    except RunDirError as exc:
        raise fail(str(exc)) from None
    out.print(compare_table(compared))


def register(app: typer.Typer) -> None:
    """Add the analysis commands to ``app``."""
    app.command("analyze")(analyze)
    app.command("plot")(plot)
    app.command("sweep", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(sweep)
    app.command("compare")(compare)
