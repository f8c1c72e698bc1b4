"""How close each attribution rule comes to the simulator's true per-query energy.

For each case (concurrency × device counter period, plus a power-only device that forces
integration and a device with telemetry dropouts that forces imputation) this runs the
simulator under load, then attributes the same telemetry with every rule and compares with
the energy the simulated device knows each request used:

- ``tokens+baseline``: the default (static power at the measured idle baseline shared
  equally, the rest by token work); ``tokens``: all energy by token work; ``equal``;
- baselines: ``total/N`` (run total ÷ request count, as AIPerf reports) and ``window``
  (each query's whole-window device energy, as sequential profilers report).

Printed per case and method: conservation error, per-query relative error p50/p95/max for
requests of 2 s or more, signed bias, the p95 in steady state (without the first wave, which
arrives all at once and queues for prefill, and the drain), the sampler's lateness p99, and
how the counter's reads were timed (its learned update grid, or the midpoint between reads).

    python benchmarks/attribution_accuracy.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ipw_async import RunConfig, finalize, run_benchmark
from ipw_async.sim import EngineConfig, SimConfig, SimulatorProcess


@dataclass(frozen=True)
class Case:
    concurrency: int
    counter_ms: float
    telemetry: str = "counter"
    dropout_every_s: int = 0

    @property
    def label(self) -> str:
        device = {
            "counter": f"counter {self.counter_ms:g} ms",
            "avg-power": "avg power only",
            "power": "power only",
        }
        label = device[self.telemetry]
        return f"c={self.concurrency:<3} {label}{' + dropouts' if self.dropout_every_s else ''}"


def cases(quick: bool) -> list[Case]:
    levels = (1, 16, 64) if quick else (1, 4, 16, 64, 256)
    periods = (100.0,) if quick else (10.0, 100.0, 500.0)
    out = [Case(c, p) for p in periods for c in levels]
    out += [Case(16, 100.0, "avg-power"), Case(16, 100.0, "power", dropout_every_s=3)]
    return out


def errors(estimate: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    rel = (estimate - truth) / truth
    return {
        "p50": float(np.percentile(np.abs(rel), 50)),
        "p95": float(np.percentile(np.abs(rel), 95)),
        "max": float(np.abs(rel).max()),
        "bias": float(rel.mean()),
    }


async def run_case(case: Case, tmp: Path) -> dict[str, Any]:
    n = 12 if case.concurrency == 1 else max(96, 4 * case.concurrency)  # waves: first, steady, drain
    sim_config = SimConfig(
        engine=EngineConfig(
            counter_period_ms=case.counter_ms, telemetry=case.telemetry, dropout_every_s=case.dropout_every_s
        )
    )
    run_dir = tmp / f"c{case.concurrency}_{case.telemetry}_{case.counter_ms:g}_{case.dropout_every_s}"
    with SimulatorProcess(sim_config) as sim:
        config = RunConfig(
            base_url=sim.base_url,
            output_dir=run_dir,
            concurrency=case.concurrency,
            dataset="synthetic",
            max_queries=n,
            prompt_tokens=256,
            output_tokens=128,
            length_sigma=0.4,
            telemetry="sim",
        )
        result = await run_benchmark(config)
        truth = httpx.get(f"{sim.root_url}/sim/truth", timeout=10).json()
    raw = result.records
    true = np.array([truth["requests"][str(i)] for i in raw.get_column("request_id").to_list()])
    long = (raw.get_column("e2e_latency_s").fill_null(0) >= 2.0).to_numpy()
    # steady state: after the first wave (which all arrives at once and queues for prefill)
    # and before the drain; what a run with --warmup equal to the concurrency measures
    ids = raw.get_column("request_id").to_numpy()
    drain = raw.get_column("closed_ns").to_numpy() > raw.get_column("sent_ns").max()
    steady = long & (ids >= case.concurrency) & ~drain
    rows: dict[str, Any] = {}
    # each method is the run's own finishing function with other settings (a 0 W baseline:
    # no static share, all energy by the rule)
    methods: dict[str, dict[str, Any]] = {
        "tokens+baseline": {},
        "tokens": {"baseline_w": 0.0},
        "equal": {"attribution": "equal"},
        "window": {"attribution": "window"},
    }
    total = None
    for name, settings in methods.items():
        out = finalize(run_dir, **settings)
        m = out.summary["energy"]["meters"]["sim"]
        total = m["total_j"]
        est = out.records.get_column("energy_j").to_numpy()
        conservation = (
            (m["window_sum_j"] - (m["total_j"] - m["idle_j"])) / m["total_j"]
            if name == "window"
            else m["conservation_error"]
        )
        rows[name] = {
            "conservation": conservation,
            "long": errors(est[long], true[long]) if long.any() else None,
            "steady": errors(est[steady], true[steady]) if steady.sum() >= 5 else None,
            "all": errors(est, true),
            "provenance": dict(
                zip(
                    *np.unique(out.records.get_column("energy_provenance").to_numpy(), return_counts=True),
                    strict=True,
                )
            ),
        }
    est = np.full(true.size, total / true.size)
    rows["total/N"] = {
        "conservation": 0.0,
        "long": errors(est[long], true[long]) if long.any() else None,
        "steady": errors(est[steady], true[steady]) if steady.sum() >= 5 else None,
        "all": errors(est, true),
    }
    return {
        "case": case.label,
        "requests": int(true.size),
        "long_requests": int(long.sum()),
        "truth_vs_measured_total": (sum(truth["requests"].values()) + truth["idle_j"]) / total - 1
        if total
        else None,
        "sampler_lateness_p99_ms": result.summary["telemetry"]["sampler"]["lateness_ms"]["p99"],
        "counter_timing": result.summary["energy"]["meters"]["sim"].get("counter_timing", "—"),
        "methods": rows,
    }


def fmt(err: dict[str, float] | None) -> str:
    if err is None:
        return f"{'—':>7} {'—':>7} {'—':>7} {'—':>8}"
    return f"{err['p50']:>7.1%} {err['p95']:>7.1%} {err['max']:>7.1%} {err['bias']:>+8.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer cases (100 ms counter only)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results = []
    print(
        "per-query relative error vs the simulator's true energy, requests of ≥ 2 s (all requests where none);"
    )
    print(
        "steady p95: the same without the first wave (sent all at once, it queues for prefill) and the drain"
    )
    header = f"{'case':<34} {'method':<16} {'conserv.':>9} {'p50':>7} {'p95':>7} {'max':>7} {'bias':>8}"
    print(f"{header} {'steady p95':>10}  sampler p99  counter reads timed by")
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases(args.quick):
            r = asyncio.run(run_case(case, Path(tmp)))
            results.append(r)
            for i, (name, m) in enumerate(r["methods"].items()):
                label = f"{r['case']} ({r['long_requests']}/{r['requests']} long)" if i == 0 else ""
                tail = f"  {r['sampler_lateness_p99_ms']:.2f} ms  {r['counter_timing']}" if i == 0 else ""
                steady = "—" if m["steady"] is None else f"{m['steady']['p95']:.1%}"
                line = f"{label:<34} {name:<16} {m['conservation']:>9.1e} {fmt(m['long'] or m['all'])}"
                print(f"{line} {steady:>10}{tail}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
