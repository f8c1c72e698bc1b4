"""``export`` (ipw, otel, mlflow) and ``report``: a finished run where its users already look.

``run`` and ``sweep`` take the same exports as options (``--otlp-endpoint``, ``--mlflow``),
made once the run's files are complete; an export that fails is a warning, never the run's
failure: the run directory is already whole.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ..harness.panels import OUTPUT
from ..rundir.manifest import RunDirError
from ._common import Debug, err, fail, finish_first, out

RunArg = Annotated[
    Path, typer.Argument(help="A run directory written by `ipw-async run`.", show_default=False)
]
RunOrSweepArg = Annotated[
    Path,
    typer.Argument(
        help="A run directory, or a sweep directory written by `ipw-async sweep`.", show_default=False
    ),
]
_OTLP_HELP = (
    "OTLP/HTTP endpoint (e.g. http://localhost:4318) to send one span per request to, with "
    "attributed energy; headers (auth) from OTEL_EXPORTER_OTLP_HEADERS."
)
_MLFLOW_HELP = "Log params, metrics and artifacts to MLflow (the tracking URI from MLFLOW_TRACKING_URI)."
_EXPERIMENT_HELP = "MLflow experiment to log to (made if missing)."


def _option(name: str, default: Any, annotation: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


EXPORT_PARAMETERS = [
    _option(
        "otlp_endpoint",
        None,
        Annotated[
            str | None,
            typer.Option(envvar="OTEL_EXPORTER_OTLP_ENDPOINT", help=_OTLP_HELP, rich_help_panel=OUTPUT),
        ],
    ),
    _option(
        "mlflow", False, Annotated[bool, typer.Option("--mlflow", help=_MLFLOW_HELP, rich_help_panel=OUTPUT)]
    ),
    _option(
        "mlflow_experiment",
        "ipw-async",
        Annotated[str, typer.Option(help=_EXPERIMENT_HELP, rich_help_panel=OUTPUT)],
    ),
]


@dataclass(frozen=True)
class Exports:
    """The exports asked for on ``run`` or ``sweep``, made once the directory is complete."""

    otlp_endpoint: str | None = None
    mlflow: bool = False
    mlflow_experiment: str = "ipw-async"

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> Exports:
        return cls(options.get("otlp_endpoint"), bool(options.get("mlflow")), options["mlflow_experiment"])

    def __call__(self, path: Path) -> None:
        """Export ``path``; each failure is one warning line (the run's files are unaffected)."""
        from ..export import ExportError

        steps: list[tuple[str, Callable[[], str]]] = []
        if self.otlp_endpoint and (path / "run.json").is_file():
            steps.append(("OpenTelemetry", lambda: _otel(path, self.otlp_endpoint or "")))
        if self.mlflow:
            steps.append(("MLflow", lambda: _mlflow(path, None, self.mlflow_experiment)))
        for name, step in steps:
            try:
                out.print(step(), markup=False)
            except (ExportError, RunDirError) as exc:
                err.print(f"[yellow]{name} export skipped:[/] {escape(str(exc))}")
            except Exception as exc:  # the run's files are whole: an exporter's fault stays a warning
                if Debug.on:
                    raise
                err.print(
                    f"[yellow]{name} export failed:[/] {escape(str(exc))} (rerun with --debug for the traceback)"
                )


def _otel(run_dir: Path, endpoint: str, timeout_s: float = 10.0) -> str:
    from ..export.otel import export_otel

    done = export_otel(run_dir, endpoint, timeout_s=timeout_s)
    spans = ", ".join(f"{n} {kind}" for kind, n in done.spans.items() if n)
    return f"OpenTelemetry: sent {spans} spans to {done.endpoint}"


def _mlflow(path: Path, tracking_uri: str | None, experiment: str) -> str:
    from ..export.mlflow import export_mlflow

    done = export_mlflow(path, tracking_uri=tracking_uri, experiment=experiment)
    children = f" with {done.children} child runs" if done.children else ""
    return f"MLflow: run {done.run_id}{children} in experiment {done.experiment!r} at {done.tracking_uri}"


def _exporting(make: Callable[[], str]) -> None:
    """Run an export command's step: its line on success, a one-line error otherwise."""
    from ..export import ExportError

    try:
        line = make()
    except (ExportError, RunDirError) as exc:
        raise fail(str(exc)) from None
    out.print(line, markup=False)


def ipw(run_dir: RunArg) -> None:
    """Write RUN_DIR/dataset in IPW's Hugging Face layout (datasets.load_from_disk reads it).

    finalize writes it for every run; this makes it for a run finished by an earlier version.
    """
    from ..export.ipw import export_ipw

    finish_first(run_dir)
    _exporting(lambda: f"written: {export_ipw(run_dir)} (datasets.load_from_disk reads it)")


def otel(
    run_dir: RunArg,
    endpoint: Annotated[
        str,
        typer.Option(
            envvar="OTEL_EXPORTER_OTLP_ENDPOINT", help="OTLP/HTTP endpoint, e.g. http://localhost:4318."
        ),
    ],
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the endpoint before giving up.")] = 10.0,
) -> None:
    """Send the run as OpenTelemetry GenAI spans: one chat span per request (tasks and tool
    calls for agentic runs), each with its attributed energy and band.

    Headers (an auth token) come from OTEL_EXPORTER_OTLP_HEADERS, as for any OTLP exporter.
    """
    finish_first(run_dir)
    _exporting(lambda: _otel(run_dir, endpoint, timeout))


def mlflow(
    path: RunOrSweepArg,
    tracking_uri: Annotated[
        str | None,
        typer.Option(help="MLflow tracking URI. Default: MLFLOW_TRACKING_URI, else MLflow's own default."),
    ] = None,
    experiment: Annotated[str, typer.Option(help=_EXPERIMENT_HELP)] = "ipw-async",
) -> None:
    """Log a run (or a sweep: a parent run with a child per level) to MLflow: config as params,
    throughput, latency percentiles, J/query, J/token, IPJ and IPW as metrics, and the summary,
    plots and report as artifacts."""
    finish_first(path)
    _exporting(lambda: _mlflow(path, tracking_uri, experiment))


def report(
    path: RunOrSweepArg,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Where to write the page. Default: report.html in the directory."
        ),
    ] = None,
) -> None:
    """Write report.html: one self-contained page (headline, figures, power model, provenance)
    that opens in any browser with no network."""
    from ..analysis.html_report import write_report

    finish_first(path)
    try:
        written = write_report(path, output)
    except (RunDirError, ValueError) as exc:
        raise fail(str(exc)) from None
    out.print(f"written: {written}", markup=False)


def report_page(path: Path) -> None:
    """report.html beside ``analyze``'s files; a page that cannot be drawn is a warning."""
    from ..analysis.html_report import write_report

    try:
        out.print(f"written: {write_report(path)}", markup=False)
    except (RunDirError, ValueError) as exc:
        err.print(f"[yellow]report.html skipped:[/] {escape(str(exc))}")


def register(app: typer.Typer) -> None:
    """Add ``export`` (with its three targets) and ``report`` to ``app``."""
    exports = typer.Typer(
        no_args_is_help=True,
        help="Export a finished run: IPW's dataset layout, OpenTelemetry spans, or MLflow.",
    )
    exports.command("ipw")(ipw)
    exports.command("otel")(otel)
    exports.command("mlflow")(mlflow)
    app.add_typer(exports, name="export")
    app.command("report")(report)
