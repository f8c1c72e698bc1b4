"""Turn runs made on a lent GPU (``shared/gpu/check.sh``) into a real-trace set scored by
``real_traces.py``: each run's request map and its per-request reference under convention v2.

The input is what ``check.sh`` returns, unpacked: a folder with the server's step log
(``steps.json``), the probe (``physics.json``) and one run directory per load. The output is a
set as ``real_traces.py`` reads it::

    <out>/steps.json.gz, physics.json
    <out>/<run>/run/measured.arrow (records.arrow before format 2; text emptied), telemetry.arrow, run.json,
        summary.json (the Arrow files zstd-compressed)
    <out>/<run>/request_map.csv      request_id → server_rid
    <out>/<run>/reference_v2.csv     reference_j (static fitted), reference_j_idle_static (the probe's idle)

Requests are joined on their first token: the harness stamps it a fraction of a millisecond
after the server writes it, on the same CLOCK_MONOTONIC, and the server's token counts must match
the record's. The reference is :func:`real_traces.rebuild`: the step log priced by the probe,
scaled to the energy counter's intervals, split by convention v2 (see that module).

    python benchmarks/build_reference.py GPU_RUNS_DIR OUT_DIR
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_traces import Probe, rebuild

# copied as they are; of the Arrow files finalize reads the measured records and the telemetry
# (:func:`kept`), not records.arrow, which it rewrites
RUN_FILES = ("run.json", "summary.json")
# A model with random weights writes meaningless text: the set keeps every timing and count
# column, drops the prompts' and answers' text and compresses its Arrow files, so a run of
# 400 requests is about a megabyte in the repository instead of five
TEXT = ("prompt", "answer")
MAX_STAMP_DELAY_S = 0.05  # a first token read later than this after the server wrote it is not joined


def measured_records(run_dir: Path) -> Path:
    """The run's records as measured: ``measured.arrow``, or ``records.arrow`` before format 2."""
    return run_dir / ("measured.arrow" if (run_dir / "measured.arrow").is_file() else "records.arrow")


def answered(run_dir: Path) -> pl.DataFrame:
    """The records that got a first token."""
    return pl.read_ipc_stream(measured_records(run_dir)).filter(pl.col("first_token_ns").is_not_null())


def kept(run_dir: Path, out: Path) -> None:
    """The run's measured records (their text emptied) and telemetry, zstd-compressed in ``out``."""
    records = pl.read_ipc_stream(measured_records(run_dir))
    blank = [pl.lit("").alias(c) for c in TEXT if records.schema.get(c) == pl.String]
    records.with_columns(blank).write_ipc_stream(out / measured_records(run_dir).name, compression="zstd")
    telemetry = pl.read_ipc_stream(run_dir / "telemetry.arrow")
    telemetry.write_ipc_stream(out / "telemetry.arrow", compression="zstd")


def request_map(run_dir: Path, log: dict) -> dict[int, str]:
    """Each answered record's server request: the latest first write before its first token
    with the same prompt and output token counts."""
    t0 = json.loads((run_dir / "run.json").read_text())["clock"]["t0_monotonic_ns"]
    records = answered(run_dir)
    server = sorted(log["requests"], key=lambda r: r["first_write"])
    writes = np.array([r["first_write"] for r in server])
    taken: set[str] = set()
    out: dict[int, str] = {}
    for rec in records.sort("first_token_ns").iter_rows(named=True):
        seen = (t0 + rec["first_token_ns"]) / 1e9
        k = int(np.searchsorted(writes, seen, side="right")) - 1
        while k >= 0 and seen - writes[k] <= MAX_STAMP_DELAY_S:
            r = server[k]
            if (
                r["rid"] not in taken
                and r["prompt_tokens"] == rec["prompt_tokens"]
                and r["output_tokens"] == rec["output_tokens"]
            ):
                out[rec["request_id"]] = r["rid"]
                taken.add(r["rid"])
                break
            k -= 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, help="check.sh's gpu_runs folder, unpacked")
    ap.add_argument("out", type=Path, help="the set to write (e.g. benchmarks/traces/h200-8b-graphs)")
    args = ap.parse_args()
    log = json.loads((args.runs / "steps.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.copy(args.runs / "physics.json", args.out / "physics.json")
    with gzip.open(args.out / "steps.json.gz", "wt") as f:
        json.dump(log, f)
    idle_w = json.loads((args.runs / "physics.json").read_text())["idle_w"]
    Probe.read(args.out / "physics.json")  # fails here, not mid-build, on a probe without its rows
    for run_dir in sorted(p.parent for p in args.runs.glob("*/run.json")):
        run = args.out / run_dir.name
        (run / "run").mkdir(parents=True, exist_ok=True)
        for name in RUN_FILES:
            shutil.copy(run_dir / name, run / "run" / name)
        kept(run_dir, run / "run")
        joined = request_map(run_dir, log)
        records = answered(run_dir)
        with open(run / "request_map.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["request_id", "server_rid"])
            w.writerows(sorted(joined.items()))
        fitted, idle = rebuild(run, None), rebuild(run, idle_w)
        with open(run / "reference_v2.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(
                [
                    "request_id",
                    "reference_j",
                    "reference_j_idle_static",
                    "prompt_tokens",
                    "output_tokens",
                    "e2e_s",
                ]
            )
            for rec in records.sort("request_id").iter_rows(named=True):
                q = rec["request_id"]
                if q in fitted.reference:
                    w.writerow(
                        [
                            q,
                            round(fitted.reference[q], 4),
                            round(idle.reference[q], 4),
                            rec["prompt_tokens"],
                            rec["output_tokens"],
                            round(rec["e2e_latency_s"], 4),
                        ]
                    )
        print(
            f"{run_dir.name}: {len(joined)}/{records.height} records joined; fitted static "
            f"{fitted.static_w:.1f} W, shift {fitted.shift_ms} ms, k_dec {fitted.k_decode:.2f}, "
            f"k_pre {fitted.k_prefill:.2f}, R² {fitted.r2:.3f}; at the probe's idle {idle_w:.1f} W: "
            f"R² {idle.r2:.3f}, k_dec {idle.k_decode:.2f}, k_pre {idle.k_prefill:.2f}"
        )


if __name__ == "__main__":
    main()
