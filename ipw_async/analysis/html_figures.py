"""The figures of ``report.html``, as inline SVG.

A run's energy timeline, J per query with its band and latency percentiles are drawn here; the
energy histogram and a sweep's figures are ``plot``'s own (:mod:`.plots`, :mod:`.sweep_plots`).
Every series is thinned to at most ``MAX_POINTS`` points and a long run's query windows are
shown as requests in flight, so that a 10,000-request run's page stays small and quick to open.
"""

from __future__ import annotations

import heapq
import io
from typing import Any

import matplotlib
import numpy as np
import polars as pl
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from .._clock import NS
from ..energy import AttributionConfig, request_windows, virtual_counter
from ..rundir.read import HEADLINE, RunDir
from ..stats import PERCENTILES
from .columns import column, energy_columns
from .plots import in_flight
from .plotting import SkipPlot, new_figure, title_suffix

MAX_POINTS = 2000  # per line: finer than the page draws it, and a few tens of kB of SVG
MAX_WINDOWS = 1000  # queries drawn as a bar each; beyond this, requests in flight stand for them
# summary latency key -> label, in the order the figure draws them
LATENCIES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "inter-token gap", "e2e": "e2e latency"}


def svg(fig: Figure) -> str:
    """The figure as an ``<svg>`` element to inline; text stays text, in the page's sans-serif."""
    buf = io.StringIO()
    # a fixed salt gives the same ids for the same figure: the page is reproducible
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "ipw-async"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]


def envelope(t: np.ndarray, v: np.ndarray, points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most ``points`` points that keep each stretch's lowest and highest value: a spike
    survives the thinning, as it would not in an average."""
    if t.size <= points:
        return t, v
    starts = np.linspace(0, t.size, points // 2, endpoint=False).astype(int)
    ends = np.append(starts[1:], t.size) - 1
    x = np.column_stack((t[starts], t[ends])).ravel()
    y = np.column_stack((np.minimum.reduceat(v, starts), np.maximum.reduceat(v, starts))).ravel()
    return x, y


def lanes(sent: np.ndarray, end: np.ndarray) -> np.ndarray:
    """A row for each query such that no two queries in flight together share one: as many rows
    as the most queries in flight at once."""
    rows = np.zeros(sent.size, dtype=int)
    free: list[tuple[float, int]] = []  # (when the row's query ends, row)
    used = 0
    for i in np.argsort(sent, kind="stable"):
        if free and free[0][0] <= sent[i]:
            rows[i] = heapq.heappop(free)[1]
        else:
            rows[i], used = used, used + 1
        heapq.heappush(free, (end[i], int(rows[i])))
    return rows


def _meter_power(ax: Axes, run: RunDir) -> bool:
    """Each meter's mean power per interval of its counter (the energy the attribution split),
    its imputed intervals shaded, and a counter's own power field beside it; False if none."""
    assert run.telemetry is not None
    drawn = False
    imputed_spans: list[tuple[float, float]] = []
    for meter in run.meters():
        vc = virtual_counter(run.telemetry, meter, AttributionConfig().gap_factor, run.session_starts_ns)
        if vc is None:
            continue
        t = vc.t / NS
        x, y = envelope(t[:-1], vc.energies / np.diff(t))
        line = ax.step(
            x, y, where="post", lw=1.2, label=f"{meter.channel} ({meter.kind}): J per interval / s"
        )
        drawn = True
        imputed_spans += [(t[i], t[i + 1] - t[i]) for i in np.flatnonzero(vc.imputed)]
        if meter.kind == "counter" and meter.power_column in run.telemetry.columns:
            rows = run.telemetry.select(meter.time_column, meter.power_column).drop_nulls()
            px, py = envelope(rows[:, 0].to_numpy() / NS, rows[:, 1].to_numpy().astype(float))
            ax.plot(
                px, py, lw=0.8, alpha=0.5, color=line[0].get_color(), label=f"{meter.channel} power field"
            )
    if imputed_spans:
        ax.broken_barh(
            imputed_spans[:MAX_POINTS],  # a meter that stalled more often than this: its first stalls
            (0, 1),
            transform=ax.get_xaxis_transform(),
            color="tab:orange",
            alpha=0.25,
            label="imputed (no reading)",
        )
    return drawn


def _query_windows(ax: Axes, records: pl.DataFrame) -> None:
    """Each query's window (sent to end) as a thin bar, or requests in flight for a long run."""
    req = request_windows(records)
    if req.is_empty():
        ax.text(0.5, 0.5, "no request was sent", ha="center", va="center", transform=ax.transAxes)
        return
    if req.height > MAX_WINDOWS:
        t, count = in_flight(records)
        x, y = envelope(t, count)
        ax.fill_between(x, y, step="post", color="tab:gray", alpha=0.6, lw=0)
        ax.set_ylabel("in flight", fontsize=8)
        return
    sent = req.get_column("sent_ns").to_numpy() / NS
    end = req.get_column("end_ns").to_numpy() / NS
    ok = (req.get_column("status") == "ok").to_numpy()
    colours = np.where(req.get_column("warmup").to_numpy(), "tab:gray", np.where(ok, "tab:blue", "tab:red"))
    rows = lanes(sent, end)
    ax.hlines(rows, sent, end, colors=colours, lw=max(0.6, min(3.0, 60 / (rows.max() + 1))))
    ax.set_ylim(rows.max() + 0.8, -0.8)
    ax.set_yticks([])
    ax.set_ylabel("queries", fontsize=8)


def energy_timeline(run: RunDir, baseline_window_ns: list[int] | None) -> Figure:
    """Meter power over the run, with every query's window below it on the same time axis."""
    if run.telemetry is None:
        raise SkipPlot("the run has no telemetry.arrow")
    fig = new_figure(9, 5.2)
    power, queries = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": (3, 1)})
    if not _meter_power(power, run):
        raise SkipPlot("no meter has two usable readings")
    if baseline_window_ns:
        start, end = (t / NS for t in baseline_window_ns)
        power.axvspan(start, end, color="tab:green", alpha=0.12, lw=0, label="idle baseline")
    power.set_ylabel("power (W)")
    power.legend(fontsize=7, loc="upper right")
    _query_windows(queries, run.records)
    queries.set_xlabel("time since run start (s)")
    fig.suptitle("energy over the run" + title_suffix(run.simulated))
    return fig


def energy_bands(run: RunDir) -> Figure:
    """Every query's energy, cheapest first, with its band: what the telemetry could not resolve."""
    energy_col = energy_columns(HEADLINE)[0]
    if energy_col not in run.ok.columns:
        raise SkipPlot("the run has no per-query energy")
    rows = run.ok.select(
        column(run.ok, energy_col), column(run.ok, "energy_low_j"), column(run.ok, "energy_high_j")
    ).filter(pl.col(energy_col).is_not_null())
    if rows.is_empty():
        raise SkipPlot("no query has an energy figure")
    rows = rows.sort(energy_col)
    pick = np.unique(np.linspace(0, rows.height - 1, min(rows.height, MAX_POINTS)).round().astype(int))
    share = (pick + 0.5) / rows.height
    energy, low, high = (rows.get_column(c).to_numpy()[pick] for c in rows.columns)
    fig = new_figure(7, 4)
    ax = fig.add_subplot()
    ax.fill_between(share, low, high, color="tab:blue", alpha=0.25, lw=0, label="band (low–high)")
    ax.plot(share, energy, color="tab:blue", lw=1.2, label=f"estimate (n={rows.height})")
    ax.axhline(rows.get_column(energy_col).mean(), ls=":", color="gray", label="mean")
    ax.set_xlabel("share of queries, cheapest first")
    ax.set_ylabel("energy per query (J, headline meter)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("energy per query with its band" + title_suffix(run.simulated))
    return fig


def latency_percentiles(latency: dict[str, Any], simulated: bool) -> Figure:
    """Each latency's percentiles (p50 to p99.9), in ms on a log scale."""
    shown = {k: label for k, label in LATENCIES.items() if (latency.get(k) or {}).get("p50") is not None}
    if not shown:
        raise SkipPlot("no request received a token")
    fig = new_figure(7, 4)
    ax = fig.add_subplot()
    names = [f"p{p:g}" for p in PERCENTILES]
    for key, label in shown.items():
        values = [latency[key].get(n) for n in names]
        ax.plot(names, [np.nan if v is None else v * 1000 for v in values], "o-", label=label)
    ax.set_yscale("log")
    # plain numbers (20, 30, 100), not powers of ten, and the in-between ticks labelled too
    ax.yaxis.set_major_formatter(LogFormatter())
    ax.yaxis.set_minor_formatter(LogFormatter(minor_thresholds=(2, 0.5)))
    ax.set_xlabel("percentile")
    ax.set_ylabel("ms")
    ax.legend(fontsize=8)
    fig.suptitle("latency percentiles" + title_suffix(simulated))
    return fig
