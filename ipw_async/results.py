"""Finishing a run is a function of its directory: attributed records, traces and summary.

``run`` ends by calling :func:`finalize`; ``ipw-async finalize`` calls it on a finished run to
re-attribute its energy with other settings, and ``ipw-async recover`` on a run that died. It
reads nothing but the files in the directory; where ``judge.jsonl`` is among them (an LLM judge
scored the run after it ended), its verdicts replace the run's own scoring. :func:`finished` is
the one policy for a run that was cut short: every command that reads a run goes through it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ._clock import NS
from .energy import AttributionConfig, attribute, energy_over
from .export.ipw import ipw_table, write_ipw_dataset
from .records import end_ns
from .rundir import files
from .rundir.manifest import Manifest
from .rundir.read import INLINE_CORRECT, RunDir
from .stats import client_stats, distribution, latency_stats, measured, task_stats, window_s
from .telemetry.base import Meter
from .traces import QueryTrace, parse_price, tool_waits, traces_from_records, traces_from_tasks, write_traces
from .validity.gate import publishable
from .validity.report import run_validity


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    records: pl.DataFrame

    @property
    def complete(self) -> bool:
        return bool(self.summary.get("complete"))


# How a run that never recorded its end is described (it was killed, or crashed).
NO_END = {
    "complete": False,
    "interrupted": False,
    "aborted": "the run ended without recording how (killed or crashed)",
}


def finalize(
    run_dir: str | Path,
    *,
    attribution: str | None = None,
    prefill_weight: float | None = None,
    power_model: str | None = None,
    baseline_w: float | None = None,
    context_cost: str | None = None,
    capture_sizes: str | None = None,
) -> RunResult:
    """Attribute energy and write ``records.arrow`` (with energy, and as Parquet),
    ``telemetry.parquet``, ``traces.jsonl``, ``summary.json`` and ``dataset/`` (IPW's layout)
    from the run directory's own files.

    The attribution settings default to the run's own; others re-attribute it (the energy
    figures change, nothing else). Raises :class:`RunDirError` when the directory lacks what
    finishing needs.
    """
    run = RunDir.open(run_dir)
    run_dir = run.path
    manifest = run.require_manifest()
    records = run.measured_records()
    telemetry = run.measured_telemetry()
    own = manifest.finishing
    rule = attribution or own.attribution
    # the run's power model is the fitted rule's: another rule asked for leaves it behind
    own_model = own.power_model if rule == own.attribution else "auto"
    settings = AttributionConfig(  # raises ValueError for an unknown rule or effect
        rule=rule,
        prefill_weight=own.prefill_weight if prefill_weight is None else prefill_weight,
        power_model=own_model if power_model is None else power_model,
        baseline_w=own.baseline_w if baseline_w is None else baseline_w,
        context_cost=own.context_cost if context_cost is None else context_cost,
        capture_sizes=own.capture_sizes if capture_sizes is None else capture_sizes,
        baseline_window_ns=manifest.baseline_window_ns,
        session_starts_ns=manifest.session_starts_ns,
    )
    energy_section: dict[str, Any] = {
        "meters": {},
        "skipped": manifest.skipped,
        "baseline_window_ns": list(manifest.baseline_window_ns) if manifest.baseline_window_ns else None,
    }
    if telemetry is not None and manifest.meters:
        records, section = attribute(telemetry, manifest.meters, records, settings)
        energy_section |= section
    records, tasks, judge_section = _judged(run, records, manifest.workload["scorer"])
    files.write_frame(records, run_dir / files.RECORDS)
    files.write_parquet(records, run_dir / files.RECORDS_PARQUET)
    if telemetry is not None:
        files.write_parquet(telemetry, run_dir / files.TELEMETRY_PARQUET)
    headline = [m for m in manifest.meters if m.channel in energy_section.get("headline_meters", ())]
    traces = _traces(records, tasks, telemetry, headline, parse_price(own.price), manifest.session_starts_ns)
    write_traces(run_dir / files.TRACES, traces)
    summary = _summary(manifest, records, energy_section)
    summary |= _validity(manifest, records, telemetry, headline)
    dropped = sum(s.get("dropped", 0) for s in manifest.sessions)  # re-run by a --resume
    summary["loss"] = loss(records, tasks, telemetry, manifest.dispatched - dropped)
    if tasks:
        summary["tasks"] = task_stats(traces, window_s(measured(records)))
    if judge_section is not None:
        summary |= {"scorer": "judge", "judge": judge_section}
    summary["validity"] = publishable(summary)
    files.write_json(run_dir / files.SUMMARY, summary)
    write_ipw_dataset(run_dir, ipw_table(records, summary, telemetry, manifest.meters))
    return RunResult(run_dir=run_dir, summary=summary, records=records)


def finished(path: str | Path) -> RunDir:
    """The one policy for a run about to be read (analysed, exported, drawn): a run ``finalize``
    finished opens as it is, with the settings it was last finished with; one that was cut short
    (killed, crashed, or still going) is finished first, in place, as ``ipw-async recover``
    would. Its measured files are never rewritten, so finishing a run that is still going takes
    a snapshot and loses nothing. :class:`RunDirError` where ``path`` is not a run."""
    run = RunDir.open(path)
    if run.manifest is None or run.finished:
        return run  # finished, or from before run.json existed: read as it is
    finalize(run.path)
    return RunDir.open(run.path)


def finish_all(path: str | Path) -> list[Path]:
    """:func:`finished` for a run or for each run in a folder of them (a sweep, a search); the
    runs it had to finish, so the caller can say so."""
    path = Path(path)
    runs = [path] if (path / files.RUN).is_file() or (path / files.RECORDS).is_file() else []
    if not runs and path.is_dir():
        runs = sorted(c for c in path.iterdir() if (c / files.RUN).is_file())
    cut_short = [p for p in runs if not RunDir.open(p).finished and (p / files.RUN).is_file()]
    for run in cut_short:
        finalize(run)
    return cut_short


# What judging after the run means for its energy, said in every judged summary.
JUDGE_ENERGY_NOTE = (
    "the judge ran after the run's measured window, tail and finalize, when no telemetry was "
    "being recorded: its calls are not in the run's energy, and its own energy is not measured"
)
SAME_SERVER_NOTE = "the judge is the run's own server, judged after the measured window"


def _judged(
    run: RunDir, records: pl.DataFrame, scorer: str | None
) -> tuple[pl.DataFrame, list[dict[str, Any]], dict[str, Any] | None]:
    """Records and tasks with the verdicts of ``judge.jsonl`` in ``correct`` (null, with the
    reason in ``judge_error``, where the judge could not score), and the summary's ``judge``
    section; as they are, and no section, for a run no judge scored. The records keep their
    own verdicts in ``inline_correct``."""
    tasks = run.tasks
    judged = run.judge_lines()
    if judged is None:
        return records, tasks, None
    header, lines = judged
    # a task's verdict goes to the call that gave its final answer too, so per-request
    # accuracy (analyze, IPJ, IPW) follows the judge in every kind of run
    by_request = {line["request_id"]: line for line in lines if line.get("request_id") is not None}
    ids = records.get_column("request_id").to_list()
    # each judged item's own verdict (the run's scorer's), by what the lines are matched on
    own = dict(zip(ids, records.get_column("correct").to_list(), strict=True))
    records = records.with_columns(
        pl.Series(
            "correct", [by_request[i]["verdict"] if i in by_request else own[i] for i in ids], pl.Boolean
        ),
        pl.col("correct").alias(INLINE_CORRECT),
        pl.Series("judge_error", [by_request.get(i, {}).get("error") for i in ids], pl.String),
    )
    key = "request_id"
    if tasks:
        by_task = {line["task_id"]: line for line in lines if line.get("task_id") is not None}
        key, own = "task_id", {t["task_id"]: t["correct"] for t in tasks}
        tasks = [
            {**t, "correct": by_task[t["task_id"]]["verdict"], "judge_error": by_task[t["task_id"]]["error"]}
            if t["task_id"] in by_task
            else t
            for t in tasks
        ]
    pairs = [(line["verdict"], own.get(line[key])) for line in lines]
    return records, tasks, _judge_section(header, lines, pairs, scorer)


def _judge_section(
    header: dict[str, Any],
    lines: list[dict[str, Any]],
    pairs: list[tuple[bool | None, bool | None]],
    scorer: str | None,
) -> dict[str, Any]:
    """The summary's ``judge``: who judged, what came back, and how it compares with the run's
    own scorer (``pairs``: each judged item's verdict and the run's own)."""
    verdicts = Counter(line["verdict"] for line in lines)
    compared = [(judge, own) for judge, own in pairs if judge is not None and own is not None]

    def total(name: str) -> int | None:
        values = [line[name] for line in lines if line.get(name) is not None]
        return sum(values) if values else None

    return {
        **header,
        "judged": len(lines),
        "verdicts": {"correct": verdicts[True], "incorrect": verdicts[False], "unscored": verdicts[None]},
        "errors": dict(Counter(line["error"] for line in lines if line["error"] is not None).most_common(10)),
        "latency_s": distribution([line["latency_s"] for line in lines if line["latency_s"] is not None]),
        "prompt_tokens": total("prompt_tokens"),
        "completion_tokens": total("completion_tokens"),
        "run_scorer": scorer,  # what scored the run as it went (null: each task's own)
        "agreement_with_run_scorer": {
            "compared": len(compared),
            "agree": sum(judge == own for judge, own in compared),
        },
        "energy": JUDGE_ENERGY_NOTE,
        "server": SAME_SERVER_NOTE if header.get("same_server") else None,
    }


def loss(
    records: pl.DataFrame, tasks: list[dict[str, Any]], telemetry: pl.DataFrame | None, dispatched: int
) -> dict[str, Any]:
    """What a run that died did not leave on disk, as far as its files can tell.

    Requests dispatched (run.json's count, at most a second old, or the highest request id on
    disk, whichever is more) but not on disk were in flight at the end, or finished in the last
    unflushed second: at least that many. A task with calls on disk but no line in tasks.jsonl
    was still running. Both are 0 for a run that ended normally.
    """
    ids = records.get_column("request_id")
    dispatched = max(dispatched, int(ids.max()) + 1 if ids.len() else 0)  # type: ignore[operator]
    task_ids = set(records.get_column("task_id").drop_nulls().to_list())
    logged = {t["task_id"] for t in tasks}
    ends = records.select(end_ns().max()).item() if records.height else None
    seen = None
    if telemetry is not None and "t_ns" in telemetry.columns and telemetry.height:
        seen = telemetry.get_column("t_ns").max()
    return {
        "requests_on_disk": records.height,
        "requests_dispatched": dispatched,
        "requests_not_recorded": dispatched - records.height,
        "tasks_not_logged": len(task_ids - logged),
        "last_record_end_s": None if ends is None else ends / NS,
        "last_telemetry_s": None if seen is None else seen / NS,  # type: ignore[operator]
    }


def _traces(
    records: pl.DataFrame,
    tasks: list[dict[str, Any]],
    telemetry: pl.DataFrame | None,
    headline: list[Meter],
    prices: tuple[float, float] | None,
    breaks: tuple[int, ...],
) -> list[QueryTrace]:
    """Per task when the run logged tasks, else per request."""
    if not tasks:
        return traces_from_records(records, prices)
    rows = {row["request_id"]: row for row in records.iter_rows(named=True)}
    tool_wait_j = None
    if telemetry is not None and headline:
        tool_wait_j = energy_over(telemetry, headline, [tool_waits(t, rows) for t in tasks], breaks)
    return traces_from_tasks(tasks, rows, prices, tool_wait_j)


def _summary(manifest: Manifest, records: pl.DataFrame, energy: dict[str, Any]) -> dict[str, Any]:
    run = manifest.as_dict()
    end = manifest.end or NO_END
    return {
        "format": manifest.format,
        "complete": end["complete"],
        "simulated": manifest.simulated,
        "interrupted": end["interrupted"],
        "aborted": end["aborted"],
        "stopped": end.get("stopped"),
        "run_id": manifest.run_id,
        "model": manifest.model,
        "base_url": manifest.base_url,
        "dataset": manifest.workload["dataset"],
        "scorer": manifest.workload["scorer"],
        **({"trace": manifest.workload["trace"]} if "trace" in manifest.workload else {}),
        "clock": run["clock"],
        "started_at": run["started_at"],
        **latency_stats(records),
        "energy": energy | _per_query_energy(records),
        "telemetry": {
            "sources": manifest.sources,
            "skipped": manifest.skipped,
            "sampler": end.get("sampler"),
            "counter_events": manifest.counter_events,
            **_counter_checks(manifest),
            "clocks": manifest.clocks,
            "gpu_processes": manifest.gpu_processes,
        },
        "harness": end.get("harness"),
        "client": client_stats(records, end.get("harness"), manifest.finishing.concurrency),
        "config": manifest.config,
        "versions": manifest.versions,
        "host": manifest.host,
    }


def _counter_checks(manifest: Manifest) -> dict[str, Any]:
    """Each energy counter's check against its power, by channel; null, and why, where none ran.
    A run that was killed has the checks it made before (``run.json`` keeps them as they come)."""
    end = manifest.end
    recorded = manifest.counter_checks if end is None else end.get("counter_checks")
    if recorded is None:
        skipped = (
            "the run was killed or crashed before its counters were checked"
            if end is None
            else "the run was made before counters were checked"
        )
        return {"counter_checks": None, "counter_checks_skipped": skipped}
    return {"counter_checks": recorded["meters"], "counter_checks_skipped": recorded["skipped"]}


def _validity(
    manifest: Manifest, records: pl.DataFrame, telemetry: pl.DataFrame | None, headline: list[Meter]
) -> dict[str, Any]:
    def over(spans: list[tuple[int, int]]) -> float | None:
        assert telemetry is not None
        return energy_over(telemetry, headline, [spans], manifest.session_starts_ns)[0]

    periods = [g.period_ns for m in headline for g in m.grids if g.period_ns > 0]
    load = manifest.load
    return run_validity(
        records,
        load.get("ramp_duration") if load.get("ramp") else None,
        over if telemetry is not None and headline else None,
        manifest.finishing.until_precision,
        max(periods) / NS if periods else None,
        (manifest.end or {}).get("watch"),
    )


def _per_query_energy(records: pl.DataFrame) -> dict[str, Any]:
    if "energy_j" not in records.columns:
        return {}
    ok = records.filter(~pl.col("warmup") & (pl.col("status") == "ok"))
    energy = ok.get_column("energy_j").drop_nulls()
    tokens = ok.filter(pl.col("energy_j").is_not_null()).get_column("output_tokens").drop_nulls().sum()
    band = ok.select((pl.col("energy_high_j") - pl.col("energy_low_j")) / 2 / pl.col("energy_j"))
    return {
        "per_query_j": distribution(energy.to_numpy()),
        "j_per_output_token": float(energy.sum()) / tokens if tokens else None,
        # half the low–high band over the estimate: what the telemetry could not resolve
        "band_half_width": distribution(band.to_series().to_numpy()),
    }
