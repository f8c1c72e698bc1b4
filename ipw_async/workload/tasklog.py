"""What the harness saw of one multi-turn task: its turns, its tool calls, how it ended.

A task log is written to ``tasks.jsonl`` the moment its task ends; finishing joins it with the
attributed records (one per LLM call) into ``traces.jsonl``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .._clock import now_ns
from .tools import ToolResult

if TYPE_CHECKING:
    from ..records import RequestRecord


class Outcome(StrEnum):
    ANSWERED = "answered"  # the model gave a final answer
    COMPLETED = "completed"  # a replayed conversation ran all its turns
    MAX_TURNS = "max_turns"  # out of turns before an answer
    TIMEOUT = "timeout"  # past the task timeout before an answer
    ERROR = "error"  # an LLM call failed; the task cannot go on
    CANCELLED = "cancelled"  # the run stopped while the task was running


@dataclass
class TaskLog:
    task_id: int
    query_id: str
    dataset: str
    warmup: bool
    prompt: str
    reference: str | None
    scheduled_ns: int  # on the run clock, when the load driver scheduled the task
    turns: list[dict[str, Any]] = field(default_factory=list)
    outcome: Outcome | None = None
    answer: str | None = None
    correct: bool | None = None
    ended_ns: int | None = None
    subject: str | None = None  # a task file's, as given
    metadata: dict[str, Any] | None = None

    def turn(self, record: RequestRecord, think_s: float | None = None) -> None:
        """A turn's LLM call, logged as it starts (so a cancelled call is still in the task),
        with the user's think time before it."""
        self.turns.append(
            {
                "turn_index": record.turn_index,
                "request_id": record.request_id,
                "think_s": think_s,
                "tools": [],
            }
        )

    def tools(self, results: Sequence[ToolResult]) -> None:
        """The tool calls the last turn led to."""
        self.turns[-1]["tools"] = [r.as_dict() for r in results]

    def end(
        self, outcome: Outcome, t0_ns: int, answer: str | None = None, correct: bool | None = None
    ) -> None:
        self.outcome, self.answer, self.correct = outcome, answer, correct
        self.ended_ns = now_ns() - t0_ns

    def as_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "query_id": self.query_id,
            "dataset": self.dataset,
            "warmup": self.warmup,
            "prompt": self.prompt,
            "reference": self.reference,
            "answer": self.answer,
            "correct": self.correct,
            "outcome": None if self.outcome is None else str(self.outcome),
            "scheduled_ns": self.scheduled_ns,
            "ended_ns": self.ended_ns,
            "subject": self.subject,
            "metadata": self.metadata,
            "turns": self.turns,
        }
