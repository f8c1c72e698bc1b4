"""The simulated model as an agent: what it says on a tool-calling or ReAct turn.

On a built-in task it follows the task's plan with the tool results it is sent. Offered any
other tools, it acts as a generic agent: from the seed and the question it decides how many
calls the task takes and which offered tool each is, fills each call's arguments to the
tool's JSON schema, then answers from the last result. One tool call per reply.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from typing import Any

from ..workload.tasks import AgentTask, task_by_question
from ..workload.tools import BUILTIN_TOOLS
from .toolargs import example_arguments

MAX_CALLS = 3  # a generic task takes 1 to MAX_CALLS tool calls
_ANSWER_WORDS = 20  # of a tool result, the most a generic answer repeats
_OBSERVATION = re.compile(r"\nObservation: (.*)")


def seeded_rng(seed: int, *parts: str) -> random.Random:
    """A generator drawn from the seed and ``parts``: the same in every process and run."""
    digest = hashlib.blake2b("\x1f".join((str(seed), *parts)).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


def as_tokens(text: str) -> list[str]:
    """Text as the tokens it streams as: each word with the whitespace before it."""
    return re.findall(r"\s*\S+", " " + text)


@dataclass
class Reply:
    """What the model says on one turn: text, or one tool call whose arguments the tokens are."""

    tokens: list[str]
    finish: str
    tool_call: tuple[str, str] | None = None  # (call id, tool name): the tokens are its arguments


def text_of(content: object) -> str:
    """A message's text: its content string, or the text parts of a list of content parts."""
    if isinstance(content, list):
        return "".join(
            part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return "" if content is None else str(content)


def _call(n: int, name: str, arguments: dict[str, Any]) -> Reply:
    """The conversation's ``n``-th tool call, its JSON arguments streamed four characters a token."""
    text = json.dumps(arguments)
    return Reply([text[i : i + 4] for i in range(0, len(text), 4)], "tool_calls", (f"call_{n}", name))


def _offered(tools: object) -> dict[str, object]:
    """Each offered function's parameters schema by name; a spec with no name is not a tool."""
    offered: dict[str, object] = {}
    for spec in tools if isinstance(tools, list) else []:
        function = spec.get("function") if isinstance(spec, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]:
            offered[function["name"]] = function.get("parameters")
    return offered


def _forced(tool_choice: object) -> str | None:
    """The tool a ``{"type": "function", "function": {"name": ...}}`` choice names."""
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) and name else None


def _gist(results: list[str]) -> str:
    """What a model takes from its last tool result: the first line, in at most 20 words;
    ``unknown`` when there is none or it was an error."""
    last = results[-1].strip() if results else ""
    if not last or last.startswith("error:"):
        return "unknown"
    return " ".join(last.splitlines()[0].split()[:_ANSWER_WORDS])


class Agent:
    """A tool-using model, deterministic for a (seed, question) pair."""

    def __init__(self, seed: int, accuracy: float, answers: list[str]) -> None:
        self.seed = seed
        self.accuracy = accuracy  # on a built-in task, the chance its answer is the result's
        self.answers = answers  # the wrong answers a built-in task's answer is drawn from

    def tool_turn(self, messages: list[object], tools: object, tool_choice: object = None) -> Reply | None:
        """The next reply of a tool-calling model: a tool call, or its answer once it has made
        the calls it meant to. ``tool_choice`` is OpenAI's: ``none`` answers, ``required``
        calls a tool, a named function calls that function. None without a user message."""
        chat = [m for m in messages if isinstance(m, dict)]
        question = next((text_of(m.get("content")) for m in chat if m.get("role") == "user"), None)
        if question is None:
            return None
        results = [text_of(m.get("content")) for m in chat if m.get("role") == "tool"]
        task = task_by_question().get(question)
        forced = _forced(tool_choice)
        n = len(results)
        if task is not None and forced is None and tool_choice != "none" and n < len(task.plan):
            step = task.plan[n]
            return _call(n, step.tool, {BUILTIN_TOOLS[step.tool].parameter: step.argument(results)})
        offered = _offered(tools)
        planned = len(task.plan) if task is not None else self.planned_calls(question)
        done = n >= planned and tool_choice != "required"
        if forced is None and (tool_choice == "none" or not offered or done):
            answer = self._final(task, results) if task is not None else _gist(results)
            return Reply(as_tokens(f"The answer is {answer}."), "stop")
        rng = seeded_rng(self.seed, "call", question, str(n))
        name = forced or rng.choice(list(offered))
        return _call(n, name, example_arguments(offered.get(name), rng, question))

    def planned_calls(self, question: str) -> int:
        """How many tool calls a task that is not built in takes: 1 to ``MAX_CALLS``, seeded."""
        return 1 + seeded_rng(self.seed, "calls", question).randrange(MAX_CALLS)

    def react_turn(self, prompt: str) -> Reply | None:
        """A ReAct model on a built-in task: ``Action: tool[input]`` (cut where the stop
        sequence would cut it) or ``Final Answer:``, reading the observations in the prompt."""
        start = prompt.rfind("\nQuestion: ")
        if start < 0 or not prompt.rstrip().endswith("Thought:"):
            return None
        block = prompt[start + 11 :]
        task = task_by_question().get(block.split("\n", 1)[0])
        if task is None:
            return None
        results = _OBSERVATION.findall(block)
        if len(results) < len(task.plan):
            step = task.plan[len(results)]
            return Reply(
                as_tokens(f"I use the {step.tool}.\nAction: {step.tool}[{step.argument(results)}]"), "stop"
            )
        return Reply(as_tokens(f"I know the answer.\nFinal Answer: {self._final(task, results)}"), "stop")

    def _final(self, task: AgentTask, results: list[str]) -> str:
        """The answer from the last tool result it was sent, right with probability ``accuracy``."""
        answer = results[-1] if results else "unknown"
        if seeded_rng(self.seed, "agent", task.question).random() < self.accuracy:
            return answer
        try:
            return str(int(answer) + 1)
        except ValueError:
            return next(a for a in self.answers if a.lower() not in answer.lower())
