"""Query traces: one JSON line per query or task, with its turns (one for single-turn runs, one
per LLM call for agentic and multi-turn runs).

Per task, wall time is split into model time (its calls' streams, sent to closed), tool time,
think time, and the rest (``queue_s``: waiting for a slot under the load's cap, and harness
overhead). Energy is the sum of the turns' attributed energy; the device energy during the
task's tool waits is shown beside it, not charged to it (other tasks used the device then).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from ._clock import NS


@dataclass
class ToolCall:
    name: str
    latency_s: float | None = None
    ok: bool = True
    arguments: str | None = None
    output: str | None = None
    server: str | None = None  # the MCP server that ran it (None: in this process)
    result_bytes: int | None = None
    error: str | None = None  # why it failed, in one line


@dataclass
class TurnTrace:
    turn_index: int
    request_id: int
    input_tokens: int | None
    output_tokens: int | None
    ttft_s: float | None
    e2e_latency_s: float | None
    cached_input_tokens: int | None = None
    stream_time_s: float | None = None
    energy_j: float | None = None
    energy_provenance: str | None = None
    power_w: float | None = None
    cost_usd: float | None = None
    status: str = "ok"
    error_type: str | None = None
    think_s: float | None = None
    tools_called: list[ToolCall] = field(default_factory=list)

    @property
    def tool_latency_s(self) -> float | None:
        """The turn's tool time; null when a call's latency was not measured (a trace written
        elsewhere), rather than counting it as no time."""
        return _total((t.latency_s for t in self.tools_called), empty=0.0)

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in _TURN_FIELDS}
        out["tools_called"] = [vars(call).copy() for call in self.tools_called]
        out["tool_latency_s"] = self.tool_latency_s
        return out


@dataclass
class QueryTrace:
    query_id: str
    dataset: str
    prompt: str
    reference: str | None
    answer: str | None
    correct: bool | None
    status: str  # ok/error for a single request; a task's outcome (answered, max_turns, …)
    completed: bool
    warmup: bool
    turns: list[TurnTrace]
    task_id: int | None = None
    total_wall_clock_s: float | None = None
    model_s: float | None = None
    tool_s: float | None = None
    think_s: float | None = None
    queue_s: float | None = None
    tool_wait_device_j: float | None = None  # device energy during tool waits, not charged
    judge_error: str | None = None  # why an LLM judge left ``correct`` null (judge.jsonl has the rest)

    @property
    def energy_j(self) -> float | None:
        """Sum over turns; null when any turn's energy is unknown (missing is not zero)."""
        return _total(t.energy_j for t in self.turns)

    @property
    def cost_usd(self) -> float | None:
        return _total(t.cost_usd for t in self.turns)

    def to_json(self) -> bytes:
        """One line of traces.jsonl (UTF-8, compact)."""
        # field by field: dataclasses.asdict deep-copies every value, and was most of the time
        # writing 100,000 traces took
        payload = {name: getattr(self, name) for name in _QUERY_FIELDS}
        payload["turns"] = [turn.as_dict() for turn in self.turns]  # in its place: fields keep their order
        payload["energy_j"] = self.energy_j
        payload["cost_usd"] = self.cost_usd
        # msgspec: a third of json.dumps's time (0.17 against 0.53 s for 20,000 traces)
        try:
            return _ENCODER.encode(payload)
        except UnicodeEncodeError:  # a lone surrogate (a file name a tool read): escaped, not lost
            return json.dumps(payload, default=_plain).encode("ascii")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> QueryTrace:
        turns = [
            TurnTrace(
                **{**_known(TurnTrace, t), "tools_called": [ToolCall(**c) for c in t.get("tools_called", [])]}
            )
            for t in raw.get("turns", [])
        ]
        return cls(**{**_known(cls, raw), "turns": turns})

    @staticmethod
    def load_jsonl(path: str | Path) -> list[QueryTrace]:
        with Path(path).open(encoding="utf-8") as f:
            return [QueryTrace.from_dict(json.loads(line)) for line in f if line.strip()]


def _plain(value: Any) -> Any:
    """A value msgspec does not encode itself: a NumPy scalar as the Python number it holds
    (msgspec would write a float64 as a string), anything else as its text."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


_ENCODER = msgspec.json.Encoder(enc_hook=_plain)
_TURN_FIELDS = tuple(f.name for f in fields(TurnTrace))
_QUERY_FIELDS = tuple(f.name for f in fields(QueryTrace))


def _known(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    """The fields a dataclass takes (derived values written beside them are dropped)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in raw.items() if k in names}


def _total(values: Iterable[float | None], empty: float | None = None) -> float | None:
    """The sum, null when any value is (missing is not zero); ``empty`` when there are none."""
    items = list(values)
    if not items:
        return empty
    return None if any(v is None for v in items) else sum(items)  # type: ignore[arg-type]


def parse_price(text: str | None) -> tuple[float, float] | None:
    """``IN/OUT`` in USD per million tokens as USD per input and per output token."""
    if text is None:
        return None
    try:
        a, b = (float(x) / 1e6 for x in text.split("/"))
    except ValueError:
        raise ValueError(
            f"--price {text!r}: expected IN/OUT in USD per million tokens, e.g. 0.15/0.60"
        ) from None
    return a, b


def _cost(row: dict[str, Any], prices: tuple[float, float] | None) -> float | None:
    if prices is None or row["prompt_tokens"] is None or row["output_tokens"] is None:
        return None
    return row["prompt_tokens"] * prices[0] + row["output_tokens"] * prices[1]


def _turn(row: dict[str, Any], prices: tuple[float, float] | None, turn_index: int = 0) -> TurnTrace:
    return TurnTrace(
        turn_index=turn_index,
        request_id=row["request_id"],
        input_tokens=row["prompt_tokens"],
        cached_input_tokens=row["cached_prompt_tokens"],
        output_tokens=row["output_tokens"],
        ttft_s=row["ttft_s"],
        e2e_latency_s=row["e2e_latency_s"],
        stream_time_s=row["stream_time_s"],
        energy_j=row.get("energy_j"),
        energy_provenance=row.get("energy_provenance"),
        power_w=row.get("power_w"),
        cost_usd=_cost(row, prices),
        status=row["status"],
        error_type=row["error_type"],
    )


# what a trace takes as it is from a record row or a task log
_SHARED = ("query_id", "dataset", "prompt", "reference", "answer", "correct", "warmup")
# what a turn reads of a record row (the energy columns only where the run was attributed)
_TURN_COLUMNS = (
    "request_id",
    "prompt_tokens",
    "cached_prompt_tokens",
    "output_tokens",
    "ttft_s",
    "e2e_latency_s",
    "stream_time_s",
    "energy_j",
    "energy_provenance",
    "power_w",
    "status",
    "error_type",
)


def traces_from_records(frame: pl.DataFrame, prices: tuple[float, float] | None = None) -> list[QueryTrace]:
    """One single-turn trace per request row (energy columns used when present)."""
    traces = []
    # the columns a trace reads: a record's token timestamps (lists) cost most of a row's copy
    wanted = {*_SHARED, *_TURN_COLUMNS, "queue_s", "judge_error"}
    for row in frame.select([c for c in frame.columns if c in wanted]).iter_rows(named=True):
        traces.append(
            QueryTrace(
                **{key: row[key] for key in _SHARED},
                status=row["status"],
                completed=row["status"] == "ok",
                turns=[_turn(row, prices)],
                total_wall_clock_s=row["stream_time_s"],
                model_s=row["stream_time_s"],
                queue_s=row["queue_s"],
                judge_error=row.get("judge_error"),
            )
        )
    return traces


COMPLETED = ("answered", "completed")  # task outcomes that reached the end of the task


def traces_from_tasks(
    tasks: list[dict[str, Any]],
    rows: dict[int, dict[str, Any]],
    prices: tuple[float, float] | None = None,
    tool_wait_j: list[float | None] | None = None,
) -> list[QueryTrace]:
    """One trace per task log (``tasks.jsonl``), its turns from the attributed records' rows
    (by request id)."""
    traces = []
    for i, task in enumerate(tasks):
        turns, think, lost = [], 0.0, False
        for logged in task["turns"]:
            row = rows.get(logged["request_id"])
            if row is None:  # a call the records file lost (a crash before its flush)
                lost = True
                continue
            turn = _turn(row, prices, logged["turn_index"])
            turn.think_s = logged.get("think_s")
            turn.tools_called = [
                ToolCall(
                    t["name"],
                    t["latency_s"],
                    t["ok"],
                    t.get("arguments"),
                    t.get("output"),
                    t.get("server"),
                    t.get("result_bytes"),
                    t.get("error"),
                )
                for t in logged["tools"]
            ]
            think += turn.think_s or 0.0
            turns.append(turn)
        wall = None
        if task.get("ended_ns") is not None:
            wall = (task["ended_ns"] - task["scheduled_ns"]) / NS
        # A lost call's time is unknown, and an unmeasured tool wait's, so then is the queue's
        # (the rest); a call that never reached the server (no stream time) spent none there
        model = None if lost else sum(t.stream_time_s or 0.0 for t in turns)
        tool = None if lost else _total((t.tool_latency_s for t in turns), empty=0.0)
        traces.append(
            QueryTrace(
                **{key: task[key] for key in _SHARED},
                status=task["outcome"],
                completed=task["outcome"] in COMPLETED,
                turns=turns,
                task_id=task["task_id"],
                total_wall_clock_s=wall,
                model_s=model,
                tool_s=tool,
                think_s=think,
                queue_s=None
                if wall is None or model is None or tool is None
                else max(0.0, wall - model - tool - think),
                tool_wait_device_j=None if tool_wait_j is None else tool_wait_j[i],
                judge_error=task.get("judge_error"),
            )
        )
    return traces


def tool_waits(task: dict[str, Any], rows: dict[int, dict[str, Any]]) -> list[tuple[int, int]]:
    """The task's tool waits on the run clock: from a turn's stream closing to the next call's send."""
    waits = []
    turns = task["turns"]
    for k, logged in enumerate(turns):
        row = rows.get(logged["request_id"])
        if not logged["tools"] or row is None:
            continue
        start = row["closed_ns"] if row["closed_ns"] is not None else row["last_token_ns"]
        following = rows.get(turns[k + 1]["request_id"]) if k + 1 < len(turns) else None
        end = following["sent_ns"] if following is not None else task.get("ended_ns")
        if start is not None and end is not None and end > start:
            waits.append((start, end))
    return waits


def write_traces(path: Path, traces: list[QueryTrace]) -> None:
    with path.open("wb") as f:
        for trace in traces:
            f.write(trace.to_json() + b"\n")
