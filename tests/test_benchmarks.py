"""The benchmark scripts are how performance claims are checked: each must at least start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SCRIPTS = sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "scripts").glob("*.py")])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_script_imports_and_explains_itself(script: Path) -> None:
    # a module moved under a script once left finalize_scale.py failing at import, unnoticed
    done = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout and len(done.stdout.splitlines()) > 3


def test_the_scripts_are_all_found() -> None:
    assert {p.name for p in SCRIPTS} >= {"attribution_accuracy.py", "finalize_scale.py", "client_overhead.py"}
