"""ipw-async: concurrent streaming benchmarks of LLM inference, with per-query energy."""

from .energy import AttributionConfig, attribute
from .files import read_arrow
from .harness import RunAborted, RunConfig, RunDirError, RunError, RunResult, finalize, run, run_benchmark
from .records import RequestRecord, Status
from .traces import QueryTrace, Turn
from .workload import Dataset, DatasetError, Query, Workload, WorkUnit

__version__ = "0.2.0"

__all__ = [
    "AttributionConfig",
    "Dataset",
    "DatasetError",
    "Query",
    "QueryTrace",
    "RequestRecord",
    "RunAborted",
    "RunConfig",
    "RunDirError",
    "RunError",
    "RunResult",
    "Status",
    "Turn",
    "WorkUnit",
    "Workload",
    "attribute",
    "finalize",
    "read_arrow",
    "run",
    "run_benchmark",
]
