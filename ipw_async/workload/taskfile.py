"""Agentic tasks from a JSONL file (``--tasks FILE.jsonl``), one JSON object per line::

    {"id": "t1", "problem": "What is 17 * 23 + 41?", "answer": "432", "scorer": "numeric",
     "tools": ["calculator"], "max_turns": 4, "subject": "arithmetic", "metadata": {"level": 1}}

``problem`` (IPW's name; ``question`` is taken too) is the only field needed. ``answer`` is the
reference (none: the task is run but not scored), scored by ``scorer`` (default ``exact``);
``tools`` limits the tools the task is offered; ``max_turns`` replaces ``--max-turns`` for it;
``id`` (default ``line-N``), ``subject`` and ``metadata`` (any JSON object) are carried into
``tasks.jsonl``. Blank lines are skipped; any other line that is not such a task is a
DatasetError naming the file and line, before the run starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..scoring import SCORERS
from .datasets import DatasetError
from .tasks import AgentTask

DEFAULT_SCORER = "exact"
FIELDS = ("id", "problem", "question", "answer", "subject", "tools", "max_turns", "scorer", "metadata")


def load_tasks(path: str | Path) -> tuple[AgentTask, ...]:
    """Every task in the file; DatasetError for a file that cannot be read or has none, or for
    the first line that is not a task."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise DatasetError(f"task file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"task file {path} cannot be read ({exc})") from None
    tasks: list[AgentTask] = []
    lines: dict[str, int] = {}  # task id -> its line
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            task = _task(line, where, f"line-{number}")
        except ValueError as exc:
            raise DatasetError(f"{where}: {exc}") from None
        if task.id in lines:
            raise DatasetError(f"{where}: id {task.id!r} is already line {lines[task.id]}'s")
        lines[task.id] = number
        tasks.append(task)
    if not tasks:
        raise DatasetError(
            f'task file {path} has no tasks: give one per line, e.g. {{"problem": "...", "answer": "..."}}'
        )
    return tuple(tasks)


def _task(line: str, where: str, default_id: str) -> AgentTask:
    """One line's task; ValueError saying what is wrong with it."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {_kind(row)}")
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:
        raise ValueError(
            f"unknown field {unknown[0]!r}; fields: {', '.join(FIELDS)} (put anything else in metadata)"
        )
    if "problem" in row and "question" in row:
        raise ValueError("give problem or question, not both")
    question = row.get("problem", row.get("question"))
    if question is None:
        raise ValueError("no problem (or question)")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"problem must be a non-empty string, got {_kind(question)}")
    task_id = row.get("id", default_id)
    if isinstance(task_id, bool) or not isinstance(task_id, str | int):
        raise ValueError(f"id must be a string or a whole number, got {_kind(task_id)}")
    answer = row.get("answer")
    if isinstance(answer, bool) or not isinstance(answer, str | int | float | None):
        raise ValueError(f"answer must be a string or a number, got {_kind(answer)}")
    scorer = row.get("scorer", DEFAULT_SCORER)
    if not isinstance(scorer, str) or scorer not in SCORERS:
        raise ValueError(f"scorer must be one of {', '.join(SCORERS)}, got {scorer!r}")
    tools = row.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, str) for t in tools)):
        raise ValueError(f"tools must be a list of tool names, got {_kind(tools)}")
    max_turns = row.get("max_turns")
    if max_turns is not None and (
        isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1
    ):
        raise ValueError(f"max_turns must be a whole number of at least 1, got {max_turns!r}")
    return AgentTask(
        id=str(task_id),
        question=question,
        answer=None if answer is None else str(answer),
        scorer=scorer,
        tools=None if tools is None else tuple(tools),
        max_turns=max_turns,
        subject=_optional(row, "subject", str, "a string"),
        metadata=_optional(row, "metadata", dict, "a JSON object"),
        source=where,
    )


def _optional(row: dict[str, Any], key: str, kind: type, what: str) -> Any:
    value = row.get(key)
    if value is not None and not isinstance(value, kind):
        raise ValueError(f"{key} must be {what}, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    """How a JSON value is named in an error: ``a list``, ``null``, ``the string 'x'``."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    names = {bool: "true/false", dict: "an object", list: "a list", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


__all__ = ["DEFAULT_SCORER", "load_tasks"]
