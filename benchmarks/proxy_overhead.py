"""What the recording proxy adds to a call: TTFT through ``ipw-async proxy`` minus TTFT direct to
the same server, in the same run.

The simulator serves; the proxy (this process, recording the run with the simulated device's
meter) stands in front of it; ``--agents`` agents in another process (as an agent framework
would be) each send ``--calls`` streaming calls, alternating direct and through the proxy, so
both paths see the same server load at the same moments. Printed per repeat: p50/p99 TTFT of
each path and their differences (target: ≤ 1 ms at p99 with 32 agents), the harness CPU per
proxied call, and whether the proxy's own records agree with what the agents saw; then the
median difference over the repeats, since on a small machine one repeat's p99 is mostly the
scheduler's noise (three processes share the cores).

    python benchmarks/proxy_overhead.py [--agents 32] [--calls 50] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from pathlib import Path

import numpy as np

from ipw_async.client import ClientConfig, StreamingClient
from ipw_async.harness import RunConfig
from ipw_async.proxy import run_proxy
from ipw_async.records import RequestRecord, Status
from ipw_async.sim import SimConfig, SimulatorProcess

QUESTION = "What is the capital of France?"


async def agents(direct: str, proxied: str, count: int, calls: int) -> dict[str, list[float]]:
    """The agents' side: TTFT of each call, stamped by the harness's own client."""
    t0 = 0
    clients = {
        name: StreamingClient(ClientConfig(base_url=url, max_connections=count), t0_ns=t0)
        for name, url in (("direct", direct), ("proxy", proxied))
    }
    body = json.dumps(
        {
            "model": "sim-small",
            "stream": True,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": QUESTION}],
        }
    ).encode()
    ttft: dict[str, list[float]] = {"direct": [], "proxy": []}
    ids = iter(range(10**9))

    async def agent(k: int) -> None:
        order = ["direct", "proxy"] if random.Random(k).random() < 0.5 else ["proxy", "direct"]
        for i in range(calls):
            path = order[i % 2]
            record = RequestRecord(next(ids), "q", "proxy-overhead", QUESTION)
            await clients[path].send(record, body)
            if record.status is Status.OK and record.ttft_s is not None:
                ttft[path].append(record.ttft_s)

    await asyncio.gather(*(agent(k) for k in range(count)))
    for client in clients.values():
        await client.aclose()
    return ttft


async def measure(sim: SimulatorProcess, count: int, calls: int, run_dir: Path) -> dict[int, float]:
    """One repeat: its table, and the proxy's added TTFT at p50 and p99 in ms."""
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    config = RunConfig(base_url=sim.base_url, telemetry="sim", baseline_s=0, tail_s=0, output_dir=run_dir)
    run = asyncio.create_task(run_proxy(config, port=0, ready=ready.set_result))
    await asyncio.wait({run, ready}, return_when=asyncio.FIRST_COMPLETED)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--agents-of", sim.base_url, ready.result(), str(count), str(calls),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    run.cancel()
    result = await run
    ttft = {k: np.array(v) * 1000 for k, v in json.loads(out).items()}
    print(f"{count} agents × {calls} calls, half through the proxy; TTFT in ms:")
    print("| path | calls | p50 | p99 |\n|---|---|---|---|")
    for path, values in ttft.items():
        print(
            f"| {path} | {len(values)} | {np.percentile(values, 50):.3f} | {np.percentile(values, 99):.3f} |"
        )
    added = {q: float(np.percentile(ttft["proxy"], q) - np.percentile(ttft["direct"], q)) for q in (50, 99)}
    for q, ms in added.items():
        print(f"added by the proxy at p{q}: {ms:+.3f} ms")
    summary = result.summary
    recorded = summary["requests"]["measured"]
    cpu = (summary.get("harness") or {}).get("cpu_s")
    print(
        f"the proxy recorded {recorded} calls (the agents sent {len(ttft['proxy'])} through it); "
        f"harness CPU {'—' if cpu is None else f'{1000 * cpu / max(recorded, 1):.2f} ms'} per call, "
        "sampling and writing included"
    )
    own = result.records.filter(result.records["status"] == "ok")["ttft_s"].drop_nulls().to_numpy() * 1000
    print(
        f"TTFT the proxy measured upstream: p50 {np.percentile(own, 50):.3f} ms, p99 {np.percentile(own, 99):.3f} ms\n"
    )
    return added


def main() -> None:
    if sys.argv[1:2] == ["--agents-of"]:
        direct, proxied, count, calls = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(asyncio.run(agents(direct, proxied, count, calls))))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--calls", type=int, default=50, help="calls per agent, half through the proxy")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    added: list[dict[int, float]] = []
    with SimulatorProcess(SimConfig()) as sim, tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            added.append(asyncio.run(measure(sim, args.agents, args.calls, Path(tmp) / f"run{r}")))
    for q in (50, 99):
        each = [a[q] for a in added]
        print(
            f"added at p{q} over {len(each)} repeats: median {np.median(each):+.3f} ms "
            f"(from {min(each):+.3f} to {max(each):+.3f})"
        )


if __name__ == "__main__":
    main()
