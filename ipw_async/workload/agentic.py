"""Agentic tasks: a model solves each task over several LLM calls, calling tools between them.

The tasks are the built-in ones or a task file's (:mod:`.taskfile`); the tools are the built-in
functions run here, or those of MCP servers (:mod:`.mcp_tools`), opened with the workload.

Two protocols, one loop. ``tools`` is tool calling (``tools`` in the request, streamed
``tool_calls``, ``role: tool`` results, written as chat has them; the request body speaks them
as /responses and /messages do), for instruct servers. ``react`` is the text protocol
(``Action: tool[input]`` / ``Observation:``, few-shot, a stop sequence), for base models on
/completions (and as one user message on the other APIs). A task ends when the model answers,
runs out of turns, passes its timeout or a call fails; every call is a record, every task a
line in ``tasks.jsonl``.
"""

from __future__ import annotations

import contextlib
import functools
import random
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._clock import NS, now_ns
from ..errors import RunError
from ..records import RequestRecord, Status
from ..scoring import score
from . import Requests, UnitCycle, WorkUnit
from .datasets import Query
from .tasklog import Outcome, TaskLog
from .tasks import AgentTask, builtin_tasks
from .tools import Toolbox, ToolResult, ToolSpec

PROTOCOLS = ("auto", "tools", "react")

SYSTEM_PROMPT = (
    "You solve tasks with the tools you are given. Call one tool at a time and use its result. "
    "When you know the final result, reply with: The answer is <answer>."
)

REACT_INTRO = "Answer the question with the tools below, one action at a time.\nTools:\n"
# Few-shot examples, each shown when the tools it calls are offered (a model copies what it sees)
REACT_EXAMPLES: tuple[tuple[frozenset[str], str], ...] = (
    (
        frozenset({"calculator"}),
        """Question: Start with 12. Multiply it by 7, then add 5. What is the result?
Thought: I multiply first.
Action: calculator[12 * 7]
Observation: 84
Thought: Now I add 5.
Action: calculator[84 + 5]
Observation: 89
Thought: I know the answer.
Final Answer: 89

""",
    ),
    (
        frozenset({"lookup"}),
        """Question: Look up the atomic number of oxygen, then look up which element has that atomic number.
Thought: I look up the atomic number.
Action: lookup[atomic number of oxygen]
Observation: 8
Thought: Now the element with that number.
Action: lookup[element with atomic number 8]
Observation: oxygen
Thought: I know the answer.
Final Answer: oxygen

""",
    ),
)
REACT_FORMAT = """Use this format:
Thought: what to do next
Action: tool[input]
Observation: the tool's result
(Thought, Action and Observation repeat as needed)
Final Answer: the answer

"""


def react_preamble(tools: Sequence[ToolSpec]) -> str:
    """The ReAct prompt's opening: a line per tool offered, then the examples that use only
    those tools (the format in words where none does)."""
    names = {t.name for t in tools}
    examples = "".join(text for needs, text in REACT_EXAMPLES if needs <= names) or REACT_FORMAT
    return REACT_INTRO + "".join(f"{t.react_line()}\n" for t in tools) + "\n" + examples


REACT_STOP = "\nObservation:"
INVALID_FORMAT = "Invalid format: reply with Action: tool[input] or Final Answer: answer."

_ACTION = re.compile(r"Action:\s*([A-Za-z_][\w.-]*)\s*\[(.*?)\]", re.DOTALL)  # MCP names may have - and .
_FINAL = re.compile(r"Final Answer:\s*(.+)")


@dataclass
class Step:
    """What one LLM call did: asked for tools, gave the final answer, or neither."""

    calls: list[tuple[str, str, str | None]] = field(default_factory=list)  # name, arguments, id
    answer: str | None = None  # set when the call gave the final answer

    @property
    def final(self) -> bool:
        return self.answer is not None


class History(Protocol):
    """One task's history under a protocol: the next request, and how a reply extends it."""

    new_input: str  # what the history gained since the last call (the records' prompt column)
    json_arguments: bool  # tool arguments come as JSON objects (tool calling), not bare text

    def fields(self) -> dict[str, Any]: ...

    def read(self, record: RequestRecord) -> Step: ...

    def extend(self, record: RequestRecord, step: Step, results: list[ToolResult]) -> None: ...


class ToolCalling:
    """Tool calling, in OpenAI chat's words (the request body puts it in the endpoint's)."""

    json_arguments = True

    def __init__(self, question: str, tool_specs: list[dict[str, object]]) -> None:
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ]
        self.tool_specs = tool_specs
        self.new_input = question

    def fields(self) -> dict[str, Any]:
        # a task offered no tools sends none: some servers refuse an empty list
        return (
            {"messages": self.messages, "tools": self.tool_specs}
            if self.tool_specs
            else {"messages": self.messages}
        )

    def read(self, record: RequestRecord) -> Step:
        if record.tool_calls:
            return Step(
                calls=[
                    (c["name"] or "", c["arguments"] or "", c["id"] or f"call_{record.request_id}_{i}")
                    for i, c in enumerate(record.tool_calls)
                ]
            )
        return Step(answer=record.answer.strip())

    def extend(self, record: RequestRecord, step: Step, results: list[ToolResult]) -> None:
        self.messages.append(
            {
                "role": "assistant",
                "content": record.answer or None,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                    for name, arguments, call_id in step.calls
                ],
            }
        )
        for r in results:
            self.messages.append({"role": "tool", "tool_call_id": r.call_id, "content": r.output})
        self.new_input = "\n".join(r.output for r in results)


class ReAct:
    """The text ReAct protocol: one growing prompt, cut at ``Observation:`` by a stop sequence."""

    json_arguments = False

    def __init__(self, question: str, chat: bool, tools: Sequence[ToolSpec]) -> None:
        self.prompt = f"{react_preamble(tools)}Question: {question}\nThought:"
        self.chat = chat
        self.new_input = f"Question: {question}\nThought:"

    def fields(self) -> dict[str, Any]:
        if self.chat:
            return {"messages": [{"role": "user", "content": self.prompt}], "stop": [REACT_STOP]}
        return {"prompt": self.prompt, "stop": [REACT_STOP]}

    def read(self, record: RequestRecord) -> Step:
        text = record.answer
        action = _ACTION.search(text)
        final = _FINAL.search(text)
        if final and (action is None or final.start() < action.start()):
            return Step(answer=final.group(1).strip())
        if action:
            return Step(calls=[(action.group(1), action.group(2).strip(), None)])
        return Step()

    def extend(self, record: RequestRecord, step: Step, results: list[ToolResult]) -> None:
        text = record.answer
        action = _ACTION.search(text)
        if action:
            text = text[: action.end()]  # a model that ran past its action invented what came next
        observation = results[0].output if results else INVALID_FORMAT
        self.new_input = f"\nObservation: {observation}\nThought:"
        self.prompt += text.rstrip() + self.new_input


def _judge(history: History, task: AgentTask, record: RequestRecord) -> bool | None:
    """A call that gave the final answer is scored against the task's; other calls are not."""
    answer = history.read(record).answer
    return None if answer is None else score(answer, task.answer, task.scorer)


def protocol_for(protocol: str, endpoint: str) -> str:
    """``auto`` is tool calling on every API that takes messages (chat, Responses, Messages:
    the request body speaks each one's tool calls) and ReAct on completions."""
    if protocol == "auto":
        return "react" if endpoint == "completions" else "tools"
    return protocol


class Agentic:
    """The built-in tool tasks (or ``tasks``, e.g. from a task file), run by an agent loop per
    unit, with the tools of ``toolbox`` (functions here, or MCP servers while it is open)."""

    name = "agentic"
    scorer = None  # each task is scored by its own scorer

    def __init__(
        self,
        toolbox: Toolbox,
        *,
        protocol: str,
        endpoint: str,
        max_turns: int,
        task_timeout_s: float | None,
        seed: int,
        tasks: tuple[AgentTask, ...] | None = None,
    ) -> None:
        self.tasks = tasks or builtin_tasks()
        self.toolbox = toolbox
        self.protocol = protocol_for(protocol, endpoint)
        self.chat = endpoint != "completions"  # every other API takes messages
        self.max_turns = max_turns
        self.task_timeout_s = task_timeout_s
        self.seed = seed
        self._by_id = {t.id: t for t in self.tasks}
        self._cycle = UnitCycle(Query(t.id, t.question, t.answer) for t in self.tasks)
        if toolbox.tools is not None:  # known now (functions here): refused before the run starts
            self._check_tools(toolbox.tools)

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[None]:
        """Its tools ready while units are performed: MCP servers started and listed."""
        async with self.toolbox.opened():
            self._check_tools(self.toolbox.tools or {})
            yield

    def _check_tools(self, tools: dict[str, ToolSpec]) -> None:
        """RunError for a task that names a tool, or whose plan calls one, that is not offered."""
        for task in self.tasks:
            for name in (*(task.tools or ()), *(step.tool for step in task.plan)):
                if name not in tools:
                    where = task.source or f"built-in task {task.id}"
                    hint = "" if task.source else " (--mcp builtin serves the built-in tools)"
                    raise RunError(
                        f"{where}: unknown tool {name!r}; tools: {', '.join(tools) or 'none'}{hint}"
                    )

    def size(self) -> int:
        return len(self.tasks)

    def units(self, count: int | None, warmup: bool) -> Iterator[WorkUnit]:
        return self._cycle.units(count, warmup)

    def _conversation(self, task: AgentTask) -> ToolCalling | ReAct:
        tools = self.toolbox.offered(task.tools)
        if self.protocol == "tools":
            return ToolCalling(task.question, [t.openai() for t in tools])
        return ReAct(task.question, self.chat, tools)

    async def perform(self, unit: WorkUnit, requests: Requests, scheduled_ns: int) -> None:
        task = self._by_id[unit.query.id]
        t0 = requests.t0_ns
        log = TaskLog(
            unit.unit_id,
            task.id,
            self.name,
            unit.warmup,
            task.question,
            task.answer,
            scheduled_ns - t0,
            subject=task.subject,
            metadata=task.metadata,
        )
        conversation = self._conversation(task)
        rng = random.Random(f"{self.seed}:{unit.unit_id}")  # tool latencies, reproducible per task
        deadline = None if self.task_timeout_s is None else now_ns() + int(self.task_timeout_s * NS)
        with requests.task(log):
            for turn in range(task.max_turns or self.max_turns):
                if deadline is not None and now_ns() > deadline:
                    log.end(Outcome.TIMEOUT, t0)
                    return
                record = requests.new_record(
                    unit, scheduled_ns if turn == 0 else now_ns(), conversation.new_input, turn
                )
                log.turn(record)
                judge = functools.partial(_judge, conversation, task)
                await requests.request(record, requests.payload(conversation.fields()), judge)
                if record.status is not Status.OK:
                    log.end(Outcome.ERROR, t0)
                    return
                step = conversation.read(record)
                if step.final:
                    log.end(Outcome.ANSWERED, t0, step.answer, record.correct)
                    return
                results = [
                    await self.toolbox.call(
                        name,
                        arguments,
                        rng,
                        t0_ns=t0,
                        json_arguments=conversation.json_arguments,
                        call_id=call_id,
                        offered=task.tools,
                    )
                    for name, arguments, call_id in step.calls
                ]
                log.tools(results)
                conversation.extend(record, step, results)
            log.end(Outcome.MAX_TURNS, t0)
