"""The prefix-cache workload: every prompt starts with a long prefix, shared or its own.

There are ``prefixes`` shared system prompts, each ``prefix_tokens`` long. A share ``share`` of
the requests starts with one of them (a cache hit once the prefix's first use is cached); the
rest start with a prefix of the same length made for that request alone (a guaranteed miss).
So one run measures cached and uncached prompt tokens side by side, on the same questions.

Which requests share: unit i does when ⌊(i+1)·share⌋ > ⌊i·share⌋, so any run of units has
exactly the share (within one), spread evenly; the sharing units take the prefixes in turn. A
record's ``query_id`` says which it got: ``shared<k>:<question id>`` or ``unique:<question id>``.
On chat the prefix is a system message before the question; on completions it heads the prompt.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from . import Requests, UnitCycle, WorkUnit
from .body import prompt_fields
from .datasets import Dataset
from .text import PromptText

SHARED, UNIQUE = "shared", "unique"


def shared_prefix(unit_id: int, share: float, prefixes: int) -> int | None:
    """The shared prefix unit ``unit_id`` starts with, or None for a prefix of its own."""
    if math.floor((unit_id + 1) * share) == math.floor(unit_id * share):
        return None
    return (math.floor((unit_id + 1) * share) - 1) % prefixes


class PrefixWorkload:
    """The dataset's questions, each after a shared or a unique prefix (see the module)."""

    def __init__(
        self, dataset: Dataset, chat: bool, text: PromptText, prefix_tokens: int, share: float, prefixes: int
    ) -> None:
        self.dataset = dataset
        self.chat = chat
        self.text = text
        self.prefix_tokens = prefix_tokens
        self.share = share
        self.prefixes = prefixes
        self.name = dataset.name
        self.scorer = dataset.scorer
        self._cycle = UnitCycle(dataset.queries)

    def size(self) -> int:
        return len(self.dataset)

    def _key(self, unit_id: int) -> str:
        """Whose prefix the unit starts with: ``shared<k>``, or ``unique<unit id>`` its own."""
        k = shared_prefix(unit_id, self.share, self.prefixes)
        return f"{SHARED}{k}" if k is not None else f"{UNIQUE}{unit_id}"

    def units(self, count: int | None, warmup: bool) -> Iterator[WorkUnit]:
        for unit in self._cycle.units(count, warmup):
            key = self._key(unit.unit_id)
            tag = UNIQUE if key.startswith(UNIQUE) else key
            yield dataclasses.replace(unit, query=dataclasses.replace(unit.query, id=f"{tag}:{unit.query.id}"))

    async def perform(self, unit: WorkUnit, requests: Requests, scheduled_ns: int) -> None:
        prefix = self.text.text(self._key(unit.unit_id), self.prefix_tokens)
        query = unit.query
        fields: dict[str, Any]
        if self.chat:
            prompt = f"{prefix}\n{query.prompt}"  # the two messages' text, as the simulator counts it
            messages = [{"role": "system", "content": prefix}, {"role": "user", "content": query.prompt}]
            fields = {"messages": messages}
        else:
            prompt = f"{prefix}\n\n{query.prompt}"
            fields = prompt_fields(prompt, False, self.dataset.stop)
        record = requests.new_record(unit, scheduled_ns, prompt)
        await requests.request(record, requests.payload(fields | query.extra_body, query.max_tokens))
