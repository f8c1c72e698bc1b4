"""The documentation site builds with every page in its navigation and no broken link."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
pytest.importorskip("material", reason="the docs extra: pip install -e '.[docs]'")


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", str(site)],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=120,
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    proc = build(ROOT, tmp_path / "site")
    assert proc.returncode == 0, proc.stderr
    pages = {p.parent.name for p in (tmp_path / "site").rglob("index.html")}
    assert {"running", "method", "outputs", "analysis", "benchmarks", "layout"} <= pages


def test_a_broken_link_or_a_page_left_out_of_the_navigation_fails_the_build(tmp_path: Path) -> None:
    for case, plant in (
        ("link", lambda docs: (docs / "layout.md").write_text("[gone](no-such-page.md)\n")),
        ("page", lambda docs: (docs / "orphan.md").write_text("# Orphan\n")),
    ):
        copy = tmp_path / case
        shutil.copytree(ROOT / "docs", copy / "docs")
        shutil.copy(ROOT / "mkdocs.yml", copy)
        plant(copy / "docs")
        proc = build(copy, copy / "site")
        assert proc.returncode != 0, case
        assert ("no-such-page.md" if case == "link" else "orphan.md") in proc.stderr
