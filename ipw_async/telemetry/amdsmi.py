"""AMD GPUs through AMD SMI (ROCm's ``amdsmi``): energy counter, power, utilisation, memory,
temperature, clocks and throttle status."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from .base import (
    CounterTracker,
    Quantity,
    SourceInfo,
    SourceUnavailable,
)
from .gpu import Gpu, GpuLibrarySource

_MIB = 1 << 20  # memory in MiB, as for NVML

# The energy counter counts 2^-16 J (15.2587890625 µJ). Some amdsmi versions report the
# resolution truncated to 15, which reads every joule about 2% low.
RESOLUTION_UJ = 15.2587890625
_TRUNCATED_RESOLUTION_UJ = 15.0

# Read from several threads the counter can come back a little lower than the read before.
# A drop of at most this fraction of the previous value is such a glitch; a larger one is a
# reset (driver reload, GPU reset), which restarts the counter near zero.
GLITCH_FRACTION = 0.01

# Errors that say "try again", so a query failing with them at open keeps its column; any
# other AMD SMI error at open means the device cannot answer it and drops the column.
_TRANSIENT_ERRORS = ("AmdSmiRetryException", "AmdSmiTimeoutException")

# What the library leaves in a field it has no value for, where it does not say "N/A".
_UNSET = frozenset({0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})


class GlitchTolerantTracker(CounterTracker):
    """A :class:`CounterTracker` that holds its value through a small backward step.

    A read lower than the last one by at most ``tolerance`` of it is a glitch, not a reset:
    the counter keeps its last value (the true one is at least that), ``backward`` counts the
    event, and the next read above it continues from there. A larger drop is a reset.
    """

    def __init__(self, tolerance: float = GLITCH_FRACTION) -> None:
        super().__init__()
        self.tolerance = tolerance
        self.backward = 0

    def update(self, raw: float) -> float:
        last = self._last_raw
        if last is not None and raw < last and last - raw <= self.tolerance * last:
            self.backward += 1
            return self._offset + last
        return super().update(raw)


class AmdSmiSource(GpuLibrarySource):
    """AMD GPUs read through AMD SMI; one ``gpu{i}`` channel and meter per selected GPU.

    ``gpus`` selects GPUs by AMD SMI index ("0", the order ``amd-smi list`` shows) or UUID;
    None selects all. ``amdsmi`` replaces the ``amdsmi`` module (tests inject a fake).
    """

    name = "amdsmi"
    library = "AMD SMI"
    init_hint = "is the amdgpu driver loaded?"
    # its Python layer answers some failures with these rather than its own exceptions
    query_errors = (LookupError, TypeError, ValueError)

    def __init__(self, gpus: Sequence[str] | None = None, amdsmi: ModuleType | None = None) -> None:
        super().__init__(gpus, amdsmi)

    def _import(self) -> ModuleType:
        try:
            return importlib.import_module("amdsmi")
        except (ImportError, OSError) as exc:
            raise SourceUnavailable(
                f"AMD SMI not available: {exc}; install ROCm's amdsmi Python package "
                "(pip install /opt/rocm/share/amd_smi)"
            ) from exc

    def _error_type(self, module: ModuleType) -> type[Exception]:
        return getattr(module, "AmdSmiException", None) or getattr(
            module, "AmdSmiLibraryException", Exception
        )

    def _init(self, module: ModuleType) -> None:
        module.amdsmi_init()

    def _shutdown(self, module: ModuleType) -> None:
        module.amdsmi_shut_down()

    def counter_events(self) -> dict[str, dict[str, int]]:
        events = super().counter_events()
        for channel, tracker in self.counters.items():
            if isinstance(tracker, GlitchTolerantTracker):
                events[channel]["backward"] = tracker.backward
        return events

    def _open_devices(self, smi: ModuleType) -> SourceInfo:
        handles = list(smi.amdsmi_get_processor_handles())
        if not handles:
            raise SourceUnavailable("AMD SMI found no GPUs; is the amdgpu driver loaded and a GPU visible?")
        uuids = [str(smi.amdsmi_get_gpu_device_uuid(h)) for h in handles]
        indices = self._resolve(uuids)
        transient = tuple(getattr(smi, n) for n in _TRANSIENT_ERRORS if hasattr(smi, n))
        columns: list[str] = []
        kinds: dict[str, str | None] = {}
        caveats: list[str] = []
        for i in indices:
            gpu = Gpu(handle=handles[i], name=self._market_name(smi, handles[i]))
            kinds[f"gpu{i}"] = self._probe(smi, gpu, f"gpu{i}", transient, caveats)
            self._selected.append(gpu)
            columns += [c for c, _ in gpu.queries]
        return self._opened(kinds, columns, self._driver_version(smi, handles[indices[0]]), caveats)

    def _market_name(self, smi: ModuleType, handle: Any) -> str:
        try:
            name = smi.amdsmi_get_gpu_asic_info(handle)["market_name"]
        except (self._error, LookupError, TypeError):
            return "AMD GPU"
        return name if isinstance(name, str) and name and name != "N/A" else "AMD GPU"

    def _driver_version(self, smi: ModuleType, handle: Any) -> str | None:
        try:
            version = smi.amdsmi_get_gpu_driver_info(handle)["driver_version"]
        except (self._error, AttributeError, LookupError, TypeError):
            return None
        return version if isinstance(version, str) and version and version != "N/A" else None

    def _probe(
        self,
        smi: ModuleType,
        gpu: Gpu,
        channel: str,
        transient: tuple[type[Exception], ...],
        caveats: list[str],
    ) -> str | None:
        """Fill ``gpu``'s queries with those this GPU supports; return its meter kind."""
        h = gpu.handle
        tracker = GlitchTolerantTracker()

        def answers(query: Callable[[], float | None]) -> bool:
            """Whether a query gives a number at open (or fails only for now)."""
            try:
                return query() is not None
            except transient:
                return True  # keep the column, reads will say None while it fails
            except (self._error, AttributeError, LookupError, TypeError, ValueError):
                return False

        def energy_count() -> tuple[float, float]:
            e = smi.amdsmi_get_energy_count(h)
            # "energy_accumulator" since amdsmi 6.2.1; "power" (a count, not watts) before
            count = e["energy_accumulator"] if "energy_accumulator" in e else e["power"]
            return float(count), float(e["counter_resolution"])

        def energy() -> float | None:
            count, resolution = energy_count()
            if resolution == _TRUNCATED_RESOLUTION_UJ:
                resolution = RESOLUTION_UJ
            if resolution <= 0:
                return None
            return tracker.update(count * resolution * 1e-6)

        if answers(lambda: energy_count()[0]):
            self.counters[channel] = tracker
            gpu.queries.append((f"{channel}.{Quantity.ENERGY_J}", energy))
            with contextlib.suppress(self._error, LookupError, TypeError, ValueError):
                if energy_count()[1] == _TRUNCATED_RESOLUTION_UJ:
                    caveats.append(f"{channel} counter resolution reported as 15 µJ, {RESOLUTION_UJ} µJ used")
        has_energy = channel in self.counters

        # Instant power (MI300 and later) where the device has it, else its average.
        has_power = False
        for key in ("current_socket_power", "average_socket_power"):

            def power(key: str = key) -> float | None:
                return _number(smi.amdsmi_get_power_info(h)[key])

            if answers(power):
                gpu.queries.append((f"{channel}.{Quantity.POWER_W}", power))
                has_power = True
                break

        def util() -> float | None:
            value = _number(smi.amdsmi_get_gpu_activity(h)["gfx_activity"])
            return value if value is None or value <= 100 else None

        def mem_used() -> float | None:
            used = smi.amdsmi_get_gpu_memory_usage(h, smi.AmdSmiMemoryType.VRAM)
            return used / _MIB if isinstance(used, int | float) else None

        for quantity, query in (
            (Quantity.UTIL_PCT, util),
            (Quantity.MEM_USED_MB, mem_used),
        ):
            if answers(query):
                gpu.queries.append((f"{channel}.{quantity}", query))

        # the hotspot (junction) sensor where there is one (MI300 has no edge sensor), else edge
        for sensor in ("HOTSPOT", "EDGE"):

            def temp(sensor: str = sensor) -> float | None:
                return _number(
                    smi.amdsmi_get_temp_metric(
                        h, getattr(smi.AmdSmiTemperatureType, sensor), smi.AmdSmiTemperatureMetric.CURRENT
                    )
                )

            if answers(temp):
                gpu.queries.append((f"{channel}.{Quantity.TEMP_C}", temp))
                break

        for quantity, clock in ((Quantity.SM_CLOCK_MHZ, "GFX"), (Quantity.MEM_CLOCK_MHZ, "MEM")):

            def clock_mhz(clock: str = clock) -> float | None:
                info = smi.amdsmi_get_clock_info(h, getattr(smi.AmdSmiClkType, clock))
                return _number(info["cur_clk"] if "cur_clk" in info else info["clk"])

            if answers(clock_mhz):
                gpu.queries.append((f"{channel}.{quantity}", clock_mhz))

        def throttle() -> float | None:
            metrics = smi.amdsmi_get_gpu_metrics_info(h)
            for key in ("indep_throttle_status", "throttle_status"):
                value = _number(metrics.get(key))
                if value is not None:
                    return value
            return None

        if answers(throttle):
            gpu.queries.append((f"{channel}.{Quantity.THROTTLE_REASONS}", throttle))

        if has_energy:
            return "counter"
        return "power" if has_power else None


def _number(value: Any) -> float | None:
    """A reading as a float; None for "N/A", anything not a number, or an unset field."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float) or value in _UNSET:
        return None
    return float(value)
