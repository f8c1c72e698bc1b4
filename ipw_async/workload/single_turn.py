"""The classic benchmark: one streaming request per query of a dataset."""

from __future__ import annotations

from collections.abc import Iterator

from . import Requests, UnitCycle, WorkUnit
from .datasets import Dataset


class SingleTurn:
    """One request per query, cycling through the dataset as often as the run needs."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.name = dataset.name
        self.scorer = dataset.scorer
        self._cycle = UnitCycle(dataset.queries)

    def size(self) -> int:
        return len(self.dataset)

    def units(self, count: int | None, warmup: bool) -> Iterator[WorkUnit]:
        return self._cycle.units(count, warmup)

    async def perform(self, unit: WorkUnit, requests: Requests, scheduled_ns: int) -> None:
        record = requests.new_record(unit, scheduled_ns, unit.query.prompt)
        await requests.request(record, requests.body(unit.query, self.dataset.stop))
