"""How long ``ipw_async.finalize`` takes on runs of 1,000 to 100,000 requests, and whether it
grows linearly.

``finalize(run_dir)`` re-attributes a finished run from its directory's files alone: it reads
``run.json``, ``measured.arrow`` and ``telemetry.arrow``, attributes the energy
(``ipw_async.energy.attribution``), and writes records (Arrow and Parquet), telemetry as
Parquet, ``traces.jsonl``, ``summary.json`` and ``dataset/``.
This measures its wall time against the run's size.

A long run is made from one real short one, tiled in time. The seed is a real run against the
built-in simulator (``telemetry="sim"``, default physics; closed loop at concurrency 32,
synthetic prompts of 256 and outputs of 64 tokens, length sigma 0.4; ``--seed-requests``
requests). Each tiled directory of N requests is the seed's directory with its data repeated
k = 0, 1, 2, … times, each copy ``k × span`` later on the run clock:

- ``measured.arrow``: new unique ``request_id``\\s (and ``unit_id``\\s), every ``*_ns`` time
  column, list columns (``chunk_ns``, ``chunk_server_ns``) included, shifted by ``k × span``;
  the last copy is cut at N requests;
- ``telemetry.arrow``: the ``t_ns`` and ``<source>.t_ns`` time columns shifted the same way
  (``lateness_ns`` and ``<source>.read_ns`` are durations, left alone), every cumulative
  ``<meter>.energy_j`` raised by ``k ×`` the seed's energy span plus the idle energy of the gap
  between copies, so counters stay monotonic; the last copy ends with its last request's
  tail; written in the seed's own batch sizes, as the sampler flushes them;
- ``run.json``: each counter's learned update grids repeated with their copy (a real run learns
  one every 20 s), ``dispatched`` and ``config.max_queries`` set to N. The span is the seed's
  whole time range plus one sampler tick, stretched to a whole number of counter periods past
  the seed's last grid, so a copy's grid continues the one before it.

Each file keeps the seed's Arrow schema and is written as the harness writes it (an Arrow IPC
stream through ``ipw_async.rundir.files.StreamWriter``). Every timed call starts from the same
pristine files (copied back in, outside the timing), as a finished run leaves them, and is
checked: it must finish and its summary must count N requests, all succeeded and on disk.

Printed per N: the wall time of ``finalize(run_dir)`` (``time.perf_counter``; best of 2 below
50,000 requests, one run above), the part of it spent in ``attribute(...)`` (timed inside the
same call, by wrapping the function finalize calls), the part spent on what it writes for other
tools (``records.parquet``, ``telemetry.parquet`` and IPW's ``dataset/``, timed the same way;
as a share of the rest of finalize, target ≤ 10%), the rest (reading, traces, summary,
writing), seconds per 1,000 requests, and the time per request against the smallest N
(1.00: linear). The target is 100,000 requests within 30 s on a 2-core machine. Each size's
progress line (stderr) also gives the power model the fitted rule chose and how many
candidates it fitted and kept as alike: the cost depends on that selection as well as on N,
so sizes compare cleanly only where it is the same (and a fresh seed may select otherwise).

    python benchmarks/finalize_scale.py [--sizes 1000,10000,100000] [--keep DIR]
        [--seed-requests 500] [--profile N]

``--keep DIR`` keeps the seed (``DIR/seed``; reused when it is already there) and the tiled
directories (``DIR/n<N>``, finalized); without it they go in a temporary directory, deleted at
the end. ``--profile N`` also runs finalize once on N requests under cProfile and prints the
top entries in ``ipw_async`` by cumulative time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import importlib
import io
import math
import pstats
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from ipw_async import RunConfig, finalize, run_benchmark
from ipw_async.rundir import files
from ipw_async.sim import EngineConfig, SimConfig, SimulatorProcess
from ipw_async.telemetry.grid import CounterGrid, chained

# the module, not the function that ipw_async.harness re-exports under the same name
finalize_module = importlib.import_module("ipw_async.results")

CONCURRENCY = 32
TARGET_N = 100_000
TARGET_S = 30.0
PRISTINE = "pristine"  # beside each tiled directory: its files as built, before any finalize
DATA = (
    files.MEASURED,
    files.RECORDS,
    files.TELEMETRY,
    files.TRACES,
    files.SUMMARY,
    files.RUN,
    files.RECORDS_PARQUET,
    files.TELEMETRY_PARQUET,
)
# what finalize writes for other tools (Parquet, IPW's dataset/): its target is ≤ 10% of finalize
EXPORT_SHARE_TARGET = 0.10


# -- the seed run ---------------------------------------------------------------------------------


async def seed_run(run_dir: Path, requests: int) -> None:
    """One real run against the built-in simulator (default physics)."""
    with SimulatorProcess(SimConfig(engine=EngineConfig())) as sim:
        config = RunConfig(
            base_url=sim.base_url,
            output_dir=run_dir,
            telemetry="sim",
            concurrency=CONCURRENCY,
            dataset="synthetic",
            max_queries=requests,
            prompt_tokens=256,
            output_tokens=64,
            length_sigma=0.4,
        )
        await run_benchmark(config)


def stream_batches(path: Path) -> list[int]:
    """The row counts of an Arrow IPC stream's batches (the empty first one left out)."""
    with pa.OSFile(str(path), "rb") as f:
        return [b.num_rows for b in ipc.open_stream(f) if b.num_rows]


def arrow_schema(path: Path) -> pa.Schema:
    with pa.OSFile(str(path), "rb") as f:
        return ipc.open_stream(f).schema


# -- tiling ---------------------------------------------------------------------------------------


@dataclass
class Seed:
    """A finished run's files, and how to lay copies of it end to end in time."""

    run_dir: Path
    manifest: dict[str, Any]
    records: pl.DataFrame
    telemetry: pl.DataFrame
    telemetry_batches: list[int]
    span_ns: int  # each copy starts this much later than the one before
    energy_step: dict[str, float]  # per cumulative energy column: what each copy adds

    @classmethod
    def read(cls, run_dir: Path) -> Seed:
        manifest = files.read_json(run_dir / files.RUN)
        records = files.read_arrow(run_dir / files.MEASURED).sort("request_id")
        telemetry = files.read_arrow(run_dir / files.TELEMETRY)
        if manifest["sessions"]:
            raise SystemExit(f"{run_dir} is a resumed run; the seed must be one session")
        tick_ns = int(manifest["telemetry"]["sample_ms"] * 1e6)
        last = max(
            _max_time(records, _record_time_columns(records)), _max_time(telemetry, _time_columns(telemetry))
        )
        span = _grid_aligned(last + tick_ns, manifest)
        steps = {c: _energy_step(telemetry, c, span, manifest) for c in _energy_columns(telemetry)}
        return cls(
            run_dir, manifest, records, telemetry, stream_batches(run_dir / files.TELEMETRY), span, steps
        )

    def build(self, n: int, out: Path) -> None:
        """A run directory of ``n`` requests at ``out``: the seed's files, tiled."""
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(self.run_dir, out)
        per = self.records.height
        copies = math.ceil(n / per)
        records = [self._records_copy(k) for k in range(copies)]
        records[-1] = records[-1].head(n - per * (copies - 1))
        # the last copy's telemetry: up to its last request's end plus the seed's own tail
        seed_end = _max_time(self.records, ["closed_ns", "last_token_ns", "headers_ns", "sent_ns"])
        tail = _max_time(self.telemetry, ["t_ns"]) - seed_end
        last_end = _max_time(records[-1], ["closed_ns", "last_token_ns", "headers_ns", "sent_ns"])
        self._write_records(pl.concat(records).rechunk(), out / files.MEASURED)
        self._write_telemetry(copies, last_end + tail, out / files.TELEMETRY)
        manifest = self._manifest(n, copies)
        files.write_json(out / files.RUN, manifest)
        for name in (files.RECORDS, files.TRACES, files.SUMMARY):  # finalize makes these: none yet
            (out / name).unlink(missing_ok=True)
        keep = out / PRISTINE
        keep.mkdir()
        for name in (files.MEASURED, files.TELEMETRY, files.RUN):
            shutil.copy2(out / name, keep / name)

    def _records_copy(self, k: int) -> pl.DataFrame:
        if k == 0:
            return self.records
        shift = k * self.span_ns
        per = self.records.height
        columns: list[pl.Expr] = [
            pl.col("request_id") + k * per,
            pl.col("unit_id") + k * per,
        ]
        for name, dtype in self.records.schema.items():
            if not name.endswith("_ns"):
                continue
            if dtype == pl.Int64:
                columns.append(pl.col(name) + shift)
            elif dtype == pl.List(pl.Int64):
                columns.append(pl.col(name).list.eval(pl.element() + shift))
        return self.records.with_columns(columns)

    def _telemetry_copy(self, k: int) -> pl.DataFrame:
        if k == 0:
            return self.telemetry
        shift = k * self.span_ns
        columns = [pl.col(c) + shift for c in _time_columns(self.telemetry)]
        columns += [pl.col(c) + k * step for c, step in self.energy_step.items()]
        return self.telemetry.with_columns(columns)

    def _write_records(self, frame: pl.DataFrame, path: Path) -> None:
        """As a run leaves it: one stream, the seed's schema."""
        files.write_frame(frame, path)
        if arrow_schema(path) != arrow_schema(self.run_dir / files.MEASURED):
            raise AssertionError("tiled measured.arrow has another schema than the seed's")

    def _write_telemetry(self, copies: int, until_ns: int, path: Path) -> None:
        """As the sampler's flushes leave it: the seed's batches, copy after copy."""
        schema = arrow_schema(self.run_dir / files.TELEMETRY)
        writer = files.StreamWriter(path, schema)
        try:
            for k in range(copies):
                frame = self._telemetry_copy(k)
                if k == copies - 1:
                    frame = frame.filter(pl.col("t_ns") <= until_ns)
                start = 0
                for size in self.telemetry_batches:
                    if start >= frame.height:
                        break
                    writer.write(files.to_arrow(frame.slice(start, size)))
                    start += size
        finally:
            writer.close()
        if arrow_schema(path) != schema:
            raise AssertionError("tiled telemetry.arrow has another schema than the seed's")

    def _manifest(self, n: int, copies: int) -> dict[str, Any]:
        manifest = dict(self.manifest)
        telemetry = dict(manifest["telemetry"])
        meters = []
        for meter in telemetry["meters"]:
            grids = meter.get("grids") or []
            tiled = [
                g
                | {
                    "phase_ns": g["phase_ns"] + k * self.span_ns,
                    "learned_at_ns": g["learned_at_ns"] + k * self.span_ns,
                }
                for k in range(copies)
                for g in grids
            ]
            meters.append(meter | {"grids": tiled})
        telemetry["meters"] = meters
        manifest["telemetry"] = telemetry
        manifest["dispatched"] = n
        manifest["config"] = manifest["config"] | {"max_queries": n}
        return manifest


def _time_columns(frame: pl.DataFrame) -> list[str]:
    """Telemetry's instants: the tick (``t_ns``) and each source's reading (``<source>.t_ns``)."""
    return [c for c in frame.columns if c == "t_ns" or c.endswith(".t_ns")]


def _record_time_columns(frame: pl.DataFrame) -> list[str]:
    return [c for c, t in frame.schema.items() if c.endswith("_ns") and t == pl.Int64]


def _energy_columns(frame: pl.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.endswith(".energy_j")]


def _max_time(frame: pl.DataFrame, columns: list[str]) -> int:
    values = [frame.get_column(c).max() for c in columns if c in frame.columns]
    return int(max(v for v in values if v is not None))  # type: ignore[type-var]


def _grid_aligned(least_ns: int, manifest: dict[str, Any]) -> int:
    """The least span ≥ ``least_ns`` after which the first counter grid continues the last
    (the span between them a whole number of periods), so a copy's updates fall where the copy
    before them predicts; ``least_ns`` where there is no counter grid."""
    for meter in manifest["telemetry"]["meters"]:
        grids = chained(tuple(CounterGrid.from_dict(g) for g in meter.get("grids") or ()))
        if grids and grids[-1].period_ns > 0:
            first, last, period = grids[0].phase_ns, grids[-1].phase_ns, grids[-1].period_ns
            periods = math.ceil((least_ns - (last - first)) / period)
            return round(last - first + max(periods, 1) * period)
    return least_ns


def _energy_step(telemetry: pl.DataFrame, column: str, span_ns: int, manifest: dict[str, Any]) -> float:
    """What one copy adds to a cumulative energy column: the seed's rise from first read to
    last, plus idle power (from the baseline window, else the run's mean) over the gap."""
    source = column.removesuffix(".energy_j")
    when = f"{source}.t_ns" if f"{source}.t_ns" in telemetry.columns else "t_ns"
    reads = telemetry.select(pl.col(when).alias("t"), pl.col(column).alias("e")).drop_nulls()
    if reads.height < 2:
        return 0.0
    t = reads.get_column("t").to_numpy()
    e = reads.get_column("e").to_numpy()
    rise, elapsed = float(e[-1] - e[0]), float(t[-1] - t[0])
    power = rise / elapsed if elapsed > 0 else 0.0  # J per ns
    window = manifest.get("baseline_window_ns")
    if window:
        inside = (t >= window[0]) & (t <= window[1])
        if inside.sum() >= 2 and t[inside][-1] > t[inside][0]:
            power = float(e[inside][-1] - e[inside][0]) / float(t[inside][-1] - t[inside][0])
    return rise + power * (span_ns - elapsed)


# -- timing ---------------------------------------------------------------------------------------


def restore(run_dir: Path) -> None:
    """The tiled directory as built: what finalize wrote is put back."""
    for name in DATA:
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "dataset", ignore_errors=True)
    for name in (files.MEASURED, files.TELEMETRY, files.RUN):
        shutil.copy2(run_dir / PRISTINE / name, run_dir / name)


@contextlib.contextmanager
def call_timer(owner: Any, *names: str) -> Iterator[list[float]]:
    """Wall time of each call made to ``owner.<name>`` (as finalize looks them up) while the
    block runs."""
    spent: list[float] = []
    originals: dict[str, Callable[..., Any]] = {name: getattr(owner, name) for name in names}

    def timing(original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent.append(time.perf_counter() - start)

        return timed

    for name, original in originals.items():
        setattr(owner, name, timing(original))
    try:
        yield spent
    finally:
        for name, original in originals.items():
            setattr(owner, name, original)


@dataclass
class Timing:
    n: int
    finalize_s: float
    attribute_s: float
    exports_s: float  # records.parquet, telemetry.parquet and dataset/ (built and written)


def time_finalize(run_dir: Path, n: int, repeats: int) -> tuple[Timing, dict[str, Any]]:
    """The best of ``repeats`` finalize calls, each on the pristine files and each checked
    (:func:`check`); and the summary the last one wrote."""
    best: Timing | None = None
    summary: dict[str, Any] = {}
    for _ in range(repeats):
        restore(run_dir)
        with (
            call_timer(finalize_module, "attribute") as attributing,
            call_timer(finalize_module, "ipw_table", "write_ipw_dataset") as dataset,
            call_timer(files, "write_parquet") as parquet,
        ):
            start = time.perf_counter()
            result = finalize(run_dir)
            elapsed = time.perf_counter() - start
        summary = check(result.summary, run_dir, n)
        if best is None or elapsed < best.finalize_s:
            best = Timing(n, elapsed, sum(attributing), sum(dataset) + sum(parquet))
    assert best is not None
    return best, summary


def check(summary: dict[str, Any], run_dir: Path, n: int) -> dict[str, Any]:
    """A finalized summary must count ``n`` requests, all succeeded and all on disk."""
    requests = summary["requests"]
    if requests["total"] != n or requests["ok"] != n or summary["loss"]["requests_not_recorded"]:
        raise AssertionError(f"{run_dir}: summary counts {requests} (loss {summary['loss']}), not {n}")
    return summary


def profile(run_dir: Path, top: int = 15) -> str:
    restore(run_dir)
    profiler = cProfile.Profile()
    profiler.runcall(finalize, run_dir)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
    stats.print_stats("ipw_async", top)
    return out.getvalue()


def describe(meter: dict[str, Any]) -> str:
    """A meter's summary in brief: conservation, counter grids, and the power model the fitted
    rule chose with the candidates it could not tell from it (each one more split to make: the
    cost of finalize depends on this selection, not on N alone)."""
    out = f"conservation {meter.get('conservation_error', float('nan')):.1e}, {len(meter.get('counter_grids', []))} grids"
    model = meter.get("power_model")
    if model:
        out += f", model {model['model']}"
        selection = model.get("selection")
        if selection is not None:  # the fitted rule's: the candidates it fitted and could not tell apart
            out += (
                f" ({len(selection.get('held_out_error', {}))} fitted, "
                f"{len(selection.get('indistinguishable', []))} alike)"
            )
    return out


def peak_rss_gb() -> float:
    """This process's peak resident memory so far (Linux reports kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def table(timings: list[Timing]) -> str:
    base = timings[0]
    lines = [
        f"{'N':>8}  {'finalize s':>10}  {'attribute s':>11}  {'exports s':>9}  {'exports %':>9}  "
        f"{'other s':>8}  {'s/1k req':>8}  {'×/req vs ' + str(base.n):>13}",
    ]
    for t in timings:
        ratio = (t.finalize_s / t.n) / (base.finalize_s / base.n)
        lines.append(
            f"{t.n:>8}  {t.finalize_s:>10.2f}  {t.attribute_s:>11.2f}  {t.exports_s:>9.2f}  "
            f"{100 * t.exports_s / (t.finalize_s - t.exports_s):>8.1f}%  "
            f"{t.finalize_s - t.attribute_s - t.exports_s:>8.2f}  "
            f"{1000 * t.finalize_s / t.n:>8.3f}  {ratio:>13.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", default="1000,10000,100000", help="request counts, comma-separated")
    parser.add_argument("--keep", type=Path, help="keep the seed and tiled run directories here")
    parser.add_argument("--seed-requests", type=int, default=500, help="requests in the seed run")
    parser.add_argument("--profile", type=int, metavar="N", help="also profile finalize on N requests")
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(",") if s.strip())
    if args.profile and args.profile not in sizes:
        sizes = sorted({*sizes, args.profile})

    with contextlib.ExitStack() as stack:
        root = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="finalize_scale_")))
        root.mkdir(parents=True, exist_ok=True)
        seed_dir = root / "seed"
        if (seed_dir / files.SUMMARY).is_file():
            print(f"seed: reusing {seed_dir}", file=sys.stderr)
        else:
            print(f"seed: {args.seed_requests} requests against the simulator …", file=sys.stderr)
            start = time.perf_counter()
            asyncio.run(seed_run(seed_dir, args.seed_requests))
            print(f"seed: done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        seed = Seed.read(seed_dir)
        print(
            f"seed: {seed.records.height} requests, {seed.telemetry.height} telemetry rows, "
            f"copies {seed.span_ns / 1e9:.3f} s apart, energy step "
            + ", ".join(f"{c} {v:.1f} J" for c, v in seed.energy_step.items()),
            file=sys.stderr,
        )

        timings = []
        for n in sizes:
            run_dir = root / f"n{n}"
            start = time.perf_counter()
            seed.build(n, run_dir)
            built = time.perf_counter() - start
            timing, summary = time_finalize(run_dir, n, repeats=2 if n < 50_000 else 1)
            meters = summary["energy"]["meters"]
            energy = ", ".join(f"{name}: {describe(m)}" for name, m in meters.items())
            print(
                f"n={n}: built in {built:.1f} s ({(run_dir / files.MEASURED).stat().st_size / 1e6:.0f} MB "
                f"records, {(run_dir / files.TELEMETRY).stat().st_size / 1e6:.1f} MB telemetry); "
                f"finalized: {summary['requests']['total']} requests, span {summary['window_s']:.0f} s; {energy}; "
                f"finalize {timing.finalize_s:.2f} s; peak RSS so far {peak_rss_gb():.1f} GB",
                file=sys.stderr,
            )
            timings.append(timing)

        print()
        print(table(timings))
        largest = timings[-1]
        if largest.n == TARGET_N:
            verdict = "met" if largest.finalize_s <= TARGET_S else "NOT met"
            print(
                f"\ntarget {TARGET_N:,} requests within {TARGET_S:.0f} s: {verdict} ({largest.finalize_s:.1f} s)"
            )
        for t in timings:
            share = t.exports_s / (t.finalize_s - t.exports_s)
            verdict = "met" if share <= EXPORT_SHARE_TARGET else "NOT met"
            print(
                f"n={t.n:,}: Parquet and dataset/ add {100 * share:.1f}% to finalize "
                f"(target ≤ {100 * EXPORT_SHARE_TARGET:.0f}%: {verdict})"
            )
        if args.profile:
            print(f"\ncProfile, finalize on {args.profile:,} requests (ipw_async, by cumulative time):")
            print(profile(root / f"n{args.profile}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
