"""Per-query energy from a run's telemetry: every joule goes to a query or to idle.

The run's timeline is cut at every telemetry knot and every request event. Each meter becomes
a *virtual counter* E(t): a cumulative counter as read (re-timed to when its value changed),
or power integrated by the trapezoid rule. In each elementary interval the meter's ΔE goes to
the requests active in it by a weight rule, or to idle when none is. With a baseline power,
the static part (baseline × dt) is shared equally among active requests and only the rest by
the rule. Where telemetry has a gap, or does not reach a request's window, ΔE is imputed from
mean power and the request's provenance says so. Sums are exact: attributed + idle = total.

The meter only knows energy per knot interval (one counter update, ~10–100 ms), while an
engine step is ~20 ms and a prefill step draws more than a decode step. So the work rules
pool a knot interval's share and split it by each request's work in the whole interval:
power follows work inside it, instead of being flat in time (the equal rule stays per piece).
With a baseline, the energy above it in the interval's idle parts is pooled too: the counter
spreads a burst of work over its period, but an idle device draws its baseline.

Work is placed where the engine did it (:mod:`power_model`): engine steps are the bursts of
token arrivals across all streams; a token is decode work in the step that delivered it, and
a prompt's computed tokens are prefill work in the steps before its first token that ran
longer than decoding alone explains, first come, first served. A request queued behind
others did no work while it waited. The default rule, ``fitted``, weighs each step by the
device's power model fitted to the run (static power, a concave curve in work up to a power
cap, a prompt token's weight), so a light step gets its due share of a reading that also
holds a heavy one; ``tokens`` counts work linearly, a prompt token at ``prefill_weight``.

Each request also gets a band, low to high: the least and most it could have used over the
work models the meter cannot tell apart (prefill spread or all in its last step, a prompt
token worth 0.1 to 1.5 output tokens, static power as measured or none), widened by its share
of the energy that a linear fit of energy to work leaves unexplained in its meter intervals.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
from scipy.optimize import nnls

from . import power_model
from ._clock import NS
from .power_model import computed_prompt_tokens
from .records import end_ns
from .telemetry.base import Meter
from .telemetry.cadence import PROBE_INTERVAL_NS, CounterGrid, last_updates

RULES = ("fitted", "tokens", "equal", "window")
# the prefill weights a band spans: a prompt token costs from a tenth to 1.5 output tokens on
# the servers we know (batched prefill is cheaper per token than a decode step)
BAND_PREFILL_WEIGHTS = (power_model.LEAST_PREFILL_WEIGHT, power_model.MOST_PREFILL_WEIGHT)


@dataclass(frozen=True)
class AttributionConfig:
    rule: str = "fitted"
    # a prompt token's work relative to an output token (prefill is batched, so cheaper per token)
    prefill_weight: float = 0.25
    baseline_w: float | None = None  # given idle power for accelerator meters
    baseline_window_ns: tuple[int, int] | None = None  # measure idle power over this window
    session_starts_ns: tuple[int, ...] = ()  # resumed sessions: no energy counted across the gap
    gap_factor: float = 4.0  # a telemetry gap longer than this × median spacing is imputed

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"unknown attribution rule {self.rule!r}; choose one of {', '.join(RULES)}")


@dataclass
class MeterResult:
    """One meter's attribution: per-request arrays aligned with the requests frame."""

    meter: str
    kind: str
    energy_j: np.ndarray
    window_j: np.ndarray
    provenance: list[str]
    mean_power_w: np.ndarray
    low_j: np.ndarray  # the band: the least and the most each request could have used
    high_j: np.ndarray
    totals: dict[str, Any] = field(default_factory=dict)


@dataclass
class VirtualCounter:
    t: np.ndarray  # ns since run start, strictly increasing
    e: np.ndarray  # joules, non-decreasing
    imputed: np.ndarray  # per knot interval: True where the energy was imputed


def _gap_mask(t: np.ndarray, factor: float) -> np.ndarray:
    dt = np.diff(t)
    if dt.size == 0:
        return np.zeros(0, dtype=bool)
    typical = float(np.median(dt))
    return dt > factor * max(typical, 1.0)


def counter_knots(
    t: np.ndarray, e: np.ndarray, grids: tuple[CounterGrid, ...] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """Knots from a cumulative counter that updates more slowly than it is read.

    A value first seen at t_i was produced somewhere after t_{i-1}: at the last update of
    the counter's learned ``grids`` when there are any, else at the midpoint, its best
    guess. Repeated reads of a stale value carry no information and are dropped.
    """
    if t.size < 2:
        return t.astype(float), e.astype(float)
    changed = np.flatnonzero(np.diff(e) > 0) + 1
    at = (t[changed - 1] + t[changed]) / 2.0
    if grids:
        update = last_updates(grids, t[changed].astype(float))
        before = t[changed - 1]
        # an update the grid puts just before the read that still saw the old value is the
        # grid's own error: it came just after that read; one it cannot explain: midpoint
        near = before - update < PROBE_INTERVAL_NS
        at = np.where(update > before, update, np.where(near, before, at))
    # the first value, too, was made at the grid's update before its read (a 500 ms counter's
    # first interval otherwise spans up to half a period too little time: 93 W for 70 W idle)
    first = last_updates(grids, t[:1].astype(float)) if grids else t[:1]
    kt = np.concatenate((first, at))
    ke = np.concatenate(([e[0]], e[changed]))
    if t[-1] > kt[-1] and changed.size == 0:
        kt, ke = np.append(kt, t[-1]), np.append(ke, e[-1])
    return kt.astype(float), ke.astype(float)


def _series(
    telemetry: pl.DataFrame, time_column: str, value_column: str
) -> tuple[np.ndarray, np.ndarray] | None:
    """A column's non-null readings in time order, or None with fewer than two."""
    if time_column not in telemetry.columns:
        return None
    rows = telemetry.select(time_column, value_column).drop_nulls()
    if rows.height < 2:
        return None
    t = rows.get_column(time_column).to_numpy().astype(float)
    v = rows.get_column(value_column).to_numpy().astype(float)
    order = np.argsort(t, kind="stable")
    return t[order], v[order]


def _continued(t: np.ndarray, e: np.ndarray, breaks: tuple[int, ...]) -> np.ndarray:
    """A counter made non-decreasing within each session, each session continuing from the
    previous one's last reading (the gap between them counts nothing)."""
    out = np.empty_like(e)
    edges = [0, *np.searchsorted(t, sorted(breaks)).tolist(), t.size]
    carry = None
    for a, b in itertools.pairwise(edges):
        if a >= b:
            continue
        part = np.maximum.accumulate(e[a:b])
        out[a:b] = part if carry is None else part - part[0] + carry
        carry = out[b - 1]
    return out


def virtual_counter(
    telemetry: pl.DataFrame, meter: Meter, gap_factor: float, breaks: tuple[int, ...] = ()
) -> VirtualCounter | None:
    """A meter's cumulative energy as knots, or None when it produced no usable data.

    At each of ``breaks`` (where a resumed session began) the time since the previous session's
    last reading counts no energy: the run was not running, and a new process's counter (the
    simulator's) may have started again from zero."""
    if meter.kind == "counter" and meter.energy_column in telemetry.columns:
        series = _series(telemetry, f"{meter.source}.t_ns", meter.energy_column)
        if series is None:
            return None
        kt, ke = counter_knots(series[0], _continued(*series, breaks), meter.grids)
    elif meter.power_column in telemetry.columns:
        series = _series(telemetry, f"{meter.source}.t_ns", meter.power_column)
        if series is None:
            return None
        kt, p = series
        ke = np.concatenate(([0.0], np.cumsum((p[1:] + p[:-1]) / 2.0 * np.diff(kt) / NS)))
    else:
        return None
    keep = np.concatenate(([True], np.diff(kt) > 0))
    kt, ke = kt[keep], ke[keep]
    for b in breaks:
        i = int(np.searchsorted(kt, b))
        if 0 < i < kt.size:
            ke[i:] += ke[i - 1] - ke[i]
    if kt.size < 2:
        return None
    return VirtualCounter(kt, ke, _gap_mask(kt, gap_factor))


def extend_counter(vc: VirtualCounter, start: float, end: float) -> VirtualCounter:
    """Cover [start, end] by extrapolating at the mean covered power (those intervals are imputed)."""
    t, e, imp = vc.t, vc.e, vc.imputed
    rate = (e[-1] - e[0]) / (t[-1] - t[0])
    if start < t[0]:
        t = np.concatenate(([start], t))
        e = np.concatenate(([e[0] - rate * (vc.t[0] - start)], e))
        imp = np.concatenate(([True], imp))
    if end > t[-1]:
        t = np.append(t, end)
        e = np.append(e, e[-1] + rate * (end - t[-2]))
        imp = np.append(imp, True)
    return VirtualCounter(t, e, imp)


@dataclass
class Segments:
    """Piecewise-constant weight densities: request index, start, end (ns), weight per ns;
    ``prefill`` is the prompt-token density at weight 1, to add at a chosen weight."""

    req: np.ndarray
    start: np.ndarray
    end: np.ndarray
    density: np.ndarray
    prefill: np.ndarray | None = None

    def weighted(self, prefill_weight: float) -> Segments:
        """The same segments with prompt tokens at ``prefill_weight``."""
        if self.prefill is None:
            return self
        return Segments(self.req, self.start, self.end, self.density + prefill_weight * self.prefill)


def _last_step_segments(requests: pl.DataFrame, steps: np.ndarray) -> Segments:
    """Prefill work (prompt tokens, weighed later, + the first token) all over the engine step
    (``steps``: their start times) that ended with the first token, then each chunk's tokens
    over the gap since the previous chunk: one of the placements the band spans."""
    reqs, starts, ends, weights, prompts = [], [], [], [], []
    cols = requests.select("sent_ns", "end_ns", "chunk_ns", "chunk_tokens", computed_prompt_tokens())
    for i, (sent, end, chunks, tokens, prompt) in enumerate(cols.iter_rows()):
        if chunks:
            # the burst before the one holding the first token ended the previous step
            k = int(np.searchsorted(steps, chunks[0], side="right")) - 2
            if k >= 0:
                sent = max(sent, steps[k])
        if not chunks:
            reqs.append(i)
            starts.append(sent)
            ends.append(end)
            weights.append(1e-9)  # so a prompt of no computed tokens still marks the request busy
            prompts.append(float(prompt))
            continue
        # chunks stamped in the same read arrived together: their tokens share one gap
        uniq, inverse = np.unique(np.asarray(chunks, dtype=float), return_inverse=True)
        tok_u = np.bincount(inverse, weights=np.asarray(tokens, dtype=float))
        reqs.extend([i] * uniq.size)
        starts.extend([sent, *uniq[:-1].tolist()])
        ends.extend(uniq.tolist())
        weights.extend(tok_u.tolist())
        prompts.extend([float(prompt), *[0.0] * (uniq.size - 1)])
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    w = np.asarray(weights, dtype=float)
    p = np.asarray(prompts, dtype=float)
    dur = e - s
    ok = dur > 0
    return Segments(np.asarray(reqs, dtype=np.int64)[ok], s[ok], e[ok], w[ok] / dur[ok], p[ok] / dur[ok])


@dataclass
class _Work:
    """What the requests did, as the client saw it: the same for every meter."""

    steps: power_model.Steps  # the engine steps inferred from the token bursts
    last_step: Segments  # each prompt's prefill all in its first token's step
    placed: Segments  # the tokens rule's work in the inferred steps (chunked prefill spread)

    @classmethod
    def of(cls, requests: pl.DataFrame) -> _Work:
        steps = power_model.steps_of(requests)
        placed = _step_segments(requests, steps, steps.entry_decode, steps.entry_prefill, rates=False)
        return cls(steps, _last_step_segments(requests, steps.end), placed)


def _step_segments(
    requests: pl.DataFrame, steps: power_model.Steps, decode: np.ndarray, prefill: np.ndarray, *, rates: bool
) -> Segments:
    """One segment per request and inferred step, inside the request's own window (a step may
    have begun before the request was sent), with the given decode and prefill work per entry,
    or weights per ns (``rates``)."""
    sent = requests.get_column("sent_ns").to_numpy().astype(float)[steps.req]
    until = requests.get_column("end_ns").to_numpy().astype(float)[steps.req]
    start = np.maximum(steps.start[steps.step], sent)
    end = np.minimum(steps.end[steps.step], until)
    ok = (end > start) & ((decode > 0) | (prefill > 0))
    dur = np.where(ok, end - start, 1.0) if not rates else np.ones_like(start)
    return Segments(steps.req[ok], start[ok], end[ok], (decode / dur)[ok], (prefill / dur)[ok])


def _model_segments(
    requests: pl.DataFrame, steps: power_model.Steps, model: power_model.PowerModel
) -> Segments:
    """Each request's share of each step's modelled dynamic power (W), by its work in the step."""
    work = steps.decode + model.prefill_weight * steps.prefill
    entry_work = steps.entry_decode + model.prefill_weight * steps.entry_prefill
    power = model.dynamic_w(work)[steps.step] * _safe_div(entry_work, work[steps.step])
    return _step_segments(requests, steps, power, np.zeros_like(power), rates=True)


def _fitted_segments(
    requests: pl.DataFrame,
    steps: power_model.Steps,
    vc: VirtualCounter,
    static_w: float | None,
    prefill_weight: float,
) -> tuple[Segments, dict[str, Any], float]:
    """Each request's share of each inferred step's modelled dynamic power; the fit's report
    and the static power to share equally (measured, else fitted)."""
    model = power_model.fit(vc.t, np.diff(vc.e), ~vc.imputed, steps, static_w, prefill_weight)
    report = model.as_dict() | {"step_time": steps.duration_fit, "steps": steps.count}
    return _model_segments(requests, steps, model), report, model.static_w


def split_known(
    telemetry: pl.DataFrame,
    meter: Meter,
    requests: pl.DataFrame,
    steps: power_model.Steps,
    model: power_model.PowerModel,
    config: AttributionConfig,
) -> np.ndarray:
    """Each request's energy from ``meter`` when the engine's steps and the device's power model
    are known rather than inferred (a simulator's own account): the same pooled split of every
    meter interval, so what remains against the truth is what the meter could not resolve.
    ``requests`` is a :func:`request_windows` frame; static power is ``model.static_w``."""
    sent, end, vc = _covering_counter(telemetry, meter, requests, config)
    if vc is None or not requests.height:
        return np.full(requests.height, np.nan)
    segments = _model_segments(requests, steps, model)
    timeline = _Timeline(vc, _equal_segments(sent, end), [segments], requests.height)
    return timeline.split(segments, model.static_w, pooled=True)[0]


def _equal_segments(sent: np.ndarray, end: np.ndarray) -> Segments:
    ok = end > sent
    idx = np.flatnonzero(ok)
    return Segments(idx, sent[ok], end[ok], np.ones(idx.size))


def _density(bounds: np.ndarray, seg: Segments) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Total density per elementary interval (0 exactly where no segment covers it) and each
    segment's interval index range."""
    ia = np.searchsorted(bounds, seg.start)
    ib = np.searchsorted(bounds, seg.end)
    acc = np.zeros(bounds.size)
    np.add.at(acc, ia, seg.density)
    np.add.at(acc, ib, -seg.density)
    # The running sum leaves float residue where coverage ends; an integer count says where
    # it really is zero, so no energy is routed to an interval nobody occupies.
    count = np.zeros(bounds.size, dtype=np.int64)
    np.add.at(count, ia, 1)
    np.add.at(count, ib, -1)
    return np.where(np.cumsum(count)[:-1] > 0, np.cumsum(acc)[:-1], 0.0), ia, ib


def _share(seg: Segments, ia: np.ndarray, ib: np.ndarray, per_density: np.ndarray, n: int) -> np.ndarray:
    """Σ over a request's segments of density × Σ_intervals(ΔE / D): its energy."""
    prefix = np.concatenate(([0.0], np.cumsum(per_density)))
    shares = np.bincount(seg.req, weights=seg.density * (prefix[ib] - prefix[ia]), minlength=n)
    return shares.astype(float)  # bincount of nothing is an integer array


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    out = np.zeros(np.shape(num))
    np.divide(num, den, out=out, where=den > 0)
    return out


class _Timeline:
    """A meter's energy cut at every knot and at every edge of the given segments: any of those
    segments, weighted any way, split it in one vectorised pass."""

    def __init__(self, vc: VirtualCounter, active: Segments, segments: list[Segments], n: int) -> None:
        segments = [active, *segments]
        edges = [vc.t, *(s.start for s in segments), *(s.end for s in segments)]
        bounds = np.unique(np.concatenate(edges))
        self.bounds = bounds[(bounds >= vc.t[0]) & (bounds <= vc.t[-1])]
        e_at = np.interp(self.bounds, vc.t, vc.e)
        self.total = float(e_at[-1] - e_at[0])
        self.d_e = np.diff(e_at)
        self.dt = np.diff(self.bounds)
        mid = (self.bounds[:-1] + self.bounds[1:]) / 2
        self.knot_of = np.clip(np.searchsorted(vc.t, mid) - 1, 0, vc.imputed.size - 1)
        self.knots = vc.t.size - 1
        self.imputed = vc.imputed[self.knot_of]
        self.n = n
        self.active = active
        self.d_eq, self.ia_eq, self.ib_eq = _density(self.bounds, active)

    def intervals_spanned(self) -> np.ndarray:
        """Per request, how many meter intervals its window spans (fractionally)."""
        knot_len = np.bincount(self.knot_of, weights=self.dt, minlength=self.knots)[self.knot_of]
        return _share(self.active, self.ia_eq, self.ib_eq, _safe_div(self.dt, knot_len), self.n)

    def unexplained(self, work: Segments, baseline: float | None) -> tuple[np.ndarray, float | None]:
        """Per piece, its part of the energy that a fit of each meter interval's energy as
        static × time + a × work leaves unexplained (|residual|), where the interval has work;
        and the static power (W) the fit found, where no baseline gave it."""
        d_rule, _, _ = _density(self.bounds, work)
        work_k = np.bincount(self.knot_of, weights=d_rule * self.dt, minlength=self.knots)
        dt_k = np.bincount(self.knot_of, weights=self.dt, minlength=self.knots) / NS
        e_k = np.bincount(self.knot_of, weights=self.d_e, minlength=self.knots)
        busy = (work_k > 0) & ~np.bincount(self.knot_of, weights=self.imputed, minlength=self.knots).astype(
            bool
        )
        if busy.sum() < 3:
            return np.zeros_like(self.d_e), None
        if baseline:
            target, x = e_k - baseline * dt_k, work_k[:, None]
        else:
            target, x = e_k, np.column_stack((dt_k, work_k))
        coef, _ = nnls(x[busy], target[busy])
        residual = np.where(busy, np.abs(target - x @ coef), 0.0)
        return _safe_div(residual, e_k)[self.knot_of] * self.d_e, None if baseline else float(coef[0])

    def split(
        self, seg_rule: Segments, baseline: float | None, *, pooled: bool, d_e: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, float, float]:
        """Each request's energy, the part of it imputed, the idle energy, and the energy of
        idle stretches given to the work in their meter interval (pooled, below): static
        (``baseline`` W) equally among the active requests, the rest by ``seg_rule``'s weights,
        equally where the rule sees no work.

        Pooled (the work rules): a meter interval's dynamic energy is split by each request's
        work in the whole interval. With a baseline, that includes the energy above it in the
        interval's idle parts: the counter spreads a burst of work over its whole period, but
        an idle device draws its baseline (without one, nothing says how much of it was idle).
        ``d_e`` splits other energy the same way."""
        d_e = self.d_e if d_e is None else d_e
        dt = self.dt
        static = np.minimum(d_e, baseline * dt / NS) if baseline else np.zeros_like(d_e)
        dynamic = d_e - static
        seg_eq, d_eq, ia_eq, ib_eq = self.active, self.d_eq, self.ia_eq, self.ib_eq
        d_rule, ia_r, ib_r = _density(self.bounds, seg_rule)
        working = d_rule > 0
        idle_iv = d_eq <= 0
        moved = np.zeros_like(working)
        if pooled:
            work_per_knot = np.bincount(self.knot_of, weights=d_rule * dt, minlength=self.knots)
            if baseline:
                moved = idle_iv & (work_per_knot > 0)[self.knot_of]
            energy_per_knot = np.bincount(
                self.knot_of, weights=np.where(working | moved, dynamic, 0.0), minlength=self.knots
            )
            by_rule = np.where(working, _safe_div(energy_per_knot, work_per_knot)[self.knot_of] * dt, 0.0)
        else:
            by_rule = _safe_div(dynamic, d_rule)
        by_equal = _safe_div(static + np.where(working, 0.0, dynamic), d_eq)
        energy = _share(seg_rule, ia_r, ib_r, by_rule, self.n) + _share(
            seg_eq, ia_eq, ib_eq, by_equal, self.n
        )
        imputed = _share(seg_rule, ia_r, ib_r, by_rule * self.imputed, self.n) + _share(
            seg_eq, ia_eq, ib_eq, by_equal * self.imputed, self.n
        )
        pooled_idle = float(np.sum(dynamic[moved]))
        return energy, imputed, float(np.sum(d_e[idle_iv])) - pooled_idle, pooled_idle


def _band(
    timeline: _Timeline,
    placements: list[Segments],
    estimates: list[np.ndarray],
    baseline: float | None,
    pooled: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """The least and most each request could have used.

    Over ``estimates`` (the rule's, the power model fitted to the run) and the work models the
    meter cannot tell apart (prefill where the inferred steps put it
    or all in the first token's step, a prompt token worth ``BAND_PREFILL_WEIGHTS`` output
    tokens, static power as measured, as fitted, or none), widened by each request's share of
    the energy that work does not explain: per meter interval, what a linear fit of energy to
    work misses.
    """
    unexplained, fitted_static = timeline.unexplained(
        placements[-1].weighted(BAND_PREFILL_WEIGHTS[0]), baseline
    )
    estimates = list(estimates)
    for segments in placements:
        for weight in BAND_PREFILL_WEIGHTS:
            for static in {baseline, fitted_static, None}:
                estimates.append(timeline.split(segments.weighted(weight), static, pooled=True)[0])
    spread = timeline.split(placements[-1], baseline, pooled=pooled, d_e=unexplained)[0]
    # residuals of separate intervals are independent: over k intervals they add up as √k
    spread = spread / np.sqrt(np.maximum(timeline.intervals_spanned(), 1.0))
    return np.maximum(np.min(estimates, axis=0) - spread, 0.0), np.max(estimates, axis=0) + spread


def request_windows(records: pl.DataFrame) -> pl.DataFrame:
    """The requests that reached the server, with ``end_ns`` (see :func:`records.end_ns`)."""
    return records.with_columns(end_ns().alias("end_ns")).filter(pl.col("sent_ns").is_not_null())


def _covering_counter(
    telemetry: pl.DataFrame, meter: Meter, requests: pl.DataFrame, config: AttributionConfig
) -> tuple[np.ndarray, np.ndarray, VirtualCounter | None]:
    """The requests' sent and end times, and the meter's virtual counter extended (imputed)
    to cover them all; None where the meter produced no usable data."""
    sent = requests.get_column("sent_ns").to_numpy().astype(float)
    end = requests.get_column("end_ns").to_numpy().astype(float)
    vc = virtual_counter(telemetry, meter, config.gap_factor, config.session_starts_ns)
    if vc is not None and requests.height:
        vc = extend_counter(vc, float(sent.min()), float(end.max()))
    return sent, end, vc


def attribute_meter(
    telemetry: pl.DataFrame, meter: Meter, requests: pl.DataFrame, config: AttributionConfig, work: _Work
) -> MeterResult:
    """Attribute one meter's energy to ``requests`` (a :func:`request_windows` frame, whose
    ``work`` is :meth:`_Work.of` it)."""
    n = requests.height
    base_prov = {"counter": "measured", "power": "integrated", "estimate": "estimated"}[meter.kind]
    sent, end, vc = _covering_counter(telemetry, meter, requests, config)
    if vc is None:
        nan = np.full(n, np.nan)
        return MeterResult(
            meter.channel,
            meter.kind,
            nan,
            nan,
            ["missing"] * n,
            nan,
            nan,
            nan,
            {"kind": meter.kind, "missing_reason": "the source produced fewer than two readings"},
        )
    # the extension beyond the telemetry is imputed: it adds to both terms alike
    measured_j = float(vc.e[-1] - vc.e[0] - np.sum(np.diff(vc.e)[vc.imputed]))
    baseline = _baseline_w(vc, meter, config)
    fitted: dict[str, Any] = {}
    seg_eq = _equal_segments(sent, end)
    seg_last, seg_tokens = work.last_step, work.placed
    # the device's power model, fitted to the run: the fitted rule's split, one end of every
    # rule's band, and in the summary; it describes the accelerator, not a host meter
    model: tuple[Segments, float] | None = None
    if meter.accelerator and n and config.rule != "window":
        seg_fit, fitted, static_fit = _fitted_segments(
            requests, work.steps, vc, baseline, config.prefill_weight
        )
        model = (seg_fit, static_fit)
    if config.rule == "fitted" and model is not None:
        seg_rule, baseline = model
    elif config.rule in ("tokens", "fitted"):
        seg_rule = seg_tokens.weighted(config.prefill_weight)
    else:
        seg_rule = seg_eq
    extra = [] if model is None else [model[0]]
    timeline = _Timeline(vc, seg_eq, [seg_rule, seg_last, seg_tokens, *extra], n)
    energy, imputed_part, idle, pooled_idle = timeline.split(
        seg_rule, baseline, pooled=config.rule != "equal"
    )
    window = np.interp(end, vc.t, vc.e) - np.interp(sent, vc.t, vc.e)
    if config.rule == "window":
        energy = window
        low = high = np.full(n, np.nan)  # the window rule counts overlaps again: no band to give
    else:
        others = [] if model is None else [timeline.split(model[0], model[1], pooled=True)[0]]
        low, high = _band(
            timeline, [seg_last, seg_tokens], [energy, *others], baseline, config.rule != "equal"
        )
    provenance = [base_prov if base_prov == "estimated" or imp <= 0 else "imputed" for imp in imputed_part]
    duration = (end - sent) / NS
    total = timeline.total
    attributed = float(energy.sum())
    return MeterResult(
        meter=meter.channel,
        kind=meter.kind,
        energy_j=energy,
        window_j=window,
        provenance=provenance,
        mean_power_w=_safe_div(energy, duration),
        low_j=low,
        high_j=high,
        totals={
            "kind": meter.kind,
            "provenance": base_prov,
            "total_j": total,
            "measured_j": measured_j,
            "imputed_j": total - measured_j,
            "attributed_j": attributed,
            "idle_j": idle,
            # of the energy while no request was in flight, what went to the work in its reading
            "idle_to_work_j": pooled_idle,
            "conservation_error": (attributed + idle - total) / total if total else None,
            "window_sum_j": float(window.sum()),
            "window_overcount": float(window.sum()) / (total - idle) if total - idle > 0 else None,
            "baseline_w": baseline,
            **({"power_model": fitted} if fitted else {}),
            "span_s": float((vc.t[-1] - vc.t[0]) / NS),
            **_counter_timing(meter),
        },
    )


def _counter_timing(meter: Meter) -> dict[str, Any]:
    """How a counter's reads were timed, and the grids to time them the same way again."""
    if meter.kind != "counter":
        return {}
    periods = sorted({round(g.period_ns / 1e6, 1) for g in meter.grids})
    if not periods:
        timing = "midpoint between reads (no update grid learned)"
    elif periods == [0.0]:
        timing = "as read (it updates about as often as it is read)"
    else:
        timing = f"last update on its learned grid ({', '.join(f'{p:g}' for p in periods)} ms)"
    return {"counter_timing": timing, "counter_grids": [g.as_dict() for g in meter.grids]}


def _baseline_w(vc: VirtualCounter, meter: Meter, config: AttributionConfig) -> float | None:
    if config.baseline_w is not None and meter.accelerator:
        return config.baseline_w
    if config.baseline_window_ns is None:
        return None
    # Only the meter's own intervals inside the window: one that straddles its end holds load
    # too, and spread by interpolation it read 108 W for 70 W idle with a 500 ms counter.
    a, b = config.baseline_window_ns
    inside = np.flatnonzero((vc.t >= a) & (vc.t <= b))
    if inside.size < 2 or vc.t[inside[-1]] - vc.t[inside[0]] < 0.25 * NS:
        return None
    first, last = inside[0], inside[-1]
    return float((vc.e[last] - vc.e[first]) / ((vc.t[last] - vc.t[first]) / NS))


def attribute(
    telemetry: pl.DataFrame, meters: list[Meter], records: pl.DataFrame, config: AttributionConfig
) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Energy columns for ``records`` (joined on request_id) and the energy section of a summary.

    Per meter ``<meter>.energy_j``, ``.provenance``, ``.power_w`` and ``.window_j``; and the
    headline ``energy_j``/``energy_provenance``/``power_w``: the sum over accelerator meters
    (or over CPU meters when there are none).
    """
    requests = request_windows(records)
    columns: dict[str, Any] = {"request_id": requests.get_column("request_id")}
    section: dict[str, Any] = {"rule": config.rule, "prefill_weight": config.prefill_weight, "meters": {}}
    work = _Work.of(requests)  # inferred once: every meter's split uses the same steps
    results = [attribute_meter(telemetry, m, requests, config, work) for m in meters]
    for r in results:
        columns[f"{r.meter}.energy_j"] = _nullable(r.energy_j)
        columns[f"{r.meter}.provenance"] = r.provenance
        columns[f"{r.meter}.power_w"] = _nullable(r.mean_power_w)
        columns[f"{r.meter}.window_j"] = _nullable(r.window_j)
        columns[f"{r.meter}.energy_low_j"] = _nullable(r.low_j)
        columns[f"{r.meter}.energy_high_j"] = _nullable(r.high_j)
        section["meters"][r.meter] = r.totals
    headline = (
        [r for r, m in zip(results, meters, strict=True) if m.accelerator]
        or [r for r in results if r.kind != "estimate"]
        or results
    )
    if headline:
        energy = np.sum([r.energy_j for r in headline], axis=0)
        power = np.sum([r.mean_power_w for r in headline], axis=0)
        prov = [_combine([r.provenance[i] for r in headline]) for i in range(requests.height)]
        columns["energy_j"] = _nullable(energy)
        # a sum of bands: each meter's extremes together (the widest the headline can be)
        columns["energy_low_j"] = _nullable(np.sum([r.low_j for r in headline], axis=0))
        columns["energy_high_j"] = _nullable(np.sum([r.high_j for r in headline], axis=0))
        columns["power_w"] = _nullable(power)
        columns["energy_provenance"] = prov
        section["headline_meters"] = [r.meter for r in headline]
        section["total_j"] = (
            sum(r.totals.get("total_j", 0.0) for r in headline) if _complete(headline) else None
        )
        section["attributed_j"] = (
            sum(r.totals.get("attributed_j", 0.0) for r in headline) if _complete(headline) else None
        )
        section["idle_j"] = (
            sum(r.totals.get("idle_j", 0.0) for r in headline) if _complete(headline) else None
        )
    frame = pl.DataFrame(columns)
    return records.join(frame, on="request_id", how="left"), section


def energy_over(
    telemetry: pl.DataFrame,
    meters: list[Meter],
    windows: list[list[tuple[int, int]]],
    breaks: tuple[int, ...] = (),
    gap_factor: float = 4.0,
) -> list[float | None]:
    """What ``meters`` measured (together) over each item's windows (ns since run start): the
    whole device's energy, not a share; null where a meter's data does not cover a window."""
    counters = [virtual_counter(telemetry, m, gap_factor, breaks) for m in meters]
    if not counters:
        return [None] * len(windows)
    out: list[float | None] = []
    for spans in windows:
        total: float | None = 0.0
        for vc in counters:
            for a, b in spans:
                if vc is None or a < vc.t[0] or b > vc.t[-1] or total is None:
                    total = None
                    break
                total += float(np.interp(b, vc.t, vc.e) - np.interp(a, vc.t, vc.e))
        out.append(total)
    return out


def _complete(results: list[MeterResult]) -> bool:
    return all("total_j" in r.totals for r in results)


def _combine(provenances: list[str]) -> str:
    for worst in ("missing", "imputed", "estimated", "integrated"):
        if worst in provenances:
            return worst
    return "measured"


def _nullable(values: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else float(v) for v in values]
