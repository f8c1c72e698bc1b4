"""Continuing a run that died: what it finished, what is left, and its own settings.

A resumed session writes into the same directory, on the same run clock (the monotonic clock
is continuous within one boot of one machine), with ``session`` = k on its records. Units it
finished keep their records; units that were in flight or cancelled run again, and their
partial records are dropped (``run.json`` counts them). Energy is not counted across the gap
between sessions.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ..errors import RunError
from ..rundir import files
from ..rundir.host import boot_id
from ..rundir.manifest import Manifest, RunDirError
from ..rundir.read import RunDir
from ..sim.config import SimConfig
from ..telemetry.http import REDACTED
from ..workload.mcp_tools import redacted
from .config import RunConfig


@dataclass
class Resume:
    run_dir: Path
    manifest: Manifest
    records: pl.DataFrame  # the records kept, as measured (no energy columns)
    telemetry: pl.DataFrame | None
    done_units: frozenset[int]
    dropped: int  # partial records of units that run again
    session: int
    next_request_id: int

    @property
    def measured_done(self) -> set[int]:
        warm = set(self.records.filter(pl.col("warmup")).get_column("unit_id").to_list())
        return set(self.done_units) - warm


def _finished_units(records: pl.DataFrame, run: RunDir) -> set[int]:
    if (run.path / files.TASKS).is_file() or records.get_column("task_id").drop_nulls().len():
        return {t["task_id"] for t in run.tasks if t["outcome"] != "cancelled"}
    ended = records.filter(pl.col("status") != "cancelled")
    return set(ended.get_column("unit_id").to_list())


def resume_from(config: RunConfig) -> tuple[RunConfig, Resume]:
    """The run in ``config.resume`` with its own settings (the API key and display from
    ``config``), and what is left of it; RunError when it cannot be continued."""
    assert config.resume is not None
    run_dir = Path(config.resume)
    try:
        run = RunDir.open(run_dir)
        manifest = run.require_manifest()
        records = run.measured_records(partial_ok=True)
        telemetry = run.measured_telemetry(partial_ok=True)
    except RunDirError as exc:
        raise RunError(f"cannot resume: {exc}") from None
    if manifest.end is not None and manifest.end.get("complete"):
        raise RunError(f"{run_dir} is a complete run: there is nothing to resume")
    if manifest.host.get("boot_id") != boot_id():
        raise RunError(
            f"{run_dir} was started on another machine or before this one last booted: its clock "
            "cannot be continued; start a new run instead"
        )
    if records.height and records.get_column("unit_id").null_count() == records.height:
        raise RunError(f"{run_dir} was written by an ipw-async older than 0.3, which cannot resume it")
    done = _finished_units(records, run)
    kept = records.filter(pl.col("unit_id").is_in(list(done)))
    resume = Resume(
        run_dir=run_dir,
        manifest=manifest,
        records=kept,
        telemetry=telemetry,
        done_units=frozenset(done),
        dropped=records.height - kept.height,
        session=int(records.get_column("session").max() or 0) + 1 if records.height else 1,  # type: ignore[operator]
        next_request_id=max(int(records.get_column("request_id").max() or 0) + 1, manifest.dispatched)  # type: ignore[operator]
        if records.height
        else manifest.dispatched,
    )
    return _own_config(manifest.config, config, run_dir), resume


def _own_config(saved: dict[str, Any], given: RunConfig, run_dir: Path) -> RunConfig:
    names = {f.name for f in dataclasses.fields(RunConfig)} - {"api_key", "sim", "resume", "output_dir", "runs_root"}
    values = {k: v for k, v in saved.items() if k in names}
    for name in _withheld(saved):  # what run.json kept out comes from this command, or the run stops
        if not getattr(given, name):
            flag = "--" + name.replace("_", "-")
            also = " (or OPENAI_API_KEY, or ANTHROPIC_API_KEY on --endpoint messages)" if name == "api_key" else ""
            raise RunError(
                f"{run_dir} used {flag} with a secret run.json does not keep: give it again with {flag}{also} "
                "when resuming"
            )
        if name in names:  # the API key is always this command's
            values[name] = getattr(given, name)
    sim = SimConfig.from_json(json.dumps(saved["sim"])) if "sim" in saved else given.sim
    return RunConfig(
        **values,
        api_key=given.api_key,
        sim=sim,
        output_dir=run_dir,
        runs_root=Path(saved.get("runs_root", "runs")),
        resume=run_dir,
    )


def _withheld(saved: dict[str, Any]) -> list[str]:
    """The fields whose secrets run.json did not keep; for a run written before it said so
    (ipw-async < 0.4), those whose value shows the redaction mark."""
    if "withheld" in saved:
        return list(saved["withheld"])
    marked = [n for n in ("base_url", "telemetry_url", "prometheus_url") if REDACTED in json.dumps(saved.get(n))]
    return marked + (["mcp"] if redacted(saved.get("mcp") or []) else [])


def continue_manifest(manifest: Manifest, resume: Resume, started_ns: int) -> None:
    """A resumed session's run.json: the run's identity, clock and baseline, one more session."""
    earlier = resume.manifest
    manifest.run_id, manifest.config = earlier.run_id, earlier.config
    manifest.baseline_window_ns = earlier.baseline_window_ns
    manifest.dispatched = resume.next_request_id
    manifest.sessions = [
        *earlier.sessions,
        {"session": resume.session, "started_ns": started_ns, "dropped": resume.dropped},
    ]
