"""Telemetry from another machine: a real agent process on loopback whose clock reads
differently, and Prometheus endpoints (DCGM exporter, the server's /metrics)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
import polars as pl
import pytest
import trustme
from aiohttp import web
from typer.testing import CliRunner

from ipw_async import finalize, run_benchmark
from ipw_async.cli import app
from ipw_async.clock_sync import ClockSync
from ipw_async.errors import RunError
from ipw_async.sim import SimConfig, SimulatorProcess
from ipw_async.telemetry import OpenSource
from ipw_async.telemetry.prometheus import PrometheusSource, parse
from ipw_async.telemetry_agent import READ_INTERVAL_S, AgentProcess, AgentServer

from .conftest import fast_engine, metrics_exporter, quick_config, scrape_once
from .test_sources import FakeGpu, nvml_source

# Tests that measure an agent's clock offset, its round trips, its stream's pace or a gap in
# time are marked `timing`: no other test beside them. The rest check what is said and refused.

SHIFT_S = 1234.5  # the agent's clock reads this much ahead of ours


@pytest.mark.timing
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
    # the offset, measured from round trips, within the bound it states (half its round trip),
    # however busy the host; and a bound worth stating (fleet_telemetry.py: ±0.19–0.24 ms)
    assert abs(clock["offset_ms"] - SHIFT_S * 1000) <= clock["uncertainty_ms"] + 1e-6
    assert clock["uncertainty_ms"] < 2.0
    assert clock["pings"] > 32
    energy = result.summary["energy"]
    assert energy["headline_meters"] == [meter]
    assert abs(energy["meters"][meter]["conservation_error"]) < 1e-9
    # on the aligned clock, each query's share is as close to the device's truth as locally
    frame = result.records
    true = np.array([truth["requests"][str(i)] for i in frame.get_column("request_id").to_list()])
    err = np.abs(frame.get_column("energy_j").to_numpy() - true) / true
    assert np.median(err) < _median_error(tmp_path / "run", "tokens", true)  # the default beats token work
    assert result.summary["simulated"] is True  # the agent read a simulated device
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


def _median_error(run_dir: Path, rule: str, true: np.ndarray) -> float:
    """The run re-attributed by ``rule``: its median error against the device's truth."""
    energy = finalize(run_dir, attribution=rule).records.get_column("energy_j").to_numpy()
    return float(np.median(np.abs(energy - true) / true))


def test_agent_help_says_how_to_use_it() -> None:
    result = CliRunner().invoke(app, ["agent", "--help"])
    assert result.exit_code == 0
    assert "--telemetry-url" in result.output
    assert "clock-shift" not in result.output  # a testing aid, not a user's option


@pytest.mark.timing
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
    assert result.summary["simulated"] is True  # the scraped GPU is the simulator's device
    assert energy["headline_meters"] == [gpu]
    assert energy["meters"][gpu]["kind"] == "counter"
    assert abs(energy["meters"][gpu]["conservation_error"]) < 1e-9
    frame = result.records
    true = np.array([truth["requests"][str(i)] for i in frame.get_column("request_id").to_list()])
    err = np.abs(frame.get_column("energy_j").to_numpy() - true) / true
    assert np.median(err) < _median_error(tmp_path / "run", "tokens", true)
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
        "gpu0@gpu-host:9400.avg_power_w": 126.84,  # NVML's power usage: an H100 averages it
        "gpu1@gpu-host:9400.energy_j": pytest.approx(9.1733e06),  # mJ to J
        "server@gpu-host:9400.llamacpp_requests_processing": 3.0,
        "server@gpu-host:9400.llamacpp_prompt_tokens_seconds": 412.5,
    }  # histograms left out


def test_dcgm_power_usage_is_read_as_the_average_it_is_on_ampere_and_newer() -> None:
    # DCGM's POWER_USAGE is nvmlDeviceGetPowerUsage: the last second's average from Ampere on,
    # GA100 aside; its INSTANT field is instant wherever it is exported
    text = """DCGM_FI_DEV_POWER_USAGE{gpu="0",modelName="NVIDIA L40S"} 301.5
DCGM_FI_DEV_POWER_USAGE{gpu="1",modelName="NVIDIA H100 80GB HBM3"} 402.0
DCGM_FI_DEV_POWER_USAGE_INSTANT{gpu="1",modelName="NVIDIA H100 80GB HBM3"} 455.0
DCGM_FI_DEV_POWER_USAGE{gpu="2",modelName="NVIDIA A100-SXM4-80GB"} 250.0
DCGM_FI_DEV_POWER_USAGE{gpu="3",modelName="Tesla V100-SXM2-32GB"} 199.0
DCGM_FI_DEV_POWER_USAGE{gpu="4"} 88.0
"""
    assert PrometheusSource("http://gpu-host:9400/metrics")._values(text) == {
        "gpu0@gpu-host:9400.avg_power_w": 301.5,
        "gpu1@gpu-host:9400.avg_power_w": 402.0,
        "gpu1@gpu-host:9400.power_w": 455.0,
        "gpu2@gpu-host:9400.power_w": 250.0,  # GA100: instant
        "gpu3@gpu-host:9400.power_w": 199.0,  # before Ampere: instant
        "gpu4@gpu-host:9400.power_w": 88.0,  # no model named: as NVML before it averaged
    }


def test_each_scraped_gpu_meter_shows_the_power_its_exporter_has() -> None:
    # dcgm-exporter's default fields on an H100: energy and the averaged power usage; the
    # counter's meter shows (and its check compares) that power, as the device averaged it.
    # Beside the instant field the average is integrated: a point value read every 50 ms
    # samples 10-20 ms steps as chance has it
    text = b"""DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",modelName="NVIDIA H100 80GB HBM3"} 9.1e+09
DCGM_FI_DEV_POWER_USAGE{gpu="0",modelName="NVIDIA H100 80GB HBM3"} 402.0
DCGM_FI_DEV_POWER_USAGE{gpu="1",modelName="NVIDIA H100 80GB HBM3"} 398.0
DCGM_FI_DEV_POWER_USAGE_INSTANT{gpu="1",modelName="NVIDIA H100 80GB HBM3"} 455.0
"""

    with metrics_exporter(text) as (root, _):
        _, info, reading = scrape_once(f"{root}/metrics")
    meters = {m.channel.split("@")[0]: m for m in info.meters}
    assert [(m.kind, m.power_quantity, m.window_ns) for m in meters.values()] == [
        ("counter", "avg_power_w", 0.0),  # the counter's energy is the device's own, unshifted
        ("power", "avg_power_w", 1e9),  # the average, placed a window late
    ]
    assert reading.values[meters["gpu0"].power_column] == 402.0
    assert reading.values[meters["gpu1"].power_column] == 398.0


@pytest.mark.parametrize(("device", "window_s"), [("avg-power", 1.0), ("power", None)])
async def test_a_scraped_gpu_power_is_integrated_as_the_device_averaged_it(
    tmp_path: Path, device: str, window_s: float | None
) -> None:
    # the simulator's exporter shows an H100-like device: its averaged power usage alone, or
    # its instant field alone
    engine = fast_engine(telemetry=device)
    config = quick_config(tmp_path, max_queries=12, sim=SimConfig(engine=engine, output_median=16))
    with SimulatorProcess(config.sim) as sim:
        config.base_url = sim.base_url
        config.telemetry = "none"
        config.prometheus_url = [f"{sim.root_url}/metrics"]
        result = await run_benchmark(config)
    gpu = f"gpu0@127.0.0.1:{sim.port}"
    meter = result.summary["energy"]["meters"][gpu]
    assert meter["kind"] == "power"
    assert meter.get("power_averaged_over_s") == window_s
    read_until = (
        pl.read_ipc_stream(tmp_path / "run" / "telemetry.arrow")
        .get_column(f"prometheus@127.0.0.1:{sim.port}.t_ns")
        .max()
    )
    assert read_until - result.records.get_column("closed_ns").max() >= (window_s or 0.0) * 1e9


async def test_a_metrics_url_with_nothing_to_read_says_so(tmp_path: Path) -> None:
    with SimulatorProcess(quick_config(tmp_path).sim) as sim:
        config = quick_config(tmp_path, base_url=sim.base_url, prometheus_url=[f"{sim.root_url}/health"])
        with pytest.raises(RunError, match="shows no metric ipw-async reads"):
            await run_benchmark(config)


@pytest.mark.timing
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


@pytest.mark.timing
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


TOKEN = "s3cret-agent-token-4c1b"


def _sim_agent(sim: SimulatorProcess, *extra: str, env: dict[str, str] | None = None) -> AgentProcess:
    return AgentProcess(["--telemetry", "sim", "--sim-url", sim.root_url, *extra], env=env)


def test_an_agent_with_a_token_lets_in_only_who_sends_it(tmp_path: Path) -> None:
    token_file = tmp_path / "agent.token"
    token_file.write_text(TOKEN + "\n")
    with (
        SimulatorProcess(quick_config(tmp_path).sim) as sim,
        _sim_agent(sim, "--token-file", str(token_file)) as agent,
    ):
        bare = httpx.get(f"{agent.root_url}/info", timeout=10)
        wrong = httpx.get(f"{agent.root_url}/clock", headers={"Authorization": "Bearer nope"}, timeout=10)
        right = httpx.get(f"{agent.root_url}/info", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert bare.status_code == 401 and "--telemetry-token-file" in bare.text
    assert wrong.status_code == 401
    assert right.status_code == 200 and right.json()["sources"][0]["name"] == "sim"


def test_an_agent_refuses_to_serve_beyond_loopback_without_a_token() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ipw_async",
            "agent",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--telemetry",
            "psutil",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "IPW_ASYNC_AGENT_TOKEN"},
    )
    assert result.returncode != 0
    message = result.stderr.strip()
    assert "refusing to serve 0.0.0.0 without a token" in message
    assert "secrets.token_urlsafe" in message and "--insecure" in message  # says how to make one
    assert "Traceback" not in result.stderr


def test_an_agent_bounds_its_streams(tmp_path: Path) -> None:
    with (
        SimulatorProcess(quick_config(tmp_path).sim) as sim,
        _sim_agent(sim, "--max-streams", "1") as agent,
    ):
        too_fast = httpx.get(f"{agent.root_url}/stream", params={"period_ms": 1}, timeout=10)
        long_probe = httpx.get(f"{agent.root_url}/stream", params={"probe_s": 600}, timeout=10)
        with httpx.stream("GET", f"{agent.root_url}/stream", params={"period_ms": 20}, timeout=10) as first:
            lines = first.iter_lines()  # held: a generator let go of closes the stream
            next(lines)  # the one stream allowed is running
            second = httpx.get(f"{agent.root_url}/stream", timeout=10)
    assert too_fast.status_code == 400 and "period_ms must be between 5" in too_fast.text
    assert long_probe.status_code == 400 and "probe_s" in long_probe.text
    assert second.status_code == 503 and "at most 1 streams" in second.text


async def test_a_run_reads_an_agent_over_tls_with_its_token(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(cert_file)
    cert.private_key_pem.write_to_path(key_file)
    ca.cert_pem.write_to_path(ca_file)
    config = quick_config(tmp_path, max_queries=16, dataset="synthetic", output_tokens=20)
    with SimulatorProcess(config.sim) as sim:
        tls = ["--tls-cert", str(cert_file), "--tls-key", str(key_file)]
        with _sim_agent(sim, *tls, env={"IPW_ASYNC_AGENT_TOKEN": TOKEN}) as agent:
            assert agent.root_url.startswith("https://")
            config.base_url = sim.base_url
            config.telemetry = "none"
            config.telemetry_url = [agent.root_url]
            config.telemetry_ca_file = ca_file
            with pytest.raises(RunError, match="refused this harness; give --telemetry-token-file"):
                await run_benchmark(config)
            token_file = tmp_path / "harness.token"
            token_file.write_text(TOKEN)
            config.telemetry_token_file = token_file
            config.overwrite = True
            result = await run_benchmark(config)
            # without the CA the self-signed certificate is refused, and the run says so
            config.telemetry_ca_file = None
            with pytest.raises(RunError, match="CERTIFICATE_VERIFY_FAILED"):
                await run_benchmark(config)
    meter = f"sim@127.0.0.1:{agent.port}"
    assert result.summary["energy"]["headline_meters"] == [meter]
    assert result.records.get_column("energy_j").drop_nulls().len() == 16


async def test_no_token_or_password_reaches_the_run_directory(tmp_path: Path) -> None:
    token_file = tmp_path / "agent.token"
    token_file.write_text(TOKEN)
    password = "exporter-pa55word"
    config = quick_config(tmp_path, max_queries=16, dataset="synthetic", output_tokens=20)
    with SimulatorProcess(config.sim) as sim, _sim_agent(sim, "--token-file", str(token_file)) as agent:
        config.base_url = sim.base_url
        config.telemetry = "none"
        config.telemetry_url = [agent.root_url]
        config.telemetry_token_file = token_file
        # the simulator's /metrics asks no password; the harness must still never write it
        config.prometheus_url = [f"http://ops:{password}@127.0.0.1:{sim.port}/metrics"]
        result = await run_benchmark(config)
    assert result.summary["complete"] is True
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert len(files) >= 5
    for path in files:
        data = path.read_bytes()
        assert TOKEN.encode() not in data, path
        assert password.encode() not in data, path
    assert result.summary["config"]["prometheus_url"] == [f"http://ops:***@127.0.0.1:{sim.port}/metrics"]


@pytest.mark.timing
async def test_a_hung_agent_costs_only_its_own_meter(tmp_path: Path) -> None:
    config = quick_config(tmp_path, concurrency=8, max_queries=None, duration=5.0, dataset="synthetic")
    with SimulatorProcess(config.sim) as sim, _sim_agent(sim) as agent:
        config.base_url = sim.base_url
        config.telemetry = "cpu-model"  # a meter of this machine, read beside the agent's
        config.telemetry_url = [agent.root_url]
        run = asyncio.create_task(run_benchmark(config))
        await asyncio.sleep(2.5)
        os.kill(agent.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(2.0)
        finally:
            os.kill(agent.pid, signal.SIGCONT)
        result = await run
    remote = f"sim@127.0.0.1:{agent.port}"
    sampler = result.summary["telemetry"]["sampler"]
    assert sampler["gaps"][remote]["largest_ms"] > 1500  # the agent's went quiet while it hung
    # this machine's meter kept its ticks through the hang: read on the tick thread, a hung
    # agent would hold every tick for its 2 s timeout and leave one or two readings in it.
    # Counted inside the hang, not as a run-wide largest gap: a starved 2-core CI stalls the
    # whole process for a few hundred ms now and then, agent or no agent.
    log = pl.read_ipc_stream(tmp_path / "run" / "telemetry.arrow")
    remote_t = log.filter(pl.col(f"{remote}.energy_j").is_not_null()).get_column(f"{remote}.t_ns").to_numpy()
    hang = int(np.argmax(np.diff(remote_t)))
    start, end = remote_t[hang], remote_t[hang + 1]
    local_t = log.filter(pl.col("cpu-model.power_w").is_not_null()).get_column("cpu-model.t_ns").to_numpy()
    during = np.count_nonzero((local_t > start) & (local_t < end))
    expected = (end - start) / (sampler["period_ms"] * 1e6)
    assert during >= 0.5 * expected, (during, expected)
    assert sampler["skipped_ticks"] < expected / 2
    provenance = set(result.records.get_column(f"{remote}.provenance").to_list())
    assert "imputed" in provenance
    assert result.summary["telemetry"]["clocks"][remote]["reconnects"] >= 1


def test_prometheus_text_from_amds_exporter_and_dcgms_covariates() -> None:
    text = """gpu_energy_consumed{gpu_id="0",serial_number="S1",hostname="h"} 2.5e+12
gpu_package_power{gpu_id="0",serial_number="S1"} 512.5
gpu_gfx_activity{gpu_id="1",serial_number="S2"} 87
amd_gpu_junction_temperature{gpu_id="1"} 71
DCGM_FI_DEV_SM_CLOCK{gpu="0"} 1980
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="0"} 4
"""
    amd = PrometheusSource("http://mi300-host:5000/metrics")
    assert amd._values(text) == {
        "gpu0@mi300-host:5000.energy_j": pytest.approx(2.5e6),  # µJ to J
        "gpu0@mi300-host:5000.power_w": 512.5,
        "gpu1@mi300-host:5000.util_pct": 87.0,
        "gpu1@mi300-host:5000.temp_c": 71.0,  # an amd_ prefix is the same field
        "gpu0@mi300-host:5000.sm_clock_mhz": 1980.0,
        "gpu0@mi300-host:5000.throttle_reasons": 4.0,
    }


@pytest.mark.timing
async def test_an_agent_reads_a_source_for_read_at_most_every_interval() -> None:
    source, fake = nvml_source(FakeGpu("GPU-aaa"))
    info = source.open()
    energy = fake.nvmlDeviceGetTotalEnergyConsumption
    reads = 0

    def counted(handle: FakeGpu) -> int:
        nonlocal reads
        reads += 1
        return energy(handle)

    fake.nvmlDeviceGetTotalEnergyConsumption = counted  # type: ignore[method-assign]
    runner = web.AppRunner(AgentServer([OpenSource(source, info)]).app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        limits = httpx.Limits(max_connections=50)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=10) as http:
            # an abusive caller: 200 reads as fast as 50 connections can ask
            start = asyncio.get_running_loop().time()
            burst = await asyncio.gather(*(http.get("/read", params={"source": "nvml"}) for _ in range(200)))
            elapsed = asyncio.get_running_loop().time() - start
            burst_reads = reads
            # a sampler at the run's default cadence (50 ms) gets a fresh reading every time
            paced = []
            for _ in range(5):
                await asyncio.sleep(0.05)
                paced.append((await http.get("/read", params={"source": "nvml"})).json())
            counters = (await http.get("/read", params={"source": "nvml", "counters": "1"})).json()
    finally:
        await runner.cleanup()
    assert all(r.status_code == 200 for r in burst)
    stamps = {r.json()["t_ns"] for r in burst}
    # one read per interval at most, whatever the callers; the others got the newest reading
    assert burst_reads == len(stamps) <= elapsed / READ_INTERVAL_S + 1
    assert burst_reads < len(burst)
    assert len({r["t_ns"] for r in paced}) == 5
    assert set(counters["values"]) == {"gpu0.energy_j"}  # its own reading, not the full one's


def test_an_agent_with_a_token_on_plain_http_beyond_loopback_says_it_travels_unencrypted(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "agent.token"
    token_file.write_text(TOKEN)
    command = [sys.executable, "-m", "ipw_async", "agent", "--host", "0.0.0.0", "--port", "0"]
    proc = subprocess.Popen(
        [*command, "--telemetry", "psutil", "--token-file", str(token_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []

    def read() -> None:  # its start-up lines, up to the warning
        assert proc.stderr is not None
        while line := proc.stderr.readline():
            lines.append(line.strip())
            if "plain http" in line:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        reader.join(timeout=60)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert (
        lines[-1]
        == "the token travels unencrypted over plain http: give --tls-cert and --tls-key to serve https"
    )
    assert TOKEN not in "\n".join(lines)
