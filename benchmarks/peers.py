"""Marginal client CPU per SSE event: ipw-async against guidellm and NVIDIA AIPerf.

All clients stream 128-token chat completions (64-token prompts) from one zero-delay
``guidellm mock-server --ttft-ms 0 --itl-ms 0 --output-tokens 128``, which sends each stream as
fast as it can, so every client runs flat out (or at the paced rate, for the rate modes).

For each client this runs it at N and at 3N requests and takes

    marginal CPU per event = (CPU(3N) - CPU(N)) / (events(3N) - events(N))

where CPU is the user+sys time of the client's whole process tree (``getrusage(RUSAGE_CHILDREN)``
around the run; this script makes itself a child subreaper so that daemonised grandchildren are
reaped, and so counted, too) and events are the SSE ``data:`` events the *server* wrote, counted
inside the mock server (a small launcher runs the unmodified ``guidellm mock-server`` command
with a counter around sanic's ``ResponseStream.write`` and a ``GET /_peers/stats`` route; the
access log is switched off so the server spends less of the shared CPU). Start-up, imports,
tokenizer loading and report writing cancel out in the difference. Each pair is run
``--repeats`` times (default 2) and the median is reported.

Clients and modes:

- ``ipw-async``      ``ipw-async run`` at concurrency 64 (the checkout this script lives in is put
  first on PYTHONPATH, so it is what gets measured).
- ``ipw-async-rate`` ``ipw-async run --rate R --arrival constant``: the same pacing as aiperf-rate.
- ``ipw-async-default`` ``ipw-async run`` at concurrency 64 as users run it: its default telemetry
  (psutil and the CPU model here, NVML and RAPL where there are) and idle baseline, where the
  two rows above measure with ``--telemetry none --baseline-s 0``, like the peers.
- ``ipw-async-rate-default`` the paced run as users run it, with the same defaults. Paced, a run
  lasts as long at any speed of client, so what it does every second (the sampler's ticks, the
  loop-lag timer, flushes) lands in the marginal figure.
- ``guidellm``       ``guidellm run --profile kind=concurrent,streams=64``.
- ``aiperf-rate``    ``aiperf profile --request-rate R --arrival-pattern constant``.
- ``aiperf-c64``     ``aiperf profile --concurrency 64``.

The peers need a tokenizer and this machine may have no route to the Hugging Face hub, so a
small byte-level BPE tokenizer is trained on the Python standard library (in a second, with the
peer venv's ``tokenizers``) and given to both as a local path. AIPerf tokenises every response
with it by default, as it would with a real model's tokenizer.

Installing the peers, each in its own venv (the defaults of --guidellm-bin and --aiperf-bin):

    python3.11 -m venv /work/peers/guidellm && /work/peers/guidellm/bin/pip install guidellm
    python3.11 -m venv /work/peers/aiperf && /work/peers/aiperf/bin/pip install aiperf

guidellm's venv is required (it is the server); a missing aiperf or ipw-async is skipped with a
one-line message. Run:

    python benchmarks/peers.py [--requests 400] [--rate 50] [--repeats 2]
        [--clients ipw-async,ipw-async-rate,ipw-async-default,ipw-async-rate-default,
                   guidellm,aiperf-rate,aiperf-c64]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
CONCURRENCY = 64
PROMPT_TOKENS = 64
OUTPUT_TOKENS = 128
IPW_CLIENTS = ("ipw-async", "ipw-async-rate", "ipw-async-default", "ipw-async-rate-default")
ALL_CLIENTS = (*IPW_CLIENTS, "guidellm", "aiperf-rate", "aiperf-c64")

# Runs `guidellm mock-server ARGS...` unchanged but for an SSE event counter and no access log.
MOCK_LAUNCHER = """
import sys
from sanic import response as sr
from guidellm.mock_server import server as ms
counts = {"events": 0, "streams": 0}
_write = sr.ResponseStream.write
async def write(self, message):
    text = message if isinstance(message, str) else bytes(message).decode("utf-8", "replace")
    counts["events"] += text.count("data:")
    counts["streams"] += text.count("data: [DONE]")
    return await _write(self, message)
sr.ResponseStream.write = write
_init = ms.MockServer.__init__
def init(self, config):
    _init(self, config)
    async def stats(_request):
        return sr.json(counts)
    self.app.add_route(stats, "/_peers/stats", methods=["GET"])
ms.MockServer.__init__ = init
_run = ms.MockServer.run
def run(self, *, access_log=False):
    _run(self, access_log=access_log)
ms.MockServer.run = run
from guidellm.cli import cli
cli(["mock-server", *sys.argv[1:]], prog_name="guidellm")
"""

# Trains a small byte-level BPE tokenizer on the standard library and saves it for AutoTokenizer.
TOKENIZER_BUILDER = """
import glob, sys, sysconfig
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
files = sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/*.py"))[:60]
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=4000, special_tokens=["<|endoftext|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train(files, trainer)
PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
    bos_token="<|endoftext|>").save_pretrained(sys.argv[1])
"""


@dataclass
class Run:
    requests: int
    cpu_s: float
    wall_s: float
    events: int
    streams: int
    rate: float | None  # requests/s the client itself reported, where it could be read


@dataclass
class Client:
    name: str
    mode: str
    argv: Callable[[int, Path], list[str]]  # (requests, scratch dir) -> command line
    env: dict[str, str] = field(default_factory=dict)
    rate: Callable[[Path], float | None] = lambda _d: None  # requests/s from the client's report
    runs: list[tuple[Run, Run]] = field(default_factory=list)


class Server:
    """The guidellm mock server, with its SSE event counter."""

    def __init__(self, python: Path, log: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.argv = [
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--ttft-ms",
            "0",
            "--itl-ms",
            "0",
            "--output-tokens",
            str(OUTPUT_TOKENS),
        ]
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [str(python), "-c", MOCK_LAUNCHER, *self.argv], stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 90
        while True:
            try:
                self.stats()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"peers.py: the guidellm mock server did not start; see {log}")
                time.sleep(0.3)
        with urllib.request.urlopen(f"{self.base}/v1/models", timeout=10) as r:
            self.model: str = json.load(r)["data"][0]["id"]

    def stats(self) -> tuple[int, int]:
        with urllib.request.urlopen(f"{self.base}/_peers/stats", timeout=10) as r:
            d = json.load(r)
        return int(d["events"]), int(d["streams"])

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def become_subreaper() -> None:
    """Orphaned descendants get reparented to this process, so their CPU reaches RUSAGE_CHILDREN."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap_descendants(keep: int, grace_s: float = 15.0) -> None:
    """Wait for (then kill) every child but the server, and reap each, so its CPU time counts."""
    deadline = time.monotonic() + grace_s
    while True:
        kids = [p for p in psutil.Process().children() if p.pid != keep]
        if not kids:
            return
        for p in kids:
            with contextlib.suppress(ChildProcessError, psutil.Error):
                if p.status() == psutil.STATUS_ZOMBIE or time.monotonic() > deadline:
                    if p.status() != psutil.STATUS_ZOMBIE:
                        p.kill()
                    os.waitpid(p.pid, 0)
        time.sleep(0.1)


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure(client: Client, n: int, server: Server, work: Path, timeout_s: float) -> Run:
    scratch = Path(tempfile.mkdtemp(prefix=f"{client.name}-{n}-", dir=work))
    argv = client.argv(n, scratch)
    env = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", "NO_COLOR": "1", **client.env}
    ev0, st0 = server.stats()
    cpu0 = children_cpu_s()
    t0 = time.monotonic()
    with (scratch / "client.log").open("wb") as log:
        proc = subprocess.Popen(
            argv, cwd=scratch, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = -1
    wall = time.monotonic() - t0
    reap_descendants(keep=server.proc.pid)
    cpu = children_cpu_s() - cpu0
    ev1, st1 = server.stats()
    if rc != 0:
        tail = (scratch / "client.log").read_text(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(f"{client.name} exited {rc} after {wall:.0f} s: {' | '.join(tail)}")
    try:
        rate = client.rate(scratch)
    except (OSError, LookupError, TypeError, ValueError):
        rate = None
    return Run(n, cpu, wall, ev1 - ev0, st1 - st0, rate)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def make_clients(args: argparse.Namespace, server: Server, tokenizer: Path) -> list[Client]:
    clients: list[Client] = []
    base, model, rate = server.base, server.model, args.rate
    wanted = set(args.clients.split(","))

    ipw = [args.ipw_async] if shutil.which(args.ipw_async) else None
    if ipw is None and (REPO / "ipw_async").is_dir():
        ipw = [sys.executable, "-m", "ipw_async"]
    if wanted & set(IPW_CLIENTS) and ipw is None:
        print(f"peers.py: skipping ipw-async: {args.ipw_async} not found", file=sys.stderr)
    elif ipw is not None:
        pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)

        # the peers' own telemetry is off: the same for ipw-async, except as users run it
        bare = ["--telemetry", "none", "--baseline-s", "0"]

        def ipw_argv(load: list[str], settings: list[str] = bare) -> Callable[[int, Path], list[str]]:
            return lambda n, d: [
                *ipw,
                "run",
                "--base-url",
                f"{base}/v1",
                "--model",
                model,
                *load,
                "--dataset",
                "synthetic",
                "--output-tokens",
                str(OUTPUT_TOKENS),
                "--prompt-tokens",
                str(PROMPT_TOKENS),
                "--length-sigma",
                "0",
                *settings,
                "--max-queries",
                str(n),
                "--output-dir",
                str(d / "run"),
                "--no-dashboard",
            ]

        def ipw_rate(d: Path) -> float:
            return float(read_json(d / "run" / "summary.json")["throughput"]["requests_per_s"])

        env = {"PYTHONPATH": pythonpath}
        if "ipw-async" in wanted:
            load = ["--concurrency", str(CONCURRENCY)]
            clients.append(Client("ipw-async", f"c{CONCURRENCY}", ipw_argv(load), env, ipw_rate))
        paced = ["--rate", str(rate), "--arrival", "constant"]
        if "ipw-async-rate" in wanted:
            clients.append(Client("ipw-async", f"rate {rate:g}/s", ipw_argv(paced), env, ipw_rate))
        if "ipw-async-default" in wanted:
            load = ["--concurrency", str(CONCURRENCY)]
            clients.append(Client("ipw-async", f"c{CONCURRENCY} default", ipw_argv(load, []), env, ipw_rate))
        if "ipw-async-rate-default" in wanted:
            clients.append(
                Client("ipw-async", f"rate {rate:g}/s default", ipw_argv(paced, []), env, ipw_rate)
            )

    guidellm = args.guidellm_bin / "guidellm"
    if "guidellm" in wanted:

        def gl_rate(d: Path) -> float:
            b = read_json(d / "benchmarks.json")["benchmarks"][0]
            return float(b["metrics"]["requests_per_second"]["successful"]["mean"])

        clients.append(
            Client(
                "guidellm",
                f"c{CONCURRENCY}",
                lambda n, d: [
                    str(guidellm),
                    "run",
                    "--backend",
                    f"kind=openai_http,target={base}",
                    "--profile",
                    f"kind=concurrent,streams={CONCURRENCY}",
                    "--constraint",
                    f"kind=max_requests,count={n}",
                    "--data",
                    f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
                    "--tokenizer",
                    f"kind=huggingface_auto,model={tokenizer}",
                    "--disable-progress",
                ],
                {"HF_HUB_OFFLINE": "1"},
                gl_rate,
            )
        )

    aiperf = args.aiperf_bin / "aiperf"
    if wanted & {"aiperf-rate", "aiperf-c64"} and not aiperf.exists():
        print(
            f"peers.py: skipping aiperf: {aiperf} not found "
            f"(python3.11 -m venv {args.aiperf_bin.parent} && {args.aiperf_bin}/pip install aiperf)",
            file=sys.stderr,
        )
    elif aiperf.exists():

        def aiperf_argv(load: list[str]) -> Callable[[int, Path], list[str]]:
            return lambda n, d: [
                str(aiperf),
                "profile",
                "--model",
                model,
                "--url",
                base,
                "--endpoint-type",
                "chat",
                "--streaming",
                "--tokenizer",
                str(tokenizer),
                "--isl",
                str(PROMPT_TOKENS),
                "--osl",
                str(OUTPUT_TOKENS),
                "--request-count",
                str(n),
                *load,
                "--ui-type",
                "none",
                "--no-server-metrics",
                "--no-gpu-telemetry",
                "--output-artifact-dir",
                str(d / "out"),
            ]

        def ap_rate(d: Path) -> float:
            return float(read_json(d / "out" / "profile_export_aiperf.json")["request_throughput"]["avg"])

        if "aiperf-rate" in wanted:
            load = ["--request-rate", str(rate), "--arrival-pattern", "constant"]
            clients.append(Client("aiperf", f"rate {rate:g}/s", aiperf_argv(load), {}, ap_rate))
        if "aiperf-c64" in wanted:
            load = ["--concurrency", str(CONCURRENCY)]
            clients.append(Client("aiperf", f"c{CONCURRENCY}", aiperf_argv(load), {}, ap_rate))
    return clients


def marginal_us(pair: tuple[Run, Run]) -> float:
    small, big = pair
    return (big.cpu_s - small.cpu_s) / max(big.events - small.events, 1) * 1e6


def report(clients: list[Client]) -> None:
    figures = {id(c): statistics.median(marginal_us(p) for p in c.runs) for c in clients if c.runs}
    ref_c64 = next(
        (
            figures[id(c)]
            for c in clients
            if c.name == "ipw-async" and id(c) in figures and c.mode.startswith("c")
        ),
        None,
    )
    ref_rate = next(
        (
            figures[id(c)]
            for c in clients
            if c.name == "ipw-async" and id(c) in figures and c.mode.startswith("rate")
        ),
        None,
    )
    head = (
        f"{'client':<10} {'mode':<12} {'requests':>9} {'events':>9} {'ev/str':>6} {'req/s':>11} "
        f"{'CPU s N/3N':>13} {'µs/event':>9} {'pairs':>13} {'ipw÷(c64)':>9} {'ipw÷(same)':>10}"
    )
    print()
    print(head)
    print("-" * len(head))
    for c in clients:
        if not c.runs:
            print(f"{c.name:<10} {c.mode:<12} failed (see above)")
            continue
        small, big = c.runs[0]
        dev = sum(b.events - s.events for s, b in c.runs) // len(c.runs)
        dstr = sum(b.streams - s.streams for s, b in c.runs) / len(c.runs)
        per_stream = dev / dstr if dstr else float("nan")
        rates = [r.rate for p in c.runs for r in p if r.rate is not None]
        rate = f"{min(rates):.0f}-{max(rates):.0f}" if rates else "-"
        cpu = f"{statistics.median(p[0].cpu_s for p in c.runs):.1f}/{statistics.median(p[1].cpu_s for p in c.runs):.1f}"
        fig = figures[id(c)]
        pairs = "/".join(f"{marginal_us(p):.1f}" for p in c.runs)
        same = ref_rate if c.mode.startswith("rate") else ref_c64
        r64 = f"{ref_c64 / fig:.2f}" if ref_c64 else "-"
        rsame = f"{same / fig:.2f}" if same else "-"
        print(
            f"{c.name:<10} {c.mode:<12} {f'{small.requests}/{big.requests}':>9} {dev:>9} {per_stream:>6.1f} "
            f"{rate:>11} {cpu:>13} {fig:>9.1f} {pairs:>13} {r64:>9} {rsame:>10}"
        )
    print(
        "\nrequests: N/3N per pair; events: SSE data: events the server sent in 3N minus in N "
        "(mean over pairs);\nev/str: those events per stream (content chunks + finish + usage + [DONE]); "
        "req/s: as the client reported it;\nCPU s: client process tree user+sys, median; µs/event: "
        "median marginal CPU per event, pairs: each pair's;\nipw÷: ipw-async's µs/event over this row's "
        "(c64 row; same-mode row), below 1 = ipw-async spends less."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=(
            "Marginal client CPU per SSE event of ipw-async, guidellm and AIPerf against one zero-delay "
            "guidellm mock server: (CPU(3N) - CPU(N)) / (events(3N) - events(N)), median of --repeats pairs."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=400, help="N: each pair runs N then 3N requests.")
    parser.add_argument(
        "--rate",
        type=float,
        default=50.0,
        help="Requests/s of the paced (open-loop, constant arrivals) modes; keep it below what the "
        "machine's cores can serve and stream at once.",
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="(N, 3N) pairs per client; the median is reported."
    )
    parser.add_argument(
        "--clients",
        default=",".join(ALL_CLIENTS),
        help=f"Comma-separated subset of {', '.join(ALL_CLIENTS)}.",
    )
    parser.add_argument(
        "--guidellm-bin",
        type=Path,
        default=Path("/work/peers/guidellm/bin"),
        help="bin/ of the venv with guidellm installed; its python serves the mock server (required).",
    )
    parser.add_argument(
        "--aiperf-bin",
        type=Path,
        default=Path("/work/peers/aiperf/bin"),
        help="bin/ of the venv with aiperf installed (skipped if absent).",
    )
    parser.add_argument(
        "--ipw-async",
        default="ipw-async",
        help="ipw-async executable (or `python -m ipw_async` from this checkout if not found); "
        "this checkout is put first on its PYTHONPATH.",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="Seconds one client run may take.")
    parser.add_argument(
        "--keep", action="store_true", help="Keep the scratch directory (logs, client reports)."
    )
    args = parser.parse_args()
    if unknown := set(args.clients.split(",")) - set(ALL_CLIENTS):
        parser.error(f"unknown clients: {', '.join(sorted(unknown))}")

    gl_python = args.guidellm_bin / "python"
    if not (gl_python.exists() and (args.guidellm_bin / "guidellm").exists()):
        sys.exit(
            f"peers.py: guidellm not found in {args.guidellm_bin} (it serves the mock server): "
            f"python3.11 -m venv {args.guidellm_bin.parent} && {args.guidellm_bin}/pip install guidellm"
        )

    become_subreaper()
    work = Path(tempfile.mkdtemp(prefix="ipw-peers-"))
    tokenizer = work / "tokenizer"
    subprocess.run([str(gl_python), "-c", TOKENIZER_BUILDER, str(tokenizer)], check=True)
    server = Server(gl_python, work / "server.log")
    print(
        f"mock server: guidellm mock-server {' '.join(server.argv)} (model {server.model}); scratch {work}",
        file=sys.stderr,
    )
    started = time.monotonic()
    clients = make_clients(args, server, tokenizer)
    print("commands (N requests, DIR a scratch directory):", file=sys.stderr)
    for c in clients:
        print(f"  {c.name} {c.mode}: {' '.join(c.argv(args.requests, Path('DIR')))}", file=sys.stderr)
    try:
        for c in clients:
            for rep in range(args.repeats):
                try:
                    small = measure(c, args.requests, server, work, args.timeout)
                    big = measure(c, 3 * args.requests, server, work, args.timeout)
                except RuntimeError as e:
                    print(f"peers.py: {c.name} {c.mode} failed: {e}", file=sys.stderr)
                    break
                pair = (small, big)
                c.runs.append(pair)
                print(
                    f"[{time.monotonic() - started:5.0f} s] {c.name} {c.mode} pair {rep + 1}: "
                    + ", ".join(
                        f"{r.requests} req {r.cpu_s:.1f} CPU s {r.wall_s:.0f} s wall {r.events} ev"
                        for r in pair
                    )
                    + f" -> {marginal_us(pair):.1f} µs/event",
                    file=sys.stderr,
                )
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(clients)


if __name__ == "__main__":
    main()
