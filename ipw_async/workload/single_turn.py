"""The classic benchmark: one streaming request per query of a dataset."""

from __future__ import annotations

from collections.abc import Iterator

from . import Requests, UnitCycle, WorkUnit
from .body import prompt_fields
from .datasets import Dataset


async def send_query(
    unit: WorkUnit, requests: Requests, scheduled_ns: int, chat: bool, stop: tuple[str, ...] = ()
) -> None:
    """The unit's query as one request: its prompt, its own max_tokens and extra body fields."""
    query = unit.query
    record = requests.new_record(unit, scheduled_ns, query.prompt)
    fields = prompt_fields(query.prompt, chat, stop) | query.extra_body
    await requests.request(record, requests.payload(fields, query.max_tokens))


class SingleTurn:
    """One request per query, cycling through the dataset as often as the run needs."""

    def __init__(self, dataset: Dataset, chat: bool = True) -> None:
        self.dataset = dataset
        self.chat = chat
        self.name = dataset.name
        self.scorer = dataset.scorer
        self._cycle = UnitCycle(dataset.queries)

    def size(self) -> int:
        return len(self.dataset)

    def units(self, count: int | None, warmup: bool) -> Iterator[WorkUnit]:
        return self._cycle.units(count, warmup)

    async def perform(self, unit: WorkUnit, requests: Requests, scheduled_ns: int) -> None:
        await send_query(unit, requests, scheduled_ns, self.chat, self.dataset.stop)
