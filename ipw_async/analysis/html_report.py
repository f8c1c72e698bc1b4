"""``report.html``: one self-contained page for a run or a sweep.

The page is made from the directory's files alone (a run that died is recovered first, as
``analyze`` does) and says what the terminal and the analyses say: the run table, latency and
energy percentiles, the energy timeline, J per query with its band, the power model the run
fitted and how each meter's energy was measured or imputed, an agentic run's tasks; a sweep's
levels, knees and load-vs-energy plots. Figures are inline SVG and the style sheet is inline,
so nothing is fetched to view it. Every string from the run is escaped: prompts and model
names are user data.
"""

from __future__ import annotations

import os
from pathlib import Path

from .html_page import REPORT
from .html_run import run_page
from .html_sweep import sweep_page


def write_report(path: str | Path, out: str | Path | None = None) -> Path:
    """report.html for a run directory or a sweep directory (default: inside it); returns its path.

    A sweep is a directory holding ``sweep/summary_stats.json``, or that ``sweep/`` folder
    itself; its page goes into ``sweep/``. ``out`` may name a file or a directory. Raises
    :class:`~ipw_async.rundir.manifest.RunDirError` for a directory that is neither.
    """
    path = Path(path)
    sweep_dir = next((d for d in (path / "sweep", path) if (d / "summary_stats.json").is_file()), None)
    page, home = (sweep_page(sweep_dir), sweep_dir) if sweep_dir else (run_page(path), path)
    target = Path(out) if out is not None else home / REPORT
    if target.is_dir():
        target = target / REPORT
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, target)
    return target
