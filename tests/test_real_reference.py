"""benchmarks/build_reference.py: what a lent GPU returns becomes a scored trace set, the same
every time, and a record it cannot place is left out rather than joined to a stranger."""

from __future__ import annotations

import csv
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "benchmarks" / "traces" / "h200-8b-graphs"


def _gpu_runs(tmp: Path, log: dict) -> Path:
    """The c8 run as check.sh returns it: the step log and probe beside the run directory."""
    runs = tmp / "gpu_runs"
    shutil.copytree(H200 / "c8" / "run", runs / "c8")
    shutil.copy(H200 / "physics.json", runs / "physics.json")
    (runs / "steps.json").write_text(json.dumps(log))
    return runs


def _build(runs: Path, out: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "build_reference.py"), str(runs), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _rows(path: Path) -> dict[str, dict[str, str]]:
    with open(path) as f:
        return {r["request_id"]: r for r in csv.DictReader(f)}


def test_a_set_rebuilt_from_what_the_gpu_returned_is_the_one_kept(tmp_path: Path) -> None:
    with gzip.open(H200 / "steps.json.gz", "rt") as f:
        log = json.load(f)
    out = tmp_path / "set"
    printed = _build(_gpu_runs(tmp_path, log), out)
    assert "c8: 72/72 records joined" in printed
    assert _rows(out / "c8" / "request_map.csv") == _rows(H200 / "c8" / "request_map.csv")
    assert _rows(out / "c8" / "reference_v2.csv") == _rows(H200 / "c8" / "reference_v2.csv")


def test_a_record_the_server_logged_otherwise_is_left_out(tmp_path: Path) -> None:
    with gzip.open(H200 / "steps.json.gz", "rt") as f:
        log = json.load(f)
    kept = _rows(H200 / "c8" / "request_map.csv")
    differs = kept["5"]["server_rid"]
    for r in log["requests"]:
        if r["rid"] == differs:
            r["output_tokens"] += 1  # the server wrote a token the record does not have
    out = tmp_path / "set"
    assert "c8: 71/72 records joined" in _build(_gpu_runs(tmp_path, log), out)
    joined = _rows(out / "c8" / "request_map.csv")
    reference = _rows(out / "c8" / "reference_v2.csv")
    assert "5" not in joined and "5" not in reference
    # no other request took its place, and it still took its share of the server's static
    assert all(joined[q] == kept[q] for q in joined)
    before = _rows(H200 / "c8" / "reference_v2.csv")
    assert reference.keys() == before.keys() - {"5"}
    for q, row in reference.items():
        assert abs(float(row["reference_j"]) / float(before[q]["reference_j"]) - 1) < 1e-5
