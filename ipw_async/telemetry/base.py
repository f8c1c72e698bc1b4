"""The one small interface every telemetry source implements."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .._clock import now_ns
from .grid import CounterGrid


class SourceUnavailable(Exception):
    """A source cannot run on this machine; the message says why, in one sentence."""


class Quantity(StrEnum):
    """What a column measures; the suffix of its name (``<channel>.<quantity>``)."""

    ENERGY_J = "energy_j"  # cumulative counter, joules, made monotonic by CounterTracker
    POWER_W = "power_w"  # instantaneous
    AVG_POWER_W = "avg_power_w"  # averaged by the device over its own window (NVML: ~1 s)
    UTIL_PCT = "util_pct"
    MEM_USED_MB = "mem_used_mb"
    TEMP_C = "temp_c"
    RSS_MB = "rss_mb"
    # covariates of a device's power: the compute clock (NVIDIA's SM, AMD's GFX), the memory
    # clock, and why the clocks are held down (the device's bitmask: NVML's clocks event
    # reasons, amdsmi's throttle status)
    SM_CLOCK_MHZ = "sm_clock_mhz"
    MEM_CLOCK_MHZ = "mem_clock_mhz"
    THROTTLE_REASONS = "throttle_reasons"


# NVML's averaged power (NVML_FI_DEV_POWER_AVERAGE, and nvmlDeviceGetPowerUsage on Ampere and
# newer but GA100) is "averaged over 1 sec"; the simulator's avg-power device averages alike
AVERAGE_WINDOW_NS = 1e9


def power_quantity(channel: str, columns: list[str]) -> Quantity:
    """The power a channel's meter integrates where it must: the device's own average where
    the log has it (placed a window late), else its instant power. An average is an integral
    of what the device drew; an instant field is a point value, on an H100 refreshed every
    100 ms, and read every 50 ms it samples 10–20 ms steps as chance has it. Read without their
    counter, the real H100 runs' requests erred 6.0% at p95 (c128) from the average, 32% from
    the instant field (Poisson: 14% and 31%; c8: 3.2% and 7.0%)."""
    if f"{channel}.{Quantity.AVG_POWER_W}" in columns:
        return Quantity.AVG_POWER_W
    return Quantity.POWER_W


def time_column(source: str) -> str:
    """The column of a source's reading times (ns since run start)."""
    return f"{source}.t_ns"


@dataclass(frozen=True)
class Meter:
    """A channel that measures energy: one GPU, one RAPL domain, the simulated device.

    ``kind`` says how its energy is known: ``counter`` (cumulative energy column), ``power``
    (power column only, integrated) or ``estimate`` (a model, not a measurement).
    ``accelerator`` meters form a run's headline energy.
    """

    channel: str
    kind: str
    accelerator: bool = False
    # the column a power-only meter integrates (the simulator may expose only averaged power)
    power_quantity: str = Quantity.POWER_W
    source: str = ""  # the source's name, set by the sampler: its time column is <source>.t_ns
    # when a counter's value changes, as the sampler's probes learned it (none: not learned)
    grids: tuple[CounterGrid, ...] = ()
    # why a counter is not used and its power is integrated instead ("": it is trusted)
    distrusted: str = ""

    @property
    def energy_column(self) -> str:
        return f"{self.channel}.{Quantity.ENERGY_J}"

    @property
    def power_column(self) -> str:
        return f"{self.channel}.{self.power_quantity}"

    @property
    def window_ns(self) -> float:
        """How long the device averaged the power this meter integrates (0: instant power, or
        a counter's energy): a step's energy reaches it spread over that long after the step."""
        averaged = self.kind == "power" and self.power_quantity == Quantity.AVG_POWER_W
        return AVERAGE_WINDOW_NS if averaged else 0.0

    @property
    def temperature_column(self) -> str:
        return f"{self.channel}.{Quantity.TEMP_C}"

    @property
    def time_column(self) -> str:
        """When each of its source's readings was taken."""
        return time_column(self.source)

    def as_dict(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "kind": self.kind,
            "accelerator": self.accelerator,
            "power_quantity": str(self.power_quantity),
            "source": self.source,
            "grids": [g.as_dict() for g in self.grids],
            "distrusted": self.distrusted,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Meter:
        grids = tuple(CounterGrid.from_dict(g) for g in data.get("grids", ()))
        return cls(
            data["channel"],
            data["kind"],
            data["accelerator"],
            data["power_quantity"],
            data["source"],
            grids,
            data.get("distrusted", ""),
        )


@dataclass
class Reading:
    """One read of a source: values by column name (None where this read failed)."""

    values: dict[str, float | None]
    # The instant the values describe, on the run clock. Sources that carry their own
    # timestamp (the simulator) set it; otherwise the sampler uses the read's midpoint.
    t_ns: int | None = None


@dataclass
class SourceInfo:
    """What a source found when it opened: its columns, meters and a one-line description."""

    columns: list[str]
    meters: list[Meter] = field(default_factory=list)
    description: str = ""
    simulated: bool = False  # its readings come from a simulated device, not hardware


class TelemetrySource(abc.ABC):
    """A hardware (or simulated) sensor read by the sampler.

    ``open`` raises :class:`SourceUnavailable` with a reason a user can act on. ``read`` is
    blocking and is called from a worker thread, never on the event loop; it must not raise
    for a transient failure but return None values instead.
    """

    name: str
    # how another process opens the same source (:func:`.sources.from_recipe`); None for one
    # that cannot be opened twice (an agent's stream, followed by threads here) or was made by hand
    recipe: dict[str, Any] | None = None

    @abc.abstractmethod
    def open(self) -> SourceInfo: ...

    @abc.abstractmethod
    def read(self) -> Reading: ...

    def read_counters(self) -> Reading:
        """The energy counters alone, for the sampler's 2 ms probe; sources whose full read
        is costly (NVML's utilisation, memory, temperature) read less here."""
        return self.read()

    def counter_events(self) -> dict[str, dict[str, int]]:
        """Resets and wraps each energy counter has shown so far, by channel."""
        return {}

    def learned_grids(self) -> dict[str, list[CounterGrid]] | None:
        """Counter update grids the source learns itself (an agent probes on its own host), by
        channel, on this machine's clock (ns); None: the sampler probes the source."""
        return None

    def clock(self) -> dict[str, Any] | None:
        """How its stamps were put on this machine's clock, where they come from another."""
        return None

    def processes(self) -> dict[str, list[int] | None]:
        """The processes computing on each of its devices now (their PIDs), by channel; None
        for a device that cannot tell, and no channel for a source without devices to ask."""
        return {}

    def close(self) -> None:  # noqa: B027 - most sources hold nothing to release
        pass


@dataclass
class OpenSource:
    """A source and what it said it reads when it opened."""

    source: TelemetrySource
    info: SourceInfo


class CounterTracker:
    """Turns a raw hardware energy counter into a monotonic one.

    With ``wrap_at`` (RAPL's ``max_energy_range_uj``) a decrease is a wrap-around and adds the
    range. Without it (NVML) a decrease is a counter reset: the energy between the last read
    and the reset is unknown, so the counter continues from its last value and ``resets``
    counts the event; it never yields negative energy.
    """

    def __init__(self, wrap_at: float | None = None) -> None:
        self.wrap_at = wrap_at
        self.resets = 0
        self.wraps = 0
        self._offset = 0.0
        self._last_raw: float | None = None

    def update(self, raw: float) -> float:
        last = self._last_raw
        if last is not None and raw < last:
            if self.wrap_at is not None:
                self._offset += self.wrap_at
                self.wraps += 1
            else:
                self._offset += last
                self.resets += 1
        self._last_raw = raw
        return self._offset + raw


class CountedSource(TelemetrySource):
    """A source whose energy counters go through a :class:`CounterTracker` per channel, so
    their resets and wraps reach the run's summary."""

    counters: dict[str, CounterTracker]

    def counter_events(self) -> dict[str, dict[str, int]]:
        return {channel: {"resets": t.resets, "wraps": t.wraps} for channel, t in self.counters.items()}


def timed_read(read: Callable[[], Reading]) -> tuple[Reading, int, int]:
    """Call a blocking read; return it with its start time and its latency in ns."""
    start = now_ns()
    reading = read()
    return reading, start, now_ns() - start


def read_time(reading: Reading, start: int, latency: int) -> int:
    """The instant a read describes: its own stamp, else the middle of the read."""
    return reading.t_ns if reading.t_ns is not None else start + latency // 2
