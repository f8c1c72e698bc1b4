"""A real sweep on the built-in simulator, and the analyses and plots of the runs it wrote."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from typer.testing import CliRunner

from ipw_async.analysis import analyze, plot_run
from ipw_async.analysis.constraints import best_levels
from ipw_async.analysis.knee import find_knee
from ipw_async.analysis.sweep import SweepResult, judge, knee_lines, levels_of, oversaturated, write_sweep
from ipw_async.cli import app
from ipw_async.harness import RunConfig
from ipw_async.harness.sweep import run_sweep
from ipw_async.rundir import RunDir, files
from ipw_async.sim import SimConfig, SimulatorProcess

from .conftest import fast_engine

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

    def spy(fig: Figure, path: Any, *args: object, **kwargs: object) -> None:
        if isinstance(path, str | Path):  # report.html draws into memory too
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
        "runs_oversaturated": 0,
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
    assert len(report.written) == 10
    assert tmp_path / "plots" / "device_state.png" in report.written  # the device's temperature
    for path in report.written:
        assert_drawn(drawn, path)


def test_plot_skips_what_a_run_lacks(sweep: SweepResult, tmp_path: Path) -> None:
    run = tmp_path / "no_telemetry"
    run.mkdir()
    (run / files.RECORDS).write_bytes((sweep.out_dir / "c2_r0" / files.RECORDS).read_bytes())
    report = plot_run(run)
    assert "power_timeline" in report.skipped and "telemetry" in report.skipped["power_timeline"]
    assert "telemetry" in report.skipped["device_state"]
    assert (run / "plots" / "ttft_cdf.png").is_file()


def test_energy_breakdown_of_a_real_run_adds_up(sweep: SweepResult) -> None:
    run_dir = sweep.out_dir / "c4_r1"
    report = analyze(run_dir, "energy")["energy"]
    summary = RunDir.open(run_dir).summary
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


def test_cli_sweep_passes_run_options_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "cli_sweep"
    store = tmp_path.as_uri() + "/mlruns"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for its file store by name
    args = ["sweep", "-c", "2", "--repeats", "1", "-n", "4", "--baseline-s", "0", "--seed", "7", "--mlflow"]
    result = CliRunner().invoke(
        app, [*args, "--output-dir", str(out), "--dataset", "synthetic", "--output-tokens", "16", "-q"]
    )
    assert result.exit_code == 0, result.output
    # --mlflow: the sweep is a parent run with its one level as a child
    assert "with 1 child runs in experiment 'ipw-async'" in result.output
    parents = mlflow.MlflowClient(store).search_runs(
        [mlflow.MlflowClient(store).get_experiment_by_name("ipw-async").experiment_id],
        filter_string="tags.ipw_async.sweep = 'true'",
    )
    assert len(parents) == 1
    rows = read_csv(out / "sweep" / "raw_runs.csv")
    assert [(r["level"], r["seed"], r["requests_measured"], r["accuracy"]) for r in rows] == [
        ("c2", "7", "4", "")
    ]


def test_cli_sweep_rejects_an_unknown_run_option(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sweep", "-c", "1", "--bogus", "1", "-o", str(tmp_path)])
    assert result.exit_code == 2 and "--bogus" in result.output


def test_a_sweep_over_a_traces_speed_replays_it_once_a_speedup_each_from_an_empty_prefix_cache(
    tmp_path: Path,
) -> None:
    # 6 requests 100 ms apart (10/s), all opening with block 1: a point that found the cache an
    # earlier point left would hit it on its first request
    trace = tmp_path / "mooncake.jsonl"
    rows = [{"timestamp": 100 * i, "input_length": 600, "output_length": 4, "hash_ids": [1, 10 + i]} for i in range(6)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "sweep"
    with SimulatorProcess(SimConfig(engine=fast_engine(prefix_cache=True), output_median=4)) as sim:
        args = ["sweep", "--trace", str(trace), "--speedup", "5,20", "--repeats", "1", "-o", str(out)]
        run_options = ["--base-url", sim.base_url, "--telemetry", "sim", "--baseline-s", "0", "-q"]
        result = CliRunner().invoke(app, [*args, *run_options])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "sweep" / "summary.json").read_text())
    assert summary["mode"] == "speedup" and summary["prefix_cache_reset"] == "done"
    assert summary["trace"]["rate_per_s"] == pytest.approx(10.0)
    assert summary["trace"]["offered_per_s"] == pytest.approx({"x5": 50.0, "x20": 200.0})
    runs = read_csv(out / "sweep" / "raw_runs.csv")
    assert [(r["level"], r["value"], r["status"], r["requests_measured"]) for r in runs] == [
        ("x5", "5.0", "ok", "6"),
        ("x20", "20.0", "ok", "6"),
    ]
    for speedup in (5, 20):
        frame = RunDir.open(out / f"x{speedup}_r0").records.sort("request_id")
        scheduled = frame["scheduled_ns"].to_numpy()
        assert (scheduled - scheduled[0]).tolist() == [i * 100_000_000 // speedup for i in range(6)]
        assert frame["cached_prompt_tokens"][0] == 0  # the cache emptied before this point


def test_a_python_sweep_over_speedups_refuses_a_speedup_of_its_own(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 8, "output_length": 2}\n')
    base = RunConfig(trace=trace, speedup=3.0)
    with pytest.raises(ValueError, match=r"replace the run's speedup \(3\)"):
        run_sweep(base, None, None, 1, tmp_path / "sweep", {}, speedups=[1.0, 2.0])
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["sweep", "-c", "1,2", "--trace", "{trace}"], "sweep its speed with --speedup 0.5,1,2,4 instead"),
        (["sweep", "--trace", "{trace}"], "give the levels as --speedup 0.5,1,2,4"),
        (["sweep", "--trace", "{trace}", "--speedup", "1,0"], "must be positive factors, e.g. 0.5,1,2,4, not 0"),
        (["sweep", "--trace", "{trace}", "--speedup", "-2"], "not -2"),
        (["sweep", "--speedup", "1,2"], "--speedup levels are the speeds of a replayed trace: add --trace FILE"),
        (["sweep", "--trace", "{missing}", "--speedup", "1,2"], "trace file not found"),
        (["search", "--slo", "ttft_p90=80ms", "--trace", "{trace}"], "ipw-async sweep --trace FILE --speedup"),
    ],
)
def test_a_sweep_or_search_a_trace_cannot_take_is_refused_in_one_line_before_anything_runs(
    tmp_path: Path, command: list[str], says: str
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 8, "output_length": 2}\n')
    paths = {"trace": str(trace), "missing": str(tmp_path / "none.jsonl")}
    out = tmp_path / "sweep"
    result = CliRunner().invoke(app, [*(a.format_map(paths) for a in command), "-o", str(out)])
    assert result.exit_code == 2
    message = " ".join(result.output.split())  # the terminal may wrap the line
    assert says in message and len(result.output.strip().splitlines()) <= 3, result.output
    assert not out.exists()  # refused before any run started


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
    records = out / "c1_r0" / files.MEASURED
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


LOADS = np.array([1, 2, 4, 8, 16, 32, 64], dtype=float)


@pytest.mark.parametrize(
    ("loads", "throughput", "knee"),
    [
        (LOADS, 100 * np.minimum(LOADS, 8), 8),  # in proportion up to 8, flat after
        (LOADS, 100 * LOADS / (1 + LOADS / 16), 8),  # smooth saturation, half-way at 16
        (np.array([1, 2, 3, 4, 6, 8, 10, 12]), 50 * np.minimum([1, 2, 3, 4, 6, 8, 10, 12], 6), 6),
    ],
)
def test_knee_finds_where_throughput_stops_growing(
    loads: np.ndarray, throughput: np.ndarray, knee: float
) -> None:
    found = find_knee(loads, throughput)
    assert found.found and found.reason is None
    # within one level of the bend
    at = int(np.flatnonzero(loads == found.load)[0])
    assert abs(at - int(np.flatnonzero(loads == knee)[0])) <= 1
    assert found.value == pytest.approx(throughput[at])
    assert found.distance is not None and found.distance >= 0.1


def test_knee_of_a_sharp_bend_is_the_bend() -> None:
    found = find_knee(LOADS, 100 * np.minimum(LOADS, 8))
    assert (found.load, found.value, found.log_x, found.log_y) == (8.0, 800.0, True, True)
    assert found.distance == pytest.approx(0.5)  # halfway along log load, already at the top


@pytest.mark.parametrize(
    ("loads", "values", "decreasing"),
    [
        (LOADS, 3.0 * LOADS, False),  # throughput in proportion to load all the way
        (np.array([1.0, 2, 3, 4, 5]), np.array([2.0, 4, 6, 8, 10]), False),
        (LOADS, 1.3 / LOADS, True),  # J/token falling in proportion to load, never flattening
    ],
)
def test_a_straight_line_has_no_knee(loads: np.ndarray, values: np.ndarray, decreasing: bool) -> None:
    found = find_knee(loads, values, decreasing=decreasing)
    assert found.load is None and found.value is None and not found.found
    assert found.reason is not None and found.reason.startswith("no knee")
    assert found.distance is not None and found.distance < 0.1


def test_fewer_than_three_points_have_no_knee() -> None:
    found = find_knee([1, 2], [10, 20])
    assert found.load is None and found.distance is None
    assert found.reason == "2 load(s) with the metric; a knee needs at least 3"
    # a level without the metric (NaN) does not count: missing is not zero
    found = find_knee([1, 2, 4], [10, float("nan"), 20])
    assert found.load is None and found.reason is not None and found.reason.startswith("2 load(s)")


def test_a_flat_metric_has_no_knee() -> None:
    found = find_knee(LOADS, [100, 101, 99, 100, 100, 101, 100])
    assert found.load is None and found.reason is not None and found.reason.startswith("flat")


def test_energy_knee_is_where_j_per_token_flattens() -> None:
    j_per_token = np.maximum(1.6 / LOADS, 0.2)  # falls in proportion up to 8, flat from there
    found = find_knee(LOADS, j_per_token, decreasing=True)
    assert (found.load, found.value) == (8.0, 0.2)
    # the falling curve is not mistaken for a rising one
    assert find_knee(LOADS, j_per_token).load != 8.0
    # the sweep in docs/analysis.md: "falling steeply up to 16 in flight and flattening by 64"
    doc = find_knee([1, 4, 16, 64], [1.6, 0.667, 0.382, 0.31], decreasing=True)
    assert doc.load == 16.0


def test_two_levels_have_no_knees(sweep: SweepResult) -> None:
    knees = files.read_json(sweep.sweep_dir / "summary.json")["knees"]
    assert knees["throughput"] is None and knees["energy"] is None
    assert knees["reasons"] == {
        "throughput": "throughput_tok_s: 2 load(s) with the metric; a knee needs at least 3",
        "energy": "j_per_token: 2 load(s) with the metric; a knee needs at least 3",
    }
    assert knee_lines(knees)[0].startswith("throughput knee (stops growing with load): none (")


@pytest.fixture(scope="module")
def saturating(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[SweepResult, dict[str, list[tuple[str, float]]]]:
    """A real sweep on a simulated server that decodes at most 2 sequences at once, and the
    knee marks on each plot it saved (plot -> [(label, x)])."""
    base = RunConfig(dataset="qa", max_queries=12, baseline_s=0, tail_s=0.2)
    base.sim.output_median = 8
    base.sim.engine.max_batch = 2  # throughput stops growing past 2 in flight
    marks: dict[str, list[tuple[str, float]]] = {}
    save = Figure.savefig

    def spy(fig: Figure, path: Path, *args: object, **kwargs: object) -> None:
        found = marks.setdefault(Path(path).name, [])
        for ax in fig.axes:
            found += [
                (f"{ax.get_ylabel()}: {line.get_label()}", float(line.get_xdata()[0])) for line in ax.lines
            ]
            found += [(f"{ax.get_ylabel()}: {c.get_label()}", math.nan) for c in ax.collections]
            found += [(f"{ax.get_ylabel()}: text {t.get_text()}", math.nan) for t in ax.texts]
        save(fig, path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Figure, "savefig", spy)
        result = run_sweep(base, [1, 2, 8], None, 1, tmp_path_factory.mktemp("saturating"), {}, display=None)
    return result, marks


def test_knees_of_a_saturating_sweep(
    saturating: tuple[SweepResult, dict[str, list[tuple[str, float]]]],
) -> None:
    result, _ = saturating
    summary = files.read_json(result.sweep_dir / "summary.json")
    knees = summary["knees"]
    means = {lv["level"]: lv["means"] for lv in result.levels}
    assert means["c8"]["throughput_tok_s"] < 1.2 * means["c2"]["throughput_tok_s"]  # it did saturate
    assert knees["reasons"] == {"throughput": None, "energy": None}
    assert knees["throughput"] == {
        "level": "c2",
        "load": 2,
        "metric": "throughput_tok_s",
        "value": pytest.approx(means["c2"]["throughput_tok_s"]),
        "distance": pytest.approx(knees["throughput"]["distance"]),
        "scale": "log2 load, log2 metric",
        "method": "kneedle",
    }
    assert knees["throughput"]["distance"] > 0.3
    assert knees["energy"]["level"] == "c2" and knees["energy"]["metric"] == "j_per_token"
    assert knees["energy"]["value"] == pytest.approx(means["c2"]["j_per_token"])
    assert knees["method"].startswith("Kneedle")
    assert knee_lines(knees) == [
        f"throughput knee (stops growing with load): c2 (throughput_tok_s {knees['throughput']['value']:.4g})",
        f"energy knee (J per unit stops falling): c2 (j_per_token {knees['energy']['value']:.4g})",
    ]


def test_knees_are_marked_on_the_plots(
    saturating: tuple[SweepResult, dict[str, list[tuple[str, float]]]],
) -> None:
    _, marks = saturating
    load = marks["load_vs_energy.png"]
    for panel, name in (
        ("energy per query (J)", "energy"),
        ("energy per output token (J)", "energy"),
        ("output throughput (tok/s)", "throughput"),
    ):
        assert (f"{panel}: {name} knee", 2.0) in load  # the vertical line at c2
        assert f"{panel}: text {name} knee c2" in [label for label, _ in load]
    assert not any("knee" in label for label, _ in load if label.startswith("TTFT"))
    ring = [label for label, _ in marks["throughput_vs_latency.png"] if "knee" in label]
    assert ring == ["output throughput (tok/s): throughput knee (c2)"]


def _copy_sweep(sweep: SweepResult, out: Path) -> list[dict[str, object]]:
    """The fixture sweep's run rows, pointing at copies of its run directories under ``out``."""
    rows = []
    for row in sweep.runs:
        run_dir = out / Path(row["run_dir"]).name
        shutil.copytree(row["run_dir"], run_dir)
        rows.append({k: v for k, v in row.items() if k != "oversaturated"} | {"run_dir": str(run_dir)})
    return rows


def _set_saturation(run_dir: str | object, verdict: bool | None) -> None:
    path = Path(str(run_dir)) / files.SUMMARY
    summary = json.loads(path.read_text())
    summary["saturation"] = {
        "oversaturated": verdict,
        "reason": "test",
        "began_s": None,
        "share_of_run": None,
    }
    path.write_text(json.dumps(summary))


def test_an_oversaturated_repeat_fails_its_level(sweep: SweepResult, tmp_path: Path) -> None:
    rows = _copy_sweep(sweep, tmp_path)
    by_name = {Path(str(r["run_dir"])).name: r for r in rows}
    _set_saturation(by_name["c4_r1"]["run_dir"], True)
    _set_saturation(by_name["c4_r0"]["run_dir"], False)
    _set_saturation(by_name["c2_r0"]["run_dir"], None)  # null: not judged; c2_r1 has no key at all
    _, levels = levels_of([2, 4], None)
    result = write_sweep(tmp_path, "concurrency", levels, rows, {}, {}, True, 2, False)
    judged = {lv["level"]: lv for lv in files.read_json(result.sweep_dir / "summary_stats.json")["levels"]}
    assert (judged["c4"]["oversaturated_repeats"], judged["c4"]["saturation_judged"]) == (1, 2)
    assert (judged["c2"]["oversaturated_repeats"], judged["c2"]["saturation_judged"]) == (0, 0)
    summary = files.read_json(result.sweep_dir / "summary.json")
    verdicts = {
        j["level"]: (j["accepted"], j["reasons"], j["oversaturated_repeats"]) for j in summary["judgement"]
    }
    assert verdicts == {"c2": (True, [], 0), "c4": (False, ["over-saturated in 1 of 2 repeats"], 1)}
    assert summary["counts"]["runs_oversaturated"] == 1
    assert summary["counts"]["accepted"] == 1 and summary["counts"]["rejected"] == 1
    raw = {Path(r["run_dir"]).name: r["oversaturated"] for r in read_csv(result.sweep_dir / "raw_runs.csv")}
    assert raw == {"c2_r0": "", "c2_r1": "", "c4_r0": "false", "c4_r1": "true"}
    # the best levels are picked from the accepted ones only
    assert summary["best"]["throughput"]["level"] == "c2"


def test_oversaturation_adds_to_other_violations(sweep: SweepResult) -> None:
    levels = [dict(lv) | {"oversaturated_repeats": 2} for lv in sweep.levels]
    judge(levels, {"min_accuracy": 1.01})
    assert all(lv["reasons"][1:] == ["over-saturated in 2 of 2 repeats"] for lv in levels)
    assert all(lv["reasons"][0].startswith("accuracy") and not lv["accepted"] for lv in levels)


def test_a_stale_summary_is_not_read(sweep: SweepResult, tmp_path: Path) -> None:
    """A run refused before it started (no figures read) may sit on an older run's files."""
    row = _copy_sweep(sweep, tmp_path)[0]
    _set_saturation(row["run_dir"], True)
    assert oversaturated(row) is True
    assert oversaturated(row | {"status": "failed", "requests_measured": None}) is None
    assert oversaturated(row | {"run_dir": str(tmp_path / "missing")}) is None
