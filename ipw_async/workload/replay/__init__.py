"""Trace replay: a timestamped trace's requests (or sessions) sent at the trace's own times.

Each unit carries its entry's arrival offset (``WorkUnit.at_ns``), which the load driver's
replay mode turns into its due time (:func:`ipw_async.load.replay_times`). Prompts are made to
the trace's input lengths (:class:`~ipw_async.workload.text.PromptText`), a Mooncake entry's
hash ids as shared blocks of text, so a server's prefix cache sees what the trace's saw; each
request asks for the trace's output length as ``max_tokens`` (nothing server-specific: add
``ignore_eos`` or ``min_tokens`` with ``--param`` to make a server produce all of it).

A unit is one entry, taken in trace order, once: ``--max-queries N`` replays the first N
entries, ``--duration`` stops at that much (scaled) trace time. A sessions trace's unit is a
session, started at its timestamp, its turns sent as a replayed conversation
(:func:`~ipw_async.workload.conversations.replay`) whose think times ``speedup`` scales too.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

from .. import Requests, WorkUnit
from ..conversations import Conversation, UserTurn, replay
from ..datasets import Query
from ..single_turn import send_query
from ..text import PromptText
from .formats import FORMATS, MOONCAKE_BLOCK_TOKENS, Trace, load_trace


class _Entries(abc.ABC):
    """Units over a trace's entries, in order, each once, numbered by its place in the trace;
    their prompts made by ``text``, as chat messages or (``chat`` False) a completion prompt."""

    scorer = None  # a trace has no answers to score

    def __init__(self, trace: Trace, chat: bool, text: PromptText) -> None:
        self.trace = trace
        self.chat = chat
        self.text = text
        self.name = trace.name
        self._next = 0

    def size(self) -> int:
        return len(self.trace)

    @abc.abstractmethod
    def _unit(self, index: int, warmup: bool) -> WorkUnit:
        """The unit of the trace's entry ``index``."""

    def units(self, count: int | None, warmup: bool) -> Iterator[WorkUnit]:
        end = self.size() if count is None else min(self.size(), self._next + count)
        while self._next < end:
            index, self._next = self._next, self._next + 1
            yield self._unit(index, warmup)


class TraceReplay(_Entries):
    """One request per trace entry, due at the entry's time."""

    def _unit(self, index: int, warmup: bool) -> WorkUnit:
        entry = self.trace.requests[index]
        prompt = self.text.blocks(entry.blocks, MOONCAKE_BLOCK_TOKENS, entry.input_tokens, f"r{index}")
        query = Query(f"{self.name}-{index:06d}", prompt, max_tokens=entry.output_tokens)
        return WorkUnit(index, query, warmup, at_ns=entry.offset_ns)

    async def perform(self, unit: WorkUnit, requests: Requests, scheduled_ns: int) -> None:
        await send_query(unit, requests, scheduled_ns, self.chat)


class SessionReplay(_Entries):
    """One task per session of a sessions trace, started at its time; its query id is the
    session's id."""

    def __init__(self, trace: Trace, chat: bool, text: PromptText, speedup: float) -> None:
        super().__init__(trace, chat, text)
        self.speedup = speedup  # think times are trace time too

    def _message(self, index: int, turn: int) -> str:
        return self.text.text(f"s{index}/t{turn}", self.trace.sessions[index].turns[turn].input_tokens)

    def _conversation(self, index: int) -> Conversation:
        session = self.trace.sessions[index]
        turns = tuple(
            UserTurn(self._message(index, k), t.think_s, t.output_tokens) for k, t in enumerate(session.turns)
        )
        return Conversation(session.session_id, turns)

    def _unit(self, index: int, warmup: bool) -> WorkUnit:
        session = self.trace.sessions[index]
        query = Query(session.session_id, self._message(index, 0))
        return WorkUnit(index, query, warmup, at_ns=session.offset_ns)

    async def perform(self, unit: WorkUnit, requests: Requests, scheduled_ns: int) -> None:
        conversation = self._conversation(unit.unit_id)  # made again here: a unit carries no turns
        await replay(conversation, unit, requests, scheduled_ns, self.name, self.chat, self.speedup)


def trace_workload(
    trace: Trace, chat: bool, seed: int, speedup: float, salt: str | None = None
) -> TraceReplay | SessionReplay:
    """The workload that replays ``trace``: its prompts drawn from ``seed`` (and ``salt``)."""
    text = PromptText(seed, salt)
    if trace.format == "sessions":
        return SessionReplay(trace, chat, text, speedup)
    return TraceReplay(trace, chat, text)


def trace_of(workload: object) -> Trace | None:
    """The trace a workload replays, or None for any other workload."""
    return workload.trace if isinstance(workload, _Entries) else None


__all__ = ["FORMATS", "SessionReplay", "Trace", "TraceReplay", "load_trace", "trace_of", "trace_workload"]
