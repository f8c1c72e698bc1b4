"""MLflow export: a finished run, a killed one and a real sweep, logged to a local file store and
read back through MlflowClient; secrets kept out; an unreachable server fails fast in one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
import pytest
from typer.testing import CliRunner

import ipw_async.export._mlflow_values as mlflow_values
from ipw_async.cli import app
from ipw_async.export import ExportError
from ipw_async.export.mlflow import MISSING_EXTRA, export_mlflow
from ipw_async.harness import RunConfig
from ipw_async.harness.sweep import run_sweep
from ipw_async.results import finalize
from ipw_async.rundir import files

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

from .conftest import SHORT_RUN, finished_short_run

SECRETS = ("s3cret", "sk-live-123", "hunter2")


@pytest.fixture(autouse=True)
def file_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow 3 refuses its file store unless asked; the tests need no server or database."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


@pytest.fixture
def store(tmp_path: Path) -> str:
    return tmp_path.as_uri() + "/mlruns"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finished_short_run(tmp_path_factory.mktemp("finished") / "short_run")


@pytest.fixture(scope="module")
def with_secrets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose URLs carry passwords and whose request params carry an API key, a long value
    and a key MLflow cannot take as it is (as a user's --param could)."""
    run = tmp_path_factory.mktemp("secrets") / "short_run"
    shutil.copytree(SHORT_RUN, run)
    manifest = json.loads((run / files.RUN).read_text())
    url = "http://alice:s3cret@127.0.0.1:39969/v1"
    manifest["base_url"] = manifest["config"]["base_url"] = url
    manifest["config"]["telemetry_url"] = ["http://bob:hunter2@gpu-host:9180"]
    manifest["config"]["params"] = {"api_key": "sk-live-123", "system": "x" * 1000, "stop/words:": 1}
    (run / files.RUN).write_text(json.dumps(manifest))
    finalize(run)
    return run


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real sweep on the simulator: two levels, one repeat each, scored (so IPJ is defined)."""
    base = RunConfig(dataset="qa", max_queries=12, baseline_s=0, tail_s=0.2)
    base.sim.output_median = 8  # short answers keep the two runs to a few seconds
    out = tmp_path_factory.mktemp("sweep")
    run_sweep(base, [2, 4], None, 1, out, {}, display=None)
    return out


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` by relative path, with a hash of its bytes."""
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def artifacts(client: MlflowClient, run_id: str, folder: str | None = None) -> list[str]:
    """Every artifact's path, folders opened."""
    out = []
    for item in client.list_artifacts(run_id, folder):
        out += artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return out


def children(client: MlflowClient, parent: Run) -> list[Run]:
    found = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    return sorted(found, key=lambda r: r.info.run_name)


def test_a_run_reads_back_as_its_summary(finished: Path, store: str) -> None:
    before = snapshot(finished)
    summary: dict[str, Any] = json.loads((finished / files.SUMMARY).read_text())
    done = export_mlflow(finished, tracking_uri=store, experiment="bench")
    assert (done.tracking_uri, done.experiment, done.children) == (store, "bench", 0)
    client = mlflow.MlflowClient(store)
    run = client.get_run(done.run_id)
    metrics, params, tags = run.data.metrics, run.data.params, run.data.tags
    energy, latency = summary["energy"], summary["latency_s"]
    expected = {
        "requests_per_s": summary["throughput"]["requests_per_s"],
        "output_tokens_per_s": summary["throughput"]["output_tokens_per_s"],
        "error_rate": 0.0,
        "ttft_p50_s": latency["ttft"]["p50"],
        "tpot_p90_s": latency["tpot"]["p90"],
        "e2e_p99_s": latency["e2e"]["p99"],
        "e2e_p99.9_s": latency["e2e"]["p99.9"],
        "j_per_query_p50": energy["per_query_j"]["p50"],
        "j_per_query_mean": energy["per_query_j"]["mean"],
        "j_per_output_token": energy["j_per_output_token"],
        "energy_total_j": energy["total_j"],
        "energy_idle_j": energy["idle_j"],
        "conservation_error": energy["meters"]["sim"]["conservation_error"],
        "meter.sim.total_j": energy["meters"]["sim"]["total_j"],
        "band_half_width_p50": energy["band_half_width"]["p50"],
    }
    assert {k: metrics[k] for k in expected} == pytest.approx(expected, rel=1e-12, abs=1e-300)
    # not scored: accuracy, IPJ and IPW are missing, not zero, and the tag says why
    assert not {"accuracy", "ipj", "ipw"} & metrics.keys()
    missing = json.loads(tags["ipw_async.missing_metrics"])
    assert missing["ipj"] == missing["ipw"] == "no scored answers, so no accuracy"
    assert params["concurrency"] == "8" and params["max_queries"] == "48"
    assert params["model"] == summary["model"] == "sim-small"
    assert params["dataset"] == "synthetic" and params["simulated"] == "false"
    assert params["run_id"] == summary["run_id"] and params["version"] == summary["versions"]["ipw-async"]
    assert params["base_url"] == summary["base_url"] and params["rate"] == "null"
    assert tags["ipw_async.run_id"] == summary["run_id"]
    assert (tags["ipw_async.simulated"], tags["ipw_async.complete"]) == ("false", "true")
    assert tags["mlflow.runName"] == run.info.run_name == "short_run"
    assert run.info.status == "FINISHED"
    clock = json.loads((finished / files.RUN).read_text())["clock"]
    assert run.info.start_time == clock["t0_unix_ns"] // 1_000_000 < run.info.end_time
    assert {"summary.json", "run.json", "traces.jsonl"} <= set(artifacts(client, done.run_id))
    logged = Path(client.download_artifacts(done.run_id, "summary.json"))
    assert logged.read_bytes() == (finished / files.SUMMARY).read_bytes()
    assert snapshot(finished) == before  # nothing written into the run directory


def test_plots_and_report_go_and_big_files_stay(
    finished: Path, store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "plotted"
    shutil.copytree(finished, run)
    (run / "plots").mkdir()
    (run / "plots" / "energy.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (run / "report.html").write_text("<html></html>")
    monkeypatch.setattr(mlflow_values, "MAX_ARTIFACT_BYTES", 50_000)  # traces.jsonl is ~100 kB
    done = export_mlflow(run, tracking_uri=store, run_name="named")
    client = mlflow.MlflowClient(store)
    logged = set(artifacts(client, done.run_id))
    assert {"summary.json", "run.json", "report.html", "plots/energy.png"} <= logged
    assert "traces.jsonl" not in logged
    found = client.get_run(done.run_id)
    assert "traces.jsonl" in json.loads(found.data.tags["ipw_async.skipped_artifacts"])
    assert found.info.run_name == "named"


def test_no_secret_reaches_params_tags_or_artifacts(with_secrets: Path, store: str, tmp_path: Path) -> None:
    done = export_mlflow(with_secrets, tracking_uri=store)
    client = mlflow.MlflowClient(store)
    run = client.get_run(done.run_id)
    shown = [*run.data.params.values(), *run.data.tags.values()]
    downloaded = Path(client.download_artifacts(done.run_id, "", str(tmp_path / "got")))
    texts = [p.read_text() for p in downloaded.rglob("*") if p.is_file()]
    assert len(texts) == 3  # summary.json, run.json, traces.jsonl
    for secret in SECRETS:
        assert not [s for s in shown + texts if secret in s], secret
    assert run.data.params["base_url"] == "http://alice:***@127.0.0.1:39969/v1"
    assert run.data.params["params.api_key"] == "***"
    assert run.data.params["telemetry_url"] == '["http://bob:***@gpu-host:9180"]'
    assert '"api_key": "***"' in (downloaded / "summary.json").read_text()
    # the logged copies were redacted, not the run's own files
    assert "sk-live-123" in (with_secrets / files.SUMMARY).read_text()


def test_a_long_value_is_cut_and_an_odd_key_made_valid(with_secrets: Path, store: str) -> None:
    done = export_mlflow(with_secrets, tracking_uri=store)
    run = mlflow.MlflowClient(store).get_run(done.run_id)
    params = run.data.params
    assert len(params["params.system"]) == 500 and params["params.system"].endswith("...")
    assert run.data.tags["ipw_async.truncated_params"] == "params.system"
    assert params["params.stop_words_"] == "1"


def test_a_killed_run_is_refused_by_the_library_and_finished_first_by_the_cli(
    finished: Path, store: str, tmp_path: Path
) -> None:
    killed = tmp_path / "killed"
    shutil.copytree(SHORT_RUN, killed)  # what a run leaves before its summary: run.json and the streams
    before = snapshot(killed)
    with pytest.raises(ExportError, match=r"cut short.*ipw-async recover"):
        export_mlflow(killed, tracking_uri=store)
    assert snapshot(killed) == before  # an export never finishes a run itself
    result = CliRunner().invoke(
        app, ["export", "mlflow", str(killed), "--tracking-uri", store], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 0, result.output
    assert "it was cut short" in result.output
    run_id = result.output.split("MLflow: run ", 1)[1].split()[0]
    client = mlflow.MlflowClient(store)
    run = client.get_run(run_id)
    summary = json.loads((killed / files.SUMMARY).read_text())  # finished in place, as recover does
    assert summary["energy"] == json.loads((finished / files.SUMMARY).read_text())["energy"]
    assert run.data.metrics["j_per_query_mean"] == pytest.approx(summary["energy"]["per_query_j"]["mean"])
    assert "summary.json" in artifacts(client, run_id)


def test_a_sweep_is_a_parent_with_a_child_per_level(sweep: Path, store: str) -> None:
    before = snapshot(sweep)
    done = export_mlflow(sweep, tracking_uri=store)
    assert done.children == 2
    client = mlflow.MlflowClient(store)
    parent = client.get_run(done.run_id)
    kids = children(client, parent)
    assert [k.info.run_name for k in kids] == ["c2_r0", "c4_r0"]
    assert [k.data.tags["ipw_async.level"] for k in kids] == ["c2", "c4"]
    assert all(k.data.tags["mlflow.parentRunId"] == done.run_id for k in kids)
    assert [k.data.params["concurrency"] for k in kids] == ["2", "4"]
    rows = {r["level"]: r for r in json.loads((sweep / "sweep" / "summary_stats.json").read_text())["levels"]}
    for kid in kids:
        means = rows[kid.data.tags["ipw_async.level"]]["means"]
        assert kid.data.metrics["requests_per_s"] == pytest.approx(means["throughput_rps"])
        assert kid.data.metrics["ipj"] == pytest.approx(means["ipj"])  # scored: IPJ and IPW are there
        assert kid.data.metrics["ipw"] > 0
    assert parent.data.tags["ipw_async.sweep"] == "true" and parent.info.status == "FINISHED"
    assert parent.data.metrics["sweep.runs_ok"] == 2
    history = client.get_metric_history(done.run_id, "levels/j_per_query")
    history = sorted(history, key=lambda m: m.step)
    assert [m.step for m in history] == [0, 1]
    assert [m.value for m in history] == pytest.approx(
        [rows["c2"]["means"]["j_per_query"], rows["c4"]["means"]["j_per_query"]]
    )
    logged = set(artifacts(client, done.run_id))
    assert {"raw_runs.csv", "summary_stats.csv", "summary.json"} <= logged
    assert any(p.startswith("plots/") and p.endswith(".png") for p in logged)
    assert snapshot(sweep) == before
    # the sweep's own folder names the same sweep
    assert export_mlflow(sweep / "sweep", tracking_uri=store).children == 2


def test_an_unreachable_server_fails_fast_in_one_line(
    finished: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "5")  # the user's own, restored after
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    before = snapshot(finished)
    start = time.monotonic()
    with pytest.raises(ExportError) as caught:
        export_mlflow(finished, tracking_uri=f"http://alice:s3cret@127.0.0.1:{port}")
    assert time.monotonic() - start < 10
    message = str(caught.value)
    assert "\n" not in message and "s3cret" not in message
    assert f"http://alice:***@127.0.0.1:{port}" in message and "cannot be reached" in message
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "5"
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ
    assert snapshot(finished) == before


def test_without_mlflow_the_error_names_the_extra(finished: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow now raises ImportError
    with pytest.raises(ExportError, match="mlflow extra") as caught:
        export_mlflow(finished)
    assert str(caught.value) == MISSING_EXTRA


def test_a_refused_file_store_says_how_to_allow_it(
    finished: Path, store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    allow = getattr(pytest.importorskip("mlflow.environment_variables"), "MLFLOW_ALLOW_FILE_STORE", None)
    if allow is None or allow.get():
        pytest.skip("this MLflow takes its file store unasked")
    with pytest.raises(ExportError, match="unless MLFLOW_ALLOW_FILE_STORE=true is set") as caught:
        export_mlflow(finished, tracking_uri=store)
    assert "\n" not in str(caught.value)


def test_a_directory_that_is_neither_is_refused(tmp_path: Path, store: str) -> None:
    with pytest.raises(ExportError, match="neither a run directory"):
        export_mlflow(tmp_path, tracking_uri=store)


def test_export_mlflow_command(finished: Path, store: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["export", "mlflow", str(finished), "--tracking-uri", store])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("MLflow: run ") and "experiment 'ipw-async'" in result.output
    refused = CliRunner().invoke(app, ["export", "mlflow", str(tmp_path), "--tracking-uri", store])
    assert (
        refused.exit_code == 2 and refused.output.startswith("error:") and "Traceback" not in refused.output
    )
