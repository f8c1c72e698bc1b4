"""ipw-async: concurrent streaming benchmarks of LLM inference, with per-query energy.

The public names load their module on first use: a process that needs one part (the sampler's
own process, a worker, the simulator) imports that part alone, not scipy and the whole harness
(1.2 s of imports on a 2-core host, where the sampler's process starts in a fifth of it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names
from ._version import __version__ as __version__

_EXPORTS: dict[str, str] = {
    "AttributionConfig": "energy",
    "attribute": "energy",
    "RunAborted": "errors",
    "RunError": "errors",
    "RunConfig": "harness",
    "run": "harness",
    "run_benchmark": "harness",
    "RequestRecord": "records",
    "Status": "records",
    "RunResult": "results",
    "finalize": "results",
    "finished": "results",
    "RunDir": "rundir",
    "RunDirError": "rundir",
    "read_arrow": "rundir.files",
    "QueryTrace": "traces",
    "ToolCall": "traces",
    "TurnTrace": "traces",
    "Dataset": "workload",
    "DatasetError": "workload",
    "Query": "workload",
    "TaskLog": "workload",
    "Workload": "workload",
    "WorkUnit": "workload",
    "Tool": "workload.tools",
    "Toolbox": "workload.tools",
    "ToolLatency": "workload.tools",
}

# three lists of one set of names (ruff and type checkers need each spelled out): a test in
# tests/test_layering.py checks that they agree
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

if TYPE_CHECKING:
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

__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())
