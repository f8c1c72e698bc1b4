"""The handful of figures that sum up a run, shared by ``sweep`` and ``compare``."""

from __future__ import annotations

from typing import Any

from ..rundir.read import HEADLINE, RunDir
from ..stats import latency_stats
from .accuracy import accuracy_counts, meter_report

# key -> (label, unit): the order is the order tables and CSV files show them in
FIGURES: dict[str, tuple[str, str]] = {
    "requests_ok": ("requests ok", ""),
    "requests_measured": ("requests measured", ""),
    "throughput_rps": ("throughput", "req/s"),
    "throughput_tok_s": ("output throughput", "tok/s"),
    "ttft_p50_s": ("TTFT p50", "s"),
    "ttft_p99_s": ("TTFT p99", "s"),
    "tpot_p50_s": ("TPOT p50", "s"),
    "tpot_p99_s": ("TPOT p99", "s"),
    "e2e_p50_s": ("e2e latency p50", "s"),
    "j_per_query": ("energy per query (mean)", "J"),
    "j_per_token": ("energy per output token", "J"),
    "mean_power_w": ("power per query (mean)", "W"),
    "accuracy": ("accuracy", ""),
    "ipj": ("IPJ (accuracy / J per query)", "1/J"),
    # multi-turn runs only (null otherwise): per task, not per call
    "tasks_per_s": ("task throughput", "tasks/s"),
    "task_success": ("task success rate", ""),
    "j_per_task": ("energy per task (mean)", "J"),
    "j_per_successful_task": ("energy per successful task", "J"),
    "task_wall_p50_s": ("task latency p50", "s"),
    "task_wall_p99_s": ("task latency p99", "s"),
    "turns_per_task": ("turns per task (mean)", ""),
}


def headline_figures(run: RunDir) -> dict[str, Any]:
    """A run's headline figures (None where not measured).

    Latency and throughput come from ``summary.json`` (recomputed from the records for a run
    cut short before writing one); energy per query, power and IPJ from the headline meter with
    the same imputation as ``analyze``; J per output token from the summary.
    """
    summary = run.summary or {}
    if "latency_s" not in summary:  # cut short before its summary: the same figures from the records
        summary = summary | latency_stats(run.records)
    requests = summary.get("requests", {})
    throughput = summary.get("throughput", {})
    latency = summary.get("latency_s", {})
    accuracy = accuracy_counts(run.records)["accuracy"]
    energy: dict[str, Any] = meter_report(run.ok, HEADLINE, accuracy) if HEADLINE in run.energy_meters else {}
    return {
        "requests_ok": requests.get("ok"),
        "requests_measured": requests.get("measured"),
        "throughput_rps": throughput.get("requests_per_s"),
        "throughput_tok_s": throughput.get("output_tokens_per_s"),
        "ttft_p50_s": latency.get("ttft", {}).get("p50"),
        "ttft_p99_s": latency.get("ttft", {}).get("p99"),
        "tpot_p50_s": latency.get("tpot", {}).get("p50"),
        "tpot_p99_s": latency.get("tpot", {}).get("p99"),
        "e2e_p50_s": latency.get("e2e", {}).get("p50"),
        "j_per_query": energy.get("energy_j", {}).get("mean"),
        "j_per_token": summary.get("energy", {}).get("j_per_output_token"),
        "mean_power_w": energy.get("power_w", {}).get("mean"),
        "accuracy": accuracy,
        "ipj": energy.get("ipj"),
    } | _task_figures(summary.get("tasks"))


def _task_figures(tasks: dict[str, Any] | None) -> dict[str, Any]:
    if not tasks:
        return dict.fromkeys(
            (
                "tasks_per_s",
                "task_success",
                "j_per_task",
                "j_per_successful_task",
                "task_wall_p50_s",
                "task_wall_p99_s",
                "turns_per_task",
            )
        )
    return {
        "tasks_per_s": tasks.get("tasks_per_s"),
        "task_success": tasks.get("success_rate"),
        "j_per_task": tasks.get("j_per_task"),
        "j_per_successful_task": tasks.get("j_per_successful_task"),
        "task_wall_p50_s": tasks["wall_s"].get("p50"),
        "task_wall_p99_s": tasks["wall_s"].get("p99"),
        "turns_per_task": tasks["turns"].get("mean"),
    }
