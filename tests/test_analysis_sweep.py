"""A real sweep on the built-in simulator, and the analyses and plots of the runs it wrote."""

from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from typer.testing import CliRunner

from ipw_async.analysis import analyze, load_run, plot_run
from ipw_async.analysis.constraints import best_levels
from ipw_async.analysis.sweep import SweepResult, judge
from ipw_async.cli import app
from ipw_async.harness import RunConfig
from ipw_async.harness.sweep import run_sweep
from ipw_async.rundir import files

SWEEP_FILES = {
    "raw_runs.csv",
    "summary_stats.csv",
    "summary_stats.json",
    "pareto_frontier_latency.csv",
    "pareto_frontier_energy.csv",
    "summary.json",
}


def plotted_points(fig: Figure) -> dict[str, int]:
    """Finite data points each axes of ``fig`` draws: line vertices, scatter offsets, bars."""
    counts = {}
    for i, ax in enumerate(fig.axes):
        points = sum(int(np.isfinite(line.get_xydata()).all(axis=1).sum()) for line in ax.lines)
        points += sum(len(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection))
        points += sum(1 for c in ax.collections if isinstance(c, PolyCollection) and c.get_paths())
        points += sum(1 for bar in ax.patches if isinstance(bar, Rectangle) and bar.get_height() != 0)
        counts[ax.get_title() or ax.get_ylabel() or f"axes {i}"] = points
    return counts


@pytest.fixture(scope="module")
def drawn() -> Iterator[dict[str, dict[str, int]]]:
    """Every figure saved while the module runs: its file name → points per axes, read off the
    artists as it is saved (a blank set of axes with a title still makes a varied PNG)."""
    figures: dict[str, dict[str, int]] = {}
    save = Figure.savefig

    def spy(fig: Figure, path: Path, *args: object, **kwargs: object) -> None:
        figures[Path(path).name] = plotted_points(fig)
        save(fig, path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Figure, "savefig", spy)
        yield figures


def assert_drawn(drawn: dict[str, dict[str, int]], path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 0
    axes = drawn[path.name]
    assert axes and all(n > 0 for n in axes.values()), f"{path.name}: {axes}"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, drawn: dict[str, dict[str, int]]) -> SweepResult:
    base = RunConfig(dataset="qa", max_queries=12, baseline_s=0, tail_s=0.2)
    base.sim.output_median = 8  # short answers keep four runs to a few seconds
    out = tmp_path_factory.mktemp("sweep")
    return run_sweep(base, [2, 4], None, 2, out, {"max_ttft_ms": 10_000.0}, display=None)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_sweep_writes_every_file(sweep: SweepResult, drawn: dict[str, dict[str, int]]) -> None:
    assert {p.name for p in sweep.sweep_dir.iterdir()} >= SWEEP_FILES
    rows = read_csv(sweep.sweep_dir / "raw_runs.csv")
    assert [(r["level"], r["repeat"], r["seed"], r["status"]) for r in rows] == [
        ("c2", "0", "0", "ok"),
        ("c2", "1", "1", "ok"),
        ("c4", "0", "0", "ok"),
        ("c4", "1", "1", "ok"),
    ]
    for r in rows:
        assert Path(r["run_dir"]).name == f"{r['level']}_r{r['repeat']}"
        assert (Path(r["run_dir"]) / files.RECORDS).is_file()
        assert r["requests_measured"] == "12"
        for figure in ("throughput_rps", "ttft_p50_s", "j_per_query", "j_per_token", "mean_power_w", "ipj"):
            assert float(r[figure]) > 0, figure
    summary = files.read_json(sweep.sweep_dir / "summary.json")
    assert summary["counts"] == {
        "runs": 4,
        "runs_planned": 4,
        "runs_ok": 4,
        "runs_failed": 0,
        "levels": 2,
        "accepted": 2,
        "rejected": 0,
    }
    assert summary["simulated"] and summary["complete"]
    assert summary["best"]["throughput"]["level"] in ("c2", "c4")
    written = {p.name for p in sweep.plots.written}
    assert written == {
        "load_vs_energy.png",
        "throughput_vs_latency.png",
        "accuracy_vs_energy.png",
        "accuracy_vs_latency.png",
        "pareto_frontier.png",
    }
    for path in sweep.plots.written:
        assert_drawn(drawn, path)


def test_summary_stats_follow_the_ci_formula(sweep: SweepResult) -> None:
    raw = read_csv(sweep.sweep_dir / "raw_runs.csv")
    stats = {r["level"]: r for r in read_csv(sweep.sweep_dir / "summary_stats.csv")}
    for level in ("c2", "c4"):
        values = [float(r["j_per_query"]) for r in raw if r["level"] == level]
        std = float(np.std(values, ddof=1))
        assert float(stats[level]["j_per_query_mean"]) == pytest.approx(np.mean(values))
        assert float(stats[level]["j_per_query_std"]) == pytest.approx(std)
        assert float(stats[level]["j_per_query_ci95"]) == pytest.approx(1.96 * std / math.sqrt(2))


def test_frontiers_hold_only_non_dominated_levels(sweep: SweepResult) -> None:
    means = {lv["level"]: lv["means"] for lv in sweep.levels}
    for name, metric in (("energy", "j_per_query"), ("latency", "e2e_p50_s")):
        front = [r["level"] for r in read_csv(sweep.sweep_dir / f"pareto_frontier_{name}.csv")]
        assert front
        for a in front:
            for b, m in means.items():
                dominated = m["accuracy"] >= means[a]["accuracy"] and m[metric] <= means[a][metric]
                assert (
                    b == a
                    or not dominated
                    or (m["accuracy"], m[metric])
                    == (
                        means[a]["accuracy"],
                        means[a][metric],
                    )
                )


def test_constraints_reject_with_reasons(sweep: SweepResult) -> None:
    levels = [dict(lv) for lv in sweep.levels]
    judge(levels, {"min_accuracy": 1.01, "max_ttft_ms": 10_000.0})
    assert all(not lv["accepted"] and lv["reasons"][0].startswith("accuracy") for lv in levels)
    assert best_levels(levels) == {"throughput": None, "j_per_query": None, "ipj": None}


def test_plots_of_a_real_run(sweep: SweepResult, tmp_path: Path, drawn: dict[str, dict[str, int]]) -> None:
    report = plot_run(sweep.out_dir / "c4_r0", tmp_path / "plots")
    assert report.skipped == {}
    assert len(report.written) == 9
    for path in report.written:
        assert_drawn(drawn, path)


def test_plot_skips_what_a_run_lacks(sweep: SweepResult, tmp_path: Path) -> None:
    run = tmp_path / "no_telemetry"
    run.mkdir()
    (run / files.RECORDS).write_bytes((sweep.out_dir / "c2_r0" / files.RECORDS).read_bytes())
    report = plot_run(run)
    assert "power_timeline" in report.skipped and "telemetry" in report.skipped["power_timeline"]
    assert (run / "plots" / "ttft_cdf.png").is_file()


def test_energy_breakdown_of_a_real_run_adds_up(sweep: SweepResult) -> None:
    run_dir = sweep.out_dir / "c4_r1"
    report = analyze(run_dir, "energy")["energy"]
    summary = load_run(run_dir).summary
    assert summary is not None
    sim = report["meters"]["sim"]
    assert abs(sim["deviation"]) < 1e-9
    # idle is "no request in flight", the same rule the attribution uses: what it left idle
    # and what it gave the work of the same meter reading
    attributed = summary["energy"]["meters"]["sim"]
    assert sim["phases"]["idle"]["energy_j"] == pytest.approx(
        attributed["idle_j"] + attributed["idle_to_work_j"], rel=1e-6
    )
    assert sim["phases"]["prefill"]["energy_j"] > 0 and sim["phases"]["decode"]["energy_j"] > 0


def test_cli_sweep_passes_run_options_through(tmp_path: Path) -> None:
    out = tmp_path / "cli_sweep"
    args = ["sweep", "-c", "2", "--repeats", "1", "-n", "4", "--baseline-s", "0", "--seed", "7"]
    result = CliRunner().invoke(
        app, [*args, "--output-dir", str(out), "--dataset", "synthetic", "--output-tokens", "16", "-q"]
    )
    assert result.exit_code == 0, result.output
    rows = read_csv(out / "sweep" / "raw_runs.csv")
    assert [(r["level"], r["seed"], r["requests_measured"], r["accuracy"]) for r in rows] == [
        ("c2", "7", "4", "")
    ]


def test_cli_sweep_rejects_an_unknown_run_option(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sweep", "-c", "1", "--bogus", "1", "-o", str(tmp_path)])
    assert result.exit_code == 2 and "--bogus" in result.output


def test_ctrl_c_stops_the_sweep_and_keeps_what_it_has(tmp_path: Path) -> None:
    out = tmp_path / "interrupted"
    cmd = [
        sys.executable,
        "-c",
        "from ipw_async.cli import main; main()",
        "sweep",
        "-c",
        "1,2",
        "--repeats",
        "2",
        "-n",
        "500",
    ]
    cmd += ["--baseline-s", "0", "-o", str(out), "-q"]
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    records = out / "c1_r0" / files.RECORDS
    deadline = time.monotonic() + 30
    while not records.exists() and time.monotonic() < deadline:  # the first run is under way
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    rows = read_csv(out / "sweep" / "raw_runs.csv")
    assert [r["status"] for r in rows] == ["interrupted"]
    summary = files.read_json(out / "sweep" / "summary.json")
    assert summary["interrupted"] and summary["counts"]["runs_planned"] == 4
