"""Scorers that decide whether an answer matches its reference."""

from __future__ import annotations

import re
import string
from collections.abc import Callable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_FINAL = re.compile(r"(?:final answer|answer is|answer:)\s*(.+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*")
_LETTER = re.compile(r"\b([A-E])\b")


def normalise(text: str) -> str:
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


def final_answer(text: str) -> str:
    """The part of a response that states the answer: after 'answer is'/'Answer:', else line 1."""
    matches = _FINAL.findall(text)
    if matches:
        return matches[-1].strip().splitlines()[0]
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def exact(answer: str, reference: str) -> bool:
    return normalise(final_answer(answer)) == normalise(reference)


def contains(answer: str, reference: str) -> bool:
    ref = normalise(reference)
    return bool(ref) and ref in normalise(answer)


def _number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def numeric(answer: str, reference: str) -> bool:
    got, want = _number(final_answer(answer)), _number(reference)
    return got is not None and want is not None and abs(got - want) <= 1e-6 * max(1.0, abs(want))


def choice(answer: str, reference: str) -> bool:
    """Multiple choice: the first standalone letter A–E of the answer against the reference's."""
    got = _LETTER.search(final_answer(answer).upper())
    want = _LETTER.search(reference.upper())
    return got is not None and want is not None and got.group(1) == want.group(1)


SCORERS: dict[str, Callable[[str, str], bool]] = {
    "exact": exact,
    "contains": contains,
    "numeric": numeric,
    "choice": choice,
}


def score(answer: str, reference: str | None, scorer: str | None) -> bool | None:
    """True/False, or None when there is nothing to score against."""
    if reference is None or scorer is None:
        return None
    return SCORERS[scorer](answer, reference)
