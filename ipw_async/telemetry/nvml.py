"""NVIDIA GPUs through NVML: energy counter, power, utilisation, memory, temperature, clocks and
the reasons the clocks are held down."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .base import (
    CounterTracker,
    Quantity,
    Reading,
    SourceInfo,
    SourceUnavailable,
)
from .gpu import Gpu, GpuLibrarySource

_MIB = 1 << 20  # memory in MiB, the unit nvidia-smi reports

# Errors that mean "this GPU or driver cannot do that query at all", so its column is dropped;
# any other error at open() is taken as transient and the column is kept.
_UNSUPPORTED_ERRORS = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")
# the Ampere chip whose nvmlDeviceGetPowerUsage is still instant, by model (A100, A30, A800 and
# their X cards; not the RTX A1000 or A3000, which average)
_GA100 = re.compile(r"\b(A100|A30|A800)X?\b")
# GPUs older than Ampere, by the names NVML and DCGM give them: Tesla, Quadro and TITAN left
# NVIDIA's names with Ampere, the cards before it were K, M, P and T numbers (Turing's T4 to
# T1000) and V100, and Turing's GeForce RTX 20xx and GTX 16xx. The list is closed: every model
# named since then is Ampere or newer.
_PRE_AMPERE = re.compile(r"\b(Tesla|Quadro|TITAN|GTX|RTX 20\d0)\b|\b([KMPT]\d{1,4}|V100)(?![0-9])")

# nvmlValue_t union member for each NVML_VALUE_TYPE_* (0..6).
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


@dataclass
class _Gpu(Gpu):
    # Field values (instant/average power) come from a single nvmlDeviceGetFieldValues call.
    field_ids: list[int] = field(default_factory=list)
    field_columns: list[str] = field(default_factory=list)


class NvmlSource(GpuLibrarySource):
    """NVIDIA GPUs read through NVML; one ``gpu{i}`` channel and meter per selected GPU.

    ``gpus`` selects GPUs by NVML index ("0", PCI bus order, which may differ from CUDA's
    default order) or UUID ("GPU-..."); None selects all. ``nvml`` replaces the ``pynvml``
    module (tests inject a fake).
    """

    name = "nvml"
    library = "NVML"
    init_hint = "is an NVIDIA driver installed?"

    def __init__(self, gpus: Sequence[str] | None = None, nvml: ModuleType | None = None) -> None:
        super().__init__(gpus, nvml)
        self._channels: list[str] = []  # each selected GPU's channel, in _selected's order

    def processes(self) -> dict[str, list[int] | None]:
        """Each selected GPU's compute processes (NVML's running compute processes), by PID."""
        nvml = self._module
        assert nvml is not None
        out: dict[str, list[int] | None] = {}
        for channel, gpu in zip(self._channels, self._selected, strict=True):
            try:
                out[channel] = sorted(int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(gpu.handle))
            except self._error:
                out[channel] = None
        return out

    def _import(self) -> ModuleType:
        try:
            return importlib.import_module("pynvml")
        except ImportError as exc:
            raise SourceUnavailable(
                f"NVML not available: {exc}; install nvidia-ml-py (pip install nvidia-ml-py)"
            ) from exc

    def _error_type(self, module: ModuleType) -> type[Exception]:
        return module.NVMLError  # type: ignore[no-any-return]

    def _init(self, module: ModuleType) -> None:
        module.nvmlInit()

    def _shutdown(self, module: ModuleType) -> None:
        module.nvmlShutdown()

    def read(self) -> Reading:
        nvml = self._module
        assert nvml is not None
        reading = super().read()
        values = reading.values
        for gpu in self._selected:
            assert isinstance(gpu, _Gpu)
            if gpu.field_ids:
                try:
                    fields = nvml.nvmlDeviceGetFieldValues(gpu.handle, gpu.field_ids)
                except self._error:
                    for column in gpu.field_columns:
                        values[column] = None
                else:
                    for column, fv in zip(gpu.field_columns, fields, strict=True):
                        values[column] = _field_watts(fv, nvml.NVML_SUCCESS)
        return reading

    def _open_devices(self, nvml: ModuleType) -> SourceInfo:
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            raise SourceUnavailable("NVML found no GPUs; is the driver loaded and a GPU visible?")
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [nvml.nvmlDeviceGetUUID(h) for h in handles]
        unsupported = tuple(getattr(nvml, n) for n in _UNSUPPORTED_ERRORS if hasattr(nvml, n))
        columns: list[str] = []
        kinds: dict[str, str | None] = {}
        for i in self._resolve(uuids):
            gpu = _Gpu(handle=handles[i], name=nvml.nvmlDeviceGetName(handles[i]))
            kinds[f"gpu{i}"] = self._probe(nvml, gpu, f"gpu{i}", unsupported)
            self._selected.append(gpu)
            self._channels.append(f"gpu{i}")
            columns += [c for c, _ in gpu.queries] + gpu.field_columns
        return self._opened(kinds, columns, nvml.nvmlSystemGetDriverVersion(), [])

    def _power_fields(self, nvml: ModuleType, gpu: _Gpu, channel: str) -> None:
        """Add the power fields this GPU answers to ``gpu``'s. A field is used only if it
        returned a value at open: instant power has a fallback and average power is an extra,
        so an unclear answer is not worth a column."""
        fields = [
            (getattr(nvml, fid), f"{channel}.{q}")
            for fid, q in (
                ("NVML_FI_DEV_POWER_INSTANT", Quantity.POWER_W),
                ("NVML_FI_DEV_POWER_AVERAGE", Quantity.AVG_POWER_W),
            )
            if hasattr(nvml, fid)
        ]
        if not fields:
            return
        try:
            answers = nvml.nvmlDeviceGetFieldValues(gpu.handle, [fid for fid, _ in fields])
        except self._error:
            answers = []
        for (fid, column), fv in zip(fields, answers, strict=False):
            if _field_watts(fv, nvml.NVML_SUCCESS) is not None:
                gpu.field_ids.append(fid)
                gpu.field_columns.append(column)

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

        self._power_fields(nvml, gpu, channel)
        instant_field = f"{channel}.{Quantity.POWER_W}" in gpu.field_columns

        has_energy = supported(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
        if has_energy:
            self.counters[channel] = tracker
            gpu.queries.append((f"{channel}.{Quantity.ENERGY_J}", energy))
        has_power = instant_field
        if not instant_field and supported(power_usage):
            has_power = True
            if not _usage_averaged(nvml, h, gpu.name, self._error):
                gpu.queries.append((f"{channel}.{Quantity.POWER_W}", power_usage))
            elif (averaged := f"{channel}.{Quantity.AVG_POWER_W}") not in gpu.field_columns:
                gpu.queries.append((averaged, power_usage))
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


def _usage_averaged(nvml: ModuleType, h: Any, name: str, error: type[Exception]) -> bool:
    """Whether nvmlDeviceGetPowerUsage is the last second's average rather than instant power:
    on Ampere and newer, GA100 (A100, A30) aside, as NVML documents it; by the model's name
    where this pynvml or the driver cannot tell the architecture."""
    architecture = getattr(nvml, "nvmlDeviceGetArchitecture", None)
    ampere = getattr(nvml, "NVML_DEVICE_ARCH_AMPERE", None)
    unknown = getattr(nvml, "NVML_DEVICE_ARCH_UNKNOWN", None)
    if architecture is None or ampere is None:
        return power_usage_averaged(name)
    try:
        arch = architecture(h)
    except error:
        return power_usage_averaged(name)
    if arch == unknown:
        return power_usage_averaged(name)
    return arch >= ampere and not _GA100.search(name)


def power_usage_averaged(name: str) -> bool:
    """Whether a GPU of this model name reports nvmlDeviceGetPowerUsage (and DCGM's
    ``DCGM_FI_DEV_POWER_USAGE``, which reads it) as the last second's average: Ampere and newer,
    GA100 aside, told by the name where no architecture is to hand (behind DCGM's exporter)."""
    return bool(name) and not _PRE_AMPERE.search(name) and not _GA100.search(name)


def _field_watts(fv: Any, success: int) -> float | None:
    """A power field value (mW) in watts, or None where NVML returned an error for it."""
    if fv.nvmlReturn != success:
        return None
    return getattr(fv.value, _VALUE_MEMBERS[fv.valueType]) / 1000.0
