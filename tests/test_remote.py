"""Telemetry from another machine: a real agent process on loopback whose clock reads
differently, and Prometheus endpoints (DCGM exporter, the server's /metrics)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from ipw_async import run_benchmark
from ipw_async.cli import app
from ipw_async.clock_sync import ClockSync
from ipw_async.errors import RunError
from ipw_async.sim import SimulatorProcess
from ipw_async.telemetry.prometheus import PrometheusSource, parse
from ipw_async.telemetry_agent import AgentProcess

from .conftest import quick_config

SHIFT_S = 1234.5  # the agent's clock reads this much ahead of ours


async def test_a_run_measures_the_servers_device_through_an_agent_on_another_clock(tmp_path: Path) -> None:
    config = quick_config(tmp_path, max_queries=48, concurrency=8, dataset="synthetic", output_tokens=40)
    with SimulatorProcess(config.sim) as sim:
        args = ["--telemetry", "sim", "--sim-url", sim.root_url, "--clock-shift-s", str(SHIFT_S)]
        with AgentProcess(args) as agent:
            config.base_url = sim.base_url
            config.telemetry = "none"  # nothing of this machine: the server's device alone
            config.telemetry_url = [agent.root_url]
            result = await run_benchmark(config)
            truth = httpx.get(f"{sim.root_url}/sim/truth").json()
    meter = f"sim@127.0.0.1:{agent.port}"
    clock = result.summary["telemetry"]["clocks"][f"sim@127.0.0.1:{agent.port}"]
    # the offset, measured from round trips, within half a millisecond of the one injected
    assert clock["offset_ms"] == pytest.approx(SHIFT_S * 1000, abs=0.5)
    assert clock["uncertainty_ms"] < 0.5
    assert clock["pings"] > 32
    energy = result.summary["energy"]
    assert energy["headline_meters"] == [meter]
    assert abs(energy["meters"][meter]["conservation_error"]) < 1e-9
    # on the aligned clock, each query's share is as close to the device's truth as locally
    frame = result.records
    true = np.array([truth["requests"][str(i)] for i in frame.get_column("request_id").to_list()])
    err = np.abs(frame.get_column("energy_j").to_numpy() - true) / true
    assert np.median(err) < 0.15
    # the counter's update grid was learned through the agent as well
    assert energy["meters"][meter]["counter_timing"].startswith("last update on its learned grid")


async def test_an_agent_that_does_not_answer_stops_the_run_with_what_to_do(tmp_path: Path) -> None:
    config = quick_config(tmp_path, telemetry_url=["http://127.0.0.1:9"])
    with pytest.raises(
        RunError, match=r"no ipw-async agent answers at http://127\.0\.0\.1:9 .*ipw-async agent"
    ):
        await run_benchmark(config)


def test_the_offset_is_the_midpoint_of_the_shortest_round_trip() -> None:
    sync = ClockSync()
    # remote = local + 500 µs; round trips of 2 ms and 0.2 ms whose stamps sit off-centre
    sync.add(0, 500_000 + 1_900_000, 2_000_000)  # stamp late in a slow trip: 900 µs off
    sync.add(10_000_000, 500_000 + 10_000_000 + 120_000, 10_200_000)  # 20 µs off
    assert sync.best().offset_ns == 520_000
    assert sync.to_local(20_000_000) == 20_000_000 - 520_000
    report = sync.report()
    assert report["offset_ms"] == pytest.approx(0.52)
    assert report["uncertainty_ms"] == pytest.approx(0.1)  # the true offset is within it
    assert abs(report["offset_ms"] - 0.5) <= report["uncertainty_ms"]


def test_agent_help_says_how_to_use_it() -> None:
    result = CliRunner().invoke(app, ["agent", "--help"])
    assert result.exit_code == 0
    assert "--telemetry-url" in result.output
    assert "clock-shift" not in result.output  # a testing aid, not a user's option


async def test_a_run_scrapes_dcgm_exporter_and_the_servers_metrics(tmp_path: Path) -> None:
    config = quick_config(tmp_path, max_queries=48, concurrency=8, dataset="synthetic", output_tokens=40)
    with SimulatorProcess(config.sim) as sim:
        config.base_url = sim.base_url
        config.telemetry = "none"
        config.prometheus_url = [f"{sim.root_url}/metrics"]  # DCGM's fields and vLLM's gauges
        result = await run_benchmark(config)
        truth = httpx.get(f"{sim.root_url}/sim/truth").json()
    gpu = f"gpu0@127.0.0.1:{sim.port}"
    energy = result.summary["energy"]
    assert energy["headline_meters"] == [gpu]
    assert energy["meters"][gpu]["kind"] == "counter"
    assert abs(energy["meters"][gpu]["conservation_error"]) < 1e-9
    frame = result.records
    true = np.array([truth["requests"][str(i)] for i in frame.get_column("request_id").to_list()])
    err = np.abs(frame.get_column("energy_j").to_numpy() - true) / true
    assert np.median(err) < 0.15
    telemetry = pl.read_ipc_stream(tmp_path / "run" / "telemetry.arrow")
    running = telemetry.get_column(f"server@127.0.0.1:{sim.port}.vllm_num_requests_running").drop_nulls()
    assert running.max() == 8  # the server saw the run's concurrency
    tokens = telemetry.get_column(f"server@127.0.0.1:{sim.port}.vllm_generation_tokens_total").drop_nulls()
    assert tokens.max() - tokens.min() >= frame.get_column("output_tokens").sum() * 0.9


def test_prometheus_text_from_dcgm_exporter_and_llama_cpp() -> None:
    text = """# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-5f1",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="h"} 126.84
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",UUID="GPU-a2c",modelName="NVIDIA H100 80GB HBM3"} 9.1733e+09
llamacpp:requests_processing 3
llamacpp:prompt_tokens_seconds{label="a \\"quoted\\" value"} 412.5
vllm:e2e_request_latency_seconds_bucket{le="1.0"} 4
"""
    samples = parse(text)
    assert samples[0] == (
        "DCGM_FI_DEV_POWER_USAGE",
        {
            "gpu": "0",
            "UUID": "GPU-5f1",
            "device": "nvidia0",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": "h",
        },
        126.84,
    )
    assert samples[1][2] == 9.1733e09
    assert samples[3][1] == {"label": 'a \\"quoted\\" value'}
    source = PrometheusSource("http://gpu-host:9400/metrics")
    values = source._values(text)
    assert values == {
        "gpu0@gpu-host:9400.power_w": 126.84,
        "gpu1@gpu-host:9400.energy_j": pytest.approx(9.1733e06),  # mJ to J
        "server@gpu-host:9400.llamacpp_requests_processing": 3.0,
        "server@gpu-host:9400.llamacpp_prompt_tokens_seconds": 412.5,
    }  # histograms left out


async def test_a_metrics_url_with_nothing_to_read_says_so(tmp_path: Path) -> None:
    with SimulatorProcess(quick_config(tmp_path).sim) as sim:
        config = quick_config(tmp_path, base_url=sim.base_url, prometheus_url=[f"{sim.root_url}/health"])
        with pytest.raises(RunError, match="shows no metric ipw-async reads"):
            await run_benchmark(config)


def test_the_agent_streams_every_source_on_its_own_schedule(tmp_path: Path) -> None:
    with (
        SimulatorProcess(quick_config(tmp_path).sim) as sim,
        AgentProcess(["--telemetry", "sim", "--sim-url", sim.root_url]) as agent,
        httpx.stream("GET", f"{agent.root_url}/stream", params={"period_ms": 20}, timeout=10) as response,
    ):
        lines = []
        for line in response.iter_lines():
            lines.append(json.loads(line))
            if len(lines) == 6:
                break
        bad = httpx.get(f"{agent.root_url}/stream", params={"period_ms": "soon"}, timeout=10)
    assert {line["source"] for line in lines} == {"sim"}
    stamps = [line["t_ns"] for line in lines]
    assert stamps == sorted(stamps)
    assert 10e6 < np.median(np.diff(stamps)) < 40e6  # every 20 ms
    assert all(line["values"]["sim.energy_j"] is not None for line in lines)
    assert bad.status_code == 400 and "period_ms" in bad.text


async def test_an_agent_that_dies_mid_run_leaves_a_gap_that_is_imputed_and_said(tmp_path: Path) -> None:
    config = quick_config(tmp_path, concurrency=8, max_queries=None, duration=4.0, dataset="synthetic")
    with SimulatorProcess(config.sim) as sim:
        agent = AgentProcess(["--telemetry", "sim", "--sim-url", sim.root_url]).start()
        config.base_url = sim.base_url
        config.telemetry = "none"
        config.telemetry_url = [agent.root_url]
        run = asyncio.create_task(run_benchmark(config))
        await asyncio.sleep(2.5)
        agent.stop()
        result = await run
    meter = f"sim@127.0.0.1:{agent.port}"
    frame = result.records
    assert result.summary["complete"] is True  # the server was fine: the run went on
    provenance = set(frame.get_column(f"{meter}.provenance").to_list())
    assert "imputed" in provenance  # the requests after the agent died say how they were measured
    energy = result.summary["energy"]["meters"][meter]
    assert energy["imputed_j"] > 0
    assert abs(energy["conservation_error"]) < 1e-9
