"""Does the meter move what it measures? The same load run as users run it, with the default
telemetry and with ``--telemetry none`` (or the sampler in its own process), side by side.

Each pair is two ``ipw-async run`` processes (each with its built-in simulator) one after the
other at the same concurrency, seed and request count; the order alternates between pairs so
that a machine warming up or slowing down does not favour one side. Printed per side (median
over the pairs, and their ranges): TTFT p50 / p99, e2e p50, loop lag p99, the client's CPU per
SSE event on its event loop and for the whole run, the sampler's share of a core, its ticks'
lateness p99 and its skipped ticks; then the ratio of each default figure to its twin's.
``--versus process`` sets the default against the same telemetry read by ``--sampler process``.
``--rate`` paces the requests instead (constant arrivals): at a trickle (``--rate 0.5
--requests 20``) the core shares are what a run costs a second with next to nothing in flight,
its timers and its sampler, which is what a paced run pays however fast its client is.

    python benchmarks/telemetry_overhead.py [--concurrency 64 | --rate R] [--requests 1500]
        [--pairs 3] [--versus none|process]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TWINS = {"none": ["--telemetry", "none"], "process": ["--sampler", "process"]}
FIGURES = {  # name: (unit, where in summary.json)
    "ttft p50": ("ms", ("latency_s", "ttft", "p50"), 1e3),
    "ttft p99": ("ms", ("latency_s", "ttft", "p99"), 1e3),
    "e2e p50": ("ms", ("latency_s", "e2e", "p50"), 1e3),
    "loop lag p99": ("ms", ("client", "loop_lag_p99_ms"), 1.0),
    "loop CPU/event": ("µs", ("client", "cpu_us_per_event"), 1.0),
    "process CPU/event": ("µs", ("client", "process_cpu_us_per_event"), 1.0),
    "loop core share": ("%", ("harness", "loop_share"), 100.0),
    "process core share": ("%", ("harness", "cpu_share"), 100.0),
    "sampler core share": ("%", ("telemetry", "sampler", "cpu_share"), 100.0),
    "sampler late p99": ("ms", ("telemetry", "sampler", "lateness_ms", "p99"), 1.0),
    "skipped ticks": ("", ("telemetry", "sampler", "skipped_ticks"), 1.0),
}


def run(options: list[str], out: Path, load: list[str], requests: int, seed: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "ipw_async", "run", *load, "-n", str(requests)]
    command += ["--seed", str(seed), "--baseline-s", "1", "-q", "-o", str(out), *options]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def figure(summary: dict[str, Any], path: tuple[str, ...], scale: float) -> float | None:
    value: Any = summary
    for key in path:
        value = (value or {}).get(key)
    return None if value is None else float(value) * scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=64, help="streams in flight")
    parser.add_argument(
        "--rate", type=float, help="requests/s with constant arrivals, in place of --concurrency"
    )
    parser.add_argument("--requests", type=int, default=1500, help="requests measured per run")
    parser.add_argument("--pairs", type=int, default=3, help="runs per side (the order alternates)")
    parser.add_argument(
        "--versus",
        choices=tuple(TWINS),
        default="none",
        help="the twin: no telemetry, or the sampler's own process",
    )
    args = parser.parse_args()
    twin = "--telemetry none" if args.versus == "none" else "--sampler process"
    sides = {"default": [], twin: TWINS[args.versus]}
    found: dict[str, dict[str, list[float]]] = {side: {name: [] for name in FIGURES} for side in sides}
    if args.rate is None:
        load, said = ["-c", str(args.concurrency)], f"c={args.concurrency}"
    else:
        load, said = ["--rate", str(args.rate), "--arrival", "constant"], f"{args.rate:g} requests/s"
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            order = list(sides) if pair % 2 == 0 else list(sides)[::-1]
            for n, side in enumerate(order):
                summary = run(sides[side], Path(tmp) / f"{pair}-{n}", load, args.requests, pair)
                for name, (_, path, scale) in FIGURES.items():
                    value = figure(summary, path, scale)
                    if value is not None:
                        found[side][name].append(value)
    print(f"{said}, {args.requests} requests a run, {args.pairs} pairs (medians)")
    print(f"{'figure':<20}{'default':>12}{twin:>18}{'ratio':>8}   ranges (default; {twin})")
    for name, (unit, _, _) in FIGURES.items():
        default, none = (statistics.median(found[s][name]) if found[s][name] else None for s in sides)
        ratio = f"{default / none:.2f}" if default is not None and none else "—"
        shown = [f"{v:,.2f} {unit}" if v is not None else "—" for v in (default, none)]
        ranges = "; ".join(
            f"{min(v):,.2f}–{max(v):,.2f}" if v else "—" for v in (found[s][name] for s in sides)
        )
        print(f"{name:<20}{shown[0]:>12}{shown[1]:>18}{ratio:>8}   {ranges}")


if __name__ == "__main__":
    main()
