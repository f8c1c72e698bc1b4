"""The run directory is the run: run.json, streams readable at any moment, finishing from disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl
import psutil
import pyarrow.ipc as ipc
import pytest
from typer.testing import CliRunner

from ipw_async import finalize, run_benchmark
from ipw_async.cli import app
from ipw_async.records import RECORD_SCHEMA
from ipw_async.sim import SimulatorProcess

from .conftest import quick_config
from .test_sources import FakeGpu, FakeNvml

cli = CliRunner()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import asyncio

    tmp = tmp_path_factory.mktemp("finished")
    # the sampler runs about 1 s here: a probe of the default 1 s learned no grid 1 run in 4
    config = quick_config(tmp, max_queries=40, concurrency=8, warmup=4, counter_probe_s=0.4)
    asyncio.run(run_benchmark(config))
    return tmp / "run"


def _energy_columns(frame: pl.DataFrame) -> list[str]:
    return [c for c in frame.columns if c not in RECORD_SCHEMA]


def test_run_json_describes_the_run(finished_run: Path) -> None:
    run = json.loads((finished_run / "run.json").read_text())
    summary = json.loads((finished_run / "summary.json").read_text())
    assert run["run_id"] == summary["run_id"]
    assert run["clock"] == summary["clock"]
    assert run["load"]["concurrency"] == 8 and run["load"]["label"] == "c8"
    meters = {m["channel"]: m for m in run["telemetry"]["meters"]}
    assert meters["sim"]["kind"] == "counter" and meters["sim"]["accelerator"] and meters["sim"]["grids"]
    assert run["baseline_window_ns"][1] > run["baseline_window_ns"][0]
    assert run["end"]["complete"] is True and run["end"]["sampler"]["samples"] > 0
    assert "api_key" not in run["config"]


def test_finalize_reproduces_the_runs_energy_exactly(finished_run: Path) -> None:
    before = json.loads((finished_run / "summary.json").read_text())
    records_before = pl.read_ipc_stream(finished_run / "records.arrow")
    result = finalize(finished_run)
    after = json.loads((finished_run / "summary.json").read_text())
    assert after["energy"] == before["energy"]
    assert after == before
    assert result.summary["energy"]["total_j"] == before["energy"]["total_j"]
    assert result.records.equals(records_before)


def test_finalize_with_another_rule_changes_only_energy(finished_run: Path, tmp_path: Path) -> None:
    import shutil

    run_dir = tmp_path / "copy"
    shutil.copytree(finished_run, run_dir)
    before = json.loads((run_dir / "summary.json").read_text())
    records_before = pl.read_ipc_stream(run_dir / "records.arrow")
    result = cli.invoke(app, ["finalize", str(run_dir), "--attribution", "equal"])
    assert result.exit_code == 0, result.output
    after = json.loads((run_dir / "summary.json").read_text())
    records_after = pl.read_ipc_stream(run_dir / "records.arrow")
    # everything but energy as it was
    assert {k: v for k, v in after.items() if k != "energy"} == {
        k: v for k, v in before.items() if k != "energy"
    }
    measured = list(RECORD_SCHEMA)
    assert records_after.select(measured).equals(records_before.select(measured))
    # the energy is split another way, and still adds up
    assert after["energy"]["rule"] == "equal" and before["energy"]["rule"] == "steps"
    assert _energy_columns(records_after) == _energy_columns(records_before)
    assert not records_after.get_column("energy_j").equals(records_before.get_column("energy_j"))
    sim = after["energy"]["meters"]["sim"]
    assert abs(sim["conservation_error"]) < 1e-9
    assert sim["total_j"] == pytest.approx(before["energy"]["meters"]["sim"]["total_j"], rel=1e-12)
    # and finalize with the run's own rule brings the first figures back
    assert cli.invoke(app, ["finalize", str(run_dir), "--attribution", "steps"]).exit_code == 0
    assert json.loads((run_dir / "summary.json").read_text())["energy"] == before["energy"]


@pytest.mark.parametrize("missing", ["run.json", "telemetry.arrow"])
def test_finalize_without_what_it_needs_is_a_one_line_error(
    finished_run: Path, tmp_path: Path, missing: str
) -> None:
    import shutil

    run_dir = tmp_path / "broken"
    shutil.copytree(finished_run, run_dir)
    (run_dir / missing).unlink()
    result = cli.invoke(app, ["finalize", str(run_dir)], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert f"holds no {missing}" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_a_run_from_a_newer_version_is_refused_with_what_to_do(finished_run: Path, tmp_path: Path) -> None:
    import shutil

    run_dir = tmp_path / "future"
    shutil.copytree(finished_run, run_dir)
    manifest = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps(manifest | {"format": manifest["format"] + 1}))
    before = (run_dir / "records.arrow").read_bytes()
    result = cli.invoke(app, ["finalize", str(run_dir)], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "by a newer ipw-async" in result.output and "upgrade ipw-async" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert (run_dir / "records.arrow").read_bytes() == before  # nothing rewritten


def test_finalize_rejects_an_unknown_rule(finished_run: Path) -> None:
    result = cli.invoke(
        app, ["finalize", str(finished_run), "--attribution", "magic"], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 2 and "'magic' is not one of 'steps', 'fitted', 'tokens'" in result.output
    # the library refuses it as plainly
    with pytest.raises(ValueError, match="unknown attribution rule 'magic'"):
        finalize(finished_run, attribution="magic")


def test_finalize_with_a_given_power_model_fits_it_and_says_so(finished_run: Path, tmp_path: Path) -> None:
    import shutil

    run_dir = tmp_path / "given"
    shutil.copytree(finished_run, run_dir)
    before = (run_dir / "records.arrow").read_bytes()
    refused = cli.invoke(
        app, ["finalize", str(run_dir), "--power-model", "curve+lagg"], env={"COLUMNS": "300"}
    )
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1
    assert "unknown power-model effect 'lagg'" in refused.output and "curve, step, padding, context" in refused.output
    assert (run_dir / "records.arrow").read_bytes() == before  # nothing rewritten

    steps = cli.invoke(app, ["finalize", str(run_dir), "--power-model", "linear"], env={"COLUMNS": "300"})
    assert steps.exit_code == 2 and "add --attribution fitted" in steps.output  # the steps rule has none
    result = cli.invoke(app, ["finalize", str(run_dir), "--attribution", "fitted", "--power-model", "linear"])
    assert result.exit_code == 0, result.output
    energy = json.loads((run_dir / "summary.json").read_text())["energy"]
    model = energy["meters"]["sim"]["power_model"]
    assert energy["power_model"] == "linear" and model["model"] == "linear" and model["selection"]["given"]
    assert model["exponent"] == 1.0 and model["lag_ms"] == 0.0
    assert abs(energy["meters"]["sim"]["conservation_error"]) < 1e-9
    # back to the run's own choice: its first figures again
    assert cli.invoke(app, ["finalize", str(run_dir), "--power-model", "auto"]).exit_code == 0
    assert (
        json.loads((run_dir / "summary.json").read_text())["energy"]
        == json.loads((finished_run / "summary.json").read_text())["energy"]
    )


def test_a_killed_run_leaves_files_plain_readers_open(tmp_path: Path) -> None:
    run_dir = tmp_path / "killed"
    args = ["-c", "4", "-n", "5000", "--no-dashboard", "--baseline-s", "0", "--dataset", "synthetic"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ipw_async", "run", *args, "--output-tokens", "16", "-o", str(run_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OPENAI_API_KEY": ""},
    )
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        rows = 0
        while time.monotonic() < deadline and rows < 20:
            time.sleep(0.2)
            if (run_dir / "measured.arrow").exists():
                rows = pl.read_ipc_stream(run_dir / "measured.arrow").height  # readable while live
        assert rows >= 20
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        for child in children:  # the simulator outlives a kill -9 (for now): not the suite
            child.kill()
    by_polars = pl.read_ipc_stream(run_dir / "measured.arrow")
    by_pyarrow = ipc.open_stream(str(run_dir / "measured.arrow")).read_all()
    assert by_polars.height == by_pyarrow.num_rows >= rows
    assert not (run_dir / "records.arrow").exists()  # finalize writes the finished records
    measured = (run_dir / "measured.arrow").read_bytes()
    assert pl.read_ipc_stream(run_dir / "telemetry.arrow").height > 0
    run = json.loads((run_dir / "run.json").read_text())
    assert run["end"] is None  # it never said how it ended
    assert not (run_dir / "summary.json").exists()
    # finishing works on what it left: partial, and every measured joule accounted for
    result = finalize(run_dir)
    assert result.summary["complete"] is False and "killed or crashed" in result.summary["aborted"]
    assert result.records.height == by_polars.height
    assert abs(result.summary["energy"]["meters"]["sim"]["conservation_error"]) < 1e-9
    # what the run measured is never rewritten; the finished records sit beside it
    assert (run_dir / "measured.arrow").read_bytes() == measured
    assert (
        pl.read_ipc_stream(run_dir / "records.arrow").get_column("energy_j").null_count() < by_polars.height
    )


class ResettingNvml(FakeNvml):
    """An energy counter at 300 W that restarts from zero once (a driver reload)."""

    def __init__(self, reset_after_s: float) -> None:
        super().__init__([FakeGpu("GPU-aaa")])
        self.start = time.monotonic()
        self.reset_at = self.start + reset_after_s

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        now = time.monotonic()
        since = self.reset_at if now >= self.reset_at else self.start
        return int((now - since) * 300_000)


async def test_a_counter_reset_shows_in_the_summary(
    tmp_path: Path, sim: SimulatorProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", ResettingNvml(reset_after_s=1.0))
    config = quick_config(
        tmp_path, base_url=sim.base_url, telemetry="nvml", max_queries=60, concurrency=2, counter_probe_s=0
    )
    config.sampler = "thread"  # the fake driver lives in this process
    result = await run_benchmark(config)
    assert result.summary["telemetry"]["counter_events"] == {"gpu0": {"resets": 1, "wraps": 0}}
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["telemetry"]["counter_events"] == {"gpu0": {"resets": 1, "wraps": 0}}
    # the reset is not negative energy: the counter goes on from where it was
    assert result.summary["energy"]["meters"]["gpu0"]["total_j"] > 0


def test_library_and_cli_seed_the_simulator_alike(tmp_path: Path) -> None:
    import asyncio

    def answers(run_dir: Path) -> list[str]:
        """The answer each question got (the simulators here differ in preamble length only)."""
        frame = pl.read_ipc_stream(run_dir / "records.arrow").sort("request_id")
        return [a.rsplit("The answer is", 1)[-1] for a in frame.get_column("answer").to_list()]

    common = ["-n", "30", "-c", "6", "--telemetry", "none", "--baseline-s", "0", "--no-dashboard"]
    result = cli.invoke(app, ["run", "--seed", "3", "-o", str(tmp_path / "cli"), *common])
    assert result.exit_code == 0, result.output
    config = quick_config(tmp_path, seed=3, max_queries=30, concurrency=6, telemetry="none", baseline_s=0)
    config.output_dir = tmp_path / "lib"
    asyncio.run(run_benchmark(config))
    config.seed, config.output_dir = 0, tmp_path / "seed0"
    asyncio.run(run_benchmark(config))
    for name in ("cli", "lib"):
        assert json.loads((tmp_path / name / "summary.json").read_text())["config"]["sim"]["seed"] == 3
    assert answers(tmp_path / "cli") == answers(tmp_path / "lib")
    assert answers(tmp_path / "lib") != answers(tmp_path / "seed0")


def _refinalized(
    finished_run: Path, run_dir: Path, option: str, refused: str, accepted: str, why: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The energy section of a copy of ``finished_run`` before and after ``finalize option
    accepted``, once ``finalize option refused`` has exited 2 saying ``why`` and rewritten nothing."""
    import shutil

    shutil.copytree(finished_run, run_dir)
    before = json.loads((run_dir / "summary.json").read_text())["energy"]
    result = cli.invoke(app, ["finalize", str(run_dir), option, refused], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and why in result.output
    assert json.loads((run_dir / "summary.json").read_text())["energy"] == before  # nothing rewritten
    assert cli.invoke(app, ["finalize", str(run_dir), option, accepted]).exit_code == 0
    return before, json.loads((run_dir / "summary.json").read_text())["energy"]


def test_finalize_says_how_a_step_s_context_is_shared_and_refuses_what_it_does_not_know(
    finished_run: Path, tmp_path: Path
) -> None:
    before, after = _refinalized(
        finished_run,
        tmp_path / "context",
        "--context-cost",
        "padded",
        "shared",
        "'padded' is not one of 'shared', 'own'",
    )
    before_model = before["meters"]["sim"]["power_model"]
    model = after["meters"]["sim"]["power_model"]
    # a padded graph's rows and attention length are the step's whatever each request reads
    padded = ["per_decode_step_j", "per_decode_second_w", "per_padded_row_j", "per_padded_row_ktoken_j"]
    assert before["context_cost"] == "own" and before_model["shared_equally"] == padded
    assert after["context_cost"] == "shared" and model["shared_equally"] == [*padded, "per_context_ktoken_j"]
    assert abs(after["meters"]["sim"]["conservation_error"]) < 1e-9


def test_finalize_pads_decode_graphs_to_the_sizes_given_and_refuses_sizes_it_cannot_read(
    finished_run: Path, tmp_path: Path
) -> None:
    sizes = "1,2,4,8,16,32,64"
    before, after = _refinalized(
        finished_run,
        tmp_path / "capture",
        "--capture-sizes",
        "16,8",
        sizes,
        "ascending batch sizes separated by commas",
    )
    assert before["capture_sizes"] == "auto"
    assert before["meters"]["sim"]["power_model"]["decode_graph"]["source"]  # the run said why
    graph = after["meters"]["sim"]["power_model"]["decode_graph"]
    assert after["capture_sizes"] == sizes and graph["capture_sizes"] == sizes
    assert graph["source"].startswith("capture sizes given")
    assert abs(after["meters"]["sim"]["conservation_error"]) < 1e-9
