"""``sweep``: the same benchmark at several load levels, repeated, with statistics over repeats.

Each level (a concurrency, an arrival rate, or a ``--trace``'s speedup) runs ``repeats`` times
with seed = seed + r, each into its own run directory ``<out_dir>/<level>_r<r>``; the sweep's own
files go to ``<out_dir>/sweep/``. A trace's level ``x2`` replays it twice as fast: the speedup is
its load, and the summary gives the rate that offers (``trace.offered_per_s``). A run that fails
is recorded as failed and the sweep goes on; Ctrl-C (or SIGTERM, SIGHUP) stops it and the files
are still written from the runs that finished.

Before each run against a server (``--base-url``) the sweep empties the server's prefix cache
where it can, so no point hits what an earlier point cached: ``POST {server root}/reset_prefix_cache``
(vLLM's endpoint, served when vLLM runs with ``VLLM_SERVER_DEV_MODE=1``; the built-in simulator's
too). A server that answers 404, 405 or 501 cannot: the sweep says so once and goes on. The sweep's
``summary.json`` says what happened in ``prefix_cache_reset``.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import http.client
import itertools
import signal
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._loop import BetweenRuns
from .._loop import run as run_loop
from ..analysis.constraints import validate
from ..analysis.headline import FIGURES, headline_figures
from ..analysis.sweep import Level, SweepResult, levels_of, write_sweep
from ..client import api_headers
from ..errors import RunError, stop_signal
from ..results import finished
from ..rundir import files
from ..rundir.lifecycle import slug
from ..rundir.manifest import Manifest, RunDirError
from ..telemetry.http import redact_url
from ..workload import DatasetError
from ..workload.replay import load_trace
from .config import RunConfig
from .live import Display, run_benchmark


def default_sweep_dir(base: RunConfig) -> Path:
    """``<runs root>/sweep_<UTC time>_<model or sim>``."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = base.model or ("sim" if base.base_url is None else "server")
    return base.runs_root / f"sweep_{stamp}_{slug(name)}"


SPEEDUP = "speedup"  # the mode of a sweep over a --trace


def sweep_levels(
    base: RunConfig, concurrency: list[int] | None, rates: list[float] | None, speedups: list[float] | None
) -> tuple[str, list[Level]]:
    """What the sweep varies and its levels: a --trace's speedups, else a concurrency or a rate;
    ValueError for levels the runs could not take."""
    if base.trace is None:
        if speedups:
            raise ValueError("--speedup levels are the speeds of a replayed trace: add --trace FILE")
        return levels_of(concurrency, rates)
    if concurrency or rates:
        raise ValueError(
            "a --trace sets the load by its own times: sweep its speed with --speedup 0.5,1,2,4 "
            "instead of --concurrency or --rate"
        )
    if not speedups:
        raise ValueError("a sweep over a --trace varies its speed: give the levels as --speedup 0.5,1,2,4")
    if base.speedup != 1.0:  # a Python caller's own speedup would be silently replaced
        raise ValueError(f"a sweep's --speedup levels replace the run's speedup ({base.speedup:g}): leave it at 1")
    bad = next((x for x in speedups if not x > 0), None)  # NaN too
    if bad is not None:
        raise ValueError(f"--speedup levels must be positive factors, e.g. 0.5,1,2,4, not {bad:g}")
    return SPEEDUP, [Level(f"x{x:g}", x, None, None) for x in speedups]


def level_config(base: RunConfig, level: Level, repeat: int, out_dir: Path) -> RunConfig:
    """The base config at this level and repeat: same dataset slice, seed + repeat; a --trace's
    level is its speedup."""
    seed = base.seed + repeat
    return dataclasses.replace(
        base,
        concurrency=level.concurrency,
        rate=level.rate,
        speedup=base.speedup if base.trace is None else level.value,
        seed=seed,
        dataset_seed=base.seed if base.dataset_seed is None else base.dataset_seed,
        output_dir=out_dir / f"{level.label}_r{repeat}",
    )


def offered(base: RunConfig, levels: list[Level]) -> dict[str, Any]:
    """What a sweep's summary says of the trace its levels replay: the trace, and the units
    (requests, or a sessions trace's sessions) a second it offers at each level: the trace's own
    rate over the units a run measures (after its warm-up, up to --max-queries) times the level's
    speedup; None where they all arrive at once. ValueError for a trace that cannot be read."""
    assert base.trace is not None
    try:
        trace = load_trace(base.trace, base.trace_format)
    except DatasetError as exc:
        raise ValueError(str(exc)) from None
    units = trace.sessions if trace.format == "sessions" else trace.requests
    measured = units[base.warmup :][: base.max_queries]
    span_s = (measured[-1].offset_ns - measured[0].offset_ns) / 1e9 if measured else 0.0
    rate = (len(measured) - 1) / span_s if span_s > 0 else None
    return trace.describe() | {
        "unit": "sessions" if trace.format == "sessions" else "requests",
        "rate_per_s": rate,
        "offered_per_s": {lv.label: None if rate is None else rate * lv.value for lv in levels},
    }


RESET_PATH = "/reset_prefix_cache"
RESET_TIMEOUT_S = 10.0
# what a sweep's summary says of its prefix-cache resets
RESET_DONE, RESET_UNSUPPORTED, RESET_KEPT = "done", "not supported", "kept"
RESET_NEW_SERVER = "not needed: each run starts its own simulator"
RESET_NOT_TRIED = "not tried: the sweep stopped before its first run"


def reset_url(base_url: str) -> str:
    """Where to ask for the reset: the server's root (its API base without ``/v1``), the base
    URL's query kept (where some gateways take their key), its user and password left out
    (they go as a header: urllib reads a password in the URL as a port)."""
    parts = urllib.parse.urlsplit(base_url)
    root = parts.path.rstrip("/").removesuffix("/v1")
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=host, path=root + RESET_PATH, fragment=""))


def _reset_headers(base_url: str, api_key: str | None, endpoint: str) -> dict[str, str]:
    """The key as the run's API sends it, else the URL's user and password as HTTP basic auth."""
    if api_key:
        return api_headers(endpoint, api_key)
    parts = urllib.parse.urlsplit(base_url)
    if parts.username is None:
        return {}
    pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
    return {"authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


def request_cache_reset(base_url: str, api_key: str | None, endpoint: str = "chat") -> str:
    """Ask the server to empty its prefix cache: ``done``, or ``not supported`` (no such route,
    method or feature: 404, 405, 501); OSError for any other failure (no answer, another status,
    an answer that is not HTTP)."""
    request = urllib.request.Request(
        reset_url(base_url), data=b"", method="POST", headers=_reset_headers(base_url, api_key, endpoint)
    )
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # as the run's client: no proxy
    try:
        with direct.open(request, timeout=RESET_TIMEOUT_S):
            return RESET_DONE
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 405, 501):
            return RESET_UNSUPPORTED
        raise OSError(f"HTTP {exc.code}") from None
    except (http.client.HTTPException, ValueError) as exc:
        raise OSError(f"{type(exc).__name__}: {exc}") from None


class PrefixResets:
    """The sweep's prefix-cache resets: one before each run, until the server says it cannot;
    each kind of outcome told once through ``note``."""

    def __init__(self, base: RunConfig, wanted: bool, note: Callable[[str], None]) -> None:
        self.base_url = base.base_url
        self.api_key = base.api_key
        self.endpoint = base.endpoint
        self.note = note
        if not wanted:
            self.state = RESET_KEPT
        elif base.base_url is None:
            self.state = RESET_NEW_SERVER
        else:
            self.state = None  # not tried yet
        self._failed: str | None = None

    def before_run(self) -> None:
        if self.state not in (None, RESET_DONE) or self.base_url is None:  # kept, unsupported, no server
            return
        url = redact_url(reset_url(self.base_url))  # as the notes show it: no secret of the URL's
        try:
            outcome = request_cache_reset(self.base_url, self.api_key, self.endpoint)
        except OSError as exc:
            if self._failed is None:  # the first failure is the one told and kept
                self._failed = redact_url(str(exc))
                self.note(f"could not reset the server's prefix cache (POST {url}: {self._failed}); the sweep goes on")
            return
        if outcome == RESET_UNSUPPORTED:
            self.note(
                f"the server cannot reset its prefix cache (POST {url} is not served): a sweep point may "
                "hit what an earlier one cached"
            )
        self.state = outcome

    @property
    def summary(self) -> str:
        """What the sweep's summary says: done, not supported, kept, not needed, or failed."""
        if self._failed is not None and self.state != RESET_UNSUPPORTED:
            return f"failed: {self._failed}"
        return self.state or RESET_NOT_TRIED


STOPPED_BY = "stopped by "  # then the signal's name: an interrupted run's error in raw_runs.csv


def stop_code(result: SweepResult) -> int:
    """A stopped sweep's exit code: 128 + the signal its interrupted run's row names (the
    result keeps no other trace of it)."""
    error = next(row["error"] for row in result.runs if row["status"] == "interrupted")
    return 128 + signal.Signals[error.removeprefix(STOPPED_BY)]


def run_row(level: Level, repeat: int, config: RunConfig) -> dict[str, Any]:
    """A raw_runs row before the run: figures all null until it finishes."""
    return {
        "level": level.label,
        "value": level.value,
        "repeat": repeat,
        "seed": config.seed,
        "run_dir": str(config.output_dir),
        "status": "failed",
        "complete": False,
        "simulated": config.base_url is None,
        "error": None,
    } | dict.fromkeys(FIGURES)


def _run_id(run_dir: Path) -> str | None:
    try:
        return Manifest.read(run_dir).run_id
    except RunDirError:
        return None


def _fill(row: dict[str, Any], run_dir: Path, previous_id: str | None) -> None:
    """Figures from whatever this run left on disk (an interrupted run leaves records).

    A run refused before it started may have found an older run there: that one is not read.
    """
    run_id = _run_id(run_dir)
    if run_id is None or run_id == previous_id:
        return
    try:
        run = finished(run_dir)
    except ValueError:  # RunDirError: it measured nothing
        return
    # a run's own label: its energy may come from a simulated device behind a real URL
    row |= headline_figures(run) | {"complete": run.complete, "simulated": run.simulated}


def run_sweep(
    base: RunConfig,
    concurrency: list[int] | None,
    rates: list[float] | None,
    repeats: int,
    out_dir: Path,
    constraints: dict[str, float | None],
    display: Display | None = None,
    progress: Callable[[dict[str, Any], int, int], None] | None = None,
    reset_prefix_cache: bool = True,
    note: Callable[[str], None] = lambda _: None,
    speedups: list[float] | None = None,
) -> SweepResult:
    """Run every level ``repeats`` times and write ``<out_dir>/sweep/``; blocking.

    The levels are ``concurrency`` or ``rates``, or with a ``base.trace`` its ``speedups``.
    ``display`` shows each run's progress (None: nothing); ``progress(row, done, total)`` is
    called after each run; ``note`` hears what the sweep has to say once (a server that cannot
    reset its prefix cache). ``reset_prefix_cache``: empty the server's prefix cache before
    each run. Raises ValueError for bad arguments before running anything.
    """
    mode, levels = sweep_levels(base, concurrency, rates, speedups)
    if repeats < 1:
        raise ValueError("--repeats must be at least 1")
    limits = validate(constraints)
    trace = None if base.trace is None else offered(base, levels)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    total = len(levels) * repeats
    interrupted = False
    resets = PrefixResets(base, reset_prefix_cache, note)
    with BetweenRuns() as stops:
        for level, repeat in itertools.product(levels, range(repeats)):
            config = level_config(base, level, repeat, out_dir)
            row = run_row(level, repeat, config)
            rows.append(row)
            assert config.output_dir is not None
            previous = _run_id(config.output_dir)
            try:
                stops.check()  # a signal between two runs stops the sweep before the next
                resets.before_run()  # a reset that fails is noted, and the run goes on
                run_loop(run_benchmark(config, display))
                row["status"] = "ok"
            except RunError as exc:
                row["error"] = str(exc)
            except Exception as exc:  # one broken run must not lose a long sweep
                row["error"] = f"{type(exc).__name__}: {exc}"
            except KeyboardInterrupt as exc:
                row["status"], row["error"] = "interrupted", f"{STOPPED_BY}{stop_signal(exc).name}"
                interrupted = True
            _fill(row, config.output_dir, previous)
            if progress is not None:
                progress(row, len(rows), total)
            if interrupted:
                break
    simulated = base.base_url is None or any(row["simulated"] for row in rows)
    result = write_sweep(out_dir, mode, levels, rows, limits, base.public(), simulated, repeats, interrupted)
    result.summary["prefix_cache_reset"] = resets.summary
    if trace is not None:
        result.summary["trace"] = trace
    files.write_json(result.sweep_dir / "summary.json", result.summary)
    return result
