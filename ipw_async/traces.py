"""Query traces: one JSON line per query with its turns (one for single-turn runs, many for agents)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl


@dataclass
class ToolCall:
    name: str
    latency_s: float | None = None
    ok: bool = True


@dataclass
class Turn:
    turn: int
    request_id: int
    input_tokens: int | None
    output_tokens: int | None
    ttft_s: float | None
    e2e_latency_s: float | None
    energy_j: float | None = None
    energy_provenance: str | None = None
    mean_power_w: float | None = None
    status: str = "ok"
    error_type: str | None = None
    tools: list[ToolCall] = field(default_factory=list)


@dataclass
class QueryTrace:
    query_id: str
    dataset: str
    prompt: str
    reference: str | None
    answer: str
    correct: bool | None
    status: str
    warmup: bool
    turns: list[Turn]

    @property
    def energy_j(self) -> float | None:
        """Sum over turns; null when any turn's energy is unknown (missing is not zero)."""
        values = [t.energy_j for t in self.turns]
        return None if not values or any(v is None for v in values) else sum(values)  # type: ignore[arg-type]

    def to_json(self) -> str:
        payload = asdict(self)
        payload["energy_j"] = self.energy_j
        return json.dumps(payload, default=str)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> QueryTrace:
        raw = dict(raw)
        raw.pop("energy_j", None)
        turns = [
            Turn(**{**t, "tools": [ToolCall(**c) for c in t.get("tools", [])]}) for t in raw.pop("turns", [])
        ]
        return cls(turns=turns, **raw)

    @staticmethod
    def load_jsonl(path: str | Path) -> list[QueryTrace]:
        with Path(path).open(encoding="utf-8") as f:
            return [QueryTrace.from_dict(json.loads(line)) for line in f if line.strip()]


def _get(row: dict[str, Any], key: str) -> Any:
    return row.get(key)


def traces_from_records(frame: pl.DataFrame) -> list[QueryTrace]:
    """One single-turn trace per request row (energy columns used when present)."""
    traces = []
    for row in frame.iter_rows(named=True):
        turn = Turn(
            turn=0,
            request_id=row["request_id"],
            input_tokens=row["prompt_tokens"],
            output_tokens=row["output_tokens"],
            ttft_s=row["ttft_s"],
            e2e_latency_s=row["e2e_latency_s"],
            energy_j=_get(row, "energy_j"),
            energy_provenance=_get(row, "energy_provenance"),
            mean_power_w=_get(row, "power_w"),
            status=row["status"],
            error_type=row["error_type"],
        )
        traces.append(
            QueryTrace(
                query_id=row["query_id"],
                dataset=row["dataset"],
                prompt=row["prompt"],
                reference=row["reference"],
                answer=row["answer"],
                correct=row["correct"],
                status=row["status"],
                warmup=row["warmup"],
                turns=[turn],
            )
        )
    return traces


def write_traces(path: Path, traces: list[QueryTrace]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for trace in traces:
            f.write(trace.to_json() + "\n")
