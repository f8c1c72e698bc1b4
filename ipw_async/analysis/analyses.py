"""``analyze``: every analysis of one run directory, written to ``<run>/analysis/*.json``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..rundir import files
from ..rundir.read import RunDir
from .accuracy import accuracy_report
from .breakdown import energy_report
from .cache import cache_report
from .latency import latency_report
from .regression import regression_report
from .tasks import task_report

ANALYSES = ("accuracy", "regression", "latency", "energy", "tasks", "cache")


def _analyses(
    scorer: str | None, slo: dict[str, float] | None
) -> dict[str, Callable[[RunDir], dict[str, Any]]]:
    return {
        "accuracy": lambda run: accuracy_report(run, scorer),
        "regression": regression_report,
        "latency": lambda run: latency_report(run, slo),
        "energy": energy_report,
        "tasks": task_report,
        "cache": cache_report,
    }


def analyze(
    run_dir: RunDir | str | Path,
    analyses: str | list[str] = "all",
    scorer: str | None = None,
    slo: dict[str, float] | None = None,
    write: bool = True,
) -> dict[str, dict[str, Any]]:
    """Run the named analyses (or ``"all"``) on a run directory; returns them by name.

    With ``write`` each one is also saved as ``<run_dir>/analysis/<name>.json``. The run must
    have been finished (``ipw_async.finished`` finishes one that was cut short, as the CLI
    does); on what it is still missing, figures are null with a reason.
    """
    names = list(ANALYSES) if analyses == "all" else [analyses] if isinstance(analyses, str) else analyses
    unknown = [n for n in names if n not in ANALYSES]
    if unknown:
        raise ValueError(f"unknown analysis {', '.join(unknown)}; choose from {', '.join(ANALYSES)} or all")
    run = RunDir.open_finished(run_dir)
    funcs = _analyses(scorer, slo)
    header = {"run_dir": str(run.path), "complete": run.complete, "simulated": run.simulated}
    results = {name: header | funcs[name](run) for name in names}
    if write:
        run.analysis_dir.mkdir(exist_ok=True)
        for name, payload in results.items():
            files.write_json(run.analysis_dir / f"{name}.json", payload)
    return results
