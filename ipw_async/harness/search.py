"""``search``: the most load a server takes within its SLOs, and what a query costs there.

Probes are runs: load doubles from ``start`` until a probe breaks an SLO (or halves until one
meets them all), then each next probe goes where the monotone fit of the probes' margins puts
the boundary (:mod:`..analysis.search`), until the bracket between the most load that met every
SLO and the least that did not, and the boundary's bootstrap interval, are both within
``precision`` of it, or the probes run out. Each probe is ``repeats`` run directories
``<out_dir>/<level>_r<k>`` (so ``analyze`` and ``plot`` work on each; repeat k runs with seed +
k), whose requests are pooled for its margins; the search's own files go to
``<out_dir>/search/``.
"""

from __future__ import annotations

import datetime as dt
import math
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from .._loop import BetweenRuns
from .._loop import run as run_loop
from ..analysis.headline import headline_figures
from ..analysis.plotting import PlotReport
from ..analysis.search import BOOTSTRAP, Boundary, Slo, boundary, boundary_interval, margins
from ..analysis.search_plot import plot_search
from ..analysis.sweep import Level
from ..errors import RunError, stop_signal
from ..load import LoadSpec
from ..results import finished
from ..rundir import files
from ..rundir.lifecycle import slug
from .config import RunConfig
from .live import Display, run_benchmark
from .sweep import level_config

# An over-saturated probe never settled, so its SLO figures describe no steady state; it fails
# as a probe whose tightest SLO was missed by its whole limit would.
OVERSATURATED_MARGIN = -1.0


@dataclass
class Probe:
    """One load level run, and how it stood against the SLOs."""

    load: float
    run_dirs: list[Path]  # one per repeat
    status: str = "failed"  # ok, failed (the run raised) or interrupted
    error: str | None = None
    margins: dict[str, float] = field(default_factory=dict)
    replicates: np.ndarray | None = None  # bootstrap × SLO
    figures: dict[str, Any] = field(default_factory=dict)  # means over the repeats
    oversaturated: bool = False  # a repeat's summary said so: it fails, whatever its SLOs
    simulated: bool = False  # a repeat's summary said so (its energy read from a simulated device)

    @property
    def tightest(self) -> float:
        tightest = min(self.margins.values(), default=-math.inf)
        return min(tightest, OVERSATURATED_MARGIN) if self.oversaturated else tightest

    @property
    def passed(self) -> bool:
        return self.status == "ok" and self.tightest >= 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "load": self.load,
            "run_dirs": [str(d) for d in self.run_dirs],
            "status": self.status,
            "error": self.error,
            "passed": self.passed,
            "oversaturated": self.oversaturated,
            "margins": {k: (v if math.isfinite(v) else None) for k, v in self.margins.items()},
            "figures": self.figures,
        }


@dataclass
class SearchResult:
    out_dir: Path
    mode: str  # concurrency or rate
    slos: list[Slo]
    probes: list[Probe]
    boundary: Boundary
    interval: tuple[float, float] | None
    stop: str
    summary: dict[str, Any]
    stopped_by: signal.Signals | None = None  # the signal that stopped the search early
    plots: PlotReport = field(default_factory=PlotReport)

    @property
    def search_dir(self) -> Path:
        return self.out_dir / "search"


def default_search_dir(base: RunConfig) -> Path:
    """``<runs root>/search_<UTC time>_<model or sim>``."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = base.model or ("sim" if base.base_url is None else "server")
    return base.runs_root / f"search_{stamp}_{slug(name)}"


def _level(mode: str, load: float) -> Level:
    if mode == "concurrency":
        return Level(LoadSpec(concurrency=int(load)).label, load, int(load), None)
    return Level(f"rate{LoadSpec(rate=load).rate:g}", load, None, load)


def _fitted(probes: list[Probe]) -> tuple[Boundary, tuple[float, float] | None]:
    """The boundary over the probes that ran, and its bootstrap interval."""
    ran = [p for p in probes if p.replicates is not None]  # a failed probe broke every SLO
    if not ran:
        return Boundary(None, None, None, False), None
    loads = np.array([p.load for p in ran])
    found = boundary(loads, np.array([p.tightest for p in ran]))
    if found.estimate is None:
        return found, None
    replicates = [p.replicates.min(axis=1) for p in ran if p.replicates is not None]
    return found, boundary_interval(loads, replicates)


def _next_load(mode: str, found: Boundary, probed: set[float]) -> float | None:
    """Where to probe next: the fitted boundary, else the bracket's middle (geometric); None
    where nothing untried lies strictly inside the bracket."""
    assert found.feasible_max is not None and found.infeasible_min is not None
    lo, hi = found.feasible_max, found.infeasible_min
    middle = math.sqrt(lo * hi)
    for candidate in (found.estimate, middle):
        if candidate is None:
            continue
        load = float(round(candidate)) if mode == "concurrency" else float(f"{candidate:.3g}")
        if lo < load < hi and load not in probed:
            return load
    return None


def _check_arguments(
    base: RunConfig,
    slos: list[Slo],
    mode: str,
    start: float,
    max_load: float,
    precision: float,
    max_probes: int,
    repeats: int,
) -> None:
    """ValueError for a search that cannot run, before anything (its folder) is made."""
    if not slos:
        raise ValueError("give at least one --slo, e.g. --slo ttft_p99=500ms")
    if mode not in ("concurrency", "rate"):
        raise ValueError("search over concurrency or rate")
    if not 0 < start <= max_load or (mode == "concurrency" and start < 1):
        raise ValueError("--start must be positive (at least 1 stream) and at most --max-load")
    if not 0 < precision < 1:
        raise ValueError("--precision is a share of the boundary, between 0 and 1 (e.g. 0.1)")
    if max_probes < 2:
        raise ValueError("--max-probes must be at least 2")
    if repeats < 1:
        raise ValueError("--repeats must be at least 1")
    if base.trace is not None:
        raise ValueError(
            "--trace replays one schedule, the trace's own times, with no concurrency or rate to search: "
            "sweep its speed instead, with `ipw-async sweep --trace FILE --speedup 0.5,1,2,4`"
        )


def run_search(
    base: RunConfig,
    slos: list[Slo],
    *,
    mode: str = "concurrency",
    start: float = 1.0,
    max_load: float = 1024.0,
    precision: float = 0.1,
    max_probes: int = 10,
    repeats: int = 1,
    out_dir: Path,
    display: Display | None = None,
    progress: Callable[[Probe, int], None] | None = None,
) -> SearchResult:
    """Search for the most load within ``slos``; blocking. Raises ValueError for bad arguments."""
    _check_arguments(base, slos, mode, start, max_load, precision, max_probes, repeats)
    out_dir.mkdir(parents=True, exist_ok=True)
    probes: list[Probe] = []
    stopped_by: signal.Signals | None = None
    stops = BetweenRuns()

    def probe(load: float) -> Probe:
        nonlocal stopped_by
        configs = [level_config(base, _level(mode, load), r, out_dir) for r in range(repeats)]
        p = Probe(load, [c.output_dir for c in configs if c.output_dir is not None])
        probes.append(p)
        try:
            for config in configs:
                stops.check()  # a signal between two runs stops the search before the next
                run_loop(run_benchmark(config, display))
            p.status = "ok"
        except RunError as exc:
            if not probes[:-1]:  # the first probe: the server or the options are wrong, not the load
                raise
            p.error = str(exc)  # the server fell over under this load: every SLO broken
            p.margins = {slo.name: -math.inf for slo in slos}
            p.replicates = np.full((BOOTSTRAP, len(slos)), -math.inf)
        except KeyboardInterrupt as exc:
            stopped_by = stop_signal(exc)
            p.status, p.error = "interrupted", f"stopped by {stopped_by.name}"
        if p.status == "ok":
            runs = [finished(d) for d in p.run_dirs]
            point, boot = margins(slos, [r.records for r in runs], seed=base.seed + len(probes))
            p.margins = {slo.name: float(m) for slo, m in zip(slos, point, strict=True)}
            p.oversaturated = any((r.summary.get("saturation") or {}).get("oversaturated") for r in runs)
            p.simulated = any(r.simulated for r in runs)
            p.replicates = np.minimum(boot, OVERSATURATED_MARGIN) if p.oversaturated else boot
            p.figures = _mean_figures([headline_figures(r) | _band(r.ok) for r in runs])
        if progress is not None:
            progress(p, len(probes))
        return p

    with stops:
        stop = _search(probe, probes, mode, start, max_load, max_probes, precision, lambda: stopped_by)
    found, interval = _fitted(probes)
    summary = _summary(mode, slos, probes, found, interval, stop, base)
    result = SearchResult(out_dir, mode, slos, probes, found, interval, stop, summary, stopped_by)
    result.search_dir.mkdir(parents=True, exist_ok=True)
    files.write_json(result.search_dir / "search.json", summary)
    result.plots = plot_search(summary, result.search_dir, simulated=summary["simulated"])
    return result


def _search(
    probe: Callable[[float], Probe],
    probes: list[Probe],
    mode: str,
    start: float,
    max_load: float,
    max_probes: int,
    precision: float,
    stopped: Callable[[], signal.Signals | None],
) -> str:
    """Bracket the boundary, then bisect it until the bracket and its interval are within
    ``precision``; why the search stopped."""
    stop = _bracket(probe, mode, start, max_load, max_probes, stopped)
    while stop is None:
        if (sig := stopped()) is not None:
            stop = f"stopped by {sig.name}"
            break
        found, interval = _fitted(probes)
        if found.estimate is None:
            stop = "no boundary in the probes"
            break
        assert found.feasible_max is not None and found.infeasible_min is not None
        bracket = (found.infeasible_min - found.feasible_max) / found.estimate
        width = None if interval is None else (interval[1] - interval[0]) / found.estimate
        if bracket <= precision and width is not None and width <= precision:
            stop = f"the bracket and the boundary's interval are within {precision:.0%}"
            break
        load = _next_load(mode, found, {p.load for p in probes})
        if load is None:
            stop = "the bracket holds no untried load (adjacent concurrencies)"
            break
        if len(probes) >= max_probes:
            stop = f"--max-probes ({max_probes}) reached"
            break
        probe(load)
    return stop


def _bracket(
    probe: Callable[[float], Probe],
    mode: str,
    start: float,
    max_load: float,
    max_probes: int,
    stopped: Callable[[], signal.Signals | None],
) -> str | None:
    """Double from ``start`` until a probe breaks an SLO, or halve until one meets them all
    (``stopped``: the signal that stopped a probe, if one did); a reason to stop where no
    bracket can be had, else None."""
    first = probe(start)
    if (sig := stopped()) is not None:
        return f"stopped by {sig.name}"
    step = 2.0 if first.passed else 0.5
    load, count = start, 1
    floor = 1.0 if mode == "concurrency" else start / 64
    while True:
        nxt = min(load * step, max_load) if step > 1 else max(load * step, floor)
        if nxt == load:
            return (
                f"every probe met the SLOs, up to --max-load {max_load:g}"
                if step > 1
                else "every probe broke an SLO, down to the least load"
            )
        if count >= max_probes:
            return f"--max-probes ({max_probes}) reached before a bracket"
        load = float(round(nxt)) if mode == "concurrency" else nxt
        p = probe(load)
        count += 1
        if (sig := stopped()) is not None:
            return f"stopped by {sig.name}"
        if p.passed != first.passed:
            return None


def _mean_figures(per_run: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's mean over a probe's repeats; null where a repeat could not measure it."""
    out: dict[str, Any] = {}
    for key in per_run[0]:
        values = [f.get(key) for f in per_run]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        out[key] = float(np.mean(values)) if numeric else (values[0] if len(values) == 1 else None)
    return out


def _band(ok: pl.DataFrame) -> dict[str, Any]:
    """The mean of each query's energy band: J/query's least and most."""
    if "energy_low_j" not in ok.columns or ok.is_empty():
        return {"j_per_query_low": None, "j_per_query_high": None}
    return {
        "j_per_query_low": ok.get_column("energy_low_j").mean(),
        "j_per_query_high": ok.get_column("energy_high_j").mean(),
    }


def _summary(
    mode: str,
    slos: list[Slo],
    probes: list[Probe],
    found: Boundary,
    interval: tuple[float, float] | None,
    stop: str,
    base: RunConfig,
) -> dict[str, Any]:
    at = next((p for p in probes if p.status == "ok" and p.load == found.feasible_max), None)
    binding = None if at is None else min(at.margins, key=lambda k: at.margins[k])
    energy_keys = (
        "j_per_query",
        "j_per_query_low",
        "j_per_query_high",
        "j_per_token",
        "ipj",
        "throughput_tok_s",
    )
    return {
        "mode": mode,
        "slos": [{"slo": s.text, "name": s.name, "limit": s.limit} for s in slos],
        "boundary": {
            "estimate": found.estimate,
            "interval95": list(interval) if interval else None,
            "feasible_max": found.feasible_max,
            "infeasible_min": found.infeasible_min,
            "binding_slo": binding,
            "cliff": found.cliff,
        },
        # measured at the most load that met every SLO, not interpolated
        "at_feasible_max": None
        if at is None
        else {k: at.figures.get(k) for k in energy_keys} | {"run_dirs": [str(d) for d in at.run_dirs]},
        "stop": stop,
        "repeats": len(probes[0].run_dirs) if probes else None,
        "probes": [p.as_dict() for p in probes],
        "simulated": base.base_url is None or any(p.simulated for p in probes),
        "config": base.public(),
    }
