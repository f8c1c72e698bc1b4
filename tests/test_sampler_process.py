"""The sampler in a process of its own: the same log, grids and figures as the thread, the
client's interpreter left alone, and a child that never outlives its run."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import psutil
import pytest

from ipw_async import run_benchmark
from ipw_async._clock import now_ns
from ipw_async.rundir import files
from ipw_async.sim import SimulatorProcess
from ipw_async.telemetry import OpenSource, Sampler, open_sources
from ipw_async.telemetry.base import Meter, Reading, SourceInfo, TelemetrySource
from ipw_async.telemetry.process import SamplerProcessError, sampler_place
from ipw_async.telemetry.prometheus import PrometheusSource
from ipw_async.telemetry.sources import make_source

from .conftest import quick_config


class Fixed(TelemetrySource):
    """A source made by hand: it has no recipe to be opened again elsewhere."""

    name = "fixed"

    def open(self) -> SourceInfo:
        return SourceInfo(columns=["fixed.power_w"], meters=[Meter("fixed", "power")])

    def read(self) -> Reading:
        return Reading({"fixed.power_w": 100.0})


@contextlib.contextmanager
def sim_sources(sim: SimulatorProcess, spec: str = "sim") -> Iterator[list[OpenSource]]:
    """The simulator's device (and ``spec``'s other sources), opened here, closed after."""
    setup = open_sources(spec, sim_root_url=sim.root_url)
    try:
        yield setup.opened
    finally:
        setup.close()


async def sampled(sampler: Sampler, rows: int) -> asyncio.Task[None]:
    """The sampler's run, started, once its log holds ``rows`` rows (or 10 s have passed)."""
    task = asyncio.create_task(sampler.run())
    for _ in range(200):
        if len(sampler.log) >= rows:
            break
        await asyncio.sleep(0.05)
    return task


def _opened(name: str, recipe: dict[str, object] | None) -> OpenSource:
    source = Fixed()
    source.name, source.recipe = name, recipe
    return OpenSource(source, source.open())


def test_auto_moves_the_reads_that_cost_milliseconds_and_keeps_what_cannot_move() -> None:
    nvml = _opened("nvml", {"name": "nvml", "gpus": None})
    host = _opened("psutil", {"name": "psutil", "gpus": None})
    agent = _opened("gpu0@gpu-host:9180", None)
    assert sampler_place("auto", [nvml, host]) == (
        True,
        "nvml reads cost a millisecond or more of a CPU each",
    )
    assert sampler_place("auto", [host]) == (False, "its sources read in microseconds")
    assert sampler_place("process", [host]) == (True, "asked for")
    assert sampler_place("thread", [nvml]) == (False, "asked for")
    # an agent's stream is followed by this process: asked or not, the sampler stays a thread
    moved, why = sampler_place("process", [nvml, agent])
    assert not moved and "gpu0@gpu-host:9180 cannot be opened again" in why


async def test_a_child_that_cannot_open_its_sources_says_so(sim: SimulatorProcess) -> None:
    with sim_sources(sim) as opened:
        opened[0].source.recipe = {"name": "sim", "root_url": "http://127.0.0.1:9"}  # nobody serves there
        sampler = Sampler(opened, 0.05, now_ns(), probe_s=0, process=True)
        with pytest.raises(SamplerProcessError, match=r"could not open its sources .*--sampler thread"):
            await sampler.start()
        assert sampler.pid is None


# A pynvml module for both processes: the tests' fake, its GPU's counter rising 5 J a read
FAKE_PYNVML = """
from tests.test_sources import FakeGpu, FakeNvml


class Rising(FakeGpu):
    reads = 0

    def query(self, what, value):
        if what == "energy":
            self.reads += 1
            self.energy_mj += 5_000
            return self.energy_mj - (900_000 if self.reads > 6 else 0)  # the driver reset it once
        return super().query(what, value)


_nvml = FakeNvml([Rising("GPU-aaa", processes=[4242])])
globals().update({name: getattr(_nvml, name) for name in dir(_nvml) if not name.startswith("_")})
"""


async def test_nvml_read_in_the_sampler_s_own_process_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # only the driver's module is faked, in this process and the child alike: NvmlSource, the
    # recipe, the child and the rows it sends are the real code path
    (tmp_path / "pynvml.py").write_text(FAKE_PYNVML)
    root = Path(__file__).parent.parent
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(tmp_path), str(root), os.environ.get("PYTHONPATH", "")])
    )
    spec = importlib.util.spec_from_file_location("pynvml", tmp_path / "pynvml.py")
    assert spec is not None and spec.loader is not None
    fake = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(root))
    spec.loader.exec_module(fake)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    source = make_source("nvml")
    opened = [OpenSource(source, source.open())]
    here = fake._nvml.gpus[0].energy_mj  # what this process read, opening it
    moved, why = sampler_place("auto", opened)
    assert moved and why == "nvml reads cost a millisecond or more of a CPU each"
    sampler = Sampler(opened, 0.05, now_ns(), probe_s=0.3, process=moved)
    task = asyncio.create_task(sampler.run())
    try:
        for _ in range(200):
            if len(sampler.log) >= 10:
                break
            await asyncio.sleep(0.05)
        assert await sampler.processes() == {"gpu0": [4242]}  # asked here, of this process's NVML
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        source.close()
    energy = [v for v in sampler.log.columns["gpu0.energy_j"] if v is not None]
    # the child's own counter, read there: rising through its reset, which reached this process,
    # and not this process's fake (never read here)
    assert sampler.counter_events() == {"gpu0": {"resets": 1, "wraps": 0}}
    assert len(energy) >= 10 and all(b > a for a, b in itertools.pairwise(energy))
    assert fake._nvml.gpus[0].energy_mj == here
    assert sampler.log.columns["gpu0.power_w"][0] == 310.0
    assert sampler.quality().runs_in == "process" and sampler.quality().cpu_s is not None


async def test_a_scrape_is_read_in_the_sampler_s_own_process_too(sim: SimulatorProcess) -> None:
    # the simulator's /metrics, as DCGM exporter serves a GPU's: opened again in the child from
    # its recipe (its URL and credentials travel on the child's stdin)
    scrape = PrometheusSource(f"{sim.root_url}/metrics")
    opened = [OpenSource(scrape, scrape.open())]
    try:
        assert sampler_place("auto", opened)[0]
        sampler = Sampler(opened, 0.05, now_ns(), probe_s=0, process=True)
        task = await sampled(sampler, 6)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        scrape.close()
    meter = next(m for m in opened[0].info.meters if m.kind == "counter")
    energy = [v for v in sampler.log.columns[meter.energy_column] if v is not None]
    assert len(energy) >= 6 and energy[-1] > energy[0]
    assert sampler.quality().runs_in == "process" and sampler.failure is None


async def test_what_the_process_reads_before_the_run_samples_is_logged_as_it_comes(
    sim: SimulatorProcess,
) -> None:
    # between start (as the run opens) and run (its tasks, after the workers started) rows
    # keep coming: read as they come, a full pipe never holds the child's ticks up
    with sim_sources(sim, "sim,psutil") as opened:
        sampler = Sampler(opened, 0.005, now_ns(), probe_s=0, process=True)
        await sampler.start()
        try:
            await asyncio.sleep(2.0)  # about 140 kB of rows at 5 ms: twice a pipe's 64 kB
            # a child held up by a full pipe would miss a tick for every row it wrote (a
            # loaded machine misses a few of 400 5 ms ticks whatever we read: CI missed 22)
            assert len(sampler.log) > 200 and sampler.skipped < len(sampler.log) / 5
            # a run stopped before it sampled: the last reading is still taken, the child ended
            before = len(sampler.log)
            await sampler.sample_once()
            assert len(sampler.log) > before
            assert sampler.pid is not None and not psutil.pid_exists(sampler.pid)
        finally:
            sampler.close()


async def test_a_sampler_process_that_dies_mid_run_says_where_telemetry_stopped(
    sim: SimulatorProcess,
) -> None:
    with sim_sources(sim) as opened:
        sampler = Sampler(opened, 0.05, now_ns(), probe_s=0, process=True)
        task = await sampled(sampler, 3)
        assert sampler.pid is not None and len(sampler.log) >= 3
        os.kill(sampler.pid, signal.SIGKILL)
        with pytest.raises(SamplerProcessError, match="killed by signal 9"):
            await asyncio.wait_for(task, 10)
        failure = sampler.quality().failure
        assert failure is not None and failure.endswith("telemetry stopped there")
        kept = len(sampler.log)
        await sampler.sample_once()  # its last reading died with it: nothing made up
        assert len(sampler.log) == kept >= 3


async def test_a_run_sampled_in_its_own_process_keeps_the_thread_s_log(
    tmp_path: Path, sim: SimulatorProcess
) -> None:
    config = quick_config(
        tmp_path, base_url=sim.base_url, max_queries=24, telemetry="sim,psutil", sampler="process"
    )
    result = await run_benchmark(config)
    sampler = result.summary["telemetry"]["sampler"]
    assert sampler["runs_in"] == "process" and sampler["samples"] > 10
    assert sampler["cpu_s"] is not None and 0 < sampler["cpu_share"] < 1
    telemetry = pl.read_ipc_stream(tmp_path / "run" / files.TELEMETRY)
    # a tick every 50 ms on the run's clock (moved once after a probe, clear of the counter's
    # updates), each counter read stamped after its tick
    deadlines = telemetry.get_column("t_ns").to_numpy()[:-1]  # the last: the run's last reading
    steps = np.diff(deadlines) / 50e6
    assert np.median(steps) == 1 and steps.min() >= 1
    assert telemetry.height - 1 + sampler["skipped_ticks"] >= (deadlines[-1] - deadlines[0]) // 50_000_000
    stamps = telemetry.get_column("sim.t_ns").to_numpy()
    assert (stamps[:-1] >= deadlines).all()
    # the memory it reports is the run's, not its own (the test's process here)
    rss = telemetry.get_column("proc.rss_mb").drop_nulls()[-1]
    assert 0.7 < rss / (psutil.Process().memory_info().rss / 2**20) < 1.3
    # the last reading came after the last request ended
    records = pl.read_ipc_stream(tmp_path / "run" / files.RECORDS)
    assert stamps[-1] >= records.get_column("closed_ns").max()
    # the counter's update grid was learned there and reached run.json
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    grids = next(m for m in run["telemetry"]["meters"] if m["channel"] == "sim")["grids"]
    assert grids and abs(grids[0]["period_ms"] - 100) < 5
    energy = result.summary["energy"]["meters"]["sim"]
    assert energy["kind"] == "counter" and abs(energy["conservation_error"]) < 1e-9
    # and it is gone (of this process's children: another worker's may be sampling now)
    assert not [
        p
        for p in psutil.process_iter(["cmdline", "ppid"])
        if p.info["ppid"] == os.getpid()
        and "ipw_async.telemetry.sampler_child" in (p.info["cmdline"] or [])
    ]
