"""The deadline-scheduled sampler and the telemetry log it keeps for the whole run."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

import anyio
import polars as pl

from .._clock import now_ns
from ..stats import distribution
from .base import Meter, Reading, SourceInfo, TelemetrySource, timed_read


@dataclass
class OpenSource:
    source: TelemetrySource
    info: SourceInfo


class TelemetryLog:
    """Columnar and whole: a query can last minutes, so nothing is dropped.

    Columns: ``t_ns`` (the tick's deadline), ``lateness_ns``, and per source ``<name>.t_ns``
    (the instant its values describe), ``<name>.read_ns`` (read latency) and its value columns.
    All times are ns since the run's start.
    """

    def __init__(self, sources: list[OpenSource]) -> None:
        self.sources = sources
        names = ["t_ns", "lateness_ns"]
        for s in sources:
            names += [f"{s.source.name}.t_ns", f"{s.source.name}.read_ns", *s.info.columns]
        self.columns: dict[str, list[float | int | None]] = {n: [] for n in names}

    @property
    def meters(self) -> list[Meter]:
        return [replace(m, source=s.source.name) for s in self.sources for m in s.info.meters]

    def __len__(self) -> int:
        return len(self.columns["t_ns"])

    def append(self, row: dict[str, float | int | None]) -> None:
        for name, values in self.columns.items():
            values.append(row.get(name))

    def frame(self) -> pl.DataFrame:
        schema = {
            n: pl.Int64() if n.endswith(("t_ns", "read_ns", "lateness_ns")) else pl.Float64()
            for n in self.columns
        }
        return pl.DataFrame(self.columns, schema=schema)

    def latest(self, column: str) -> float | None:
        for value in reversed(self.columns.get(column, ())):
            if value is not None:
                return float(value)
        return None


@dataclass
class SamplerQuality:
    period_ms: float
    samples: int = 0
    skipped_ticks: int = 0
    lateness_ms: dict[str, float | int | None] = field(default_factory=dict)
    read_latency_ms: dict[str, dict[str, float | int | None]] = field(default_factory=dict)


class Sampler:
    """Reads every source once per period, at absolute deadlines so it never drifts.

    The reads are blocking and run together in one worker thread; the loop only sleeps and
    appends. When a tick is missed entirely it is skipped (and counted), not bunched up.
    """

    def __init__(self, sources: list[OpenSource], period_s: float, t0_ns: int) -> None:
        self.period_ns = int(period_s * 1e9)
        self.t0_ns = t0_ns
        self.log = TelemetryLog(sources)
        self.skipped = 0
        self._sources = sources

    def _read_all(self) -> list[tuple[Reading, int, int]]:
        return [timed_read(s.source.read) for s in self._sources]

    def _row(
        self, deadline: int, woke: int, reads: list[tuple[Reading, int, int]]
    ) -> dict[str, float | int | None]:
        t0 = self.t0_ns
        row: dict[str, float | int | None] = {"t_ns": deadline - t0, "lateness_ns": woke - deadline}
        for s, (reading, start, latency) in zip(self._sources, reads, strict=True):
            name = s.source.name
            at = reading.t_ns if reading.t_ns is not None else start + latency // 2
            row[f"{name}.t_ns"] = at - t0
            row[f"{name}.read_ns"] = latency
            row.update(reading.values)
        return row

    async def sample_once(self) -> None:
        t = now_ns()
        self.log.append(self._row(t, t, await anyio.to_thread.run_sync(self._read_all)))

    async def run(self) -> None:
        """Sample until cancelled; the caller takes a final sample after the last request."""
        if not self._sources:
            return
        deadline = now_ns()
        while True:
            delay = deadline - now_ns()
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            woke = now_ns()
            reads = await anyio.to_thread.run_sync(self._read_all)
            self.log.append(self._row(deadline, woke, reads))
            deadline += self.period_ns
            behind = now_ns() - deadline
            if behind > 0:
                missed = behind // self.period_ns + 1
                self.skipped += int(missed)
                deadline += int(missed) * self.period_ns

    def quality(self) -> SamplerQuality:
        cols = self.log.columns

        def ms(column: str) -> dict[str, float | int | None]:
            return distribution([v / 1e6 for v in cols[column] if v is not None])

        return SamplerQuality(
            period_ms=self.period_ns / 1e6,
            samples=len(self.log),
            skipped_ticks=self.skipped,
            lateness_ms=ms("lateness_ns"),
            read_latency_ms={s.source.name: ms(f"{s.source.name}.read_ns") for s in self._sources},
        )
