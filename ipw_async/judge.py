"""Scoring answers with an LLM judge: a fixed prompt, one word back."""

from __future__ import annotations

import re

# The judge's one prompt (documented in docs/agentic.md): the simulator recognises it by its
# first line, so a run on the embedded default can be judged too.
JUDGE_PROMPT = (
    "You are grading an answer against a reference answer.\n"
    "Question: {question}\n"
    "Reference answer: {reference}\n"
    "Answer to grade: {answer}\n"
    "Is the answer to grade correct, given the reference? "
    "Reply with exactly one word: CORRECT or INCORRECT."
)

_VERDICT = re.compile(r"\b(INCORRECT|CORRECT)\b", re.IGNORECASE)


def verdict(reply: str) -> bool | None:
    """True for CORRECT, False for INCORRECT (the first of them in the reply), None for neither."""
    found = _VERDICT.search(reply)
    return None if found is None else found.group(1).upper() == "CORRECT"
