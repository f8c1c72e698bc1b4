"""What the simulated model says: seeded answers to the built-in questions, filler of a drawn
length for any other prompt, and the verdicts, tool calls and ReAct turns a request asks for."""

from __future__ import annotations

import random
import re
from typing import Any

from ..judging import read_prompt, verdict_word
from ..scoring import contains, exact, numeric
from ..workload.datasets import qa_pairs, question_of
from .agent import Agent, Reply, as_tokens, seeded_rng, text_of
from .config import SimConfig

_FILLER = [
    "Let", "me", "think", "about", "this", "step", "by", "step.", "The", "question", "asks", "for",
    "a", "short", "fact,", "so", "I", "recall", "what", "I", "know", "and", "check", "it", "against",
    "related", "facts", "before", "I", "answer.", "Considering", "the", "context", "carefully",
]  # fmt: skip


class Responder:
    """Decides what the model says: deterministic for a (seed, prompt) pair."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.answers = dict(qa_pairs())
        self._all_answers = sorted(set(self.answers.values()))
        self.agent = Agent(config.seed, config.accuracy, self._all_answers)

    def _answer(self, question: str, rng: random.Random) -> str:
        right = self.answers[question]
        if rng.random() < self.config.accuracy:
            return right
        if right.lstrip("-").isdigit():
            return str(int(right) + rng.choice((-2, -1, 1, 2, 10)))
        return rng.choice([a for a in self._all_answers if a != right])

    def tokens(
        self, prompt: str, chat: bool, max_tokens: int, ignore_eos: bool, stop: list[str]
    ) -> tuple[list[str], str]:
        """Output tokens and finish reason."""
        cfg = self.config
        rng = seeded_rng(cfg.seed, prompt)
        question = question_of(prompt)
        if ignore_eos or question not in self.answers:
            n = (
                max_tokens
                if ignore_eos
                else round(rng.lognormvariate(0, cfg.output_sigma) * cfg.output_median)
            )
            n = max(1, n)
            words = [" " + rng.choice(_FILLER) for _ in range(min(n, max_tokens))]
            return words, "length" if n >= max_tokens else "stop"
        answer = self._answer(question, rng)
        if chat:
            n = max(0, round(rng.lognormvariate(0, cfg.output_sigma) * cfg.output_median) - 4)
            words = [" " + w for w in _FILLER[: min(n, len(_FILLER))]]
            words += [f" {w}" for w in f"The answer is {answer}.".split()]
        else:
            words = [f" {w}" for w in answer.split()]
            if "\n" not in stop:
                words += ["\n", "Q:"]
        if len(words) > max_tokens:
            return words[:max_tokens], "length"
        return words, "stop"

    def turn(self, messages: list[object], body: dict[str, Any], prompt: str, chat: bool) -> Reply | None:
        """The reply the request's kind sets (a judge's verdict, a tool-calling or ReAct turn),
        or None for a plain answer."""
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        last = text_of(users[-1].get("content")) if users else ""
        tools = body.get("tools")
        return (
            judge_turn(last if chat else prompt)
            or (self.agent.tool_turn(messages, tools, body.get("tool_choice")) if tools else None)
            or self.agent.react_turn(prompt)
        )


_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*")  # a reference that is a number is graded as one


def judge_turn(text: str) -> Reply | None:
    """A judge's verdict on a filled-in judge prompt (:data:`ipw_async.judging.JUDGE_PROMPT`):
    CORRECT when the answer matches the reference, numerically when the reference is a
    number, else by containing it; None for any other prompt."""
    filled = read_prompt(text)
    if filled is None:
        return None
    answer, reference = filled.get("answer"), (filled.get("reference") or "").strip()
    if answer is None or not reference:
        right = False
    elif _NUMBER.fullmatch(reference):
        right = numeric(answer, reference)
    else:
        right = exact(answer, reference) or contains(answer, reference)
    return Reply(as_tokens(verdict_word(right)), "stop")
