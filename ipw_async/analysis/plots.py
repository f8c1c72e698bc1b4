"""``plot``: PNG figures of one run: regressions, token lengths, power and device state over
time, energy, TTFT."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import polars as pl
from matplotlib.figure import Figure
from scipy import stats

from .._clock import NS
from ..energy import request_windows
from ..rundir.read import HEADLINE, RunDir
from ..telemetry.base import Quantity
from .columns import column, energy_columns
from .plotting import PlotReport, SkipPlot, new_figure, render, title_suffix
from .regression import PAIRS, fit, points

AXIS_LABELS = {
    "prompt_tokens": "input (prompt) tokens",
    "output_tokens": "output tokens",
    "energy_j": "energy per query (J, headline meter)",
    "power_w": "power per query (W, headline meter)",
    "e2e_latency_s": "e2e latency (s)",
    "ttft_s": "TTFT (s)",
}
PROVENANCE_COLOURS = {
    "measured": "tab:blue",
    "integrated": "tab:green",
    "imputed": "tab:orange",
    "estimated": "tab:purple",
    "missing": "tab:gray",
}


def regression_plot(run: RunDir, name: str) -> Figure:
    x_col, y_col = PAIRS[name]
    x, y, _ = points(run.records, x_col, y_col)
    if x.size == 0:
        raise SkipPlot(f"no request has both {x_col} and {y_col}")
    fig = new_figure()
    ax = fig.add_subplot()
    ax.scatter(x, y, s=14, alpha=0.6, label=f"queries (n={x.size})")
    line = fit(x, y)
    if line["slope"] is not None:
        xs = np.linspace(x.min(), x.max(), 50)
        lo, hi = line["slope_ci"]
        ax.plot(
            xs,
            line["intercept"] + line["slope"] * xs,
            color="tab:red",
            label=f"fit: slope {line['slope']:.4g} [{lo:.3g}, {hi:.3g}], r² {line['r2']:.3f}",
        )
    else:
        ax.set_title(f"no fit: {line['reason']}", fontsize=9)
    ax.set_xlabel(AXIS_LABELS[x_col])
    ax.set_ylabel(AXIS_LABELS[y_col])
    fig.suptitle(name.replace("_", " ") + title_suffix(run.simulated))
    ax.legend(fontsize=8)
    return fig


def output_tokens_kde(run: RunDir) -> Figure:
    tokens = column(run.ok, "output_tokens").drop_nulls().to_numpy()
    if tokens.size < 2 or np.ptp(tokens) == 0:
        raise SkipPlot("a density needs at least two different output lengths")
    kde = stats.gaussian_kde(tokens)
    xs = np.linspace(max(0.0, tokens.min() - 0.1 * np.ptp(tokens)), tokens.max() + 0.1 * np.ptp(tokens), 200)
    fig = new_figure()
    ax = fig.add_subplot()
    ax.hist(tokens, bins="auto", density=True, alpha=0.35, label=f"histogram (n={tokens.size})")
    ax.plot(xs, kde(xs), color="tab:blue", label="Gaussian KDE")
    ax.set_xlabel("output tokens per query")
    ax.set_ylabel("density")
    ax.legend(fontsize=8)
    fig.suptitle("output length" + title_suffix(run.simulated))
    return fig


def in_flight(records: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Requests in flight as a step function: change times (s) and the count from each on."""
    req = request_windows(records)
    sent = req.get_column("sent_ns").to_numpy().astype(float)
    end = req.get_column("end_ns").to_numpy().astype(float)
    times = np.concatenate((sent, end))
    steps = np.concatenate((np.ones(sent.size), -np.ones(end.size)))
    order = np.argsort(times, kind="stable")
    return times[order] / NS, np.cumsum(steps[order])


def power_timeline(run: RunDir) -> Figure:
    if run.telemetry is None:
        raise SkipPlot("the run has no telemetry.arrow")
    series = [
        (m.channel, m.time_column, m.power_column)
        for m in run.meters()
        if m.power_column in run.telemetry.columns
    ]
    if not series:
        raise SkipPlot("the telemetry log has no power column")
    fig = new_figure(9, 4.5)
    ax = fig.add_subplot()
    for channel, time_col, power_col in series:
        rows = run.telemetry.select(time_col, power_col).drop_nulls()
        ax.plot(rows[:, 0].to_numpy() / NS, rows[:, 1].to_numpy(), lw=1, label=f"{channel} power")
    ax.set_xlabel("time since run start (s)")
    ax.set_ylabel("power (W)")
    twin = ax.twinx()
    t, count = in_flight(run.records)
    if t.size:
        twin.step(t, count, where="post", color="tab:gray", alpha=0.6, lw=1, label="requests in flight")
    twin.set_ylabel("requests in flight")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="upper right")
    fig.suptitle("power and load over the run" + title_suffix(run.simulated))
    return fig


# what drives a device's power besides the load, a panel each where the telemetry has it
DEVICE_STATE = (
    (Quantity.SM_CLOCK_MHZ, "compute clock (MHz)"),
    (Quantity.MEM_CLOCK_MHZ, "memory clock (MHz)"),
    (Quantity.TEMP_C, "temperature (°C)"),
    (Quantity.THROTTLE_REASONS, "clocks held down"),
)


def device_state(run: RunDir) -> Figure:
    """Each accelerator's clocks, temperature and throttling over the run, one panel each."""
    if run.telemetry is None:
        raise SkipPlot("the run has no telemetry.arrow")
    telemetry = run.telemetry
    meters = [m for m in run.meters() if m.accelerator]
    panels = [
        (
            quantity,
            label,
            [
                (m, f"{m.channel}.{quantity}")
                for m in meters
                if f"{m.channel}.{quantity}" in telemetry.columns
            ],
        )
        for quantity, label in DEVICE_STATE
    ]
    panels = [p for p in panels if p[2]]
    if not panels:
        raise SkipPlot("the telemetry log has no device clock, temperature or throttle column")
    fig = new_figure(9, 1.2 + 1.8 * len(panels))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (quantity, label, series) in zip(axes, panels, strict=True):
        for meter, col in series:
            rows = telemetry.select(meter.time_column, col).drop_nulls()
            t, v = rows[:, 0].to_numpy() / NS, rows[:, 1].to_numpy()
            if quantity == Quantity.THROTTLE_REASONS:  # a bitmask: held down or not
                ax.step(t, (v != 0).astype(float), where="post", lw=1, label=meter.channel)
                ax.set_yticks([0, 1], ["no", "yes"])
            else:
                ax.plot(t, v, lw=1, label=meter.channel)
        ax.set_ylabel(label, fontsize=8)
    axes[0].legend(fontsize=8, loc="upper right")
    axes[-1].set_xlabel("time since run start (s)")
    fig.suptitle("device state over the run" + title_suffix(run.simulated))
    return fig


def energy_histogram(run: RunDir) -> Figure:
    energy_col, _, provenance_col = energy_columns(HEADLINE)
    if energy_col not in run.ok.columns:
        raise SkipPlot("the run has no per-query energy")
    rows = run.ok.select(energy_col, pl.col(provenance_col).fill_null("missing")).filter(
        pl.col(energy_col).is_not_null()
    )
    if rows.is_empty():
        raise SkipPlot("no query has an energy figure")
    missing = run.ok.height - rows.height
    labels = sorted(rows.get_column(provenance_col).unique().to_list())
    data = [rows.filter(pl.col(provenance_col) == lab).get_column(energy_col).to_numpy() for lab in labels]
    fig = new_figure()
    ax = fig.add_subplot()
    bins = np.histogram_bin_edges(rows.get_column(energy_col).to_numpy(), bins="auto")
    ax.hist(
        data,
        bins=bins,
        stacked=True,
        color=[PROVENANCE_COLOURS.get(lab, "black") for lab in labels],
        label=[f"{lab} ({d.size})" for lab, d in zip(labels, data, strict=True)],
    )
    ax.set_xlabel("energy per query (J, headline meter)")
    ax.set_ylabel("queries")
    ax.legend(title="provenance" + (f"; {missing} without energy" if missing else ""), fontsize=8)
    fig.suptitle("energy per query" + title_suffix(run.simulated))
    return fig


def ttft_cdf(run: RunDir) -> Figure:
    ttft = np.sort(column(run.ok, "ttft_s").drop_nulls().to_numpy())
    if ttft.size == 0:
        raise SkipPlot("no request received a token")
    fig = new_figure()
    ax = fig.add_subplot()
    ax.step(ttft * 1000, np.arange(1, ttft.size + 1) / ttft.size, where="post")
    for p in (50, 99):
        ax.axvline(np.percentile(ttft, p) * 1000, ls=":", color="gray")
        ax.text(np.percentile(ttft, p) * 1000, 0.02, f" p{p}", fontsize=8, color="gray")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    fig.suptitle(f"TTFT CDF (n={ttft.size})" + title_suffix(run.simulated))
    return fig


def plot_run(run_dir: RunDir | str | Path, output: str | Path | None = None) -> PlotReport:
    """Write every plot of a finished run as PNG into ``output`` (default ``<run_dir>/plots``)."""
    run = RunDir.open_finished(run_dir)
    out_dir = Path(output) if output is not None else run.path / "plots"
    report = PlotReport()
    for name in PAIRS:
        render(report, out_dir, f"regression_{name}", partial(regression_plot, run, name))
    render(report, out_dir, "output_tokens_kde", partial(output_tokens_kde, run))
    render(report, out_dir, "power_timeline", partial(power_timeline, run))
    render(report, out_dir, "device_state", partial(device_state, run))
    render(report, out_dir, "energy_histogram", partial(energy_histogram, run))
    render(report, out_dir, "ttft_cdf", partial(ttft_cdf, run))
    return report
