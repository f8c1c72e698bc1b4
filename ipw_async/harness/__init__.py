"""The harness: one run's config and the live run (its ledger, where its units run, its files).

The public names load their module on first use: a worker process imports where units run,
not the run's opening, finishing and their solvers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

_EXPORTS: dict[str, str] = {
    "RunConfig": "config",
    "Display": "live",
    "run": "live",
    "run_benchmark": "live",
    "workload_of": "workloads",
}

__all__ = ["Display", "RunConfig", "run", "run_benchmark", "workload_of"]

if TYPE_CHECKING:
    from .config import RunConfig
    from .live import Display, run, run_benchmark
    from .workloads import workload_of

__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())
