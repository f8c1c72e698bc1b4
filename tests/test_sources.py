"""Tests for the NVML, RAPL, psutil and cpu-model telemetry sources and the source registry."""

from __future__ import annotations

import os
import time
from collections import namedtuple
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipw_async._clock import now_ns
from ipw_async.telemetry.amdsmi import AmdSmiSource
from ipw_async.telemetry.base import SourceUnavailable
from ipw_async.telemetry.cpu_model import CpuModelSource
from ipw_async.telemetry.host import CpuUtilisation, PsutilSource
from ipw_async.telemetry.nvml import NvmlSource
from ipw_async.telemetry.rapl import RaplSource
from ipw_async.telemetry.sources import available_source_names, make_source

# --- a fake pynvml: only the module is faked, NvmlSource runs unchanged above it -------------


class FakeNVMLError(Exception):
    pass


class FakeNotSupported(FakeNVMLError):
    pass


class FakeUnknown(FakeNVMLError):
    pass


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    energy_mj: int | None = 1_000_000  # None: no energy counter (pre-Volta)
    power_mw: int = 300_000
    fields: dict[int, int] = field(default_factory=lambda: {186: 310_000, 185: 290_000})
    util: int = 87
    mem_used: int = 40 * 2**30
    temp: int = 61
    sm_clock: int | None = 1980  # MHz; None: not supported
    mem_clock: int | None = 2619
    clock_reasons: int | None = 0x4  # nvmlClocksEventReasonSwPowerCap
    failing: set[str] = field(default_factory=set)  # queries that fail transiently now
    processes: list[int] = field(default_factory=list)  # PIDs computing on it
    architecture: int | None = None  # NVML_DEVICE_ARCH_*; None: this pynvml cannot tell

    def query(self, what: str, value: int | None) -> int:
        if what in self.failing:
            raise FakeUnknown("Unknown Error")
        if value is None:
            raise FakeNotSupported("Not Supported")
        return value


class FakeNvml:
    NVMLError = FakeNVMLError
    NVMLError_NotSupported = FakeNotSupported
    NVML_SUCCESS = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_VALUE_TYPE_UNSIGNED_INT = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_FI_DEV_POWER_AVERAGE = 185
    NVML_FI_DEV_POWER_INSTANT = 186
    NVML_DEVICE_ARCH_AMPERE = 7
    NVML_DEVICE_ARCH_HOPPER = 9
    NVML_DEVICE_ARCH_UNKNOWN = 0xFFFFFFFF

    def __init__(self, gpus: list[FakeGpu], init_error: str | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = 0

    def nvmlInit(self) -> None:
        if self.init_error:
            raise FakeNVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return h.name

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        return h.query("energy", h.energy_mj)

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return h.query("power", h.power_mw)

    def nvmlDeviceGetArchitecture(self, h: FakeGpu) -> int:
        return h.query("architecture", h.architecture)

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, ids: list[int]) -> list[SimpleNamespace]:
        h.query("fields", 0)
        return [
            SimpleNamespace(
                fieldId=i,
                nvmlReturn=self.NVML_SUCCESS if i in h.fields else self.NVML_ERROR_NOT_SUPPORTED,
                valueType=self.NVML_VALUE_TYPE_UNSIGNED_INT,
                value=SimpleNamespace(uiVal=h.fields.get(i, 0)),
            )
            for i in ids
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[SimpleNamespace]:
        h.query("processes", 0)
        return [SimpleNamespace(pid=pid, usedGpuMemory=2**30) for pid in h.processes]

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(gpu=h.query("util", h.util), memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(used=h.query("mem", h.mem_used), total=80 * 2**30)

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        return h.query("temp", h.temp)

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock: int) -> int:
        if clock == self.NVML_CLOCK_SM:
            return h.query("sm_clock", h.sm_clock)
        assert clock == self.NVML_CLOCK_MEM
        return h.query("mem_clock", h.mem_clock)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        return h.query("clock_reasons", h.clock_reasons)


class OldFakeNvml(FakeNvml):
    """A pynvml from before driver 535: the reasons call still has its "throttle" name."""

    nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        return h.query("clock_reasons", h.clock_reasons)


def nvml_source(*gpus: FakeGpu, select: list[str] | None = None) -> tuple[NvmlSource, FakeNvml]:
    fake = FakeNvml(list(gpus))
    return NvmlSource(gpus=select, nvml=fake), fake  # type: ignore[arg-type]


def test_nvml_reads_every_quantity_in_si_units() -> None:
    source, fake = nvml_source(FakeGpu("GPU-aaa", energy_mj=5_000))
    info = source.open()
    assert info.columns == [
        "gpu0.energy_j",
        "gpu0.util_pct",
        "gpu0.mem_used_mb",
        "gpu0.temp_c",
        "gpu0.sm_clock_mhz",
        "gpu0.mem_clock_mhz",
        "gpu0.throttle_reasons",
        "gpu0.power_w",
        "gpu0.avg_power_w",
    ]
    assert [(m.channel, m.kind, m.accelerator) for m in info.meters] == [("gpu0", "counter", True)]
    assert info.description == "1 × NVIDIA H100 80GB HBM3 (driver 550.54)"
    values = source.read().values
    assert values == {
        "gpu0.energy_j": 5.0,
        "gpu0.power_w": 310.0,  # instant field, not the averaged nvmlDeviceGetPowerUsage
        "gpu0.avg_power_w": 290.0,
        "gpu0.util_pct": 87.0,
        "gpu0.mem_used_mb": 40 * 1024.0,
        "gpu0.temp_c": 61.0,
        "gpu0.sm_clock_mhz": 1980.0,
        "gpu0.mem_clock_mhz": 2619.0,
        "gpu0.throttle_reasons": 4.0,
    }
    fake.gpus[0].energy_mj = 7_500
    assert source.read().values["gpu0.energy_j"] == 7.5
    # the sampler's 2 ms probe asks for the counter alone; both reads are stamped at the
    # counter reads, not at the slower queries after them
    fake.gpus[0].energy_mj = 8_000
    before = now_ns()
    counters = source.read_counters()
    assert counters.values == {"gpu0.energy_j": 8.0}
    assert counters.t_ns is not None and before <= counters.t_ns <= now_ns()
    assert source.read().t_ns is not None
    source.close()
    assert fake.initialised == 0


def test_nvml_counter_reset_never_gives_negative_energy() -> None:
    source, fake = nvml_source(FakeGpu("GPU-aaa", energy_mj=10_000))
    source.open()
    assert source.read().values["gpu0.energy_j"] == 10.0
    fake.gpus[0].energy_mj = 2_000  # driver reload: the counter restarts from zero
    assert source.read().values["gpu0.energy_j"] == 12.0
    fake.gpus[0].energy_mj = 3_000
    assert source.read().values["gpu0.energy_j"] == 13.0
    assert source.counters["gpu0"].resets == 1


def test_nvml_selects_gpus_by_index_and_uuid() -> None:
    gpus = [FakeGpu("GPU-aaa"), FakeGpu("GPU-bbb", name="NVIDIA A100"), FakeGpu("GPU-ccc")]
    source, _ = nvml_source(*gpus, select=["2"])
    info = source.open()
    assert [m.channel for m in info.meters] == ["gpu2"]
    assert set(source.read().values) == set(info.columns)
    assert all(c.startswith("gpu2.") for c in info.columns)

    source, _ = nvml_source(*gpus, select=["GPU-bbb", "0", "1"])
    info = source.open()
    assert [m.channel for m in info.meters] == ["gpu1", "gpu0"]
    assert info.description == "1 × NVIDIA A100 + 1 × NVIDIA H100 80GB HBM3 (driver 550.54)"


def test_nvml_unknown_gpu_lists_the_available_ones() -> None:
    source, fake = nvml_source(FakeGpu("GPU-aaa"), FakeGpu("GPU-bbb"), select=["GPU-nope"])
    with pytest.raises(SourceUnavailable, match="GPU-nope") as excinfo:
        source.open()
    assert "0 (GPU-aaa)" in str(excinfo.value) and "1 (GPU-bbb)" in str(excinfo.value)
    assert fake.initialised == 0  # NVML shut down again

    source, _ = nvml_source(FakeGpu("GPU-aaa"), select=["3"])
    with pytest.raises(SourceUnavailable, match=r"'3'.*available: 0 \(GPU-aaa\)"):
        source.open()


def test_nvml_init_failure_is_unavailable_with_a_hint() -> None:
    source = NvmlSource(nvml=FakeNvml([], init_error="Driver Not Loaded"))  # type: ignore[arg-type]
    with pytest.raises(SourceUnavailable, match="NVML not available: Driver Not Loaded; is an NVIDIA driver"):
        source.open()


def test_nvml_without_energy_counter_meters_power() -> None:
    source, _ = nvml_source(FakeGpu("GPU-aaa", energy_mj=None))
    info = source.open()
    assert "gpu0.energy_j" not in info.columns
    assert [(m.channel, m.kind) for m in info.meters] == [("gpu0", "power")]
    assert "no energy counter on gpu0" in info.description
    assert "gpu0.energy_j" not in source.read().values


def test_nvml_falls_back_to_power_usage_without_power_fields() -> None:
    # a GPU before Ampere, whose power usage is instant
    source, _ = nvml_source(FakeGpu("GPU-aaa", name="Tesla V100-SXM2-16GB", fields={}))
    info = source.open()
    assert "gpu0.avg_power_w" not in info.columns
    assert source.read().values["gpu0.power_w"] == 300.0


@pytest.mark.parametrize(
    ("name", "architecture", "averaged"),
    [
        ("NVIDIA H100 80GB HBM3", FakeNvml.NVML_DEVICE_ARCH_HOPPER, True),
        ("NVIDIA A100-SXM4-80GB", FakeNvml.NVML_DEVICE_ARCH_AMPERE, False),  # GA100: instant
        ("NVIDIA A800 80GB PCIe", FakeNvml.NVML_DEVICE_ARCH_AMPERE, False),  # GA100 too
        ("NVIDIA RTX A1000 6GB Laptop GPU", FakeNvml.NVML_DEVICE_ARCH_AMPERE, True),  # not GA100
        ("Tesla V100-SXM2-16GB", 5, False),
        # the architecture unknown to this driver: by the model's name, as behind DCGM
        ("NVIDIA H100 80GB HBM3", FakeNvml.NVML_DEVICE_ARCH_UNKNOWN, True),
        ("Tesla V100-SXM2-16GB", FakeNvml.NVML_DEVICE_ARCH_UNKNOWN, False),
        ("NVIDIA A30", FakeNvml.NVML_DEVICE_ARCH_UNKNOWN, False),
    ],
)
def test_power_usage_is_read_as_the_average_it_is_on_ampere_and_newer(
    name: str, architecture: int, averaged: bool
) -> None:
    # without the power fields and the counter, the meter integrates nvmlDeviceGetPowerUsage:
    # NVML documents it as the last second's average on Ampere and newer, GA100 aside, and an
    # average reaches the meter a window late
    gpu = FakeGpu("GPU-aaa", name=name, energy_mj=None, fields={}, architecture=architecture)
    source, _ = nvml_source(gpu)
    info = source.open()
    column = "gpu0.avg_power_w" if averaged else "gpu0.power_w"
    assert source.read().values[column] == 300.0
    assert [m.window_ns for m in info.meters] == [1e9 if averaged else 0.0]


def test_nvml_transient_read_error_gives_none_not_zero() -> None:
    source, fake = nvml_source(FakeGpu("GPU-aaa"))
    source.open()
    fake.gpus[0].failing = {"energy", "fields"}
    values = source.read().values
    assert values["gpu0.energy_j"] is None
    assert values["gpu0.power_w"] is None and values["gpu0.avg_power_w"] is None
    assert values["gpu0.util_pct"] == 87.0
    fake.gpus[0].failing = set()
    assert source.read().values["gpu0.energy_j"] == 1000.0


def test_nvml_transient_error_at_open_keeps_the_column() -> None:
    gpu = FakeGpu("GPU-aaa", failing={"temp"})
    source, _ = nvml_source(gpu)
    assert "gpu0.temp_c" in source.open().columns
    assert source.read().values["gpu0.temp_c"] is None
    gpu.failing = set()
    assert source.read().values["gpu0.temp_c"] == 61.0


def test_nvml_clocks_and_reasons_follow_the_device() -> None:
    source, fake = nvml_source(FakeGpu("GPU-aaa"))
    source.open()
    gpu = fake.gpus[0]
    gpu.sm_clock, gpu.mem_clock, gpu.clock_reasons = 1410, 1593, 0x4 | 0x20  # power cap + HW slowdown
    values = source.read().values
    assert (values["gpu0.sm_clock_mhz"], values["gpu0.mem_clock_mhz"]) == (1410.0, 1593.0)
    assert values["gpu0.throttle_reasons"] == float(0x24)
    # the 2 ms probe reads the counter alone, never the covariates
    assert set(source.read_counters().values) == {"gpu0.energy_j"}
    gpu.failing = {"sm_clock"}
    assert source.read().values["gpu0.sm_clock_mhz"] is None


def test_nvml_drops_an_unsupported_covariate() -> None:
    source, _ = nvml_source(FakeGpu("GPU-aaa", mem_clock=None, clock_reasons=None))
    info = source.open()
    assert "gpu0.sm_clock_mhz" in info.columns
    assert "gpu0.mem_clock_mhz" not in info.columns and "gpu0.throttle_reasons" not in info.columns
    values = source.read().values
    assert "gpu0.mem_clock_mhz" not in values and values["gpu0.sm_clock_mhz"] == 1980.0


def test_nvml_reads_throttle_reasons_through_the_old_name() -> None:
    fake = OldFakeNvml([FakeGpu("GPU-aaa", clock_reasons=0x1)])
    source = NvmlSource(nvml=fake)  # type: ignore[arg-type]
    assert "gpu0.throttle_reasons" in source.open().columns
    assert source.read().values["gpu0.throttle_reasons"] == 1.0


# --- RAPL against a fake powercap tree ---------------------------------------------------------


def write_zone(path: Path, name: str, energy_uj: int, max_uj: int = 262_143_328_850) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "name").write_text(f"{name}\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")


@pytest.fixture
def powercap(tmp_path: Path) -> Path:
    root = tmp_path / "powercap"
    (root / "intel-rapl").mkdir(parents=True)  # the control type, not a zone
    write_zone(root / "intel-rapl:0", "package-0", 1_500_000)
    write_zone(root / "intel-rapl:0" / "intel-rapl:0:0", "core", 400_000)
    write_zone(root / "intel-rapl:0" / "intel-rapl:0:1", "dram", 250_000)
    write_zone(root / "intel-rapl:1", "psys", 9_000_000)  # whole platform: would double count
    return root


def test_rapl_reads_package_and_dram_in_joules(powercap: Path) -> None:
    source = RaplSource(root=powercap)
    info = source.open()
    assert info.columns == ["rapl.package-0.energy_j", "rapl.dram-0.energy_j"]
    assert [(m.channel, m.kind, m.accelerator) for m in info.meters] == [
        ("rapl.package-0", "counter", False),
        ("rapl.dram-0", "counter", False),
    ]
    assert source.read().values == {"rapl.package-0.energy_j": 1.5, "rapl.dram-0.energy_j": 0.25}
    (powercap / "intel-rapl:0" / "energy_uj").write_text("2750000\n")
    assert source.read().values["rapl.package-0.energy_j"] == 2.75
    source.close()


def test_rapl_flat_layout_and_second_package(tmp_path: Path) -> None:
    write_zone(tmp_path / "intel-rapl:0", "package-0", 1)
    write_zone(tmp_path / "intel-rapl:2", "package-1", 2)
    write_zone(tmp_path / "intel-rapl:2:0", "dram", 3)
    source = RaplSource(root=tmp_path)
    assert source.open().columns == [
        "rapl.package-0.energy_j",
        "rapl.package-1.energy_j",
        "rapl.dram-1.energy_j",
    ]
    source.close()


def test_rapl_wraparound_stays_monotonic(tmp_path: Path) -> None:
    write_zone(tmp_path / "intel-rapl:0", "package-0", 900_000, max_uj=1_000_000)
    source = RaplSource(root=tmp_path)
    source.open()
    assert source.read().values["rapl.package-0.energy_j"] == 0.9
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("100000\n")
    assert source.read().values["rapl.package-0.energy_j"] == pytest.approx(1.1)
    assert source.counters["rapl.package-0"].wraps == 1
    source.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.integers(min_value=0, max_value=999), max_size=20))
def test_rapl_energy_is_the_sum_of_increments(tmp_path: Path, steps: list[int]) -> None:
    max_uj = 1000
    write_zone(tmp_path / "intel-rapl:0", "package-0", 0, max_uj=max_uj)
    source = RaplSource(root=tmp_path)
    source.open()
    energy_file = tmp_path / "intel-rapl:0" / "energy_uj"
    assert source.read().values["rapl.package-0.energy_j"] == 0.0
    total = 0
    for step in steps:  # each step below the wrap range, so every wrap is seen
        total += step
        energy_file.write_text(f"{total % max_uj}\n")
        assert source.read().values["rapl.package-0.energy_j"] == pytest.approx(total / 1e6)
    source.close()


def test_rapl_missing_root_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match=r"no RAPL powercap interface at .*powercap not mounted"):
        RaplSource(root=tmp_path / "missing").open()


def test_rapl_without_package_zone_is_unavailable(tmp_path: Path) -> None:
    write_zone(tmp_path / "intel-rapl:0", "psys", 1)
    with pytest.raises(SourceUnavailable, match="no RAPL package zones"):
        RaplSource(root=tmp_path).open()


def test_rapl_permission_error_says_how_to_fix_it(powercap: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def deny_energy(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith("energy_uj"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny_energy)
    with pytest.raises(SourceUnavailable, match=r"need root.*sudo chmod a\+r .*/intel-rapl:\*/energy_uj"):
        RaplSource(root=powercap).open()


def test_rapl_close_releases_file_handles(powercap: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    source = RaplSource(root=powercap)
    source.open()
    assert len(os.listdir("/proc/self/fd")) == before + 2
    source.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_rapl_unreadable_value_gives_none(powercap: Path) -> None:
    source = RaplSource(root=powercap)
    source.open()
    (powercap / "intel-rapl:0" / "energy_uj").write_text("")
    values = source.read().values
    assert values["rapl.package-0.energy_j"] is None
    assert values["rapl.dram-0.energy_j"] == 0.25
    source.close()


# --- host: psutil and the cpu-model estimate ---------------------------------------------------

CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait")


class FakeCpuTimes:
    """psutil.cpu_times() for a CPU whose utilisation the test sets."""

    def __init__(self) -> None:
        self.busy = 0.0
        self.idle = 0.0

    def run(self, util_pct: float, seconds: float = 1.0) -> None:
        self.busy += seconds * util_pct / 100
        self.idle += seconds * (1 - util_pct / 100)

    def __call__(self) -> CpuTimes:
        return CpuTimes(user=self.busy, nice=0.0, system=0.0, idle=self.idle, iowait=0.0)


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch) -> FakeCpuTimes:
    fake = FakeCpuTimes()
    monkeypatch.setattr(psutil, "cpu_times", fake)
    return fake


def test_psutil_source_reads_plausible_numbers() -> None:
    source = PsutilSource()
    info = source.open()
    assert info.columns == ["cpu.util_pct", "mem.used_mb", "proc.rss_mb"]
    assert info.meters == []
    start = time.process_time()
    while time.process_time() - start < 0.05:  # let CPU time pass: several of the kernel's 10 ms ticks
        sum(i * i for i in range(10_000))
    values = source.read().values
    assert values["cpu.util_pct"] is not None and 0.0 <= values["cpu.util_pct"] <= 100.0
    total_mb = psutil.virtual_memory().total / 2**20
    assert values["mem.used_mb"] is not None and 0 < values["mem.used_mb"] < total_mb
    assert values["proc.rss_mb"] is not None and 1 < values["proc.rss_mb"] < total_mb


def test_cpu_utilisation_keeps_its_own_baseline(cpu: FakeCpuTimes) -> None:
    a, b = CpuUtilisation(psutil), CpuUtilisation(psutil)
    cpu.run(50)
    assert a.percent() == 50.0
    # b was read in the same tick as a: it still sees its own whole interval, not 0 %.
    assert b.percent() == 50.0
    assert a.percent() == 50.0  # no tick elapsed: the last value, not 0 %
    cpu.run(20, seconds=3)
    assert a.percent() == pytest.approx(20.0)


def test_cpu_model_power_is_bounded_and_monotone(cpu: FakeCpuTimes) -> None:
    source = CpuModelSource(tdp_w=100.0, idle_fraction=0.3)
    info = source.open()
    assert info.columns == ["cpu-model.power_w"]
    assert [(m.channel, m.kind, m.accelerator) for m in info.meters] == [("cpu-model", "estimate", False)]
    powers = []
    for util in range(0, 101, 5):
        cpu.run(util)
        powers.append(source.read().values["cpu-model.power_w"])
    assert powers[0] == pytest.approx(30.0) and powers[-1] == pytest.approx(100.0)
    assert all(30.0 - 1e-9 <= p <= 100.0 + 1e-9 for p in powers)
    assert powers == sorted(powers) and len(set(powers)) == len(powers)
    # Concave: half utilisation costs more than half the dynamic range.
    assert source.power_at(0.5) > 30.0 + 0.5 * 70.0


def test_cpu_model_description_says_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    description = CpuModelSource().open().description
    assert description == (
        "estimate: TDP 20 W (assumed 10 W/core × 2 cores) × utilisation curve; not a measurement"
    )
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert CpuModelSource().tdp_w == 280.0
    assert "clamped to 280 W" in CpuModelSource().open().description
    assert CpuModelSource(tdp_w=65).open().description.startswith("estimate: TDP 65 W × ")


def test_cpu_model_rejects_nonsense_parameters() -> None:
    with pytest.raises(ValueError, match="tdp_w"):
        CpuModelSource(tdp_w=0)
    with pytest.raises(ValueError, match="idle_fraction"):
        CpuModelSource(idle_fraction=1.5)


# --- registry ----------------------------------------------------------------------------------


def test_registry_makes_each_source() -> None:
    assert available_source_names() == ["nvml", "amdsmi", "rapl", "psutil", "cpu-model"]
    for name in available_source_names():
        assert make_source(name).name == name
    nvml = make_source("nvml", gpus=["1"])
    assert isinstance(nvml, NvmlSource) and nvml.gpus == ["1"]
    amd = make_source("amdsmi", gpus=["0"])
    assert isinstance(amd, AmdSmiSource) and amd.gpus == ["0"]


def test_registry_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match=r"'nope'.*nvml, amdsmi, rapl, psutil, cpu-model"):
        make_source("nope")
