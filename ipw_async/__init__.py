"""ipw-async: concurrent streaming benchmarks of LLM inference, with per-query energy."""

from .energy import AttributionConfig, attribute
from .errors import RunAborted, RunError
from .harness import RunConfig, run, run_benchmark
from .records import RequestRecord, Status
from .results import RunResult, finalize
from .rundir.files import read_arrow
from .rundir.manifest import RunDirError
from .traces import QueryTrace, ToolCall, TurnTrace
from .workload import Dataset, DatasetError, Query, TaskLog, Workload, WorkUnit
from .workload.tools import Tool, Toolbox, ToolLatency

__version__ = "0.3.0"

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
    "TaskLog",
    "Tool",
    "ToolCall",
    "ToolLatency",
    "Toolbox",
    "TurnTrace",
    "WorkUnit",
    "Workload",
    "attribute",
    "finalize",
    "read_arrow",
    "run",
    "run_benchmark",
]
