"""``search``: a thin shell over :func:`ipw_async.harness.search.run_search`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from ._common import err, fail, out
from .options import parse_run_args, run_config

if TYPE_CHECKING:
    from ..harness.search import Probe, SearchResult


def search(
    ctx: typer.Context,
    slo: Annotated[
        list[str],
        typer.Option(
            metavar="SLO",
            help="A limit every probe must meet, repeatable: ttft_p99=500ms, tpot_p99=60ms, e2e_p95=10s "
            "(any percentile of ttft, tpot or e2e, in ms or s) or error_rate=1%.",
            show_default=False,
        ),
    ],
    over: Annotated[
        str, typer.Option(help="What the search varies: concurrency (streams) or rate (requests/s, Poisson).")
    ] = "concurrency",
    start: Annotated[
        float, typer.Option(help="The first probe's load; it doubles (or halves) from here.")
    ] = 1.0,
    max_load: Annotated[float, typer.Option(help="Never probe more load than this.")] = 1024.0,
    precision: Annotated[
        float,
        typer.Option(
            help="Stop when the bracket around the boundary and its 95% interval are both within this "
            "share of it (0.1: 10%)."
        ),
    ] = 0.1,
    max_probes: Annotated[
        int, typer.Option(help="Stop after this many probes (loads), wherever the search stands.")
    ] = 10,
    repeats: Annotated[
        int,
        typer.Option(
            help="Runs per probe (repeat r uses seed + r), their requests pooled; the boundary's "
            "interval then resamples the runs, then their requests, so it holds run-to-run spread."
        ),
    ] = 1,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir",
            "-o",
            help="Search directory: one run directory per probe, and search/ with search.json and "
            "search.png (default ./runs/search_<UTC time>_<model or sim>).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Find the most load the server takes within your SLOs, and what a query costs there.

    Any `ipw-async run` option may follow (e.g. -n 200 --dataset synthetic --base-url URL): every probe is such a run, into its own directory. Load doubles from --start until a probe breaks an SLO, then each probe goes where a monotone fit of the probes' SLO margins puts the boundary, until it is known to --precision.

    Prints the boundary with its bootstrap interval, the SLO that binds, a cliff flag, and J/query, J/token and IPJ at the most load that met every SLO; writes search/search.json and search/search.png. Ctrl-C, SIGTERM or SIGHUP stops the search after writing what the finished probes found (exit 130, 143, 129).
    """
    from ..analysis.search import Slo
    from ..errors import RunError
    from ..harness.search import default_search_dir, run_search

    try:
        slos = [Slo.parse(text) for text in slo]
        options = parse_run_args(ctx.args)
    except ValueError as exc:
        raise fail(str(exc)) from None
    except typer.TyperException as exc:
        raise fail(f"{exc.format_message()} (in the run options passed through to each probe)") from None
    base = run_config(options)
    quiet = bool(options.get("quiet"))
    try:
        result = run_search(
            base,
            slos,
            mode=over,
            start=start,
            max_load=max_load,
            precision=precision,
            max_probes=max_probes,
            repeats=repeats,
            out_dir=output_dir or default_search_dir(base),
            progress=None if quiet else _progress_line,
        )
    except (ValueError, RunError) as exc:
        raise fail(str(exc)) from None
    out.print(_table(result))
    if result.stopped_by is not None:
        err.print(f"[yellow]interrupted:[/] the probes that finished are in {result.out_dir}")
        raise typer.Exit(128 + result.stopped_by)


def _progress_line(probe: Probe, count: int) -> None:
    verdict = "met every SLO" if probe.passed else "broke an SLO"
    if probe.status != "ok":
        verdict = f"{probe.status}: {probe.error}"
    margins = ", ".join(f"{k} {v:+.0%}" for k, v in probe.margins.items() if abs(v) != float("inf"))
    err.print(
        f"probe {count}: load {probe.load:g} {verdict} ({margins}) → {', '.join(map(str, probe.run_dirs))}",
        markup=False,
        soft_wrap=True,
    )


def _num(value: float | None, spec: str = ".3g") -> str:
    return "—" if value is None else format(value, spec)


def _table(result: SearchResult) -> Table:
    s = result.summary
    b = s["boundary"]
    simulated = "[SIMULATED] " if s["simulated"] else ""
    table = Table(
        title=f"{simulated}ipw-async search → {result.search_dir}", show_header=False, title_justify="left"
    )
    table.add_column(style="bold")
    table.add_column()
    table.add_row("SLOs", ", ".join(x["slo"] for x in s["slos"]))
    interval = b["interval95"]
    table.add_row(
        f"boundary ({s['mode']})",
        f"{_num(b['estimate'])}"
        + (f" (95% interval {_num(interval[0])}–{_num(interval[1])})" if interval else ""),
    )
    table.add_row("most load that met every SLO", _num(b["feasible_max"]))
    table.add_row("least load that broke one", _num(b["infeasible_min"]))
    table.add_row("binding SLO", b["binding_slo"] or "—")
    table.add_row("cliff", "yes: the margin falls off abruptly at the boundary" if b["cliff"] else "no")
    at = s["at_feasible_max"]
    if at:
        band = (
            f" (band {_num(at['j_per_query_low'])}–{_num(at['j_per_query_high'])})"
            if at.get("j_per_query_low") is not None
            else ""
        )
        table.add_row("J/query there", f"{_num(at['j_per_query'])} J{band}")
        table.add_row("J/output token there", f"{_num(at['j_per_token'])} J")
        table.add_row("IPJ there", _num(at["ipj"]))
    table.add_row("probes", str(len(s["probes"])))
    table.add_row("stopped", s["stop"])
    return table


def register(app: typer.Typer) -> None:
    app.command("search", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(search)
