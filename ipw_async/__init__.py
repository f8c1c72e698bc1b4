"""ipw-async: concurrent streaming benchmarks of LLM inference, with per-query energy."""

from .datasets import Dataset, DatasetError, Query
from .energy import AttributionConfig, attribute
from .io import read_arrow
from .records import RequestRecord, Status
from .runner import RunConfig, RunError, RunResult, run, run_benchmark
from .traces import QueryTrace, Turn

__version__ = "0.1.0"

__all__ = [
    "AttributionConfig",
    "Dataset",
    "DatasetError",
    "Query",
    "QueryTrace",
    "RequestRecord",
    "RunConfig",
    "RunError",
    "RunResult",
    "Status",
    "Turn",
    "attribute",
    "read_arrow",
    "run",
    "run_benchmark",
]
