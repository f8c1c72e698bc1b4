"""The built-in agentic tasks: questions a model answers by calling tools, with ground truth.

Each task carries a plan, the tool calls that solve it, as templates over earlier results
(``{0}`` is the first call's result). The reference answer is what the plan gives when the
real tools run it; the simulator follows the same plan with the results it is actually sent,
so a tool error in the harness changes the simulated model's next call, as it would a model's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from typing import Any

from .datasets._qa_facts import ATOMIC_NUMBERS, CAPITALS, MOUNTAINS
from .tools import BUILTIN_TOOLS


@dataclass(frozen=True)
class ToolStep:
    tool: str
    template: str  # the argument, with {0}, {1}, … standing for earlier results

    def argument(self, results: list[str]) -> str:
        return self.template.format(*results)


@dataclass(frozen=True)
class AgentTask:
    """A task: its question, the reference answer (None: unscored) and how answers are scored;
    a built-in task's plan; a task file's options and where in the file it is."""

    id: str
    question: str
    answer: str | None
    scorer: str
    plan: tuple[ToolStep, ...] = ()
    tools: tuple[str, ...] | None = None  # the tools it is offered (None: every one)
    max_turns: int | None = None  # instead of the run's --max-turns
    subject: str | None = None
    metadata: dict[str, Any] | None = None  # carried into tasks.jsonl as given
    source: str | None = None  # "FILE line N" for a task file's: where errors point

    @property
    def turns(self) -> int:
        """LLM calls a model that follows the plan makes: one per tool call, one to answer."""
        return len(self.plan) + 1


def _solve(plan: tuple[ToolStep, ...]) -> str:
    results: list[str] = []
    for step in plan:
        results.append(BUILTIN_TOOLS[step.tool].run(step.argument(results)))
    return results[-1]


_OPS = (("add", "+"), ("subtract", "-"), ("multiply it by", "*"))


def _arithmetic(i: int, rng: random.Random) -> AgentTask:
    steps = 1 + i % 7  # 2 to 8 turns
    start = rng.randint(11, 99)
    words, plan = [], []
    value = str(start)
    for k in range(steps):
        verb, sign = rng.choice(_OPS)
        n = rng.randint(2, 12) if sign == "*" else rng.randint(3, 97)
        words.append(f"{verb} {n}")
        plan.append(ToolStep("calculator", f"{value if k == 0 else '{' + str(k - 1) + '}'} {sign} {n}"))
        value = ""
    question = f"Start with {start}. " + ", then ".join(words).capitalize() + ". What is the result?"
    steps_t = tuple(plan)
    return AgentTask(f"arith-{i:02d}", question, _solve(steps_t), "numeric", steps_t)


def _lookup(i: int, rng: random.Random) -> AgentTask:
    if i % 2 == 0:
        country, city = rng.choice(CAPITALS)
        question = f"What is the capital of {country}? Use the lookup tool."
        return AgentTask(
            f"lookup-{i:02d}", question, city, "contains", (ToolStep("lookup", f"capital of {country}"),)
        )
    element, _ = rng.choice(ATOMIC_NUMBERS)
    plan = (
        ToolStep("lookup", f"atomic number of {element}"),
        ToolStep("lookup", "element with atomic number {0}"),
    )
    question = f"Look up the atomic number of {element}, then look up which element has that atomic number."
    return AgentTask(f"lookup-{i:02d}", question, element, "contains", plan)


def _mixed(i: int, rng: random.Random) -> AgentTask:
    if i % 2 == 0:
        (a, _), (b, _) = rng.sample(ATOMIC_NUMBERS, 2)
        factor = rng.randint(2, 9)
        plan = (
            ToolStep("lookup", f"atomic number of {a}"),
            ToolStep("lookup", f"atomic number of {b}"),
            ToolStep("calculator", "{0} + {1}"),
            ToolStep("calculator", f"{{2}} * {factor}"),
        )
        question = f"Add the atomic numbers of {a} and {b}, then multiply the sum by {factor}."
    else:
        (a, _), (b, _) = rng.sample(MOUNTAINS, 2)
        plan = (
            ToolStep("lookup", f"height of {a} in metres"),
            ToolStep("lookup", f"height of {b} in metres"),
            ToolStep("calculator", "{0} - {1}"),
        )
        question = f"How many metres higher is {a} than {b}? (The answer may be negative.)"
    return AgentTask(f"mixed-{i:02d}", question, _solve(plan), "numeric", plan)


@cache
def builtin_tasks() -> tuple[AgentTask, ...]:
    """48 tasks, deterministic: 24 arithmetic chains of 1–7 calculator calls, 12 lookups of one
    or two facts, and 12 that look facts up and compute with them."""
    rng = random.Random(11)
    tasks = [_arithmetic(i, rng) for i in range(24)]
    tasks += [_lookup(i, rng) for i in range(12)]
    tasks += [_mixed(i, rng) for i in range(12)]
    return tuple(tasks)


@cache
def task_by_question() -> dict[str, AgentTask]:
    return {t.question: t for t in builtin_tasks()}
