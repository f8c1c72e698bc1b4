"""What a GPU management library's source shares, whatever the vendor (NVML, AMD SMI): the
library loaded once and held between init and shutdown, GPUs selected by index or UUID, and
each GPU's supported queries, energy counters read first and stamped together."""

from __future__ import annotations

import abc
import contextlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .._clock import now_ns
from .base import (
    CountedSource,
    CounterTracker,
    Meter,
    Quantity,
    Reading,
    SourceInfo,
    SourceUnavailable,
    power_quantity,
)


@dataclass
class Gpu:
    """One selected GPU and the queries that open() found it supports."""

    handle: Any
    name: str
    queries: list[tuple[str, Callable[[], float | None]]] = field(default_factory=list)


def is_energy(column: str) -> bool:
    return column.endswith(f".{Quantity.ENERGY_J}")


class GpuLibrarySource(CountedSource):
    """GPUs read through a vendor's library; one ``gpu{i}`` channel and meter per selected GPU.

    ``gpus`` selects GPUs by the library's index or by UUID; None selects all. ``module``
    replaces the library's Python module (tests inject a fake).
    """

    library = ""  # its name in messages
    init_hint = ""  # what to check when it does not initialise
    query_errors: tuple[type[Exception], ...] = ()  # besides the library's own, a query may raise

    def __init__(self, gpus: Sequence[str] | None = None, module: ModuleType | None = None) -> None:
        self.gpus = list(gpus) if gpus is not None else None
        self._module = module
        self._selected: list[Gpu] = []
        self._error: type[Exception] = Exception
        self._initialised = False
        self.counters: dict[str, CounterTracker] = {}  # per channel; resets reach the summary

    @abc.abstractmethod
    def _import(self) -> ModuleType:
        """The library's module; SourceUnavailable saying how to install it."""

    @abc.abstractmethod
    def _error_type(self, module: ModuleType) -> type[Exception]: ...

    @abc.abstractmethod
    def _init(self, module: ModuleType) -> None: ...

    @abc.abstractmethod
    def _shutdown(self, module: ModuleType) -> None: ...

    @abc.abstractmethod
    def _open_devices(self, module: ModuleType) -> SourceInfo: ...

    def open(self) -> SourceInfo:
        module = self._load()
        try:
            self._init(module)
        except self._error as exc:
            raise SourceUnavailable(f"{self.library} not available: {exc}; {self.init_hint}") from exc
        self._initialised = True
        self._selected = []
        self.counters = {}
        try:
            return self._open_devices(module)
        except BaseException:
            self.close()
            raise

    def read(self) -> Reading:
        counters = self.read_counters()
        return Reading(counters.values | self._query(lambda column: not is_energy(column)), counters.t_ns)

    def read_counters(self) -> Reading:
        # Every GPU's counter first, stamped together: the other queries take longer than
        # the counter grid's timing is good for.
        start = now_ns()
        values = self._query(is_energy)
        return Reading(values, (start + now_ns()) // 2)

    def _query(self, wanted: Callable[[str], bool]) -> dict[str, float | None]:
        errors = (self._error, *self.query_errors)
        values: dict[str, float | None] = {}
        for gpu in self._selected:
            for column, query in gpu.queries:
                if wanted(column):
                    try:
                        values[column] = query()
                    except errors:
                        values[column] = None
        return values

    def close(self) -> None:
        if self._initialised:
            self._initialised = False
            self._selected = []
            # If the driver refuses there is nothing left to release.
            with contextlib.suppress(self._error):
                self._shutdown(self._module)  # type: ignore[arg-type]

    def _load(self) -> ModuleType:
        if self._module is None:
            self._module = self._import()
        self._error = self._error_type(self._module)
        return self._module

    def _resolve(self, uuids: list[str]) -> list[int]:
        """The indices ``gpus`` selects, in its order; SourceUnavailable naming what exists."""
        if self.gpus is None:
            return list(range(len(uuids)))
        by_uuid = {u.lower(): i for i, u in enumerate(uuids)}
        indices: list[int] = []
        for wanted in self.gpus:
            key = wanted.strip()
            if key.isdigit() and int(key) < len(uuids):
                index = int(key)
            elif key.lower() in by_uuid:
                index = by_uuid[key.lower()]
            else:
                available = ", ".join(f"{i} ({u})" for i, u in enumerate(uuids))
                raise SourceUnavailable(f"no GPU {wanted!r} on this machine; available: {available}")
            if index not in indices:
                indices.append(index)
        return indices

    def _opened(
        self, kinds: dict[str, str | None], columns: list[str], driver: str | None, caveats: list[str]
    ) -> SourceInfo:
        """What open() found: a meter per GPU with power (``kinds`` by channel), and a line
        naming the GPUs, the driver and what each GPU lacks."""
        meters = []
        for channel, kind in kinds.items():
            if kind is None:
                caveats.append(f"no power reading on {channel}")
                continue
            quantity = power_quantity(channel, columns)  # an average is integrated a window late
            meters.append(Meter(channel=channel, kind=kind, accelerator=True, power_quantity=quantity))
            if kind == "power":
                caveats.append(f"no energy counter on {channel}, power integrated")
        names = Counter(g.name for g in self._selected)
        description = " + ".join(f"{n} × {name}" for name, n in names.items())
        if driver:
            description += f" (driver {driver})"
        if caveats:
            description += "; " + "; ".join(caveats)
        return SourceInfo(columns=columns, meters=meters, description=description)
