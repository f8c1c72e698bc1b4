"""Analysis on hand-built run directories: every expected figure is computed here by hand."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from scipy import stats as sps
from typer.testing import CliRunner

from ipw_async.analysis import (
    analyze,
    compare_runs,
    energy_report,
    fit,
    goodput,
    impute_energy,
    mean_ci,
    pareto_front,
    parse_slo,
)
from ipw_async.analysis.constraints import best_levels, violations
from ipw_async.cli import app
from ipw_async.records import NS, RequestRecord, Status, records_frame
from ipw_async.rundir import RunDir, files

MS = 1_000_000


def record(
    i: int,
    *,
    ttft_ms: int = 100,
    e2e_ms: int = 500,
    tokens: int = 10,
    prompt_tokens: int = 50,
    correct: bool | None = True,
    ok: bool = True,
    warmup: bool = False,
    start_ms: int = 0,
) -> RequestRecord:
    """A request sent at ``start_ms`` with its first token after ``ttft_ms`` and last after ``e2e_ms``."""
    sent = start_ms * MS
    first, last = sent + ttft_ms * MS, sent + e2e_ms * MS
    chunks = np.linspace(first, last, tokens).astype(int).tolist()
    return RequestRecord(
        request_id=i,
        query_id=f"q{i}",
        dataset="hand",
        prompt="p",
        reference="4",
        warmup=warmup,
        scheduled_ns=sent,
        dispatched_ns=sent,
        sent_ns=sent,
        first_token_ns=first,
        last_token_ns=last,
        closed_ns=last + MS,
        chunk_ns=chunks,
        chunk_tokens=[1] * tokens,
        answer="4" if correct else "5",
        prompt_tokens=prompt_tokens,
        usage_output_tokens=tokens,
        status=Status.OK if ok else Status.ERROR,
        correct=correct if ok else None,
    )


# request, energy (J), power (W), e2e (ms), correct, ok, warmup
FIXTURE: list[tuple[float | None, float | None, int, bool | None, bool, bool]] = [
    (10.0, 20.0, 500, True, True, False),  # 0
    (20.0, 40.0, 500, False, True, False),  # 1
    (None, 30.0, 1000, True, True, False),  # 2: energy missing -> 30 W × 1.0 s
    (0.0, None, 800, True, True, False),  # 3: energy 0, no power -> mean power × 0.8 s
    (15.0, 25.0, 500, None, True, False),  # 4: no verdict
    (5.0, 10.0, 500, None, False, False),  # 5: failed
    (100.0, 50.0, 500, True, True, True),  # 6: warmup
]


def write_run(path: Path, summary: dict[str, Any] | None = None) -> Path:
    recs = [
        record(i, e2e_ms=e2e, correct=correct, ok=ok, warmup=warmup, start_ms=200 * i)
        for i, (_, _, e2e, correct, ok, warmup) in enumerate(FIXTURE)
    ]
    frame = records_frame(recs).with_columns(
        pl.Series("energy_j", [row[0] for row in FIXTURE], dtype=pl.Float64),
        pl.Series("power_w", [row[1] for row in FIXTURE], dtype=pl.Float64),
        pl.Series("energy_provenance", ["measured"] * len(FIXTURE)),
    )
    path.mkdir(parents=True, exist_ok=True)
    files.write_frame(frame, path / files.RECORDS)
    if summary is not None:
        files.write_json(path / files.SUMMARY, summary)
    return path


@pytest.fixture
def hand_run(tmp_path: Path) -> Path:
    return write_run(tmp_path / "run", {"complete": True, "simulated": False})


def test_ipj_and_ipw_by_hand(hand_run: Path) -> None:
    acc = analyze(hand_run, "accuracy")["accuracy"]
    # scored: requests 0-3 (4 has no verdict, 5 failed, 6 is warmup); correct: 0, 2, 3
    assert (acc["correct"], acc["incorrect"], acc["unscored"], acc["scored"]) == (3, 1, 2, 4)
    assert acc["accuracy"] == pytest.approx(0.75)
    mean_power = (20 + 40 + 30 + 25) / 4  # ok, measured requests with a power figure
    energies = [10.0, 20.0, 30.0 * 1.0, mean_power * 0.8, 15.0]
    head = acc["energy"]["headline"]
    assert head["energy_j"]["mean"] == pytest.approx(np.mean(energies))
    assert head["energy_j"]["median"] == pytest.approx(np.median(energies))
    assert (head["energy_j"]["imputed"], head["energy_j"]["imputed_from_mean_power"]) == (2, 1)
    assert head["power_w"]["mean"] == pytest.approx(mean_power)
    assert head["ipj"] == pytest.approx(0.75 / np.mean(energies))
    assert head["ipw"] == pytest.approx(0.75 / mean_power)
    assert (hand_run / "analysis" / "accuracy.json").is_file()


def test_rescoring_with_a_scorer_overrides_the_recorded_verdicts(hand_run: Path) -> None:
    # every reference is "4"; answers are "4" where the fixture says correct, "5" otherwise, and
    # request 4's recorded verdict is null but its answer is "5": rescored, it counts as wrong
    acc = analyze(hand_run, "accuracy", scorer="exact", write=False)["accuracy"]
    assert (acc["correct"], acc["scored"]) == (3, 5)


def test_imputation_touches_only_null_or_non_positive_energies() -> None:
    energy = np.array([5.0, np.nan, 0.0, -1.0, 7.0])
    power = np.array([10.0, 20.0, np.nan, 40.0, np.nan])
    latency = np.array([1.0, 2.0, 3.0, 0.5, 9.0])
    out = impute_energy(energy, power, latency)
    mean_power = (10 + 20 + 40) / 3
    np.testing.assert_allclose(out.energy_j, [5.0, 40.0, mean_power * 3.0, 20.0, 7.0])
    assert out.imputed.tolist() == [False, True, True, True, False]
    assert out.from_mean_power.tolist() == [False, False, True, False, False]


def test_missing_energy_stays_missing_with_a_reason() -> None:
    out = impute_energy(np.array([np.nan, np.nan]), np.array([np.nan, np.nan]), np.array([1.0, 2.0]))
    assert out.missing.all() and not out.imputed.any()


def test_no_energy_columns_gives_null_ipj_with_reason(tmp_path: Path) -> None:
    run = tmp_path / "bare"
    run.mkdir()
    files.write_frame(records_frame([record(0), record(1, correct=False)]), run / files.RECORDS)
    acc = analyze(run, "accuracy", write=False)["accuracy"]
    assert acc["accuracy"] == 0.5 and acc["energy"] == {} and acc["energy_reason"]


def test_regression_recovers_a_known_slope() -> None:
    rng = np.random.default_rng(1)
    x = np.arange(200, dtype=float)
    y = 0.4 * x + 12.0 + rng.normal(0, 2.0, x.size)
    res = fit(x, y)
    assert res["slope"] == pytest.approx(0.4, abs=0.02)
    lo, hi = res["slope_ci"]
    assert lo < 0.4 < hi
    t = sps.t.ppf(0.975, x.size - 2)
    assert hi - lo == pytest.approx(2 * t * res["slope_stderr"])
    assert res["r2"] > 0.95 and res["n"] == 200


@pytest.mark.parametrize(
    ("x", "y", "reason"),
    [([1.0, 2.0], [1.0, 2.0], "at least 3"), ([3.0, 3.0, 3.0], [1.0, 2.0, 3.0], "x does not vary")],
)
def test_regression_refuses_degenerate_data(x: list[float], y: list[float], reason: str) -> None:
    res = fit(np.array(x), np.array(y))
    assert res["slope"] is None and reason in res["reason"]


def test_regression_report_states_exclusions(hand_run: Path) -> None:
    fits = analyze(hand_run, "regression", write=False)["regression"]["fits"]
    energy = fits["energy_vs_output_tokens"]
    assert energy["excluded"] == {"warmup": 1, "failed": 1, "null_output_tokens_or_energy_j": 1}
    assert energy["n"] == 4
    assert energy["reason"] == "x does not vary"  # every fixture request has 10 tokens


def test_mean_ci_formula() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    out = mean_ci([*values, None])
    std = float(np.std(values, ddof=1))
    assert out == {"n": 4, "mean": 2.5, "std": pytest.approx(std), "ci95": pytest.approx(1.96 * std / 2)}
    assert mean_ci([5.0]) == {"n": 1, "mean": 5.0, "std": None, "ci95": None}
    assert mean_ci([]) == {"n": 0, "mean": None, "std": None, "ci95": None}


def test_pareto_front_of_a_known_set() -> None:
    points = [
        {"name": "a", "acc": 0.9, "lat": 5.0},
        {"name": "b", "acc": 0.8, "lat": 2.0},
        {"name": "c", "acc": 0.7, "lat": 3.0},  # worse than b on both
        {"name": "d", "acc": 0.9, "lat": 6.0},  # ties a on accuracy, slower
        {"name": "e", "acc": 0.95, "lat": 9.0},
        {"name": "f", "acc": None, "lat": 1.0},  # cannot be compared
    ]
    front = pareto_front(points, {"acc": "max", "lat": "min"})
    assert [p["name"] for p in front] == ["a", "b", "e"]


def test_constraints_and_best_levels() -> None:
    means = {"ttft_p50_s": 0.3, "accuracy": None, "throughput_tok_s": 100.0}
    reasons = violations(means, {"max_ttft_ms": 200, "min_accuracy": 0.5, "min_throughput": 50})
    assert reasons == ["TTFT p50 300 > 200", "accuracy not measured"]
    levels = [
        {
            "level": "c1",
            "value": 1,
            "accepted": True,
            "means": {"throughput_tok_s": 10, "j_per_query": 5, "ipj": None},
        },
        {
            "level": "c8",
            "value": 8,
            "accepted": True,
            "means": {"throughput_tok_s": 50, "j_per_query": 9, "ipj": None},
        },
        {"level": "c64", "value": 64, "accepted": False, "means": {"throughput_tok_s": 99, "j_per_query": 1}},
    ]
    best = best_levels(levels)
    assert best["throughput"]["level"] == "c8" and best["j_per_query"]["level"] == "c1"
    assert best["ipj"] is None


def test_goodput_with_an_slo() -> None:
    recs = [
        record(0, ttft_ms=50, e2e_ms=500, tokens=10, start_ms=0),  # tpot 50 ms
        record(1, ttft_ms=150, e2e_ms=600, tokens=10, start_ms=100),  # misses TTFT
        record(2, ttft_ms=80, e2e_ms=1880, tokens=10, start_ms=200),  # tpot 200 ms: misses TPOT
        record(3, ttft_ms=90, e2e_ms=90, tokens=1, start_ms=300),  # one token: TPOT unverifiable
        record(4, ttft_ms=60, e2e_ms=400, tokens=5, start_ms=400, ok=False),  # failed
        record(5, ttft_ms=10, e2e_ms=100, tokens=5, warmup=True),  # warmup: not counted
    ]
    frame = records_frame(recs)
    out = goodput(frame, {"ttft_ms": 100.0, "tpot_ms": 100.0})
    window = (recs[2].closed_ns - recs[0].sent_ns) / NS  # type: ignore[operator]
    assert out["met"] == 1 and out["measured"] == 5
    assert out["fraction"] == pytest.approx(1 / 5)
    assert out["goodput_rps"] == pytest.approx(1 / window)
    assert out["per_slo"]["tpot_ms"]["unverifiable"] == 1


def test_parse_slo() -> None:
    assert parse_slo("ttft_ms=200, tpot_ms=50") == {"ttft_ms": 200.0, "tpot_ms": 50.0}
    assert parse_slo(None) == {}
    for bad in ("ttft=200", "ttft_ms=fast", "e2e_ms=-1"):
        with pytest.raises(ValueError):
            parse_slo(bad)


def test_energy_breakdown_by_phase(tmp_path: Path) -> None:
    # 100 W for 10 s; A prefills 2-3 s and decodes 3-6 s, B prefills 4-5 s and decodes 5-7 s
    recs = [
        record(0, ttft_ms=1000, e2e_ms=3999, start_ms=2000),
        record(1, ttft_ms=1000, e2e_ms=2999, start_ms=4000),
    ]
    t = np.arange(0, 10 * NS + 1, NS // 10)
    telemetry = pl.DataFrame(
        {
            "t_ns": t,
            "dev.t_ns": t,
            "dev.read_ns": np.zeros(t.size, int),
            "dev.power_w": np.full(t.size, 100.0),
        }
    )
    run = tmp_path / "phases"
    run.mkdir()
    files.write_frame(records_frame(recs), run / files.RECORDS)
    files.write_frame(telemetry, run / files.TELEMETRY)
    files.write_json(
        run / files.SUMMARY, {"energy": {"meters": {"dev": {"kind": "power"}}, "headline_meters": ["dev"]}}
    )
    report = energy_report(RunDir.open(run))
    dev = report["meters"]["dev"]
    phases = {k: v["energy_j"] for k, v in dev["phases"].items()}
    # closed_ns is 1 ms after the last token
    assert phases == {
        "prefill": pytest.approx(200.0),
        "decode": pytest.approx(300.0),
        "idle": pytest.approx(500.0),
    }
    assert dev["sum_of_parts_j"] == pytest.approx(1000.0) and dev["deviation"] == pytest.approx(0.0)


def test_breakdown_without_telemetry_says_why(hand_run: Path) -> None:
    report = analyze(hand_run, "energy", write=False)["energy"]
    assert report["meters"] == {} and "telemetry" in report["reason"]


def test_analyze_all_on_records_only(tmp_path: Path) -> None:
    run = write_run(tmp_path / "partial")  # no summary.json: a run cut short
    results = analyze(run)
    assert set(results) == {"accuracy", "regression", "latency", "energy", "tasks", "cache"}
    assert results["tasks"]["tasks"] is None and "multi-turn" in results["tasks"]["reason"]
    assert results["cache"]["groups"] is None and "no cached prompt tokens" in results["cache"]["reason"]
    assert results["accuracy"]["complete"] is False
    assert sorted(p.name for p in (run / "analysis").iterdir()) == [
        "accuracy.json",
        "cache.json",
        "energy.json",
        "latency.json",
        "regression.json",
        "tasks.json",
    ]


def test_compare_shows_dash_for_missing(hand_run: Path, tmp_path: Path) -> None:
    other = write_run(tmp_path / "other")
    (_, a), (title_b, _) = compare_runs([hand_run, other])
    assert title_b.endswith("[partial]")
    assert a["accuracy"] == pytest.approx(0.75) and a["throughput_rps"] is not None
    assert a["j_per_token"] is None  # the summary has no energy section
    result = CliRunner().invoke(app, ["compare", str(hand_run), str(other)])
    assert result.exit_code == 0, result.output
    assert "—" in result.output and "75.0%" in result.output


@pytest.mark.parametrize("command", ["analyze", "plot", "compare"])
def test_cli_on_a_missing_run_dir_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    # a short relative path: cli.fail's console wraps at the terminal width
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [command, "nope"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "not a directory" in lines[0]


def test_cli_on_a_dir_without_records(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["analyze", str(tmp_path)])
    assert result.exit_code == 2 and "records.arrow" in result.output


def test_cli_analyze_writes_and_reports(hand_run: Path) -> None:
    result = CliRunner().invoke(app, ["analyze", str(hand_run), "--slo", "ttft_ms=500"])
    assert result.exit_code == 0, result.output
    assert "accuracy 75.0%" in result.output and "goodput" in result.output
    lat = files.read_json(hand_run / "analysis" / "latency.json")
    assert lat["goodput"]["met"] == 5 and math.isclose(lat["goodput"]["fraction"], 5 / 6)


def test_cli_rejects_a_bad_slo(hand_run: Path) -> None:
    result = CliRunner().invoke(app, ["analyze", str(hand_run), "--slo", "speed=1"])
    assert result.exit_code == 2 and "error:" in result.output
