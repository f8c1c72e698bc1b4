"""Whether a finished run's energy figures can be published: every check a reviewer would ask
for, each with its reason where it fails, read from the run's own summary.

A check that could not be made (a run killed before its counters were checked, a meter with
no counter period to judge its gaps by) is unknown, not passed: the verdict is ``valid`` only
when every check passed, ``not valid`` when one failed, and ``unknown`` otherwise.
"""

from __future__ import annotations

from typing import Any

# more than this share of a headline meter's energy imputed (no reading covered its time)
IMPUTED_SHARE = 0.05
# a meter whose longest time without a reading is more than this many of its counter's periods
GAP_PERIODS = 2.0
# a remote meter's clock known to worse than this share of its counter's period (or, with no
# period, worse than CLOCK_BOUND_MS): its intervals land on the wrong requests
CLOCK_BOUND_SHARE = 0.1
CLOCK_BOUND_MS = 5.0
FAULTY_COUNTER = ("stuck", "backwards", "disagrees")


class _Checks:
    def __init__(self) -> None:
        self.checks: dict[str, dict[str, Any]] = {}

    def add(self, name: str, ok: bool | None, detail: str) -> None:
        self.checks[name] = {"ok": ok, "detail": detail}

    def verdict(self) -> dict[str, Any]:
        failed = [c["detail"] for c in self.checks.values() if c["ok"] is False]
        unknown = [c["detail"] for c in self.checks.values() if c["ok"] is None]
        verdict = "not valid" if failed else "unknown" if unknown else "valid"
        return {"verdict": verdict, "reasons": failed, "unknown": unknown, "checks": self.checks}


def publishable(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's ``validity``: the verdict, the reasons it is not valid, what could not be
    checked, and every check with its detail."""
    checks = _Checks()
    simulated = bool(summary.get("simulated"))
    checks.add("measured", not simulated, "its energy is a simulated device's" if simulated else "a real device's energy")
    _ended(checks, summary)
    energy = summary.get("energy") or {}
    headline = energy.get("headline_meters") or []
    checks.add("energy", bool(headline), "an energy meter" if headline else "no energy meter was read")
    meters = {name: m for name, m in (energy.get("meters") or {}).items() if name in headline}
    telemetry = summary.get("telemetry") or {}
    sampler = telemetry.get("sampler") or {}
    _coverage(checks, meters, sampler)
    _counters(checks, telemetry.get("counter_checks"), headline, telemetry.get("counter_checks_skipped"))
    _clocks(checks, telemetry.get("clocks") or {}, headline, sampler)
    _alone(checks, telemetry.get("gpu_processes") or {}, headline)
    saturation = summary.get("saturation") or {}
    over = saturation.get("oversaturated")
    reason = saturation.get("reason") or "not assessed"
    checks.add("load", None if over is None else not over, f"over-saturated: {reason}" if over else reason)
    return checks.verdict()


def _ended(checks: _Checks, summary: dict[str, Any]) -> None:
    if summary.get("complete"):
        checks.add("complete", True, "the run finished its plan")
        return
    why = summary.get("aborted") or summary.get("stopped") or ("interrupted" if summary.get("interrupted") else None)
    checks.add("complete", False, f"the run did not finish: {why or 'it ended before its plan'}")


def _coverage(checks: _Checks, meters: dict[str, Any], sampler: dict[str, Any]) -> None:
    """How much of each headline meter's energy no reading covered, its longest gap, and the
    sampler's skipped ticks."""
    for name, meter in meters.items():
        imputed, total = meter.get("imputed_j"), meter.get("total_j")
        if imputed is None or not total:
            checks.add(f"coverage {name}", None, f"{name}: its imputed energy is not known")
            continue
        share = imputed / total
        ok = share <= IMPUTED_SHARE
        checks.add(
            f"coverage {name}",
            ok,
            f"{name}: {share:.1%} of its energy had no reading (imputed)"
            + ("" if ok else f", over {IMPUTED_SHARE:.0%}"),
        )
        gap = (sampler.get("gaps") or {}).get(name) or {}
        largest, period = gap.get("largest_ms"), gap.get("counter_period_ms")
        if largest is None or period is None:
            checks.add(f"gaps {name}", None, f"{name}: its longest gap without a reading is not known")
        else:
            ok = largest <= GAP_PERIODS * period
            checks.add(
                f"gaps {name}",
                ok,
                f"{name} went {largest:,.0f} ms without a reading (its counter updates every {period:,.0f} ms)",
            )
    skipped = sampler.get("skipped_ticks")
    if skipped is None:
        why = "no telemetry source was read" if sampler.get("samples") == 0 else "the run did not record its end"
        checks.add("sampler", None, f"the sampler's ticks are not known ({why})")
    else:
        checks.add("sampler", skipped == 0, f"the sampler skipped {skipped:,} ticks" if skipped else "no tick skipped")


def _counters(
    checks: _Checks, results: dict[str, Any] | None, headline: list[str], skipped: Any
) -> None:
    if results is None:
        checks.add("counters", None, f"the counters were not checked ({skipped or 'no check recorded'})")
        return
    faulty = [
        f"{name} {check['status']}: {check['reason']}"
        for name, check in results.items()
        if name in headline and check.get("status") in FAULTY_COUNTER
    ]
    checks.add("counters", not faulty, "; ".join(faulty) or "every headline counter passed its check")


def _clocks(checks: _Checks, clocks: dict[str, Any], headline: list[str], sampler: dict[str, Any]) -> None:
    """A remote meter's clock alignment, against its counter's update period."""
    for name in headline:
        # an agent's sources share its clock: a meter's is its agent's (``<channel>@host:port``)
        where = name.partition("@")[2]
        clock = next((c for source, c in clocks.items() if where and source.endswith(f"@{where}")), None)
        if clock is None:
            continue  # read on this machine, or timed on its clock as it was scraped
        bound = clock.get("uncertainty_ms")
        period = ((sampler.get("gaps") or {}).get(name) or {}).get("counter_period_ms")
        limit = CLOCK_BOUND_SHARE * period if period else CLOCK_BOUND_MS
        if bound is None:
            checks.add(f"clock {name}", None, f"{name}: its clock's alignment is not known")
        else:
            checks.add(
                f"clock {name}",
                bound <= limit,
                f"{name}: its clock is known to ±{bound:.2f} ms (at most ±{limit:.1f} ms)",
            )


def _alone(checks: _Checks, processes: dict[str, dict[str, list[int] | None]], headline: list[str]) -> None:
    """Each headline device computing only for the server under test: a whole-device counter
    charges any other process's work to the run's queries. One process there as the load began
    is the server's; another beside it, or one that appeared while it ran, fails."""
    for name in headline:
        seen = processes.get(name)
        if seen is None:
            continue  # a device that cannot list its processes (a simulator, an exporter)
        before, after = seen.get("before"), seen.get("after")
        if before is None or after is None:
            checks.add(f"alone {name}", None, f"{name}: the processes computing on it are not known")
            continue
        joined = sorted(set(after) - set(before))
        if len(before) > 1:
            why = f"{len(before)} processes were computing on {name} as the load began (PIDs {_pids(before)})"
            checks.add(f"alone {name}", False, f"{why}: another's work is charged to these queries")
        elif joined:
            why = f"a process started computing on {name} during the run (PID {_pids(joined)})"
            checks.add(f"alone {name}", False, f"{why}: its work is charged to these queries")
        else:
            checks.add(f"alone {name}", True, f"{name}: no other process computed on it")


def _pids(pids: list[int]) -> str:
    return ", ".join(map(str, pids))
