"""The harness: one run's config, the live session and its executor."""

from .config import RunConfig
from .session import Display, run, run_benchmark, workload_of

__all__ = ["Display", "RunConfig", "run", "run_benchmark", "workload_of"]
