"""How much the harness costs per SSE event, and how late it stamps them.

Two regimes, 128-token streams at 64 and 256 concurrent streams (at least 2,000 requests):

- zero-delay: the simulator's steps take no time, so it sends as fast as it can and the
  client is saturated. Gives requests/s, SSE events/s and this process's CPU µs per event.
  Stamp delay here is mostly backlog: bytes waiting in socket buffers for a busy client.
- paced (``--step-ms``, default 5 ms steps, i.e. 200 tokens/s per stream): a fast server
  the client can keep up with. Stamp delay (client arrival − server send, same monotonic
  clock) and event-loop lag here measure the harness's own stamping error.

``--dashboard`` adds the live dashboard (rendered to a null terminal) and ``--telemetry
psutil`` the telemetry sampler's thread, to measure their cost: compare CPU µs/event with and
without.

    python benchmarks/client_overhead.py [--requests 2000] [--levels 64,256] [--step-ms 5]
        [--dashboard] [--telemetry none|psutil]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ipw_async import RunConfig, RunResult, run_benchmark
from ipw_async.harness import Display
from ipw_async.sim import EngineConfig, SimConfig


def stream_config(**fields: Any) -> RunConfig:
    """128-token streams of 64-token prompts and nothing but the load: no baseline, no tail."""
    return RunConfig(
        dataset="synthetic",
        output_tokens=128,
        length_sigma=0.0,
        prompt_tokens=64,
        baseline_s=0,
        tail_s=0,
        **fields,
    )


def stream_figures(result: RunResult) -> tuple[pl.DataFrame, int, np.ndarray]:
    """A run's requests that succeeded, their SSE events, and each token event's stamp delay
    (client arrival − server send, one clock) in ms."""
    ok = result.records.filter(pl.col("status") == "ok")
    delay_ms = (
        ok.select((pl.col("chunk_ns").explode() - pl.col("chunk_server_ns").explode()) / 1e6)
        .to_series()
        .drop_nulls()
        .to_numpy()
    )
    return ok, int(ok.get_column("chunk_count").sum()), delay_ms


def measure(
    concurrency: int, requests: int, dashboard: bool, step_ms: float = 0.0, telemetry: str = "none"
) -> dict[str, Any]:
    display: Display | None = None
    if dashboard:
        from rich.console import Console

        from ipw_async.dashboard import Dashboard

        display = Dashboard(console=Console(file=io.StringIO(), force_terminal=True, width=120))
    with tempfile.TemporaryDirectory() as tmp:
        config = stream_config(
            output_dir=Path(tmp) / "run",
            concurrency=concurrency,
            max_queries=requests,
            telemetry=telemetry,
            sim=SimConfig(
                engine=EngineConfig(
                    zero_delay=step_ms == 0,
                    step_base_ms=step_ms,
                    step_per_seq_ms=0.0,
                    step_per_prefill_token_ms=0.0,
                    max_batch=max(256, concurrency),
                )
            ),
        )
        result = asyncio.run(run_benchmark(config, display))
    ok, events, delay_ms = stream_figures(result)
    harness = result.summary["harness"]
    cpu_s = harness["cpu_s"]
    wall_s = cpu_s / harness["cpu_share"]
    lag = harness["loop_lag_ms"]
    return {
        "concurrency": concurrency,
        "requests_ok": ok.height,
        "requests_per_s": ok.height / wall_s,
        "sse_events_per_s": events / wall_s,
        "cpu_us_per_event": cpu_s / events * 1e6,
        "cpu_share_of_wall": cpu_s / wall_s,
        "stamp_delay_ms_p50": float(np.percentile(delay_ms, 50)),
        "stamp_delay_ms_p99": float(np.percentile(delay_ms, 99)),
        "loop_lag_ms_p99": lag["p99"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--levels", default="64,256")
    parser.add_argument("--step-ms", type=float, default=5.0, help="engine step of the paced regime")
    parser.add_argument("--dashboard", action="store_true", help="run the live dashboard too")
    parser.add_argument("--telemetry", default="none", help="telemetry sources to sample too (none, psutil)")
    args = parser.parse_args()
    print(
        f"client overhead: 128-token streams, {args.requests} requests, "
        f"dashboard {'on' if args.dashboard else 'off'}, telemetry {args.telemetry}"
    )
    print(
        f"{'regime':<14} {'streams':>7} {'req/s':>8} {'events/s':>10} {'CPU µs/event':>13} {'CPU/wall':>9} "
        f"{'stamp p50 ms':>13} {'stamp p99 ms':>13} {'loop lag p99 ms':>16}"
    )
    for step_ms in (0.0, args.step_ms):
        regime = "zero-delay" if step_ms == 0 else f"paced {step_ms:g} ms"
        for level in (int(x) for x in args.levels.split(",")):
            r = measure(level, args.requests, args.dashboard, step_ms, args.telemetry)
            print(
                f"{regime:<14} {r['concurrency']:>7} {r['requests_per_s']:>8.1f} {r['sse_events_per_s']:>10,.0f} "
                f"{r['cpu_us_per_event']:>13.1f} {r['cpu_share_of_wall']:>9.0%} {r['stamp_delay_ms_p50']:>13.3f} "
                f"{r['stamp_delay_ms_p99']:>13.3f} {r['loop_lag_ms_p99']:>16.2f}"
            )


if __name__ == "__main__":
    main()
