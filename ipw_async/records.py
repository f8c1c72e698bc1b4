"""One request as measured: raw events on the run clock and the metrics derived from them.

Definitions (DESIGN.md rule 3), all times relative to the run's start on one monotonic clock:

- ``ttft_s`` = first token-bearing chunk − sent; null when no token arrived (never 0).
- ``e2e_latency_s`` = last token chunk − sent; ``stream_time_s`` = stream closed − sent.
- ``tpot_s`` = (e2e_latency − ttft) / (output_tokens − 1), defined for output_tokens ≥ 2.
- ``itl_s`` = gaps between successive token-bearing chunks, with ``chunk_tokens`` beside them.
- ``queue_s`` = dispatched − scheduled: time the harness held the request before sending it.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import polars as pl
import pyarrow as pa

from ._clock import NS

# Characters per token of English text on a typical tokenizer, as the simulator counts them: what
# stands in for a token count where there is none (a prompt made to a length, a prompt whose
# server reported no usage)
CHARS_PER_TOKEN = 4


class Status(StrEnum):
    OK = "ok"
    ERROR = "error"
    CANCELLED = "cancelled"


class ErrorType(StrEnum):
    CONNECT = "connect_error"  # could not open a connection
    TIMEOUT = "timeout"  # connect or read timeout
    HTTP = "http_error"  # non-2xx status
    STREAM = "stream_error"  # an error object inside a 200 stream
    DISCONNECT = "disconnected"  # the server closed the stream before [DONE]
    MALFORMED = "malformed_event"  # an SSE event that is not valid JSON
    NOT_STREAMING = "not_streaming"  # a 200 answer that is one JSON body, not an event stream
    CANCELLED = "cancelled"  # the run was interrupted while this request was in flight
    OTHER = "other"


@dataclass(slots=True)
class RequestRecord:
    """Everything measured for one request. Times are ns since run start (None: never happened)."""

    request_id: int
    query_id: str
    dataset: str
    prompt: str
    reference: str | None = None
    warmup: bool = False
    # the load unit this request served, and which session of the run sent it (0; k after the
    # k-th --resume); agentic and multi-turn runs: its task, and its place in the task
    unit_id: int | None = None
    session: int = 0
    task_id: int | None = None
    turn_index: int | None = None
    # timing events
    scheduled_ns: int = 0
    dispatched_ns: int | None = None
    sent_ns: int | None = None
    headers_ns: int | None = None
    first_event_ns: int | None = None
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    closed_ns: int | None = None
    # one entry per token-bearing chunk: arrival time, token count, server send time (if sent)
    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    chunk_server_ns: list[int | None] = field(default_factory=list)
    # content
    answer: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    tool_calls: list[dict[str, str | None]] = field(default_factory=list)  # id, name, arguments
    # token counts: from the server's usage when it sent one
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None  # of prompt_tokens, found in the server's prefix cache
    usage_output_tokens: int | None = None
    # the server's own timings where it reports them (llama.cpp), to hold TTFT/TPOT against
    server_prompt_ms: float | None = None
    server_tpot_ms: float | None = None
    # outcome
    status: Status = Status.OK
    http_status: int | None = None
    reconnects: int = 0  # times the request was re-sent because its pooled connection was closing
    error_type: ErrorType | None = None
    error_message: str | None = None
    correct: bool | None = None

    # -- derived metrics ----------------------------------------------------------------------

    @property
    def chunk_count(self) -> int:
        return len(self.chunk_ns)

    @property
    def output_tokens(self) -> int | None:
        if self.usage_output_tokens is not None:
            return self.usage_output_tokens
        return sum(self.chunk_tokens) if self.chunk_ns else None

    @property
    def output_tokens_source(self) -> str | None:
        if self.usage_output_tokens is not None:
            return "usage"
        return "chunks" if self.chunk_ns else None

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_ns is None or self.sent_ns is None:
            return None
        return (self.first_token_ns - self.sent_ns) / NS

    @property
    def e2e_latency_s(self) -> float | None:
        if self.last_token_ns is None or self.sent_ns is None:
            return None
        return (self.last_token_ns - self.sent_ns) / NS

    @property
    def stream_time_s(self) -> float | None:
        if self.closed_ns is None or self.sent_ns is None:
            return None
        return (self.closed_ns - self.sent_ns) / NS

    @property
    def tpot_s(self) -> float | None:
        tokens = self.output_tokens
        ttft, e2e = self.ttft_s, self.e2e_latency_s
        if tokens is None or tokens < 2 or ttft is None or e2e is None:
            return None
        return (e2e - ttft) / (tokens - 1)

    @property
    def itl_s(self) -> list[float]:
        ts = self.chunk_ns
        return [(b - a) / NS for a, b in itertools.pairwise(ts)]

    @property
    def queue_s(self) -> float | None:
        if self.dispatched_ns is None:
            return None
        return (self.dispatched_ns - self.scheduled_ns) / NS


def _opt_str(value: object) -> str | None:
    return str(value) if value else None


def _server_stamps(r: RequestRecord) -> list[int | None] | None:
    return r.chunk_server_ns if any(v is not None for v in r.chunk_server_ns) else None


_attr = operator.attrgetter
_TOOL_CALL = pl.Struct({"id": pl.String(), "name": pl.String(), "arguments": pl.String()})

# The columns of measured.arrow (records.arrow before energy), in one table: name, type, and how a record gives it.
COLUMNS: tuple[tuple[str, pl.DataType, Callable[[RequestRecord], object]], ...] = (
    ("request_id", pl.Int64(), _attr("request_id")),
    ("query_id", pl.String(), _attr("query_id")),
    ("dataset", pl.String(), _attr("dataset")),
    ("warmup", pl.Boolean(), _attr("warmup")),
    ("unit_id", pl.Int64(), _attr("unit_id")),
    ("session", pl.Int32(), _attr("session")),
    ("task_id", pl.Int64(), _attr("task_id")),
    ("turn_index", pl.Int32(), _attr("turn_index")),
    ("prompt", pl.String(), _attr("prompt")),
    ("reference", pl.String(), _attr("reference")),
    ("answer", pl.String(), _attr("answer")),
    ("reasoning", pl.String(), lambda r: r.reasoning or None),
    ("finish_reason", pl.String(), _attr("finish_reason")),
    ("tool_calls", pl.List(_TOOL_CALL), _attr("tool_calls")),
    ("correct", pl.Boolean(), _attr("correct")),
    ("status", pl.String(), lambda r: str(r.status)),
    ("http_status", pl.Int32(), _attr("http_status")),
    ("reconnects", pl.Int32(), _attr("reconnects")),
    ("error_type", pl.String(), lambda r: _opt_str(r.error_type)),
    ("error_message", pl.String(), _attr("error_message")),
    ("scheduled_ns", pl.Int64(), _attr("scheduled_ns")),
    ("dispatched_ns", pl.Int64(), _attr("dispatched_ns")),
    ("sent_ns", pl.Int64(), _attr("sent_ns")),
    ("headers_ns", pl.Int64(), _attr("headers_ns")),
    ("first_event_ns", pl.Int64(), _attr("first_event_ns")),
    ("first_token_ns", pl.Int64(), _attr("first_token_ns")),
    ("last_token_ns", pl.Int64(), _attr("last_token_ns")),
    ("closed_ns", pl.Int64(), _attr("closed_ns")),
    ("queue_s", pl.Float64(), _attr("queue_s")),
    ("ttft_s", pl.Float64(), _attr("ttft_s")),
    ("tpot_s", pl.Float64(), _attr("tpot_s")),
    ("e2e_latency_s", pl.Float64(), _attr("e2e_latency_s")),
    ("stream_time_s", pl.Float64(), _attr("stream_time_s")),
    ("itl_s", pl.List(pl.Float64()), _attr("itl_s")),
    ("chunk_ns", pl.List(pl.Int64()), _attr("chunk_ns")),
    ("chunk_tokens", pl.List(pl.Int32()), _attr("chunk_tokens")),
    ("chunk_server_ns", pl.List(pl.Int64()), _server_stamps),
    ("prompt_tokens", pl.Int64(), _attr("prompt_tokens")),
    ("cached_prompt_tokens", pl.Int64(), _attr("cached_prompt_tokens")),
    ("output_tokens", pl.Int64(), _attr("output_tokens")),
    ("output_tokens_source", pl.String(), _attr("output_tokens_source")),
    ("chunk_count", pl.Int64(), _attr("chunk_count")),
    ("server_prompt_ms", pl.Float64(), _attr("server_prompt_ms")),
    ("server_tpot_ms", pl.Float64(), _attr("server_tpot_ms")),
)

RECORD_SCHEMA: dict[str, pl.DataType] = {name: dtype for name, dtype, _ in COLUMNS}


def record_row(record: RequestRecord) -> dict[str, object]:
    """One record as a row of ``measured.arrow``."""
    return {name: get(record) for name, _, get in COLUMNS}


# The same as Arrow writes it: large strings and lists rather than view types, which every
# Arrow reader opens (rundir.files.to_arrow's level)
RECORD_ARROW_SCHEMA: pa.Schema = (
    pl.DataFrame(schema=RECORD_SCHEMA).to_arrow(compat_level=pl.CompatLevel.oldest()).schema
)


def records_table(records: list[RequestRecord]) -> pa.Table:
    """Records as an Arrow table of :data:`RECORD_ARROW_SCHEMA`, built a column at a time.

    The run's writer thread builds these while the event loop stamps tokens, and each C call
    that converts Python values holds the GIL throughout: pyarrow converts a column in one
    short call (about 0.1 ms for 32 records of 128 tokens), where polars' row-wise constructor
    held it for about 2 ms, and the loop with it.
    """
    columns = {
        name: pa.array([get(r) for r in records], type=arrow.type)
        for (name, _, get), arrow in zip(COLUMNS, RECORD_ARROW_SCHEMA, strict=True)
        if name != "itl_s"
    }
    columns["itl_s"] = _intervals(columns["chunk_ns"])
    return pa.table([columns[field.name] for field in RECORD_ARROW_SCHEMA], schema=RECORD_ARROW_SCHEMA)


def _intervals(chunk_ns: pa.LargeListArray) -> pa.LargeListArray:
    """Each record's inter-token latencies (s) from its chunk stamps, as :attr:`RequestRecord.itl_s`
    gives them, in a few array operations: built in Python, a float a token, they were a quarter
    of what a batch of records cost to build (1.0 against 0.78 ms for 32 records of 128 tokens)."""
    offsets = chunk_ns.offsets.to_numpy()
    stamps = chunk_ns.values.to_numpy()[offsets[0] : offsets[-1]]  # a slice's values are its parent's
    offsets = offsets - offsets[0]
    counts = np.maximum(np.diff(offsets) - 1, 0)
    within = np.ones(max(stamps.size - 1, 0), dtype=bool)
    starts = offsets[1:-1]
    within[np.unique(starts[(starts > 0) & (starts < stamps.size)]) - 1] = False  # one list to the next
    gaps = np.diff(stamps)[within] / NS
    itl_offsets = np.concatenate(([0], np.cumsum(counts)))
    return pa.LargeListArray.from_arrays(pa.array(itl_offsets, pa.int64()), pa.array(gaps, pa.float64()))


def records_frame(records: list[RequestRecord]) -> pl.DataFrame:
    """A typed polars frame of records, the schema of ``measured.arrow`` (``records.arrow`` before its energy columns)."""
    return pl.from_arrow(records_table(records))  # type: ignore[return-value]


def end_ns() -> pl.Expr:
    """When a request stopped occupying the server, as far as the client can tell: its stream
    closed, else its last token, else its response headers, else when it was sent."""
    return pl.coalesce("closed_ns", "last_token_ns", "headers_ns", "sent_ns")
