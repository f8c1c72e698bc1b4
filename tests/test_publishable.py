"""The validity gate: a run's energy figures are publishable only when every check passed; each
failure is a reason a reviewer can read, and what could not be checked is unknown, not passed."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ipw_async.cli.run import execute
from ipw_async.sim import SimulatorProcess
from ipw_async.validity.gate import publishable

from .conftest import finished_short_run, quick_config
from .test_sources import FakeGpu, FakeNvml

# a real GPU run's summary, as far as the gate reads it: every check passes
GOOD: dict[str, Any] = {
    "simulated": False,
    "complete": True,
    "energy": {
        "headline_meters": ["gpu0@gpu-host:9180"],
        "meters": {"gpu0@gpu-host:9180": {"imputed_j": 1.0, "total_j": 1000.0}},
    },
    "telemetry": {
        "sampler": {
            "skipped_ticks": 0,
            "gaps": {"gpu0@gpu-host:9180": {"largest_ms": 60.0, "counter_period_ms": 100.0}},
        },
        "counter_checks": {"gpu0@gpu-host:9180": {"status": "ok", "reason": "within 3%"}},
        "clocks": {"nvml@gpu-host:9180": {"uncertainty_ms": 0.3}},
    },
    "saturation": {"oversaturated": False, "reason": "in-flight and TTFT level"},
}


def changed(path: str, value: Any) -> dict[str, Any]:
    summary = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = summary
    for key in parents:
        node = node[key]
    node[last] = value
    return summary


def test_a_run_that_passes_every_check_is_valid() -> None:
    gate = publishable(GOOD)
    assert gate["verdict"] == "valid" and gate["reasons"] == [] and gate["unknown"] == []
    assert all(check["ok"] for check in gate["checks"].values())
    assert gate["checks"]["clock gpu0@gpu-host:9180"]["ok"]  # the agent's clock, found by its host


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        ("simulated", True, "its energy is a simulated device's"),
        ("complete", False, "the run did not finish"),
        ("energy.meters.gpu0@gpu-host:9180", {"imputed_j": 80.0, "total_j": 1000.0}, "8.0% of its energy had no reading"),
        ("telemetry.sampler.skipped_ticks", 12, "the sampler skipped 12 ticks"),
        ("telemetry.sampler.gaps", {"gpu0@gpu-host:9180": {"largest_ms": 900.0, "counter_period_ms": 100.0}}, "went 900 ms without a reading"),
        ("telemetry.counter_checks", {"gpu0@gpu-host:9180": {"status": "stuck", "reason": "no update in 3 s"}}, "stuck: no update in 3 s"),
        ("telemetry.clocks", {"nvml@gpu-host:9180": {"uncertainty_ms": 25.0}}, "its clock is known to ±25.00 ms"),
        ("saturation", {"oversaturated": True, "reason": "TTFT rising"}, "over-saturated: TTFT rising"),
        ("telemetry.gpu_processes", {"gpu0@gpu-host:9180": {"before": [7, 9], "after": [7, 9]}}, "2 processes were computing on gpu0@gpu-host:9180 as the load began (PIDs 7, 9)"),
    ],
)  # fmt: skip
def test_each_failed_check_makes_the_run_not_valid_and_says_why(path: str, value: Any, reason: str) -> None:
    gate = publishable(changed(path, value))
    assert gate["verdict"] == "not valid"
    assert len(gate["reasons"]) == 1 and reason in gate["reasons"][0]


def test_a_check_that_could_not_be_made_is_unknown_not_passed() -> None:
    gate = publishable(changed("telemetry.counter_checks", None))
    assert gate["verdict"] == "unknown" and gate["reasons"] == []
    assert gate["checks"]["counters"]["ok"] is None and "not checked" in gate["unknown"][0]
    assert publishable(changed("saturation", {"oversaturated": None, "reason": "too short"}))["verdict"] == "unknown"


def test_require_valid_exits_3_with_the_reasons_after_writing_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "ipw_async", "run", "-c", "2", "-n", "6", "--baseline-s", "0"]
    done = subprocess.run(
        [*command, "--no-dashboard", "-q", "--require-valid", "-o", str(run_dir)], capture_output=True, text=True
    )
    assert done.returncode == 3, done.stderr
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and "not valid for publishing" in lines[0] and "simulated device" in lines[0]
    summary = json.loads((run_dir / "summary.json").read_text())  # everything measured is on disk
    assert summary["complete"] is True and summary["validity"]["verdict"] == "not valid"


def test_finalize_writes_the_verdict_into_every_summary(tmp_path: Path) -> None:
    summary = json.loads((finished_short_run(tmp_path / "run") / "summary.json").read_text())
    assert summary["validity"]["verdict"] in ("valid", "not valid", "unknown")
    assert summary["validity"] == publishable({k: v for k, v in summary.items() if k != "validity"})


class SharedGpu(FakeNvml):
    """One GPU at 300 W whose server (PID 4242) is joined by another once the load has begun."""

    def __init__(self) -> None:
        super().__init__([FakeGpu("GPU-aaa", processes=[4242])])
        self.start = time.monotonic()
        self.asked = 0

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        return int((time.monotonic() - self.start) * 300_000)

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        self.asked += 1
        h.processes = [4242, 5151] if self.asked > 1 else [4242]  # the first ask is as the load begins
        return super().nvmlDeviceGetComputeRunningProcesses(h)


def test_a_process_that_joins_the_gpu_during_the_run_fails_the_gate(
    tmp_path: Path, sim: SimulatorProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", SharedGpu())
    config = quick_config(
        tmp_path, base_url=sim.base_url, telemetry="nvml", max_queries=40, concurrency=2, counter_probe_s=0
    )
    config.sampler = "thread"  # the fake driver lives in this process
    config.require_valid = True
    assert execute(config, display=None) == 3  # type: ignore[arg-type]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["telemetry"]["gpu_processes"] == {"gpu0": {"before": [4242], "after": [4242, 5151]}}
    reasons = summary["validity"]["reasons"]
    assert any("a process started computing on gpu0 during the run (PID 5151)" in r for r in reasons)
