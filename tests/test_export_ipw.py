"""A run where IPW's users look: dataset/ through HF datasets, Parquet, and the format check."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ipw_async.cli import app
from ipw_async.export import ExportError
from ipw_async.export.ipw import export_ipw
from ipw_async.harness import run_benchmark
from ipw_async.rundir import files

from .conftest import SHORT_RUN, finished_short_run, quick_config


def measured_records(run_dir: Path) -> pl.DataFrame:
    return pl.read_ipc_stream(run_dir / files.RECORDS).filter(~pl.col("warmup")).sort("request_id")


def energies(ds: datasets.Dataset, model: str) -> list[float | None]:
    return [row[model]["energy_metrics"]["per_query_joules"] for row in ds["model_metrics"]]


def assert_dataset_matches(run_dir: Path) -> datasets.Dataset:
    """load_from_disk gives one row per measured query, energy equal to records.arrow's."""
    ds = datasets.load_from_disk(str(run_dir / "dataset"))
    records = measured_records(run_dir)
    model = json.loads((run_dir / files.SUMMARY).read_text())["model"]
    assert ds.num_rows == records.height
    assert energies(ds, model) == records.get_column("energy_j").to_list()
    assert ds["problem"] == records.get_column("prompt").to_list()
    ours = ds["ipw_async"]
    assert [o["request_id"] for o in ours] == records.get_column("request_id").to_list()
    assert [o["energy_low_j"] for o in ours] == records.get_column("energy_low_j").to_list()
    return ds


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finished_short_run(tmp_path_factory.mktemp("ipw") / "run")


def test_ipw_documented_access_path_reads_each_querys_energy(finished: Path) -> None:
    ds = assert_dataset_matches(finished)
    records = measured_records(finished)
    model = json.loads((finished / files.SUMMARY).read_text())["model"]
    first = ds[0]
    # IPW's analysis scripts read exactly this path
    assert first["model_metrics"][model]["energy_metrics"]["per_query_joules"] == records["energy_j"][0]
    assert first["model_answers"][model] == records["answer"][0]
    metrics = first["model_metrics"][model]
    assert metrics["token_metrics"] == {
        "input": records["prompt_tokens"][0],
        "output": records["output_tokens"][0],
    }
    assert metrics["latency_metrics"]["time_to_first_token_seconds"] == records["ttft_s"][0]
    assert metrics["latency_metrics"]["per_token_ms"] == pytest.approx(records["tpot_s"][0] * 1e3)
    # the window's energy, shared with the queries beside it, is at least the query's own share
    assert metrics["energy_metrics"]["total_joules"] >= metrics["energy_metrics"]["per_query_joules"]
    watts = metrics["power_metrics"]["gpu"]["total_watts"]
    assert watts["min"] <= watts["median"] <= watts["max"]
    # missing is not zero: nothing counts FLOPs, nobody scored these synthetic answers
    assert metrics["compute_metrics"] == {"flops_per_request": None, "macs_per_request": None}
    assert metrics["lm_correctness"] is None
    assert metrics["gpu_info"]["device_id"] is None  # the simulator's device has no index
    # the whole dataset round-trips through datasets' own Parquet writer too
    out = finished / "roundtrip.parquet"
    ds.to_parquet(str(out))
    assert pl.read_parquet(out).height == ds.num_rows


def test_records_arrow_and_parquet_hold_the_same_rows(finished: Path) -> None:
    arrow = pl.read_ipc_stream(finished / files.RECORDS)
    assert pl.read_parquet(finished / files.RECORDS_PARQUET).equals(arrow)
    assert pq.read_table(finished / files.RECORDS_PARQUET).num_rows == arrow.height
    telemetry = pl.read_ipc_stream(finished / files.TELEMETRY)
    assert pl.read_parquet(finished / files.TELEMETRY_PARQUET).equals(telemetry)
    # HF datasets also reads the records stream as it is
    assert datasets.Dataset.from_file(str(finished / files.RECORDS)).num_rows == arrow.height


def test_a_recovered_run_gets_its_dataset(tmp_path: Path) -> None:
    run_dir = tmp_path / "killed"
    shutil.copytree(SHORT_RUN, run_dir)
    manifest = json.loads((run_dir / files.RUN).read_text())
    manifest["end"] = None  # as kill -9 leaves it
    (run_dir / files.RUN).write_text(json.dumps(manifest))
    result = CliRunner().invoke(app, ["recover", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert_dataset_matches(run_dir)


async def test_an_agentic_run_keeps_tasks_and_turns(tmp_path: Path) -> None:
    result = await run_benchmark(quick_config(tmp_path, workload="agentic", max_queries=4, concurrency=2))
    ds = assert_dataset_matches(result.run_dir)
    records = measured_records(result.run_dir)
    ours = ds["ipw_async"]
    assert [o["task_id"] for o in ours] == records.get_column("task_id").to_list()
    assert [o["turn_index"] for o in ours] == records.get_column("turn_index").to_list()
    assert {o["task_id"] for o in ours} == set(records.get_column("task_id").to_list())
    # scored against the task's reference: a verdict, not IPW's default False
    model = result.summary["model"]
    verdicts = [row[model]["lm_correctness"] for row in ds["model_metrics"]]
    assert verdicts == records.get_column("correct").to_list() and any(v is not None for v in verdicts)
    # host memory over each query's window, read off psutil's samples in it
    host = [row[model]["memory_metrics"]["cpu_mb"] for row in ds["model_metrics"]]
    assert all(h["min"] is None or h["min"] <= h["median"] <= h["max"] for h in host)
    assert any(h["max"] is not None for h in host)


def test_export_ipw_makes_the_dataset_for_a_run_finished_before_it_existed(
    finished: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "old"
    shutil.copytree(finished, run_dir)
    shutil.rmtree(run_dir / "dataset")
    result = CliRunner().invoke(app, ["export", "ipw", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "load_from_disk" in result.output
    assert_dataset_matches(run_dir)


def test_export_ipw_of_a_run_cut_short(tmp_path: Path) -> None:
    run_dir = tmp_path / "unfinished"
    shutil.copytree(SHORT_RUN, run_dir)  # never finalized: no summary.json
    with pytest.raises(ExportError, match=r"cut short.*ipw-async recover"):
        export_ipw(run_dir)  # the library never finishes a run itself
    assert not (run_dir / "dataset").exists()
    result = CliRunner().invoke(app, ["export", "ipw", str(run_dir)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output  # the command finishes it first, and says so
    assert "it was cut short" in result.output and "Traceback" not in result.output
    assert_dataset_matches(run_dir)


def test_a_summary_from_a_newer_version_is_refused_in_one_line(finished: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "newer"
    shutil.copytree(finished, run_dir)
    summary = json.loads((run_dir / files.SUMMARY).read_text())
    assert summary["format"] == 1
    summary["format"] = 99
    (run_dir / files.SUMMARY).write_text(json.dumps(summary))
    result = CliRunner().invoke(app, ["analyze", str(run_dir)])
    assert result.exit_code == 2
    line = result.output.strip()
    assert "newer ipw-async" in line and "upgrade" in line and "\n" not in line


def test_window_statistics_are_each_querys_own_samples() -> None:
    """avg, max, median and min over the samples inside each query's [sent, end], skipping a
    null reading, for two columns on one clock (tied times included): against a direct count."""
    from ipw_async.export.ipw import _Windows

    t = [0, 10, 10, 20, 30, 40, 50]
    power = [1.0, 2.0, 3.0, None, 5.0, 6.0, 7.0]
    memory = [9.0, None, 8.0, 7.0, 6.0, 5.0, 4.0]
    log = pl.DataFrame({"gpu.t_ns": t, "gpu.power_w": power, "gpu.mem_mb": memory})
    starts, ends = np.array([5, 0, 60, 35]), np.array([30, 10, 70, 35])  # the last two hold none
    windows = _Windows(log, starts, ends)
    for column, values in (("gpu.power_w", power), ("gpu.mem_mb", memory)):
        got = windows.stats((column, "gpu"))
        for q, (a, b) in enumerate(zip(starts, ends, strict=True)):
            inside = [v for ti, v in zip(t, values, strict=True) if a <= ti <= b and v is not None]
            want = [np.mean(inside), max(inside), np.median(inside), min(inside)] if inside else [np.nan] * 4
            assert [got[k][q] for k in ("avg", "max", "median", "min")] == pytest.approx(want, nan_ok=True)
