"""Trace replay against the simulator: how late each request leaves, and energy per request and
per session.

Two runs, each against the built-in simulator (prefix caching on, as for every replay):

- ``mooncake``: a generated Mooncake-shaped trace (``--entries``, default 2,000, Poisson
  arrivals at ``--trace-rate`` per second of trace time, default 50; prompts lognormal around
  1,024 tokens in 512-token hash-id blocks, half of them starting with one of 20 shared
  conversation prefixes), replayed ``--speedup`` times faster (default 2). Printed: lateness
  (dispatched − scheduled, the driver's and the client's delay) p50/p99/max, the prompt tokens
  found cached, and J/request. The target is p99 ≤ 2 ms.
- ``sessions``: a generated sessions trace (``--sessions``, default 60, 2–5 turns each, think
  times 1–4 s), at the same speedup. Printed: lateness of first and later turns, J/request and
  J/session (the sum of a session's attributed energy), each as mean and p50.

First, the timer alone: 1,500 waits of 2-12 ms on an idle event loop, each to an absolute time,
with ``ipw_async``'s alarm (``ipw_async._alarm.sleep_until``, what a replay waits with) and with
the loop's own timer slept again until the time has come; lateness p50/p99 and the process's
CPU per wait.

``--own-core`` runs the simulator on the last core and the client on the others: on a small
machine a simulator sharing the client's cores delays its timers (see docs/benchmarks.md).

    python benchmarks/trace_replay.py [--entries 2000] [--trace-rate 50] [--speedup 2] [--sessions 60]
        [--own-core]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import numpy as np
import polars as pl

from ipw_async import RunConfig, run_benchmark
from ipw_async._alarm import sleep_until
from ipw_async._clock import NS, now_ns
from ipw_async._loop import run as run_loop
from ipw_async.sim import SimConfig, simulator_apart
from ipw_async.sim.physics import EngineConfig
from ipw_async.workload.replay.formats import MOONCAKE_BLOCK_TOKENS


def mooncake_trace(path: Path, entries: int, rate: float, seed: int) -> Path:
    """A Mooncake-shaped JSONL trace: ms timestamps, lengths, and hash ids of shared prefixes."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, entries)) * 1000
    next_id = 0
    prefixes = []  # 20 conversations' leading blocks, 1-4 blocks each
    for _ in range(20):
        n = int(rng.integers(1, 5))
        prefixes.append(list(range(next_id, next_id + n)))
        next_id += n
    with path.open("w") as f:
        for t in times:
            tokens = int(np.clip(rng.lognormal(np.log(1024), 0.6), 64, 8192))
            blocks = -(-tokens // MOONCAKE_BLOCK_TOKENS)
            shared = prefixes[int(rng.integers(len(prefixes)))] if rng.random() < 0.5 else []
            shared = shared[: blocks - 1]
            own = list(range(next_id, next_id + blocks - len(shared)))
            next_id += len(own)
            output = int(np.clip(rng.lognormal(np.log(32), 0.5), 2, 256))
            row = {"timestamp": int(t), "input_length": tokens, "output_length": output, "hash_ids": shared + own}
            f.write(json.dumps(row) + "\n")
    return path


def sessions_trace(path: Path, sessions: int, seed: int) -> Path:
    """Conversations starting over ~sessions/6 seconds, 2-5 turns, 1-4 s of think time."""
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for i, start in enumerate(np.sort(rng.uniform(0, sessions / 6, sessions))):
            turns = [
                {
                    "input_length": int(rng.integers(40, 400)),
                    "output_length": int(rng.integers(16, 96)),
                    "think_s": round(float(rng.uniform(1, 4)), 3),
                }
                for _ in range(int(rng.integers(2, 6)))
            ]
            f.write(json.dumps({"session_id": f"user-{i:03d}", "timestamp": round(float(start), 3), "turns": turns}) + "\n")
    return path


@contextlib.contextmanager
def simulator(own_core: bool) -> Iterator[str | None]:
    """The base URL of a simulator on a core of its own, this process (the client) on the others;
    None (the run starts its own, sharing every core) without ``own_core``."""
    if not own_core:
        yield None
        return
    with simulator_apart(SimConfig(engine=EngineConfig(prefix_cache=True))) as sim:
        yield sim.base_url


def replay(trace: Path, speedup: float, out: Path, own_core: bool) -> pl.DataFrame:
    """The trace replayed against the simulator; its measured records, energy attributed."""
    with simulator(own_core) as base_url:
        sim = {"base_url": base_url, "telemetry": "sim"} if base_url else {}
        config = RunConfig(trace=trace, speedup=speedup, output_dir=out, baseline_s=1.0, tail_s=0.5, **sim)
        result = run_loop(run_benchmark(config))
    assert result.complete, f"the replay of {trace.name} did not complete"
    client = result.summary["client"]
    # what else held the event loop: a timer cannot fire while another callback runs
    print(
        f"  (event loop lag p99 {client['loop_lag_p99_ms']:.2f} ms, {client['events_per_s']:.0f} stream "
        f"events/s, {'the simulator on a core of its own' if own_core else 'every core shared with the simulator'})"
    )
    return result.records.filter(~pl.col("warmup"))


def lateness_ms(frame: pl.DataFrame) -> str:
    late = ((frame.get_column("dispatched_ns") - frame.get_column("scheduled_ns")) / 1e6).to_numpy()
    return percentiles_ms(late)


def percentiles_ms(late: np.ndarray) -> str:
    return f"p50 {np.percentile(late, 50):.3f} ms, p99 {np.percentile(late, 99):.3f} ms, max {late.max():.3f} ms"


async def loop_timer_until(due_ns: int) -> None:
    """The loop's own timer (whole milliseconds in uvloop), slept again while early."""
    while (left := due_ns - now_ns()) > 0:
        await asyncio.sleep(left / NS)


async def idle_waits(until: Callable[[int], Awaitable[None]], waits: int, seed: int) -> tuple[np.ndarray, float]:
    """Lateness (ms) of ``waits`` waits to absolute times 2-12 ms ahead, and CPU (µs) per wait."""
    rng = np.random.default_rng(seed)
    late = np.empty(waits)
    cpu = time.process_time()
    for i, ahead in enumerate(rng.uniform(2e6, 12e6, waits).astype(int)):
        due = now_ns() + int(ahead)
        await until(due)
        late[i] = (now_ns() - due) / 1e6
    return late, (time.process_time() - cpu) / waits * 1e6


def timer_alone(seed: int) -> None:
    for name, until in (("alarm (what a replay waits with)", sleep_until), ("the loop's own timer", loop_timer_until)):
        late, cpu = run_loop(idle_waits(until, 1500, seed))
        print(f"  {name}: lateness {percentiles_ms(late)}; {cpu:.0f} µs of CPU per wait")


def per(values: pl.Series) -> str:
    return f"mean {values.mean():.2f} J, p50 {values.median():.2f} J"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--trace-rate", type=float, default=50.0)
    parser.add_argument("--speedup", type=float, default=2.0)
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--own-core", action="store_true", help="the simulator on the last core, the client on the others (Linux)"
    )
    args = parser.parse_args()
    print("[timer alone] 1,500 waits of 2-12 ms on an idle event loop")
    timer_alone(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        trace = mooncake_trace(root / "mooncake.jsonl", args.entries, args.trace_rate, args.seed)
        frame = replay(trace, args.speedup, root / "mooncake", args.own_core)
        ok = frame.filter(pl.col("status") == "ok")
        span = (frame.get_column("scheduled_ns").max() - frame.get_column("scheduled_ns").min()) / 1e9
        cached = ok.get_column("cached_prompt_tokens").sum() / ok.get_column("prompt_tokens").sum()
        print(
            f"[simulated] mooncake-shaped trace: {frame.height} requests over {span:.1f} s "
            f"({args.trace_rate:g}/s of trace time x{args.speedup:g}), {ok.height} ok"
        )
        print(f"  lateness (dispatched - scheduled): {lateness_ms(frame)}")
        print(f"  prompt tokens found cached: {cached:.1%}")
        print(f"  J/request: {per(ok.get_column('energy_j'))}")

        trace = sessions_trace(root / "sessions.jsonl", args.sessions, args.seed)
        frame = replay(trace, args.speedup, root / "sessions", args.own_core)
        ok = frame.filter(pl.col("status") == "ok")
        sessions = frame.group_by("task_id").agg(
            pl.col("energy_j").sum(), (pl.col("status") == "ok").all(), pl.col("energy_j").null_count().alias("unmeasured")
        )
        # a sum over a turn with no energy would read as a cheaper session: those are left out
        complete = sessions.filter(pl.col("status") & (pl.col("unmeasured") == 0))
        print(
            f"[simulated] sessions trace: {sessions.height} sessions, {frame.height} requests "
            f"(x{args.speedup:g}), {complete.height} sessions all ok and measured"
        )
        print(f"  lateness of first turns: {lateness_ms(frame.filter(pl.col('turn_index') == 0))}")
        print(f"  lateness of later turns: {lateness_ms(frame.filter(pl.col('turn_index') > 0))}")
        print(f"  J/request: {per(ok.get_column('energy_j'))}")
        print(f"  J/session: {per(complete.get_column('energy_j'))}")


if __name__ == "__main__":
    main()
