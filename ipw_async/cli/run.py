"""``run``, ``finalize`` and ``sim``: thin shells over :func:`run_benchmark`, :func:`finalize`
and the simulator's :func:`serve`, each imported when its command runs: ``--help`` and a bad
option answer without loading the run, the finisher and their solvers."""

from __future__ import annotations

import inspect
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from .._loop import run as run_loop
from ..errors import RunAborted, RunError, stop_signal
from ..harness.config import RunConfig
from ..harness.display import Display
from ..rundir import RunDir
from ..rundir.manifest import RunDirError
from ..sim.config import SimConfig
from ..sim.faults import Faults
from ..sim.physics import EngineConfig
from ._common import Debug, err, fail, out
from .export import EXPORT_PARAMETERS, Exports
from .judge import JUDGE_PARAMETERS, Judging
from .options import RUN_PARAMETERS, parameters, run_config, values_for, with_parameters

if TYPE_CHECKING:
    from ..results import RunResult

    Start = Callable[[RunConfig, Display], Coroutine[Any, Any, RunResult]]


def display_for(dashboard: bool, quiet: bool) -> Display:
    """The live dashboard on a terminal; plain lines in a log or pipe; nothing with --quiet."""
    from ..progress import LinesDisplay

    if dashboard and not quiet and sys.stderr.isatty():
        from ..dashboard import Dashboard

        return Dashboard()
    return LinesDisplay(quiet=quiet)


def execute(
    config: RunConfig,
    display: Display,
    exports: Exports | None = None,
    judging: Judging | None = None,
    start: Start | None = None,
) -> int:
    """Run (``start``: a benchmark, the default, or a proxy's run) with one-line errors, then
    judge its answers (``judging``) and make the ``exports`` asked for, so they carry the judged
    results; the exit code says how the run ended (0 ok, 1 partial, 2 unusable, 3 not valid for
    publishing with ``--require-valid``, 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP: 128 + the stop
    signal's number). A proxy's run ends normally on a stop signal (0)."""
    if start is None:
        from ..harness.live import run_benchmark

        start = run_benchmark
    try:
        result = run_loop(start(config, display))
    except RunError as exc:
        if Debug.on:
            raise
        err.print(f"[bold red]error:[/] {escape(str(exc))}")
        return 1 if isinstance(exc, RunAborted) else 2
    except KeyboardInterrupt as exc:
        on_disk = "the records measured so far are on disk (summary says complete: false)"
        err.print(f"[yellow]{_stopped(exc)}:[/] {on_disk}")
        return 128 + stop_signal(exc)
    code = 0 if result.complete else 1
    if judging is not None:  # after the run's measured window, tail and finalize: not in its energy
        try:
            judging(result.run_dir, code)
        except KeyboardInterrupt as exc:
            kept = f"the run's files are finished; the verdicts so far are in {result.run_dir}"
            err.print(f"[yellow]{_stopped(exc)}:[/] {kept}")
            return 128 + stop_signal(exc)
    if exports is not None:
        exports(result.run_dir)
    if config.require_valid and code == 0:
        return _validity_code(result.run_dir)
    return code


def _validity_code(run_dir: Path) -> int:
    """3, with its reasons in one line, where the finished run is not valid for publishing."""
    validity = (RunDir.open(run_dir).summary or {}).get("validity") or {}
    if validity.get("verdict") == "valid":
        return 0
    why = validity.get("reasons") or [f"could not tell: {u}" for u in validity.get("unknown") or []]
    err.print(f"[bold red]error:[/] not valid for publishing (--require-valid): {escape('; '.join(why))}")
    return 3


def _stopped(exc: KeyboardInterrupt) -> str:
    sig = stop_signal(exc)
    return "interrupted" if sig == signal.SIGINT else f"stopped by {sig.name}"


def run(ctx: typer.Context, **options: Any) -> None:
    """Stream requests at a fixed concurrency or arrival rate; measure latency and per-query energy.

    With no --base-url this starts the built-in simulator (a real HTTP server in its own
    process, with a simulated device) and labels everything as simulated.
    """
    config = run_config(options)
    try:
        config.validate()  # a bad option is refused before the run's machinery loads
    except RunError as exc:
        if Debug.on:
            raise
        raise fail(str(exc)) from None
    judging = Judging.from_options(options)
    display = display_for(not options["no_dashboard"], options["quiet"])
    raise typer.Exit(execute(config, display, Exports.from_options(options), judging))


# the run's settings that finalize can change: how its energy is attributed
FINALIZE_SETTINGS = (
    "attribution",
    "context_cost",
    "capture_sizes",
    "prefill_weight",
    "power_model",
    "baseline_w",
)


def finalize_command(
    run_dir: Annotated[
        Path, typer.Argument(help="A run directory written by `ipw-async run`.", show_default=False)
    ],
    **settings: Any,
) -> None:
    """Re-attribute a run's energy from its own files, with other settings, without re-running it.

    Rewrites records.arrow (energy columns) and records.parquet, traces.jsonl, summary.json and
    dataset/ (IPW's layout); every other figure stays as measured. Its options are the run's
    energy options; with none it reproduces the run's own energy figures exactly.
    """
    from ..report import summary_table
    from ..results import finalize

    given = values_for(RunConfig, settings, FINALIZE_SETTINGS)
    try:
        result = finalize(run_dir, **given)
    except (RunDirError, ValueError) as exc:  # ValueError: an unknown rule or power-model effect
        raise fail(str(exc)) from None
    rule, own = result.summary["energy"].get("rule"), result.summary["config"]["attribution"]
    if rule is not None:
        whose = "the run's own" if rule == own else f"the run used {own}"
        out.print(f"energy attributed by the {rule} rule ({whose})")
    out.print(summary_table(result.summary, str(result.run_dir)))


def recover(
    run_dir: Annotated[
        Path, typer.Argument(help="The directory of a run that was killed or crashed.", show_default=False)
    ],
) -> None:
    """Rebuild a dead run's summary, traces and per-query energy from what it left on disk.

    Reads run.json, the whole batches of measured.arrow and telemetry.arrow and tasks.jsonl;
    marks the run complete: false with the reason; says how many requests were dispatched but
    never recorded (in flight at the end, or in its last unflushed second).
    """
    from ..report import summary_table
    from ..results import finalize

    try:
        result = finalize(run_dir)
    except RunDirError as exc:
        raise fail(str(exc)) from None
    lost = result.summary["loss"]
    state = (
        "ended normally"
        if result.summary["complete"]
        else f"did not finish: {result.summary['aborted'] or 'interrupted'}"
    )
    out.print(f"{run_dir}: the run {state}")
    out.print(
        f"recovered {lost['requests_on_disk']} requests; {lost['requests_not_recorded']} dispatched but not on disk"
        + (f"; {lost['tasks_not_logged']} tasks still running" if lost["tasks_not_logged"] else "")
    )
    out.print(summary_table(result.summary, str(result.run_dir)))


def sim(**options: Any) -> None:
    """Serve the built-in SIMULATED OpenAI-compatible server and device until Ctrl-C, SIGTERM or
    SIGHUP, its normal end (exit 0)."""
    from ..sim.server import serve

    host, port = options["host"], options["port"]
    try:
        config = SimConfig(
            engine=EngineConfig(**values_for(EngineConfig, options)),
            faults=Faults(**values_for(Faults, options)),
            **values_for(SimConfig, options),
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    try:
        run_loop(serve(config, host, port))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


SIM_ADDRESS = [
    inspect.Parameter(
        "host",
        inspect.Parameter.KEYWORD_ONLY,
        default="127.0.0.1",
        annotation=Annotated[str, typer.Option(help="Address to listen on (loopback by default).")],
    ),
    inspect.Parameter(
        "port",
        inspect.Parameter.KEYWORD_ONLY,
        default=8000,
        annotation=Annotated[int, typer.Option(help="Port (0: any free port).")],
    ),
]


def register(app: typer.Typer) -> None:
    app.command("run")(with_parameters(run, RUN_PARAMETERS + JUDGE_PARAMETERS + EXPORT_PARAMETERS))
    app.command("finalize")(
        with_parameters(finalize_command, parameters(RunConfig, FINALIZE_SETTINGS, "Default: the run's."))
    )
    app.command("recover")(recover)
    sim_parameters = SIM_ADDRESS + parameters(SimConfig) + parameters(EngineConfig) + parameters(Faults)
    app.command("sim")(with_parameters(sim, sim_parameters))
