"""AMD GPUs through AMD SMI, against a fake ``amdsmi`` module: only the module is faked, the
real AmdSmiSource runs above it."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import pytest

from ipw_async._clock import now_ns
from ipw_async.telemetry.amdsmi import RESOLUTION_UJ, AmdSmiSource
from ipw_async.telemetry.base import SourceUnavailable
from ipw_async.telemetry.setup import _names, open_sources

from .test_sources import FakeNvml

# --- a fake amdsmi -----------------------------------------------------------------------------

STATUS_NOT_SUPPORTED = 2
STATUS_RETRY = 47
STATUS_DRIVER_NOT_LOADED = 52


class FakeAmdSmiException(Exception):
    pass


class FakeLibraryException(FakeAmdSmiException):
    def __init__(self, err_code: int) -> None:
        super().__init__(err_code)
        self.err_code = err_code


class FakeRetryException(FakeLibraryException):
    def __init__(self) -> None:
        super().__init__(STATUS_RETRY)


class MemoryType(IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class TemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    VRAM = 2


class TemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1


class ClkType(IntEnum):
    GFX = 0
    DF = 1
    MEM = 4


@dataclass
class FakeAmdGpu:
    uuid: str
    market_name: str = "AMD Instinct MI300X"
    count: int | None = 65_536_000  # energy counter; None: no counter
    resolution: float = RESOLUTION_UJ
    energy_key: str = "energy_accumulator"  # "power" before amdsmi 6.2.1
    current_power: int | str = 750  # MI300: instant socket power
    average_power: int | str = "N/A"
    gfx_activity: int | str = 93
    vram_used: int = 150 * 2**30
    temps: dict[str, int] = field(default_factory=lambda: {"HOTSPOT": 71})  # MI300 has no edge sensor
    clocks: dict[str, int] = field(default_factory=lambda: {"GFX": 2100, "MEM": 1300})
    clock_key: str = "clk"  # "cur_clk" in newer amdsmi
    metrics: dict[str, Any] = field(
        default_factory=lambda: {"throttle_status": "N/A", "indep_throttle_status": 0}
    )
    failing: set[str] = field(default_factory=set)  # queries that fail now
    retrying: set[str] = field(default_factory=set)  # queries that ask to be tried again

    def check(self, what: str) -> None:
        if what in self.retrying:
            raise FakeRetryException()
        if what in self.failing:
            raise FakeLibraryException(8)  # AMDSMI_STATUS_API_FAILED


class FakeAmdSmi:
    AmdSmiException = FakeAmdSmiException
    AmdSmiLibraryException = FakeLibraryException
    AmdSmiRetryException = FakeRetryException
    AmdSmiMemoryType = MemoryType
    AmdSmiTemperatureType = TemperatureType
    AmdSmiTemperatureMetric = TemperatureMetric
    AmdSmiClkType = ClkType

    def __init__(self, gpus: list[FakeAmdGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = 0

    def amdsmi_init(self) -> None:
        if self.init_error is not None:
            raise FakeLibraryException(self.init_error)
        self.initialised += 1

    def amdsmi_shut_down(self) -> None:
        self.initialised -= 1

    def amdsmi_get_processor_handles(self) -> list[FakeAmdGpu]:
        return list(self.gpus)

    def amdsmi_get_gpu_device_uuid(self, h: FakeAmdGpu) -> str:
        return h.uuid

    def amdsmi_get_gpu_asic_info(self, h: FakeAmdGpu) -> dict[str, Any]:
        return {"market_name": h.market_name, "vendor_id": "0x1002"}

    def amdsmi_get_gpu_driver_info(self, h: FakeAmdGpu) -> dict[str, str]:
        return {"driver_name": "amdgpu", "driver_version": "6.8.5", "driver_date": "2015/01/01 00:00"}

    def amdsmi_get_energy_count(self, h: FakeAmdGpu) -> dict[str, Any]:
        h.check("energy")
        if h.count is None:
            raise FakeLibraryException(STATUS_NOT_SUPPORTED)
        return {h.energy_key: h.count, "counter_resolution": h.resolution, "timestamp": 1_712_024_507_665}

    def amdsmi_get_power_info(self, h: FakeAmdGpu) -> dict[str, Any]:
        h.check("power")
        return {
            "current_socket_power": h.current_power,
            "average_socket_power": h.average_power,
            "gfx_voltage": "N/A",
            "power_limit": 750,
        }

    def amdsmi_get_gpu_activity(self, h: FakeAmdGpu) -> dict[str, Any]:
        h.check("util")
        return {"gfx_activity": h.gfx_activity, "umc_activity": 40, "mm_activity": "N/A"}

    def amdsmi_get_gpu_memory_usage(self, h: FakeAmdGpu, mem_type: MemoryType) -> int:
        h.check("mem")
        assert mem_type is MemoryType.VRAM
        return h.vram_used

    def amdsmi_get_temp_metric(
        self, h: FakeAmdGpu, sensor: TemperatureType, metric: TemperatureMetric
    ) -> int:
        h.check("temp")
        assert metric is TemperatureMetric.CURRENT
        if sensor.name not in h.temps:
            raise FakeLibraryException(STATUS_NOT_SUPPORTED)
        return h.temps[sensor.name]

    def amdsmi_get_clock_info(self, h: FakeAmdGpu, clock: ClkType) -> dict[str, Any]:
        h.check("clock")
        if clock.name not in h.clocks:
            raise FakeLibraryException(STATUS_NOT_SUPPORTED)
        return {h.clock_key: h.clocks[clock.name], "min_clk": 500, "max_clk": 2100, "clk_locked": False}

    def amdsmi_get_gpu_metrics_info(self, h: FakeAmdGpu) -> dict[str, Any]:
        h.check("metrics")
        return dict(h.metrics)


def amd_source(*gpus: FakeAmdGpu, select: list[str] | None = None) -> tuple[AmdSmiSource, FakeAmdSmi]:
    fake = FakeAmdSmi(list(gpus))
    return AmdSmiSource(gpus=select, amdsmi=fake), fake  # type: ignore[arg-type]


def joules(count: int, resolution: float = RESOLUTION_UJ) -> float:
    return count * resolution * 1e-6


# --- reading ----------------------------------------------------------------------------------


def test_amdsmi_reads_every_quantity_in_si_units() -> None:
    source, fake = amd_source(FakeAmdGpu("aaaa-0001"), FakeAmdGpu("aaaa-0002", count=131_072_000))
    info = source.open()
    assert info.columns[:8] == [
        "gpu0.energy_j",
        "gpu0.power_w",
        "gpu0.util_pct",
        "gpu0.mem_used_mb",
        "gpu0.temp_c",
        "gpu0.sm_clock_mhz",
        "gpu0.mem_clock_mhz",
        "gpu0.throttle_reasons",
    ]
    assert info.columns[8:] == [c.replace("gpu0", "gpu1") for c in info.columns[:8]]
    assert [(m.channel, m.kind, m.accelerator) for m in info.meters] == [
        ("gpu0", "counter", True),
        ("gpu1", "counter", True),
    ]
    assert info.description == "2 × AMD Instinct MI300X (driver 6.8.5)"
    values = source.read().values
    # 65,536,000 counts of 2^-16 J are 1000 J exactly
    assert values["gpu0.energy_j"] == pytest.approx(1000.0) and values["gpu1.energy_j"] == pytest.approx(
        2000.0
    )
    assert {k: v for k, v in values.items() if k.startswith("gpu0.") and k != "gpu0.energy_j"} == {
        "gpu0.power_w": 750.0,
        "gpu0.util_pct": 93.0,
        "gpu0.mem_used_mb": 150 * 1024.0,
        "gpu0.temp_c": 71.0,
        "gpu0.sm_clock_mhz": 2100.0,
        "gpu0.mem_clock_mhz": 1300.0,
        "gpu0.throttle_reasons": 0.0,
    }
    fake.gpus[0].count += 655_360  # 10 J
    assert source.read().values["gpu0.energy_j"] == pytest.approx(1010.0)
    # the 2 ms probe reads the counters alone, stamped at the reads
    before = now_ns()
    counters = source.read_counters()
    assert set(counters.values) == {"gpu0.energy_j", "gpu1.energy_j"}
    assert counters.t_ns is not None and before <= counters.t_ns <= now_ns()
    source.close()
    assert fake.initialised == 0


def test_amdsmi_selects_gpus_by_index_and_uuid() -> None:
    gpus = [
        FakeAmdGpu("aaaa-0001"),
        FakeAmdGpu("aaaa-0002", market_name="AMD Instinct MI250X"),
        FakeAmdGpu("c"),
    ]
    source, _ = amd_source(*gpus, select=["2"])
    info = source.open()
    assert [m.channel for m in info.meters] == ["gpu2"]
    assert set(source.read().values) == set(info.columns)
    assert all(c.startswith("gpu2.") for c in info.columns)

    source, _ = amd_source(*gpus, select=["aaaa-0002", "0", "1"])
    info = source.open()
    assert [m.channel for m in info.meters] == ["gpu1", "gpu0"]
    assert info.description == "1 × AMD Instinct MI250X + 1 × AMD Instinct MI300X (driver 6.8.5)"


def test_amdsmi_unknown_gpu_lists_the_available_ones() -> None:
    source, fake = amd_source(FakeAmdGpu("aaaa-0001"), FakeAmdGpu("aaaa-0002"), select=["nope"])
    with pytest.raises(SourceUnavailable, match="'nope'") as excinfo:
        source.open()
    assert "0 (aaaa-0001)" in str(excinfo.value) and "1 (aaaa-0002)" in str(excinfo.value)
    assert fake.initialised == 0  # AMD SMI shut down again

    source, _ = amd_source(FakeAmdGpu("aaaa-0001"), select=["3"])
    with pytest.raises(SourceUnavailable, match=r"'3'.*available: 0 \(aaaa-0001\)"):
        source.open()


def test_amdsmi_missing_module_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi raises ImportError
    with pytest.raises(
        SourceUnavailable, match=r"AMD SMI not available: .*install ROCm's amdsmi Python package"
    ):
        AmdSmiSource().open()


def test_amdsmi_init_failure_and_no_gpus_are_unavailable() -> None:
    source = AmdSmiSource(amdsmi=FakeAmdSmi([], init_error=STATUS_DRIVER_NOT_LOADED))  # type: ignore[arg-type]
    with pytest.raises(SourceUnavailable, match="AMD SMI not available: 52; is the amdgpu driver loaded"):
        source.open()
    fake = FakeAmdSmi([])
    with pytest.raises(SourceUnavailable, match="found no GPUs"):
        AmdSmiSource(amdsmi=fake).open()  # type: ignore[arg-type]
    assert fake.initialised == 0


# --- the known traps --------------------------------------------------------------------------


def test_amdsmi_reads_the_counter_under_its_old_key() -> None:
    # before amdsmi 6.2.1 the count came as "power": a count, not watts
    source, _ = amd_source(FakeAmdGpu("aaaa-0001", energy_key="power"))
    info = source.open()
    assert [m.kind for m in info.meters] == ["counter"]
    values = source.read().values
    assert values["gpu0.energy_j"] == pytest.approx(1000.0)
    assert values["gpu0.power_w"] == 750.0


def test_amdsmi_truncated_resolution_is_corrected_and_said() -> None:
    source, fake = amd_source(FakeAmdGpu("aaaa-0001", resolution=15.0))
    info = source.open()
    assert "gpu0 counter resolution reported as 15 µJ, 15.2587890625 µJ used" in info.description
    # 1000 J, not the 983 J the truncated resolution would give
    assert source.read().values["gpu0.energy_j"] == pytest.approx(1000.0)
    fake.gpus[0].count += 65_536
    assert source.read().values["gpu0.energy_j"] == pytest.approx(1001.0)

    source, _ = amd_source(FakeAmdGpu("aaaa-0001"))
    assert "resolution" not in source.open().description


def test_amdsmi_small_backward_step_is_held_not_a_reset() -> None:
    source, fake = amd_source(FakeAmdGpu("aaaa-0001"))
    source.open()
    gpu = fake.gpus[0]
    assert source.read().values["gpu0.energy_j"] == pytest.approx(1000.0)
    gpu.count -= 6_553  # 0.1 J back: another thread's read raced this one
    assert source.read_counters().values["gpu0.energy_j"] == pytest.approx(1000.0)
    assert source.read().values["gpu0.energy_j"] == pytest.approx(1000.0)
    gpu.count = 65_536_000 + 65_536  # on again: 1 J after the held value, nothing counted twice
    assert source.read().values["gpu0.energy_j"] == pytest.approx(1001.0)
    assert source.counter_events() == {"gpu0": {"resets": 0, "wraps": 0, "backward": 2}}


def test_amdsmi_drop_to_near_zero_is_a_reset() -> None:
    source, fake = amd_source(FakeAmdGpu("aaaa-0001"))
    source.open()
    assert source.read().values["gpu0.energy_j"] == pytest.approx(1000.0)
    fake.gpus[0].count = 65_536 * 2  # driver reload: the counter restarts from zero
    assert source.read().values["gpu0.energy_j"] == pytest.approx(1002.0)
    fake.gpus[0].count = 65_536 * 5
    assert source.read().values["gpu0.energy_j"] == pytest.approx(1005.0)
    assert source.counter_events() == {"gpu0": {"resets": 1, "wraps": 0, "backward": 0}}


def test_amdsmi_stuck_counter_reads_its_value_with_power_beside_it() -> None:
    # a counter that stopped: the source cannot tell, but it reports both, so the start-of-run
    # check can compare the counter with the power it should have integrated
    source, fake = amd_source(FakeAmdGpu("aaaa-0001"))
    source.open()
    readings = []
    for watts in (300, 500, 700):
        fake.gpus[0].current_power = watts
        readings.append(source.read().values)
    assert [r["gpu0.energy_j"] for r in readings] == [pytest.approx(1000.0)] * 3
    assert [r["gpu0.power_w"] for r in readings] == [300.0, 500.0, 700.0]
    assert source.counter_events() == {"gpu0": {"resets": 0, "wraps": 0, "backward": 0}}


def test_amdsmi_not_available_and_failing_reads_give_none() -> None:
    source, fake = amd_source(FakeAmdGpu("aaaa-0001"))
    source.open()
    gpu = fake.gpus[0]
    gpu.current_power, gpu.gfx_activity = "N/A", "N/A"
    values = source.read().values
    assert values["gpu0.power_w"] is None and values["gpu0.util_pct"] is None
    assert values["gpu0.temp_c"] == 71.0
    gpu.current_power, gpu.gfx_activity = 0xFFFF, 0xFFFF  # unset fields the library left as they were
    values = source.read().values
    assert values["gpu0.power_w"] is None and values["gpu0.util_pct"] is None
    gpu.gfx_activity = 150  # no activity is over 100%: the library's own "N/A" rule
    assert source.read().values["gpu0.util_pct"] is None
    gpu.failing = {"energy", "clock"}
    values = source.read().values
    assert values["gpu0.energy_j"] is None
    assert values["gpu0.sm_clock_mhz"] is None and values["gpu0.mem_clock_mhz"] is None
    assert values["gpu0.mem_used_mb"] == 150 * 1024.0
    gpu.failing = set()
    assert source.read().values["gpu0.energy_j"] == pytest.approx(1000.0)


def test_amdsmi_mi200_shape_average_power_edge_sensor_new_clock_key() -> None:
    gpu = FakeAmdGpu(
        "aaaa-0001",
        market_name="AMD Instinct MI250X",
        current_power="N/A",
        average_power=420,
        temps={"EDGE": 48},
        clock_key="cur_clk",
        metrics={"throttle_status": True, "indep_throttle_status": "N/A"},
    )
    source, _ = amd_source(gpu)
    source.open()
    values = source.read().values
    assert values["gpu0.power_w"] == 420.0  # the average, where there is no instant power
    assert values["gpu0.temp_c"] == 48.0
    assert values["gpu0.sm_clock_mhz"] == 2100.0
    assert values["gpu0.throttle_reasons"] == 1.0


def test_amdsmi_drops_what_the_device_cannot_answer_and_keeps_what_may_come_back() -> None:
    gpu = FakeAmdGpu(
        "aaaa-0001",
        temps={},
        clocks={"GFX": 1700},
        metrics={"throttle_status": "N/A"},
        retrying={"util"},
    )
    source, _ = amd_source(gpu)
    info = source.open()
    assert "gpu0.temp_c" not in info.columns and "gpu0.mem_clock_mhz" not in info.columns
    assert "gpu0.throttle_reasons" not in info.columns
    assert "gpu0.sm_clock_mhz" in info.columns
    assert "gpu0.util_pct" in info.columns  # "retry" at open is not "not supported"
    assert source.read().values["gpu0.util_pct"] is None
    gpu.retrying = set()
    assert source.read().values["gpu0.util_pct"] == 93.0


def test_amdsmi_without_energy_counter_meters_power() -> None:
    source, _ = amd_source(FakeAmdGpu("aaaa-0001", count=None))
    info = source.open()
    assert "gpu0.energy_j" not in info.columns
    assert [(m.channel, m.kind) for m in info.meters] == [("gpu0", "power")]
    assert "no energy counter on gpu0, power integrated" in info.description
    assert source.read_counters().values == {}


# --- through open_sources, as a run and the agent open it ----------------------------------------


def test_open_sources_opens_amdsmi_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeAmdSmi([FakeAmdGpu("aaaa-0001"), FakeAmdGpu("aaaa-0002")])
    monkeypatch.setitem(sys.modules, "amdsmi", fake)
    setup = open_sources("amdsmi", gpus=["1"])
    try:
        assert setup.skipped == {}
        [opened] = setup.opened
        assert opened.source.name == "amdsmi"
        assert [(m.channel, m.kind, m.accelerator) for m in opened.info.meters] == [("gpu1", "counter", True)]
        assert opened.source.read().values["gpu1.energy_j"] == pytest.approx(1000.0)
    finally:
        setup.close()
    assert fake.initialised == 0


def test_auto_tries_amdsmi_only_where_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    assert "amdsmi" not in _names("auto", simulated=False, remote=False)
    fake = FakeAmdSmi([FakeAmdGpu("aaaa-0001")])
    monkeypatch.setitem(sys.modules, "amdsmi", fake)
    assert "amdsmi" not in _names("auto", simulated=True, remote=False)
    assert "amdsmi" not in _names("auto", simulated=False, remote=True)
    # an AMD machine: NVML is skipped, AMD SMI gives the accelerator meters
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], init_error="Driver Not Loaded"))
    setup = open_sources("auto")
    try:
        assert "nvml" in setup.skipped and "amdsmi" not in setup.skipped
        amd = [s for s in setup.opened if s.source.name == "amdsmi"]
        assert [m.channel for s in amd for m in s.info.meters if m.accelerator] == ["gpu0"]
    finally:
        setup.close()
