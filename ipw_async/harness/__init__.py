"""The harness: one run's config and the live run (its ledger, where its units run, its files)."""

from .config import RunConfig
from .live import Display, run, run_benchmark
from .workloads import workload_of

__all__ = ["Display", "RunConfig", "run", "run_benchmark", "workload_of"]
