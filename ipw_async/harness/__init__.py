"""The harness: one run's config, the live session, its executor and directory, and finishing."""

from .config import RunConfig
from .directory import Manifest, RunDirError
from .errors import RunAborted, RunError
from .finalize import RunResult, finalize
from .session import Display, run, run_benchmark, workload_of

__all__ = [
    "Display",
    "Manifest",
    "RunAborted",
    "RunConfig",
    "RunDirError",
    "RunError",
    "RunResult",
    "finalize",
    "run",
    "run_benchmark",
    "workload_of",
]
