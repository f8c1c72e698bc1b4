"""How close each attribution rule comes to the simulator's true per-query energy.

For each case (concurrency × device counter period, plus a device that reports only its power
averaged over a second, which forces integration, and a power-only device with telemetry
dropouts, which forces imputation) this runs the
simulator under load, then attributes the same telemetry with every rule and compares with
the energy the simulated device knows each request used:

- ``steps (default)``: static power at the measured idle baseline shared equally, each
  engine step inferred from token arrivals costing what the run's fit of step costs says,
  shared by accounting convention v2 (the simulator's truth follows it too); ``fitted``: the
  rest by the power model fitted to the run, its per-step power shared equally;
  ``tokens``: the rest by token work, linearly; ``tokens, 0 W``: all energy by token work;
  ``equal``;
- baselines: ``total/N`` (run total ÷ request count, as AIPerf reports) and ``window``
  (each query's whole-window device energy, as sequential profilers report).

Printed per case and method (columns): ``conserv.``: attributed plus idle energy against the
meter's total, relative (for ``window``: its overcount); ``p50``/``p95``/``max``: per-query
|relative error| for requests of 2 s or more (all requests where none); ``bias``: the signed
mean relative error; ``steady p95``: the p95 in steady state (without the first wave, which
arrives all at once and queues for prefill, and the drain); ``band holds``: how often the
truth lies inside the rule's low/high band, ± the band's median half-width; then the sampler's
lateness p99, how the counter's reads were timed (its learned update grid, or the midpoint
between reads) and the power model the fitted rule chose (the run's summary,
``energy.meters.sim.power_model.model``).

With ``--random N`` it judges the methods on N draws instead, each seeded: the simulator's
physics from ``ipw_async.sim.drawn_physics`` and a workload (prompts of median 64–4,096
tokens, outputs 16–512, length sigma 0.2–1.0; closed loop at 1–128 or Poisson 1–24/s with a
cap), 12 s of sending each. ``--family wide`` (the default) draws the wider family: besides
the classic physics (work exponent 0.5–1.0, prefill work 0.1–1.5, static 30–150 W, dynamic
10–60 W, step 5–30 ms, per-sequence and per-prefill-token step costs over a 4× range, prefill
budget 512–8,192, counter 10–500 ms, prefix caching on or off), each real-device effect is
present in about 60% of draws: ``step`` (power while any step runs, step_w), ``context``
(decode work and step time growing with context, κ), ``position`` (prefill work growing with
the token's position, κp), ``lag`` (the meter lags the power), ``jitter`` (counter updates off
their grid), ``thermal`` (static power leaking up as the die warms) and a power cap that clips
or, as ``stretch``, slows the steps. ``--family classic`` draws the classic physics alone (all
effects absent), exactly the family of before, for "no worse than before" comparisons. Each
draw's physics line names the effects drawn (``effects: none`` when none) and their values
(``step`` W, ``κ`` work/1000 tokens + step ms/1000 tokens, ``κp``, ``lag`` ms, ``jitter`` ms,
``leak`` W with its time constant, ``cap`` W and mode), and the power model chosen.

Each draw's simulator also logs its steps, so five more rows say where an error comes from:
``sim steps+model`` splits the meter over the simulator's own steps as it split each of them
(each step's power as drawn, each request's share as it caused it: what remains is the
meter's resolution, and no rule can do better from it), ``default, sim steps`` is the default
rule with the simulator's own steps in place of the ones it infers (its step costs, or the
power model where it chooses one, fitted over them: what it adds to the floor is the model's
form and fit; the logged steps carry each decoder's work as the device weighed it, its
context and padding in, so this row is given the context weight the rule otherwise fits, and
a draw the last table says its inferred steps bound may be bound by that weight), ``sim power
model`` splits by the simulator's power model over its own steps (it has no term for graph,
forward or per-token joules), ``sim model`` by that model over the steps the run inferred,
and ``fit, true effects`` is the fitted rule told which effects the device has
(``--power-model``). A last table gives each draw's default p95 built up over the
meter, the rule's model and the inferred steps, and the stage that bounds it. Each draw's
line names the decode graphs' padding the default chose (``|``: sizes that pad its batches
alike) beside the one the engine ran, and the aggregate says how often the step times told
it. The aggregate gives each method's
median and worst p95, over all draws and over those with a counter of 100 ms or less; then,
over the latter, the default's checks: draws with a p95 ≤ 5%, the median draw's p95, the
worst draw's band holds and the draws where they are ≥ 90%, the worst |conservation|, the
draws where it is worse than ``tokens`` and where worse than ``equal``, and (wide family) its
median p95 over the draws with and without each effect.

With ``--ablation`` it runs the default physics with every effect absent (``none``), then with
each effect alone at its representative setting (``ipw_async.sim.physics.EFFECTS``), at
concurrency 16 and 64 (16 only with ``--quick``), a 100 ms counter and the cases' synthetic
workload (prompt 256, output 128 tokens, length sigma 0.4), and prints each run as above, then
a table: per effect and concurrency the default's p95, its band holds, the p95 of ``tokens``,
of ``equal`` and of ``sim steps+model`` (the meter's floor), and the power model chosen.

``--runs DIR`` keeps each run's directory there with the simulator's truth (``truth.json``)
and physics (``physics.json``) beside it, and scores those already there again instead of
rerunning them (attribution is a function of the run).

    python benchmarks/attribution_accuracy.py [--quick] [--random N [--family wide|classic] | --ablation]
        [--runs DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ipw_async import RunConfig, finalize, run_benchmark
from ipw_async.sim import EngineConfig, SimConfig, SimulatorProcess, drawn_physics
from ipw_async.sim.account import known_energy
from ipw_async.sim.physics import ABSENT, EFFECTS, effects_of


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


DEFAULT = "steps (default)"  # what `ipw-async run` reports unless told otherwise
FITTED = "fitted"  # the power model fitted to the run, its per-step power shared equally
FLOOR = "sim steps+model"  # the simulator's own steps, split as it split them: the meter's resolution
FORM = "sim power model"  # its power model over its own steps: the power model's form
GIVEN = "fit, true effects"  # the fitted rule told which effects the device has: no selection
COSTED = "default, sim steps"  # the default rule over the simulator's own steps
# Where the default's error comes from, stage by stage: each oracle row removes one stage
STAGES = (
    ("meter", None, FLOOR),
    ("rule", FLOOR, COSTED),
    ("steps", COSTED, DEFAULT),
)


def true_effects(engine: EngineConfig) -> str:
    """The power-model effects (``--power-model``) the simulated device has (of its curve: the
    per-step and per-forward joules of ``graph``, ``rows``, ``forward`` and ``tokens`` have no
    power-model effect, so ``fit, true effects`` and ``sim model`` do not describe them)."""
    present = {
        "curve": engine.work_exponent != 1.0 or math.isfinite(engine.max_w),
        "step": engine.step_w > 0,
        "context": engine.context_work > 0,
        "position": engine.prefill_position_work > 0,
        "lag": engine.meter_lag_ms > 0,
        "drift": engine.thermal_leak_w > 0,
    }
    return "+".join(name for name, on in present.items() if on) or "linear"


def errors(estimate: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    rel = (estimate - truth) / truth
    return {
        "p50": float(np.percentile(np.abs(rel), 50)),
        "p95": float(np.percentile(np.abs(rel), 95)),
        "max": float(np.abs(rel).max()),
        "bias": float(rel.mean()),
    }


async def measure(engine: EngineConfig, options: dict[str, Any], run_dir: Path) -> tuple[Any, dict[str, Any]]:
    """One run against a simulator with this physics; the run's result and the simulator's truth."""
    with SimulatorProcess(SimConfig(engine=engine)) as sim:
        config = RunConfig(base_url=sim.base_url, output_dir=run_dir, telemetry="sim", **options)
        result = await run_benchmark(config)
        truth = httpx.get(f"{sim.root_url}/sim/truth", timeout=10).json()
    return result, truth


async def kept(engine: EngineConfig, options: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The simulator's truth for a run in ``run_dir``: the one kept beside it (``truth.json``),
    or a new run's, kept there with its physics (``physics.json``)."""
    saved, physics = run_dir / "truth.json", run_dir / "physics.json"
    if saved.exists():
        if physics.exists() and json.loads(physics.read_text()) != asdict(engine):
            print(
                f"warning: {run_dir} was run with other physics than asked; scoring it anyway",
                file=sys.stderr,
            )
        return json.loads(saved.read_text())
    # a run interrupted before its truth was kept is run again, over what it left
    _, truth = await measure(engine, options | {"overwrite": True}, run_dir)
    saved.write_text(json.dumps(truth))
    physics.write_text(json.dumps(asdict(engine)))
    return truth


def chosen_model(summary: dict[str, Any]) -> str | None:
    """The power model the fitted rule chose for the simulated meter, from a run's summary."""
    fitted = summary["energy"]["meters"].get("sim", {}).get("power_model") or {}
    return fitted.get("model")


def chosen_graph(summary: dict[str, Any]) -> str | None:
    """The decode graphs' padding the default rule chose (layout and capture sizes), marked
    where the step times did not tell it."""
    fitted = summary["energy"]["meters"].get("sim", {}).get("power_model") or {}
    graph = fitted.get("decode_graph") or {}
    if not graph:
        return None
    told = graph.get("source") == "inferred from step times"
    sizes = "|".join([graph["capture_sizes"], *graph.get("alike", [])])  # alike: the same rows here
    return f"{graph['layout']} {sizes}" + ("" if told else " (kept)")


def _same_padding(chosen: str, ran: str) -> bool:
    """Whether the padding chosen (``layout sizes|alike``) is the one the engine ran."""
    layout, sizes = chosen.split(" ", 1)
    ran_layout, ran_sizes = ran.split(" ", 1)
    return layout == ran_layout and ran_sizes in sizes.split("|")


def true_graph(engine: EngineConfig) -> str:
    """The padding the simulated engine ran, named as :func:`chosen_graph` names it."""
    if not engine.padded_buckets:
        return "dense none"
    return f"{'dense' if engine.dense_batch else 'slots'} {engine.capture_sizes}"


def score(
    run_dir: Path, truth: dict[str, Any], steady_from: int, engine: EngineConfig | None = None
) -> tuple[dict[str, Any], np.ndarray, np.ndarray, dict[str, Any]]:
    """Every method's errors against the truth: measured requests that succeeded, those of
    2 s or more (all where none), and the steady state (from request ``steady_from`` on, before
    the drain). Each method is the run's own finishing function with other settings (a 0 W
    baseline: no static share, all energy by the rule); where the simulator kept its steps
    (``engine``: its physics), also the split its own steps and physics give. Also the summary
    the default method finishes the run with (its power model: :func:`chosen_model`)."""
    methods: dict[str, dict[str, Any]] = {
        DEFAULT: {"attribution": "steps"},
        FITTED: {"attribution": "fitted"},
        "tokens": {"attribution": "tokens"},
        "tokens, 0 W": {"attribution": "tokens", "baseline_w": 0.0},
        "equal": {"attribution": "equal"},
        "window": {"attribution": "window"},
    }
    if engine is not None:
        methods = {
            DEFAULT: methods.pop(DEFAULT),
            GIVEN: {"attribution": "fitted", "power_model": true_effects(engine)},
        } | methods
    rows: dict[str, Any] = {}
    total = None
    summary: dict[str, Any] = {}
    for name, settings in methods.items():
        out = finalize(run_dir, **settings)
        if name == DEFAULT:
            summary = out.summary
        m = out.summary["energy"]["meters"]["sim"]
        total = m["total_j"]
        raw = out.records
        keep = (~raw.get_column("warmup") & (raw.get_column("status") == "ok")).to_numpy()
        true = np.array([truth["requests"][str(i)] for i in raw.get_column("request_id").to_list()])[keep]
        est = raw.get_column("energy_j").to_numpy()[keep]
        long = (raw.get_column("e2e_latency_s").fill_null(0) >= 2.0).to_numpy()[keep]
        # steady state: after the first wave (which all arrives at once and queues for
        # prefill) and before the drain; what a run with --warmup equal to the load measures
        ids = raw.get_column("request_id").to_numpy()[keep]
        drain = (raw.get_column("closed_ns").to_numpy() > raw.get_column("sent_ns").max())[keep]
        steady = long & (ids >= steady_from) & ~drain
        conservation = (
            (m["window_sum_j"] - (m["total_j"] - m["idle_j"])) / m["total_j"]
            if name == "window"
            else m["conservation_error"]
        )
        low = raw.get_column("energy_low_j").to_numpy()[keep]
        high = raw.get_column("energy_high_j").to_numpy()[keep]
        inside = (true >= low * (1 - 1e-9)) & (true <= high * (1 + 1e-9))
        rows[name] = {
            "conservation": conservation,
            # how often the truth falls in the run's uncertainty band, and the band's median half-width
            "band": {
                "inside": int(inside.sum()),
                "queries": int(inside.size),
                "holds": float(inside.mean()),
                "holds_long": float(inside[long].mean()) if long.any() else None,
                "half_width": float(np.median((high - low) / 2 / est)),
            }
            if name != "window"
            else None,
            "long": errors(est[long], true[long]) if long.any() else None,
            "steady": errors(est[steady], true[steady]) if steady.sum() >= 5 else None,
            "all": errors(est, true),
            "provenance": dict(
                zip(
                    *np.unique(raw.get_column("energy_provenance").to_numpy()[keep], return_counts=True),
                    strict=True,
                )
            ),
        }

    def unconstrained(est: np.ndarray) -> dict[str, Any]:
        return {
            "conservation": 0.0,
            "long": errors(est[long], true[long]) if long.any() else None,
            "steady": errors(est[steady], true[steady]) if steady.sum() >= 5 else None,
            "all": errors(est, true),
        }

    rows["total/N"] = unconstrained(np.full(true.size, total / true.size))
    if engine is not None and "steps" in truth:
        # the simulator's own steps and physics in place of the run's inferences: what is left
        # is the meter's resolution (logged steps), that and the power model's form, or those
        # and the inferred steps
        ids = raw.get_column("request_id").to_numpy()[keep]
        known = known_energy(run_dir, truth, engine)
        for name, key in (
            (FLOOR, "logged steps"),
            (COSTED, "logged steps, default rule"),
            (FORM, "logged steps, power model"),
            ("sim model", "inferred steps"),
        ):
            rows[name] = unconstrained(np.array([known[key][i] for i in ids]))
    return rows, true, long, summary


async def run_case(case: Case, runs: Path, effect: str | None = None) -> dict[str, Any]:
    """One fixed case; with ``effect`` (``"none"`` or a key of ``EFFECTS``), at the default
    physics with every effect absent but that one, its steps logged and judged as well."""
    n = 12 if case.concurrency == 1 else max(96, 4 * case.concurrency)  # waves: first, steady, drain
    pinned = {
        "counter_period_ms": case.counter_ms,
        "telemetry": case.telemetry,
        "dropout_every_s": case.dropout_every_s,
    }
    if effect is None:
        engine = EngineConfig(**pinned)  # type: ignore[arg-type]
    else:
        engine = EngineConfig(**(ABSENT | EFFECTS.get(effect, {}) | pinned), record_steps=True)  # type: ignore[arg-type]
    prefix = "" if effect is None else f"ablation-{effect}_"
    run_dir = (
        runs / f"{prefix}c{case.concurrency}_{case.telemetry}_{case.counter_ms:g}_{case.dropout_every_s}"
    )
    options = {
        "concurrency": case.concurrency,
        "dataset": "synthetic",
        "max_queries": n,
        "prompt_tokens": 256,
        "output_tokens": 128,
        "length_sigma": 0.4,
    }
    truth = await kept(engine, options, run_dir)
    scored = engine if effect is not None else None
    rows, true, long, summary = score(run_dir, truth, steady_from=case.concurrency, engine=scored)
    meter = summary["energy"]["meters"]["sim"]
    total = meter["total_j"]
    return {
        "case": case.label if effect is None else f"{effect:<8} c={case.concurrency:<3}",  # 100 ms counter
        "effect": effect,
        "concurrency": case.concurrency,
        "requests": int(true.size),
        "long_requests": int(long.sum()),
        "truth_vs_measured_total": (sum(truth["requests"].values()) + truth["idle_j"]) / total - 1
        if total
        else None,
        "sampler_lateness_p99_ms": summary["telemetry"]["sampler"]["lateness_ms"]["p99"],
        "counter_timing": meter.get("counter_timing", "—"),
        "model": chosen_model(summary),
        "methods": rows,
    }


def effects_label(e: EngineConfig) -> str:
    """The real-device effects present in ``e`` and their settings, compactly."""
    values = []
    if e.step_w > 0:
        values.append(f"step {e.step_w:.0f} W")
    if e.context_work > 0 or e.step_per_context_ms > 0:
        values.append(f"κ {e.context_work:.2f}+{e.step_per_context_ms:.3f} ms")
    if e.prefill_position_work > 0:
        values.append(f"κp {e.prefill_position_work:.2f}")
    if e.meter_lag_ms > 0:
        values.append(f"lag {e.meter_lag_ms:.0f} ms")
    if e.counter_jitter_ms > 0:
        values.append(f"jitter {e.counter_jitter_ms:.1f} ms")
    if e.thermal_leak_w > 0:
        values.append(f"leak {e.thermal_leak_w:.0f} W τ {e.thermal_tau_s:.0f} s")
    if e.power_limit != ABSENT["power_limit"] or e.max_w != ABSENT["max_w"]:
        values.append(f"cap {e.max_w:.0f} W {e.power_limit}")
    if e.decode_step_j > 0 or e.decode_row_j > 0:
        values.append(f"graph {e.decode_step_j:.2f} J + {e.decode_row_j:.3f} J/row")
    if e.padded_buckets:
        values.append("padded")
    if e.prefill_forward_j > 0 or e.prefill_token_j > 0:
        values.append(f"forward {e.prefill_forward_j:.2f} J + {e.prefill_token_j:.3f} J/token")
    if e.clocks_up_w > 0:
        values.append(f"serving +{e.clocks_up_w:.0f} W")
    names = ",".join(effects_of(e)) or "none"
    return f"effects: {names}" + (f" ({', '.join(values)})" if values else "")


@dataclass(frozen=True)
class Draw:
    """One randomized case: physics (of ``family``) and workload drawn from ``seed``."""

    seed: int
    family: str
    engine: EngineConfig
    options: dict[str, Any]
    steady_from: int

    @classmethod
    def of(cls, seed: int, family: str = "wide") -> Draw:
        rng = random.Random(10_000 + seed)  # the workload's own stream, apart from the physics'
        engine = drawn_physics(seed, effects=family == "wide", record_steps=True)
        options: dict[str, Any] = {
            "dataset": "synthetic",
            "prompt_tokens": round(math.exp(rng.uniform(math.log(64), math.log(4096)))),
            "output_tokens": round(math.exp(rng.uniform(math.log(16), math.log(512)))),
            "length_sigma": rng.uniform(0.2, 1.0),
            "seed": seed,
            # bounded in time, not count: a draw of long outputs on slow steps takes minutes a wave
            "duration": 12.0,
            "max_queries": 240,
        }
        if rng.random() < 0.5:
            c = round(math.exp(rng.uniform(0, math.log(128))))
            options |= {"concurrency": c, "warmup": min(c, 32)}
            steady = c
        else:
            cap = rng.choice((16, 32, 64, 128))
            options |= {"rate": rng.uniform(1.0, 24.0), "max_concurrency": cap, "warmup": 8}
            steady = 0
        return cls(seed, family, engine, options, steady)

    @property
    def run_name(self) -> str:
        # classic draws keep the name they had before the wide family, so kept runs still score
        return f"draw{self.seed}" if self.family == "classic" else f"{self.family}{self.seed}"

    @property
    def label(self) -> str:
        e, o = self.engine, self.options
        load = (
            f"c={o['concurrency']}"
            if "concurrency" in o
            else f"r={o['rate']:.1f}/s cap {o['max_concurrency']}"
        )
        cache = " cache" if e.prefix_cache else ""
        return (
            f"#{self.seed:<2} {load:<16} in {o['prompt_tokens']:>4}/out {o['output_tokens']:>3} · "
            f"{e.static_w:.0f}+{e.dynamic_w:.0f}·w^{e.work_exponent:.2f} W, pf {e.prefill_work:.2f}, "
            f"step {e.step_base_ms:.0f} ms, budget {e.prefill_budget_tokens}, counter {e.counter_period_ms:.0f} ms{cache}"
            f" · {effects_label(e)}"
        )


async def run_draw(draw: Draw, runs: Path) -> dict[str, Any]:
    """One draw, scored; a run already in ``runs`` (with its truth) is scored again, not rerun."""
    run_dir = runs / draw.run_name
    truth = await kept(draw.engine, draw.options, run_dir)
    rows, true, long, summary = score(run_dir, truth, steady_from=draw.steady_from, engine=draw.engine)
    return {
        "case": draw.label,
        "seed": draw.seed,
        "family": draw.family,
        "effects": effects_of(draw.engine),
        "counter_ms": draw.engine.counter_period_ms,
        "requests": int(true.size),
        "long_requests": int(long.sum()),
        "sampler_lateness_p99_ms": summary["telemetry"]["sampler"]["lateness_ms"]["p99"],
        "model": chosen_model(summary),
        "graphs": chosen_graph(summary),
        "true_graphs": true_graph(draw.engine),
        "methods": rows,
    }


def p95(method: dict[str, Any]) -> float:
    return (method["long"] or method["all"])["p95"]


def print_aggregate(results: list[dict[str, Any]]) -> None:
    """Median and worst p95 of each method, over all draws and over those with a counter ≤ 100 ms;
    then the default rule's checks over the latter."""
    names = list(results[0]["methods"])
    fast = [r for r in results if r["counter_ms"] <= 100]
    print(f"\naggregate p95 over {len(results)} draws ({len(fast)} with a counter ≤ 100 ms):")
    print(
        f"{'method':<16} {'median':>8} {'worst':>8} {'median ≤100ms':>14} {'worst ≤100ms':>13} {'worst conserv.':>15}"
    )
    for name in names:
        all_p = [p95(r["methods"][name]) for r in results]
        fast_p = [p95(r["methods"][name]) for r in fast] or [float("nan")]
        worst_c = max(abs(r["methods"][name]["conservation"]) for r in results)
        print(
            f"{name:<16} {np.median(all_p):>8.1%} {max(all_p):>8.1%} {np.median(fast_p):>14.1%} "
            f"{max(fast_p):>13.1%} {worst_c:>15.1e}"
        )
    beaten = sum(p95(r["methods"][DEFAULT]) > p95(r["methods"]["equal"]) for r in results)
    print(f"draws where the default rule is worse than equal: {beaten} of {len(results)}")
    bands = [r["methods"][DEFAULT]["band"] for r in results]
    inside, queries = sum(b["inside"] for b in bands), sum(b["queries"] for b in bands)
    print(
        f"the default rule's band holds the truth for {inside / queries:.1%} of {queries} queries "
        f"(worst draw {min(b['holds'] for b in bands):.1%}); median half-width "
        f"{np.median([b['half_width'] for b in bands]):.1%}"
    )
    told = [r for r in results if r.get("graphs") and not r["graphs"].endswith("(kept)")]
    right = sum(_same_padding(r["graphs"], r["true_graphs"]) for r in told)
    print(
        f"decode-graph padding told by the step times in {len(told)} of {len(results)} draws, "
        f"as the engine ran it in {right} of those"
    )
    if not fast:
        return
    n = len(fast)
    default = [p95(r["methods"][DEFAULT]) for r in fast]
    holds = [r["methods"][DEFAULT]["band"]["holds"] for r in fast]
    worse = {
        other: sum(p95(r["methods"][DEFAULT]) > p95(r["methods"][other]) for r in fast)
        for other in ("tokens", "equal")
    }
    print(f"the default rule over the {n} draws with a counter ≤ 100 ms:")
    print(
        f"  p95 ≤ 5% in {sum(p <= 0.05 for p in default)} of {n}; the median draw's p95 {np.median(default):.1%}"
    )
    print(f"  band holds: worst draw {min(holds):.1%}; ≥ 90% in {sum(h >= 0.9 for h in holds)} of {n}")
    print(f"  worst |conservation| {max(abs(r['methods'][DEFAULT]['conservation']) for r in fast):.1e}")
    print(f"  worse than tokens in {worse['tokens']} of {n}; worse than equal in {worse['equal']} of {n}")
    if any(r.get("effects") for r in fast):
        print("  median p95 with / without each effect (draws):")
        for name in EFFECTS:
            with_ = [p for p, r in zip(default, fast, strict=True) if name in r.get("effects", ())]
            without = [p for p, r in zip(default, fast, strict=True) if name not in r.get("effects", ())]
            print(
                f"    {name:<9} {median_of(with_):>7} ({len(with_)}) / {median_of(without):>7} ({len(without)})"
            )


def print_bounds(results: list[dict[str, Any]]) -> None:
    """Per draw, the default's p95 built up stage by stage from the oracles: the meter's floor
    (the simulator's steps, split as it split them), then the default rule over those steps
    (its model's form and fit), then over the steps it infers (the default itself); the
    largest step bounds it."""
    print("\nwhere the default's p95 comes from, stage by stage (each oracle row removes one stage):")
    print(f"{'draw':<5} {'counter':>8} {'meter':>7} {'+rule':>7} {'+steps':>7}  bound    effects")
    bounds: dict[str, list[int]] = {name: [] for name, _, _ in STAGES}
    for r in results:
        seed = r["seed"]
        m = r["methods"]
        if COSTED not in m:
            continue
        steps = {name: p95(m[row]) - (p95(m[base]) if base else 0.0) for name, base, row in STAGES}
        bound = max(steps, key=lambda name: steps[name])
        bounds[bound].append(seed)
        print(
            f"#{seed:<4} {r['counter_ms']:>6.0f}ms {steps['meter']:>7.1%} {steps['rule']:>+7.1%} "
            f"{steps['steps']:>+7.1%}  {bound:<8} {','.join(r['effects']) or 'none'}"
        )
    print("draws bounded by each stage: " + "; ".join(f"{k} {len(v)} {v}" for k, v in bounds.items()))


def median_of(values: list[float]) -> str:
    return f"{np.median(values):.1%}" if values else "—"


def print_ablation(results: list[dict[str, Any]]) -> None:
    """Per effect alone (``none``: all absent) and concurrency: the default against the other rules and the floor."""
    print("\nablation: the default physics with every effect absent (none), then each effect alone")
    print(
        f"{'effect':<9} {'c':>3} {'default p95':>11} {'band holds':>10} {'tokens p95':>10} "
        f"{'equal p95':>9} {'floor p95':>9}  power model"
    )
    for r in results:
        m = r["methods"]
        floor = f"{p95(m[FLOOR]):.1%}" if FLOOR in m else "—"
        print(
            f"{r['effect']:<9} {r['concurrency']:>3} {p95(m[DEFAULT]):>11.1%} {m[DEFAULT]['band']['holds']:>10.1%} "
            f"{p95(m['tokens']):>10.1%} {p95(m['equal']):>9.1%} {floor:>9}  {r['model'] or '—'}"
        )
    print(
        "(p95: per-query |relative error| of requests ≥ 2 s; floor: sim steps+model, the meter's resolution)"
    )


def fmt(err: dict[str, float] | None) -> str:
    if err is None:
        return f"{'—':>7} {'—':>7} {'—':>7} {'—':>8}"
    return f"{err['p50']:>7.1%} {err['p95']:>7.1%} {err['max']:>7.1%} {err['bias']:>+8.1%}"


def print_case(r: dict[str, Any], tail: str) -> None:
    if len(r["case"]) > 34:  # a drawn case: its physics on a line of its own
        graphs = f" · graphs {r['graphs']} (ran {r['true_graphs']})" if r.get("graphs") else ""
        print(
            f"{r['case']} ({r['long_requests']}/{r['requests']} long) · model {r.get('model') or '—'}{graphs}"
        )
    for i, (name, m) in enumerate(r["methods"].items()):
        label = "" if i or len(r["case"]) > 34 else f"{r['case']} ({r['long_requests']}/{r['requests']} long)"
        steady = "—" if m["steady"] is None else f"{m['steady']['p95']:.1%}"
        line = f"{label:<34} {name:<16} {m['conservation']:>9.1e} {fmt(m['long'] or m['all'])}"
        band = "" if m.get("band") is None else f" {m['band']['holds']:>6.1%} ±{m['band']['half_width']:.0%}"
        print(f"{line} {steady:>10}{band:>12}{tail if i == 0 else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer cases (100 ms counter only; ablation at c=16)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--random",
        type=int,
        metavar="N",
        help="instead: N draws of physics and workload at random (seeds S..S+N-1), each judged alike",
    )
    parser.add_argument(
        "--seed-start",
        type=int,
        default=0,
        metavar="S",
        help="the first draw's seed (default 0); report claims on a range never used while developing",
    )
    mode.add_argument(
        "--ablation",
        action="store_true",
        help="instead: the default physics with every effect absent, then each effect alone, at c=16 and 64",
    )
    parser.add_argument(
        "--family",
        choices=("wide", "classic"),
        default="wide",
        help="with --random: the physics family drawn: wide (with the real-device effects) or classic "
        "(none of them: the family of before)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--runs",
        type=Path,
        help="keep each run's directory and truth here, and score those already there again "
        "instead of rerunning them (attribution is a function of the run)",
    )
    args = parser.parse_args()
    results = []
    print(
        "per-query relative error vs the simulator's true energy, requests of ≥ 2 s (all requests where none);"
    )
    print(
        "steady p95: the same without the first wave (sent all at once, it queues for prefill) and the drain;"
    )
    print("band holds: how often the truth is inside the rule's low/high band, ± its median half-width")
    header = f"{'case':<34} {'method':<16} {'conserv.':>9} {'p50':>7} {'p95':>7} {'max':>7} {'bias':>8}"
    print(f"{header} {'steady p95':>10} {'band holds':>12}  sampler p99  counter reads timed by  power model")
    with tempfile.TemporaryDirectory() as tmp:
        runs = args.runs or Path(tmp)
        runs.mkdir(parents=True, exist_ok=True)
        if args.random:
            for seed in range(args.seed_start, args.seed_start + args.random):
                draw = Draw.of(seed, args.family)
                r = asyncio.run(run_draw(draw, runs))
                results.append(r)
                print_case(r, tail=f"  {r['sampler_lateness_p99_ms']:.2f} ms")
            print_aggregate(results)
            print_bounds(results)
        else:
            todo = (
                [(Case(c, 100.0), e) for e in ("none", *EFFECTS) for c in ((16,) if args.quick else (16, 64))]
                if args.ablation
                else [(case, None) for case in cases(args.quick)]
            )
            for case, effect in todo:
                r = asyncio.run(run_case(case, runs, effect))
                results.append(r)
                print_case(
                    r,
                    tail=f"  {r['sampler_lateness_p99_ms']:.2f} ms  {r['counter_timing']}  {r['model'] or '—'}",
                )
            if args.ablation:
                print_ablation(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
