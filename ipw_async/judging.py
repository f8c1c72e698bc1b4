"""What the LLM judge and the simulator that plays one must agree on: the prompt the judge is
asked (filled in, and read back) and the one word it answers (said, and read back).

Apart from :mod:`ipw_async.judge`, which reads and finishes run directories, so the simulator
can grade a judge's prompt without sitting above the finisher.
"""

from __future__ import annotations

import hashlib
import re
import string

# The judge's one prompt (documented in docs/judge.md): the simulator recognises it by its
# first line, so a run on the embedded default can be judged too.
JUDGE_PROMPT = (
    "You are grading an answer against a reference answer.\n"
    "Question: {question}\n"
    "Reference answer: {reference}\n"
    "Answer to grade: {answer}\n"
    "Is the answer to grade correct, given the reference? "
    "Reply with exactly one word: CORRECT or INCORRECT."
)

# The prompt's identity in judge.jsonl and the summary: verdicts under another prompt differ.
PROMPT_ID = hashlib.sha256(JUDGE_PROMPT.encode()).hexdigest()[:12]

CORRECT, INCORRECT = "CORRECT", "INCORRECT"
_VERDICT = re.compile(rf"\b({INCORRECT}|{CORRECT})\b", re.IGNORECASE)


def verdict(reply: str) -> bool | None:
    """True for CORRECT, False for INCORRECT (the first of them in the reply), None for neither."""
    found = _VERDICT.search(reply)
    return None if found is None else found.group(1).upper() == CORRECT


def verdict_word(right: bool) -> str:
    """The one word a judge answers, as :func:`verdict` reads it back."""
    return CORRECT if right else INCORRECT


def _fields_pattern(template: str) -> re.Pattern[str]:
    """A pattern that reads back the values filled into ``template``'s fields."""
    parts: list[str] = []
    seen: set[str] = set()
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if name:
            parts.append(f"(?P={name})" if name in seen else f"(?P<{name}>.*?)")
            seen.add(name)
    return re.compile("".join(parts), re.DOTALL)


_FIRST_LINE = JUDGE_PROMPT.split("\n", 1)[0]
_FIELDS = _fields_pattern(JUDGE_PROMPT.strip())


def read_prompt(text: str) -> dict[str, str] | None:
    """The fields filled into :data:`JUDGE_PROMPT` (``question``, ``reference``, ``answer``), read
    back from ``text``; empty for a text that opens as the judge's prompt but does not follow it,
    None for any other text."""
    if not text.startswith(_FIRST_LINE):
        return None
    found = _FIELDS.fullmatch(text.strip())
    return found.groupdict() if found else {}
