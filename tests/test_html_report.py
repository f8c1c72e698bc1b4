"""report.html in a real headless Chromium: it loads from file:// with nothing fetched and no
console error, says what the run is (simulated, partial), holds the headline figures, and each
figure really draws; its user strings are escaped, and a 10,000-request run's page stays small.

Without Chromium (``/usr/bin/chromium`` or ``$IPW_ASYNC_CHROMIUM``) the browser tests skip,
unless ``IPW_ASYNC_REQUIRE_BROWSER=1`` (CI), where they fail.
"""

from __future__ import annotations

import asyncio
import html
import io
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import polars as pl
import pytest
from matplotlib.image import imread

from ipw_async import run_benchmark
from ipw_async.analysis.headline import headline_figures
from ipw_async.analysis.html_figures import MAX_POINTS, envelope, lanes
from ipw_async.analysis.html_report import REPORT, write_report
from ipw_async.harness import RunConfig
from ipw_async.harness.sweep import run_sweep
from ipw_async.report import ms
from ipw_async.results import NO_END, finalize, finished
from ipw_async.rundir import RunDir, RunDirError, files

from .conftest import quick_config

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

SHORT_RUN = Path(__file__).parent / "data" / "short_run"
CHROMIUM = Path(os.environ.get("IPW_ASYNC_CHROMIUM", "/usr/bin/chromium"))
REQUIRE_BROWSER = os.environ.get("IPW_ASYNC_REQUIRE_BROWSER") == "1"
# no sandbox (containers), and nothing Chromium would fetch on its own behalf
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
RUN_FIGURES = ("fig-latency", "fig-timeline", "fig-energy-band", "fig-energy-histogram")
SWEEP_FIGURES = ("fig-load-vs-energy", "fig-throughput-vs-latency", "fig-pareto")
MAX_BYTES = 5_000_000
MAX_LOAD_S = 2.0
T = TypeVar("T")


def _no_browser(reason: str) -> None:
    if REQUIRE_BROWSER:
        pytest.fail(f"IPW_ASYNC_REQUIRE_BROWSER=1, but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium for the module."""
    if not CHROMIUM.is_file():
        _no_browser(f"no Chromium at {CHROMIUM} (set IPW_ASYNC_CHROMIUM to its path)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("the playwright package is not installed (pip install -e '.[test]')")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@dataclass
class Opened:
    page: Page
    load_s: float
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def text(self, selector: str) -> str:
        return self.page.locator(selector).inner_text()

    def cells(self, table_id: str) -> dict[str, list[str]]:
        """A table's rows by their first cell: the rest of the row's cells."""
        rows = self.page.locator(f"#{table_id} tbody tr").all()
        return {r.locator("td").first.inner_text(): r.locator("td").all_inner_texts()[1:] for r in rows}


Opener = Callable[[Path], Opened]


@pytest.fixture
def open_report(browser: Browser) -> Iterator[Opener]:
    """Opens a report.html from file:// and records every request, console error and page error."""
    pages: list[Page] = []

    def opener(path: Path) -> Opened:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        pages.append(page)
        opened = Opened(page, math.nan)
        page.on("request", lambda r: opened.requests.append(r.url))
        page.on("requestfailed", lambda r: opened.errors.append(f"request failed: {r.url}"))
        page.on("console", lambda m: opened.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: opened.errors.append(str(e)))
        start = time.perf_counter()
        page.goto(path.resolve().as_uri(), wait_until="load")
        opened.load_s = time.perf_counter() - start
        return opened

    yield opener
    for page in pages:
        page.close()


def assert_clean(opened: Opened) -> None:
    """Loaded with no error, nothing fetched but the file itself (and data: URLs), in time."""
    assert opened.errors == []
    assert opened.requests and all(u.startswith(("file:", "data:")) for u in opened.requests), opened.requests
    assert opened.load_s < MAX_LOAD_S


def coloured_pixels(png: bytes) -> int:
    """Pixels in colour: drawn data (lines, bars, bands); axes, text and captions are grey."""
    rgb = imread(io.BytesIO(png), format="png")[..., :3]
    return int(((rgb.max(axis=2) - rgb.min(axis=2)) > 0.08).sum())


def assert_figures_drawn(opened: Opened, ids: tuple[str, ...]) -> None:
    for fig_id in ids:
        figure = opened.page.locator(f"#{fig_id}")
        assert figure.locator("figcaption").inner_text()
        drawing = figure.locator("svg")
        assert drawing.count() == 1, f"{fig_id}: {figure.inner_text()}"
        box = drawing.bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 200, (fig_id, box)
        # a figure without data (axes, ticks, titles: black and grey on white) has none at all
        assert coloured_pixels(drawing.screenshot()) > 200, fig_id


def off_thread(work: Callable[[], T]) -> T:
    """Run blocking work that starts its own event loop: playwright's sync API keeps one
    running in this thread once the browser is up."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(work).result()


def _copy_short_run(dest: Path, **run_json: object) -> Path:
    shutil.copytree(SHORT_RUN, dest)
    path = dest / files.RUN
    path.write_text(json.dumps(json.loads(path.read_text()) | run_json))
    return dest


@pytest.fixture(scope="module")
def simulated_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorded short run, labelled simulated and finished by this version."""
    run_dir = _copy_short_run(tmp_path_factory.mktemp("sim") / "run", simulated=True)
    finalize(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The short run as kill -9 leaves it (no end in run.json, no summary, 12 requests lost),
    after its sampler stalled for 0.6 s: energy over the stall is imputed."""
    run_dir = _copy_short_run(tmp_path_factory.mktemp("killed") / "run", end=None, dispatched=60)
    telemetry = files.read_arrow(run_dir / files.TELEMETRY)
    files.write_frame(pl.concat([telemetry.head(20), telemetry.slice(32)]), run_dir / files.TELEMETRY)
    return run_dir


@pytest.fixture(scope="module")
def agentic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = quick_config(
        tmp_path_factory.mktemp("agentic"), workload="agentic", max_queries=6, concurrency=3
    )
    return off_thread(lambda: asyncio.run(run_benchmark(config)).run_dir)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real sweep on the simulator: two levels, one repeat each, short answers."""
    base = RunConfig(dataset="qa", max_queries=12, baseline_s=0, tail_s=0.2)
    base.sim.output_median = 8
    out = tmp_path_factory.mktemp("sweep")
    off_thread(lambda: run_sweep(base, [2, 4], None, 1, out, {}, display=None))
    return out


def test_a_simulated_run_page(open_report: Opener, simulated_run: Path) -> None:
    path = write_report(simulated_run)
    assert path == simulated_run / REPORT
    summary = files.read_json(simulated_run / files.SUMMARY)
    opened = open_report(path)
    assert_clean(opened)
    assert "SIMULATED" in opened.text("#banner-sim")
    assert opened.page.locator("#banner-partial").count() == 0
    headline = opened.cells("headline-table")
    assert headline["model"] == ["sim-small"]
    assert headline["requests ok / measured"] == ["48 / 48"]
    assert headline["J/output token"] == [f"{summary['energy']['j_per_output_token']:,.3f}"]
    assert headline["energy (sim)"][0].startswith(f"{summary['energy']['total_j']:,.1f} J")
    assert "idle" in headline["energy (sim)"][0]
    assert headline["conservation error"] == [
        f"{abs(summary['energy']['meters']['sim']['conservation_error']):.2e}"
    ]
    assert "IPJ (accuracy / J per query)" not in headline  # the run scored no answers
    latency = opened.cells("latency-table")
    assert latency["TTFT"][0] == ms(summary["latency_s"]["ttft"]["p50"])
    assert latency["e2e latency"][3] == ms(summary["latency_s"]["e2e"]["p99"])
    assert len(opened.page.locator("#costliest-table tbody tr").all()) == 20
    parameters = opened.cells("power-model-0-parameters")
    model = summary["energy"]["meters"]["sim"]["power_model"]
    assert parameters["static power"][0] == f"{model['static_w']:,.4g} W"
    assert "(chosen)" in opened.text("#power-model-0-candidates")
    assert opened.cells("meters-table")["sim"][0] == f"{summary['energy']['total_j']:,.1f} J"
    assert_figures_drawn(opened, RUN_FIGURES)


def test_a_killed_run_is_finished_first_and_says_so(open_report: Opener, killed_run: Path) -> None:
    assert not (killed_run / files.SUMMARY).exists()
    with pytest.raises(RunDirError, match=r"cut short.*ipw-async recover"):
        write_report(killed_run)  # the page never finishes a run itself: the policy is the CLI's
    assert not (killed_run / files.SUMMARY).exists()
    finished(killed_run)
    path = write_report(killed_run)
    summary = files.read_json(killed_run / files.SUMMARY)  # recovered, as `ipw-async report` does
    assert summary["complete"] is False and summary["loss"]["requests_not_recorded"] == 12
    opened = open_report(path)
    assert_clean(opened)
    banner = opened.text("#banner-partial")
    assert banner.startswith("PARTIAL RUN")
    assert f"aborted: {NO_END['aborted']}" in banner
    assert "48 of 60 dispatched requests are on disk: 12 were in flight" in banner
    assert opened.page.locator("#banner-sim").count() == 0  # the recorded run was against a server
    assert opened.text("#headline-table caption").endswith("PARTIAL")
    read = opened.cells("provenance-table")["sim"]
    assert read[2] == f"— ({summary['telemetry']['counter_checks_skipped']})"
    imputed = summary["energy"]["meters"]["sim"]["imputed_j"]
    assert imputed > 0 and opened.cells("meters-table")["sim"][2] == f"{imputed:,.1f} J"
    assert "imputed" in read[1]  # queries whose energy the stall left to imputation
    assert opened.page.locator("#fig-timeline svg text", has_text="imputed (no reading)").count() == 1
    assert_figures_drawn(opened, RUN_FIGURES)


def test_an_agentic_run_page(open_report: Opener, agentic_run: Path) -> None:
    opened = open_report(write_report(agentic_run))
    assert_clean(opened)
    assert "SIMULATED" in opened.text("#banner-sim")
    summary = files.read_json(agentic_run / files.SUMMARY)
    tasks = opened.page.locator("#tasks-table tbody tr").all()
    assert len(tasks) == summary["tasks"]["count"] == 6
    traces = {t["task_id"]: t for t in map(json.loads, (agentic_run / files.TRACES).read_text().splitlines())}
    first = tasks[0].locator("td").all_inner_texts()
    costliest = max(traces.values(), key=lambda t: t["energy_j"])
    assert first[0] == str(costliest["task_id"]) and first[3] == str(len(costliest["turns"]))
    assert first[8] == f"{costliest['energy_j']:,.2f} J"
    assert opened.cells("turns-table")["0"][0] == "6"  # every task made a first call
    headline = opened.cells("headline-table")
    ipj = headline_figures(RunDir.open(agentic_run))["ipj"]
    assert headline["IPJ (accuracy / J per query)"] == [f"{ipj:.4g} /J"]
    assert headline["IPW (accuracy / W per query)"][0].endswith(" /W")
    assert_figures_drawn(opened, RUN_FIGURES)


def test_a_sweep_page(open_report: Opener, sweep_dir: Path) -> None:
    linked = write_report(sweep_dir / "c2_r0")  # a run's own page, linked from the sweep's
    path = write_report(sweep_dir)
    assert path == sweep_dir / "sweep" / REPORT == write_report(sweep_dir / "sweep")
    opened = open_report(path)
    assert_clean(opened)
    assert "SIMULATED" in opened.text("#banner-sim")
    levels = opened.cells("levels-table")
    assert set(levels) == {"c2", "c4"}
    assert all(row[0] == "1/1" and row[-1] == "accepted" for row in levels.values())
    assert "throughput knee" in opened.text("#knees")
    runs = opened.page.locator("#runs-table a")
    assert runs.count() == 1 and runs.inner_text() == "c2_r0"
    assert (path.parent / runs.get_attribute("href")).resolve() == linked.resolve()
    assert_figures_drawn(opened, SWEEP_FIGURES)


def test_user_strings_are_escaped(simulated_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(simulated_run, run_dir)
    summary_path = run_dir / files.SUMMARY
    hostile_model = '<script>alert("model")</script> [/]'  # [/] is also bad rich markup
    summary_path.write_text(json.dumps(files.read_json(summary_path) | {"model": hostile_model}))
    records = files.read_arrow(run_dir / files.RECORDS)
    hostile_prompt = "<script>document.title='owned'</script><img src=x onerror=alert(1)>"
    costliest = records.get_column("energy_j").arg_max()
    prompts = records.get_column("prompt").scatter(costliest, hostile_prompt)
    files.write_frame(records.with_columns(prompts), run_dir / files.RECORDS)
    page = write_report(run_dir).read_text()
    assert "<script" not in page and "<img" not in page
    assert html.escape(hostile_model) in page
    assert html.escape(hostile_prompt)[:60] in page  # the prompt is cut short, escaped


def test_a_figure_without_its_data_says_why(simulated_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(simulated_run, run_dir)
    (run_dir / files.TELEMETRY).unlink()
    page = write_report(run_dir).read_text()
    timeline = page[page.index('<figure id="fig-timeline">') :]
    assert timeline.startswith(
        '<figure id="fig-timeline"><p class="missing">— <span class="why">(the run has no telemetry.arrow)'
    )
    assert page.count("<svg") == len(RUN_FIGURES) - 1


def test_thinning_keeps_the_extremes_and_windows_never_share_a_row() -> None:
    t = np.arange(100_000, dtype=float)
    v = np.sin(t / 500)
    v[77_777] = 50.0  # one spike in 100,000 readings
    x, y = envelope(t, v)
    assert x.size <= MAX_POINTS and y.max() == 50.0 and y.min() == pytest.approx(-1, abs=1e-3)
    assert np.all(np.diff(x) >= 0)
    rng = np.random.default_rng(0)
    sent = np.sort(rng.uniform(0, 100, 500))
    end = sent + rng.exponential(2, 500)
    rows = lanes(sent, end)
    for row in np.unique(rows):
        mine = np.argsort(sent[rows == row])
        assert np.all(sent[rows == row][mine][1:] >= end[rows == row][mine][:-1])
    in_flight = max(int(((sent <= s) & (end > s)).sum()) for s in sent)
    assert rows.max() + 1 == in_flight  # as many rows as the most queries in flight at once


@pytest.fixture(scope="module")
def big_run(simulated_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10,000 requests: the short run's records and telemetry repeated back to back in time
    (its summary stays the short run's: what grows with the records is what is measured)."""
    run_dir = tmp_path_factory.mktemp("big") / "run"
    shutil.copytree(simulated_run, run_dir)
    records = files.read_arrow(run_dir / files.RECORDS)
    telemetry = files.read_arrow(run_dir / files.TELEMETRY)
    period = 100_000_000  # copies start on the counter's grid, near enough
    span = (int(telemetry.get_column("t_ns").max()) // period + 1) * period
    step_j = float(telemetry.get_column("sim.energy_j").max()) + 1.0
    copies = math.ceil(10_000 / records.height)
    times = [c for c in records.columns if c.endswith("_ns") and records.schema[c] == pl.Int64]
    records = pl.concat(
        records.with_columns(
            *(pl.col(c) + k * span for c in times), pl.col("request_id") + k * records.height
        )
        for k in range(copies)
    ).head(10_000)
    telemetry = pl.concat(
        telemetry.with_columns(
            *(pl.col(c) + k * span for c in ("t_ns", "sim.t_ns")), pl.col("sim.energy_j") + k * step_j
        )
        for k in range(copies)
    )
    files.write_frame(records, run_dir / files.RECORDS)
    files.write_frame(telemetry, run_dir / files.TELEMETRY)
    return run_dir


def test_a_10000_request_page_stays_small(big_run: Path) -> None:
    start = time.perf_counter()
    path = write_report(big_run)
    elapsed = time.perf_counter() - start
    assert RunDir.open(big_run).records.height == 10_000
    size = path.stat().st_size
    assert size < MAX_BYTES, f"{size:,} bytes"
    assert elapsed < 10, f"{elapsed:.1f} s to write"
    page = path.read_text()
    assert page.count("<svg") == len(RUN_FIGURES)
    assert "the 20 costliest of 10,000" in page


def test_a_10000_request_page_opens_quickly(open_report: Opener, big_run: Path) -> None:
    path = big_run / REPORT
    if not path.is_file():
        write_report(big_run)
    opened = open_report(path)
    assert_clean(opened)  # within MAX_LOAD_S
    assert_figures_drawn(opened, RUN_FIGURES)
