"""NVIDIA GPUs through NVML: energy counter, power, utilisation, memory, temperature, clocks and
the reasons the clocks are held down."""

from __future__ import annotations

import contextlib
import importlib
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
)

_MIB = 1 << 20  # memory in MiB, the unit nvidia-smi reports

# Errors that mean "this GPU or driver cannot do that query at all", so its column is dropped;
# any other error at open() is taken as transient and the column is kept.
_UNSUPPORTED_ERRORS = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")

# nvmlValue_t union member for each NVML_VALUE_TYPE_* (0..6).
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


@dataclass
class _Gpu:
    """One selected GPU and the queries that open() found it supports."""

    handle: Any
    name: str
    queries: list[tuple[str, Callable[[], float]]] = field(default_factory=list)
    # Field values (instant/average power) come from a single nvmlDeviceGetFieldValues call.
    field_ids: list[int] = field(default_factory=list)
    field_columns: list[str] = field(default_factory=list)


class NvmlSource(CountedSource):
    """NVIDIA GPUs read through NVML; one ``gpu{i}`` channel and meter per selected GPU.

    ``gpus`` selects GPUs by NVML index ("0", PCI bus order, which may differ from CUDA's
    default order) or UUID ("GPU-..."); None selects all. ``nvml`` replaces the ``pynvml``
    module (tests inject a fake).
    """

    name = "nvml"

    def __init__(self, gpus: Sequence[str] | None = None, nvml: ModuleType | None = None) -> None:
        self.gpus = list(gpus) if gpus is not None else None
        self._nvml = nvml
        self._selected: list[_Gpu] = []
        self._error: type[Exception] = Exception
        self._initialised = False
        self.counters: dict[str, CounterTracker] = {}  # per channel; resets and wraps reach the summary

    def open(self) -> SourceInfo:
        nvml = self._load()
        try:
            nvml.nvmlInit()
        except self._error as exc:
            raise SourceUnavailable(f"NVML not available: {exc}; is an NVIDIA driver installed?") from exc
        self._initialised = True
        self._selected = []
        self.counters = {}
        try:
            return self._open_devices(nvml)
        except BaseException:
            self.close()
            raise

    def read(self) -> Reading:
        nvml = self._nvml
        error = self._error
        counters = self.read_counters()
        values = counters.values | self._query(lambda column: not _is_energy(column))
        for gpu in self._selected:
            if gpu.field_ids:
                try:
                    fields = nvml.nvmlDeviceGetFieldValues(gpu.handle, gpu.field_ids)
                except error:
                    for column in gpu.field_columns:
                        values[column] = None
                else:
                    for column, fv in zip(gpu.field_columns, fields, strict=True):
                        values[column] = _field_watts(fv, nvml.NVML_SUCCESS)
        return Reading(values, counters.t_ns)

    def read_counters(self) -> Reading:
        # Every GPU's counter first, stamped together: the other queries take longer than
        # the counter grid's timing is good for.
        start = now_ns()
        values = self._query(_is_energy)
        return Reading(values, (start + now_ns()) // 2)

    def _query(self, wanted: Callable[[str], bool]) -> dict[str, float | None]:
        values: dict[str, float | None] = {}
        for gpu in self._selected:
            for column, query in gpu.queries:
                if wanted(column):
                    try:
                        values[column] = query()
                    except self._error:
                        values[column] = None
        return values

    def close(self) -> None:
        if self._initialised:
            self._initialised = False
            self._selected = []
            # If the driver refuses there is nothing left to release.
            with contextlib.suppress(self._error):
                self._nvml.nvmlShutdown()

    def _load(self) -> ModuleType:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                raise SourceUnavailable(
                    f"NVML not available: {exc}; install nvidia-ml-py (pip install nvidia-ml-py)"
                ) from exc
        self._error = self._nvml.NVMLError
        return self._nvml

    def _open_devices(self, nvml: ModuleType) -> SourceInfo:
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            raise SourceUnavailable("NVML found no GPUs; is the driver loaded and a GPU visible?")
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [nvml.nvmlDeviceGetUUID(h) for h in handles]
        indices = self._resolve(uuids)
        unsupported = tuple(getattr(nvml, n) for n in _UNSUPPORTED_ERRORS if hasattr(nvml, n))

        columns: list[str] = []
        meters: list[Meter] = []
        caveats: list[str] = []
        for i in indices:
            gpu = _Gpu(handle=handles[i], name=nvml.nvmlDeviceGetName(handles[i]))
            channel = f"gpu{i}"
            kind = self._probe(nvml, gpu, channel, unsupported)
            self._selected.append(gpu)
            columns += [c for c, _ in gpu.queries] + gpu.field_columns
            if kind is None:
                caveats.append(f"no power reading on {channel}")
            else:
                meters.append(Meter(channel=channel, kind=kind, accelerator=True))
                if kind == "power":
                    caveats.append(f"no energy counter on {channel}, power integrated")

        names = Counter(g.name for g in self._selected)
        description = " + ".join(f"{n} × {name}" for name, n in names.items())
        description += f" (driver {nvml.nvmlSystemGetDriverVersion()})"
        if caveats:
            description += "; " + "; ".join(caveats)
        return SourceInfo(columns=columns, meters=meters, description=description)

    def _resolve(self, uuids: list[str]) -> list[int]:
        if self.gpus is None:
            return list(range(len(uuids)))
        by_uuid = {u: i for i, u in enumerate(uuids)}
        indices: list[int] = []
        for wanted in self.gpus:
            key = wanted.strip()
            if key.isdigit() and int(key) < len(uuids):
                index = int(key)
            elif key in by_uuid:
                index = by_uuid[key]
            else:
                available = ", ".join(f"{i} ({u})" for i, u in enumerate(uuids))
                raise SourceUnavailable(f"no GPU {wanted!r} on this machine; available: {available}")
            if index not in indices:
                indices.append(index)
        return indices

    def _probe(
        self, nvml: ModuleType, gpu: _Gpu, channel: str, unsupported: tuple[type[Exception], ...]
    ) -> str | None:
        """Fill ``gpu``'s queries with those this GPU supports; return its meter kind."""
        h = gpu.handle
        tracker = CounterTracker()

        def energy() -> float:
            return tracker.update(nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0)

        def power_usage() -> float:
            return nvml.nvmlDeviceGetPowerUsage(h) / 1000.0

        def util() -> float:
            return float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)

        def mem_used() -> float:
            return nvml.nvmlDeviceGetMemoryInfo(h).used / _MIB

        def temp() -> float:
            return float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))

        def sm_clock() -> float:
            return float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))

        def mem_clock() -> float:
            return float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM))

        # the bitmask of nvmlClocksEventReason*, called "throttle reasons" before driver 535
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )

        def throttle_reasons() -> float:
            return float(reasons(h))

        def supported(query: Callable[[], Any]) -> bool:
            try:
                query()
            except unsupported:
                return False
            except self._error:
                pass  # transient: keep the column, reads will say None when it fails
            return True

        # Power fields are used only if they returned a value at open: instant power has a
        # fallback and average power is an extra, so an unclear answer is not worth a column.
        fields = [
            (getattr(nvml, fid), f"{channel}.{q}")
            for fid, q in (
                ("NVML_FI_DEV_POWER_INSTANT", Quantity.POWER_W),
                ("NVML_FI_DEV_POWER_AVERAGE", Quantity.AVG_POWER_W),
            )
            if hasattr(nvml, fid)
        ]
        if fields:
            try:
                answers = nvml.nvmlDeviceGetFieldValues(h, [fid for fid, _ in fields])
            except self._error:
                answers = []
            for (fid, column), fv in zip(fields, answers, strict=False):
                if _field_watts(fv, nvml.NVML_SUCCESS) is not None:
                    gpu.field_ids.append(fid)
                    gpu.field_columns.append(column)
        instant_field = f"{channel}.{Quantity.POWER_W}" in gpu.field_columns

        has_energy = supported(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
        if has_energy:
            self.counters[channel] = tracker
            gpu.queries.append((f"{channel}.{Quantity.ENERGY_J}", energy))
        has_power = instant_field
        if not instant_field and supported(power_usage):
            has_power = True
            gpu.queries.append((f"{channel}.{Quantity.POWER_W}", power_usage))
        # covariates of power, where this pynvml has the calls (none reads in read_counters)
        covariates: list[tuple[Quantity, Callable[[], float]]] = []
        if hasattr(nvml, "nvmlDeviceGetClockInfo"):
            covariates += [(Quantity.SM_CLOCK_MHZ, sm_clock), (Quantity.MEM_CLOCK_MHZ, mem_clock)]
        if reasons is not None:
            covariates.append((Quantity.THROTTLE_REASONS, throttle_reasons))
        for quantity, query in (
            (Quantity.UTIL_PCT, util),
            (Quantity.MEM_USED_MB, mem_used),
            (Quantity.TEMP_C, temp),
            *covariates,
        ):
            if supported(query):
                gpu.queries.append((f"{channel}.{quantity}", query))
        if has_energy:
            return "counter"
        return "power" if has_power else None


def _is_energy(column: str) -> bool:
    return column.endswith(f".{Quantity.ENERGY_J}")


def _field_watts(fv: Any, success: int) -> float | None:
    """A power field value (mW) in watts, or None where NVML returned an error for it."""
    if fv.nvmlReturn != success:
        return None
    return getattr(fv.value, _VALUE_MEMBERS[fv.valueType]) / 1000.0
