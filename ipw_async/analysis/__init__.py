"""Turning run directories into answers: accuracy per joule, regressions, sweeps.

The public names load their module on first use: the CLI imports this package at every start
(to register its commands), and scipy and matplotlib should cost nothing to ``ipw-async run``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

_EXPORTS: dict[str, str] = {
    "analyze": "analyses",
    "ANALYSES": "analyses",
    "accuracy_report": "accuracy",
    "impute_energy": "accuracy",
    "correctness": "accuracy",
    "fit": "regression",
    "regression_report": "regression",
    "goodput": "latency",
    "latency_report": "latency",
    "parse_slo": "latency",
    "energy_report": "breakdown",
    "cache_report": "cache",
    "token_costs": "cache",
    "mean_ci": "repeats",
    "pareto_front": "pareto",
    "SweepResult": "sweep",
    "headline_figures": "headline",
    "compare_runs": "compare",
    "compare_table": "compare",
    "plot_run": "plots",
    "PlotReport": "plotting",
}

# three lists of one set of names (ruff and type checkers need each spelled out): a test in
# tests/test_layering.py checks that they agree
__all__ = [
    "ANALYSES",
    "PlotReport",
    "SweepResult",
    "accuracy_report",
    "analyze",
    "cache_report",
    "compare_runs",
    "compare_table",
    "correctness",
    "energy_report",
    "fit",
    "goodput",
    "headline_figures",
    "impute_energy",
    "latency_report",
    "mean_ci",
    "pareto_front",
    "parse_slo",
    "plot_run",
    "regression_report",
    "token_costs",
]

if TYPE_CHECKING:
    from .accuracy import accuracy_report, correctness, impute_energy
    from .analyses import ANALYSES, analyze
    from .breakdown import energy_report
    from .cache import cache_report, token_costs
    from .compare import compare_runs, compare_table
    from .headline import headline_figures
    from .latency import goodput, latency_report, parse_slo
    from .pareto import pareto_front
    from .plots import plot_run
    from .plotting import PlotReport
    from .regression import fit, regression_report
    from .repeats import mean_ci
    from .sweep import SweepResult

__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())
