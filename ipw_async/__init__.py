"""ipw-async: concurrent streaming benchmarks of LLM inference, with per-query energy."""

from ._version import __version__ as __version__
from .energy import AttributionConfig, attribute
from .errors import RunAborted, RunError
from .harness import RunConfig, run, run_benchmark
from .records import RequestRecord, Status
from .results import RunResult, finalize, finished
from .rundir import RunDir, RunDirError
from .rundir.files import read_arrow
from .traces import QueryTrace, ToolCall, TurnTrace
from .workload import Dataset, DatasetError, Query, TaskLog, Workload, WorkUnit
from .workload.tools import Tool, Toolbox, ToolLatency

__all__ = [
    "AttributionConfig",
    "Dataset",
    "DatasetError",
    "Query",
    "QueryTrace",
    "RequestRecord",
    "RunAborted",
    "RunConfig",
    "RunDir",
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
    "finished",
    "read_arrow",
    "run",
    "run_benchmark",
]
