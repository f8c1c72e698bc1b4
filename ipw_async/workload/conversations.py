"""Conversation replay: multi-turn chats whose user turns are given and assistant turns generated.

A JSONL file, one conversation per line, either
``{"id": "c1", "turns": ["first question", {"content": "follow-up", "think_s": 2.0}]}``
or ``{"id": "c1", "messages": [{"role": "user", ...}, {"role": "assistant", ...}, ...]}``
(assistant messages are dropped and generated anew; a leading system message is kept).
``think_s`` (per turn, or for the whole conversation) is the user's pause before a turn, from
the end of the answer before it: a turn is due then, and its record's ``scheduled_ns`` says so.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._alarm import sleep_until
from .._clock import NS, now_ns
from ..records import Status
from . import Requests, UnitCycle, WorkUnit
from .datasets import DatasetError, Query, qa_pairs
from .tasklog import Outcome, TaskLog


@dataclass(frozen=True)
class UserTurn:
    content: str
    think_s: float = 0.0
    max_tokens: int | None = None  # the answer's length, where it is given (a replayed trace)


@dataclass(frozen=True)
class Conversation:
    id: str
    turns: tuple[UserTurn, ...]
    system: str | None = None


def _turn(raw: Any, default_think: float, where: str) -> UserTurn:
    if isinstance(raw, str) and raw.strip():
        return UserTurn(raw, default_think)
    if isinstance(raw, dict) and isinstance(raw.get("content"), str) and raw["content"].strip():
        think = raw.get("think_s", default_think)
        if not isinstance(think, int | float) or think < 0:
            raise DatasetError(f"{where}: think_s must be a non-negative number of seconds")
        return UserTurn(raw["content"], float(think))
    raise DatasetError(f'{where}: a turn must be non-empty text or {{"content": text, "think_s": s}}')


def _conversation(row: Any, n: int, where: str) -> Conversation:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object with 'turns' or 'messages'")
    think = row.get("think_s", 0.0)
    if not isinstance(think, int | float) or think < 0:
        raise DatasetError(f"{where}: think_s must be a non-negative number of seconds")
    system = None
    if isinstance(row.get("turns"), list):
        raw_turns = row["turns"]
    elif isinstance(row.get("messages"), list):
        messages = row["messages"]
        if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system":
            system = str(messages[0].get("content", ""))
        raw_turns = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    else:
        raise DatasetError(f"{where}: expected a 'turns' list or a 'messages' list")
    turns = tuple(_turn(t, float(think), f"{where} turn {i + 1}") for i, t in enumerate(raw_turns))
    if not turns:
        raise DatasetError(f"{where}: no user turns")
    return Conversation(str(row.get("id", f"conversation-{n:05d}")), turns, system)


def load_conversations(path: str | Path) -> list[Conversation]:
    """Conversations from a JSONL file; a bad row is named by its line number."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"conversation file not found: {path}")
    out = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path} row {n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: not valid JSON ({exc.msg})") from None
            out.append(_conversation(row, n, where))
    if not out:
        raise DatasetError(f"{path}: no conversations")
    return out


def builtin_conversations() -> list[Conversation]:
    """Chats of 2 to 6 questions from the built-in QA set, each turn asked after the last answer."""
    questions = [q for q, _ in qa_pairs()]
    out, start = [], 0
    for n in itertools.count():
        size = 2 + n % 5
        if start + size > len(questions):
            return out
        out.append(Conversation(f"chat-{n:03d}", tuple(UserTurn(q) for q in questions[start : start + size])))
        start += size
    return out


class ConversationReplay:
    """One unit per conversation: its user turns sent in order, each after the previous answer."""

    scorer = None

    def __init__(self, conversations: list[Conversation], name: str, chat: bool) -> None:
        self.conversations = conversations
        self.name = name
        self.chat = chat
        self._by_id = {c.id: c for c in conversations}
        self._cycle = UnitCycle(Query(c.id, c.turns[0].content) for c in conversations)

    def size(self) -> int:
        return len(self.conversations)

    def units(self, count: int | None, warmup: bool) -> Iterator[WorkUnit]:
        return self._cycle.units(count, warmup)

    async def perform(self, unit: WorkUnit, requests: Requests, scheduled_ns: int) -> None:
        await replay(self._by_id[unit.query.id], unit, requests, scheduled_ns, self.name, self.chat)


def _fields(messages: list[dict[str, str]], chat: bool) -> dict[str, Any]:
    if chat:
        return {"messages": messages}
    transcript = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages)
    return {"prompt": transcript + "Assistant:", "stop": ["\nUser:"]}


async def replay(
    conversation: Conversation,
    unit: WorkUnit,
    requests: Requests,
    scheduled_ns: int,
    name: str,
    chat: bool,
    speedup: float = 1.0,
) -> None:
    """One conversation as a task: its user turns in order, each with the history before it,
    each due its think time (over ``speedup``) after the previous answer ended."""
    t0 = requests.t0_ns
    log = TaskLog(
        unit.unit_id,
        unit.query.id,
        name,
        unit.warmup,
        conversation.turns[0].content,
        None,
        scheduled_ns - t0,
    )
    messages = [{"role": "system", "content": conversation.system}] if conversation.system else []
    due = scheduled_ns
    with requests.task(log):
        for i, turn in enumerate(conversation.turns):
            think = turn.think_s / speedup if i > 0 else None
            if think is not None:
                due = now_ns() + round(think * NS)
                await sleep_until(due)  # then the record's scheduled_ns is when the turn was due
            messages.append({"role": "user", "content": turn.content})
            record = requests.new_record(unit, due, turn.content, i)
            log.turn(record, think_s=think)
            body = requests.payload(_fields(messages, chat), turn.max_tokens)
            await requests.request(record, body, lambda _: None)
            if record.status is not Status.OK:
                log.end(Outcome.ERROR, t0)
                return
            messages.append({"role": "assistant", "content": record.answer})
        log.end(Outcome.COMPLETED, t0, messages[-1]["content"])
