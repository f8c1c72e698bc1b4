"""How much the harness costs per SSE event, and how late it stamps them.

1. The client loop, in one process against the zero-delay simulator (128-token streams, or
   ``--output-tokens``, at 128 and 1,024 concurrent streams): CPU µs per SSE event of
   ipw-async's client (every event stamped at the socket, every record kept), of httpx's
   response machinery over the same transport, and of a bare aiohttp read loop (read, split
   events, stamp; nothing kept), with the ratios measured in the same run.
2. Whole runs, two regimes, the same streams at 64 and 256 concurrent streams (at least
   2,000 requests), what the run around the client costs per event (whole run − loop), and
   what the run reports as its client's cost (``summary.json`` ``client.cpu_us_per_event``: its
   event loop's thread over the measured phase) against the loop alone at the same streams,
   and what its writer's thread costs (``client.writer_cpu_us_per_event``: the records turned
   into Arrow and written, off the loop):

- zero-delay: the simulator's steps take no time, so it sends as fast as it can and the
  client is saturated. Gives requests/s, SSE events/s and this process's CPU µs per event.
  Stamp delay here is mostly backlog: bytes waiting in socket buffers for a busy client.
- paced (``--step-ms``, default 5 ms steps, i.e. 200 tokens/s per stream): a fast server
  the client can keep up with. Stamp delay (client arrival − server send, same monotonic
  clock) and event-loop lag here measure the harness's own stamping error.

``--dashboard`` adds the live dashboard (rendered to a null terminal) and ``--telemetry
psutil`` the telemetry sampler's thread (``auto``: a run's default sources), to measure their
cost: compare CPU µs/event with and without; ``--sampler process`` reads them in a process of
the sampler's own (its CPU counted in the run's). ``--own-core`` runs the whole runs against a
simulator on the last core, the run on the others, as on a GPU host where the server does not
take the client's cores; by default the run's own simulator shares every core with it.
``--output-tokens 2`` makes every stream two events long, where what a request costs apart
from its events (its record, its connection's turn, its row in the file) is most of the bill.
``--lone`` adds part 1 again with one stream against a simulator stepping every 2 ms, where
every event comes off the socket alone, a wakeup and a read of its own (a paced run's case):
what each loop costs there is mostly the kernel's.

    python benchmarks/client_overhead.py [--requests 2000] [--levels 64,256] [--step-ms 5]
        [--loop-levels 128,1024] [--dashboard] [--telemetry none|psutil|auto] [--own-core]
        [--sampler auto|thread|process] [--output-tokens 128] [--lone]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
import polars as pl

from ipw_async import RunConfig, RunResult, run_benchmark
from ipw_async._clock import now_ns
from ipw_async._loop import run as run_loop
from ipw_async.client import ClientConfig, StreamingClient
from ipw_async.harness import Display
from ipw_async.records import RequestRecord
from ipw_async.sim import EngineConfig, SimConfig, SimulatorProcess, simulator_apart
from ipw_async.transport import ConnectionPool, PoolTransport
from ipw_async.workload.body import BodyDefaults, prompt_fields

ZERO_DELAY = SimConfig(
    engine=EngineConfig(zero_delay=True, step_per_seq_ms=0.0, step_per_prefill_token_ms=0.0, max_batch=2048)
)

LONE_STEP_MS = 2.0
LONE = SimConfig(
    engine=EngineConfig(step_base_ms=LONE_STEP_MS, step_per_seq_ms=0.0, step_per_prefill_token_ms=0.0)
)
LONE_REQUESTS = 40  # one at a time: 40 x 128 events at 2 ms each, about 10 s a loop


def body(tokens: int) -> bytes:
    """A chat request for ``tokens`` output tokens of a 64-token prompt."""
    return BodyDefaults("sim-small", tokens, params={"ignore_eos": True}).encode(
        prompt_fields("x " * 64, chat=True)
    )


HEADERS = {"content-type": "application/json"}


async def _timed(streams: int, requests: int, one: Callable[[int], Awaitable[int]]) -> float:
    """CPU µs per SSE event of ``streams`` loops sharing ``requests``; ``one`` sends a request
    and says how many events it read."""
    todo = iter(range(requests))
    events = 0

    async def loop() -> None:
        nonlocal events
        for i in todo:
            read = await one(i)  # not `events += await ...`: that reads events before the await
            events += read

    cpu = time.process_time()
    await asyncio.gather(*(loop() for _ in range(streams)))
    return (time.process_time() - cpu) / events * 1e6


async def ipw_loop(base_url: str, streams: int, requests: int, request: bytes) -> float:
    """ipw-async's client: every event stamped where it came off the socket, every record kept."""
    client = StreamingClient(ClientConfig(base_url=base_url, max_connections=streams), now_ns())
    kept: list[RequestRecord] = []

    async def one(i: int) -> int:
        record = RequestRecord(request_id=i, query_id="q", dataset="d", prompt="p")
        await client.send(record, request)
        kept.append(record)
        return record.chunk_count

    try:
        return await _timed(streams, requests, one)
    finally:
        await client.aclose()


async def bare_loop(base_url: str, streams: int, requests: int, request: bytes) -> float:
    """The least a client can do on aiohttp: read, split events, stamp, keep nothing."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams)) as session:

        async def one(_: int) -> int:
            events = 0
            async with session.post(
                f"{base_url}/chat/completions", data=request, headers=HEADERS
            ) as response:
                buf = b""
                async for chunk in response.content.iter_any():
                    time.perf_counter_ns()
                    *complete, buf = (buf + chunk).split(b"\n\n")
                    events += len(complete)
            return events

        return await _timed(streams, requests, one)


async def httpx_loop(base_url: str, streams: int, requests: int, request: bytes) -> float:
    """httpx's streaming response over ipw-async's transport: read, split, stamp, keep nothing."""
    transport = PoolTransport(ConnectionPool(streams))
    async with httpx.AsyncClient(transport=transport, timeout=None) as http:

        async def one(_: int) -> int:
            events = 0
            async with http.stream(
                "POST", f"{base_url}/chat/completions", content=request, headers=HEADERS
            ) as r:
                buf = b""
                async for chunk in r.aiter_raw():
                    time.perf_counter_ns()
                    *complete, buf = (buf + chunk).split(b"\n\n")
                    events += len(complete)
            return events

        return await _timed(streams, requests, one)


LOOPS = {"ipw-async client": ipw_loop, "httpx over its transport": httpx_loop, "bare aiohttp loop": bare_loop}


def client_loops(
    base_url: str, streams: int, requests: int, tokens: int, rounds: int = 2
) -> dict[str, float]:
    """Each loop's CPU µs per event, the median of ``rounds`` alternating rounds."""
    figures: dict[str, list[float]] = {name: [] for name in LOOPS}
    for _ in range(rounds):
        for name, loop in LOOPS.items():
            figures[name].append(run_loop(loop(base_url, streams, max(requests, 2 * streams), body(tokens))))
    return {name: float(np.median(values)) for name, values in figures.items()}


def stream_config(tokens: int = 128, **fields: Any) -> RunConfig:
    """Streams of ``tokens`` output tokens, 64-token prompts and nothing but the load: no
    baseline, no tail."""
    return RunConfig(
        dataset="synthetic",
        output_tokens=tokens,
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
    concurrency: int,
    requests: int,
    dashboard: bool,
    step_ms: float = 0.0,
    telemetry: str = "none",
    own_core: bool = False,
    sampler: str = "auto",
    tokens: int = 128,
) -> dict[str, Any]:
    display: Display | None = None
    if dashboard:
        from rich.console import Console

        from ipw_async.dashboard import Dashboard

        display = Dashboard(console=Console(file=io.StringIO(), force_terminal=True, width=120))
    sim = SimConfig(
        engine=EngineConfig(
            zero_delay=step_ms == 0,
            step_base_ms=step_ms,
            step_per_seq_ms=0.0,
            step_per_prefill_token_ms=0.0,
            max_batch=max(256, concurrency),
        )
    )
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        # the run's own simulator shares every core; apart, it has the last one to itself
        server: dict[str, Any] = {"sim": sim}
        if own_core:
            server = {"base_url": stack.enter_context(simulator_apart(sim)).base_url}
        config = stream_config(
            tokens,
            output_dir=Path(tmp) / "run",
            concurrency=concurrency,
            max_queries=requests,
            telemetry=telemetry,
            sampler=sampler,
            **server,
        )
        result = run_loop(run_benchmark(config, display))
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
        # what the run says its client cost: its event loop's thread, over the measured phase
        "reported_us_per_event": result.summary["client"]["cpu_us_per_event"],
        # the writer's thread: the records turned into Arrow and written, off the loop
        "writer_us_per_event": result.summary["client"].get("writer_cpu_us_per_event"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--levels", default="64,256")
    parser.add_argument("--step-ms", type=float, default=5.0, help="engine step of the paced regime")
    parser.add_argument("--dashboard", action="store_true", help="run the live dashboard too")
    parser.add_argument(
        "--telemetry",
        default="none",
        help="telemetry sources to sample too (none, psutil, auto: a run's default)",
    )
    parser.add_argument(
        "--sampler",
        default="auto",
        choices=("auto", "thread", "process"),
        help="where the telemetry is read: a thread of the run, or a process of its own",
    )
    parser.add_argument(
        "--own-core",
        action="store_true",
        help="whole runs against a simulator on the last core, the run on the others, as on a GPU host (Linux)",
    )
    parser.add_argument("--loop-levels", default="128,1024", help="streams for the client-loop comparison")
    parser.add_argument("--output-tokens", type=int, default=128, help="tokens a stream, in every part")
    parser.add_argument(
        "--lone",
        action="store_true",
        help="the client loops with one stream against 2 ms steps too: every event read alone",
    )
    args = parser.parse_args()
    tokens = args.output_tokens
    print(
        f"1. the client loop, one process, zero-delay simulator, {tokens}-token streams, {args.requests} requests"
    )
    print(f"{'streams':>7} {'client':<26} {'CPU µs/event':>13} {'× bare aiohttp':>15}")
    loops: dict[int, float] = {}
    with SimulatorProcess(ZERO_DELAY) as sim:
        for level in (int(x) for x in args.loop_levels.split(",")):
            figures = client_loops(sim.base_url, level, args.requests, tokens)
            loops[level] = figures["ipw-async client"]
            for name, us in figures.items():
                print(f"{level:>7} {name:<26} {us:>13.2f} {us / figures['bare aiohttp loop']:>15.2f}")
        levels = [int(x) for x in args.levels.split(",")]
        for level in levels:  # the loop alone at the whole runs' levels, for what the run adds
            loops.setdefault(
                level, run_loop(ipw_loop(sim.base_url, level, max(args.requests, 2 * level), body(tokens)))
            )
    if args.lone:
        print(
            f"1b. the client loop, one stream, a simulator on a core of its own stepping every {LONE_STEP_MS:g} ms: "
            "each event alone"
        )
        with simulator_apart(LONE) as sim:
            figures = client_loops(sim.base_url, 1, LONE_REQUESTS, tokens)
        for name, us in figures.items():
            print(f"{1:>7} {name:<26} {us:>13.2f} {us / figures['bare aiohttp loop']:>15.2f}")
    print()
    print(
        f"2. whole runs: {tokens}-token streams, {args.requests} requests, "
        f"dashboard {'on' if args.dashboard else 'off'}, telemetry {args.telemetry} (sampler {args.sampler}), "
        f"{'the simulator on a core of its own' if args.own_core else 'every core shared with the simulator'}"
    )
    print(
        f"{'regime':<14} {'streams':>7} {'req/s':>8} {'events/s':>10} {'CPU µs/event':>13} {'CPU/wall':>9} "
        f"{'stamp p50 ms':>13} {'stamp p99 ms':>13} {'loop lag p99 ms':>16} {'around µs/event':>16} "
        f"{'reported client':>16} {'÷ loop alone':>13} {'writer µs/event':>16}"
    )
    for step_ms in (0.0, args.step_ms):
        regime = "zero-delay" if step_ms == 0 else f"paced {step_ms:g} ms"
        for level in levels:
            r = measure(
                level,
                args.requests,
                args.dashboard,
                step_ms,
                args.telemetry,
                args.own_core,
                args.sampler,
                tokens,
            )
            # the run around the client: only comparable where the loop ran flat out too
            around = f"{r['cpu_us_per_event'] - loops[level]:.1f}" if step_ms == 0 else "—"
            reported = r["reported_us_per_event"]
            ratio = f"{reported / loops[level]:.2f}" if step_ms == 0 and reported is not None else "—"
            print(
                f"{regime:<14} {r['concurrency']:>7} {r['requests_per_s']:>8.1f} {r['sse_events_per_s']:>10,.0f} "
                f"{r['cpu_us_per_event']:>13.1f} {r['cpu_share_of_wall']:>9.0%} {r['stamp_delay_ms_p50']:>13.3f} "
                f"{r['stamp_delay_ms_p99']:>13.3f} {r['loop_lag_ms_p99']:>16.2f} {around:>16} "
                f"{reported if reported is not None else float('nan'):>16.1f} {ratio:>13} "
                f"{r['writer_us_per_event'] if r['writer_us_per_event'] is not None else float('nan'):>16.1f}"
            )


if __name__ == "__main__":
    main()
