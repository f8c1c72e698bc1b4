"""What a run's exports cost on a 10,000-request run: Parquet and IPW's ``dataset/`` inside
``finalize``, an OTLP export, an MLflow export and ``report.html``.

The run is ``finalize_scale.py``'s: one real simulator run (500 requests by default) tiled in
time to N requests, then finalized (best of 2). Each export then reads the finished directory:

- **finalize**: its wall time, and the part spent writing ``records.parquet``,
  ``telemetry.parquet`` and ``dataset/`` as a share of the rest (target ≤ 10%);
- **OTLP**: ``export_otel`` to an OTLP/HTTP receiver on loopback in a child process that
  reads each request and answers 200, with the spans sent and the wall time (target ≤ 30 s);
- **MLflow**: ``export_mlflow`` to a file store in a temporary directory (target ≤ 30 s);
- **report.html**: the time to write it, its size (target under 5 MB), and the time Chromium
  (``/usr/bin/chromium`` or ``$IPW_ASYNC_CHROMIUM``, driven by playwright) takes from
  navigation to the load event (target under 2 s); skipped, and said so, with no browser.

    python benchmarks/export_cost.py [--requests 10000] [--keep DIR] [--seed-requests 500]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from finalize_scale import Seed, seed_run, time_finalize

from ipw_async.analysis.html_report import write_report
from ipw_async.export.mlflow import export_mlflow
from ipw_async.export.otel import export_otel
from ipw_async.rundir import files

EXPORT_S_TARGET = 30.0
REPORT_MB_TARGET = 5.0
REPORT_LOAD_S_TARGET = 2.0
FINALIZE_SHARE_TARGET = 0.10

# a collector stand-in in its own process, so its reading does not share our interpreter
RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def otlp(run_dir: Path) -> str:
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline())
        start = time.perf_counter()
        done = export_otel(run_dir, f"http://127.0.0.1:{port}", timeout_s=30)
        elapsed = time.perf_counter() - start
    finally:
        receiver.terminate()
        receiver.wait()
    spans = sum(done.spans.values())
    return f"OTLP export: {spans:,} spans in {elapsed:.1f} s (target ≤ {EXPORT_S_TARGET:.0f} s: {verdict(elapsed <= EXPORT_S_TARGET)})"


def mlflow(run_dir: Path, tmp: Path) -> str:
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    start = time.perf_counter()
    export_mlflow(run_dir, tracking_uri=(tmp / "mlruns").as_uri())
    elapsed = time.perf_counter() - start
    return (
        f"MLflow export: {elapsed:.1f} s, the first in this process (target ≤ {EXPORT_S_TARGET:.0f} s: "
        f"{verdict(elapsed <= EXPORT_S_TARGET)})"
    )


def report(run_dir: Path) -> str:
    start = time.perf_counter()
    page = write_report(run_dir)
    written = time.perf_counter() - start
    size_mb = page.stat().st_size / 1e6
    line = (
        f"report.html: written in {written:.1f} s, {size_mb:.2f} MB "
        f"(target < {REPORT_MB_TARGET:.0f} MB: {verdict(size_mb < REPORT_MB_TARGET)})"
    )
    browser = os.environ.get("IPW_ASYNC_CHROMIUM", "/usr/bin/chromium")
    if not Path(browser).is_file():
        return line + f"; not opened: no Chromium at {browser}"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=browser, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        tab = chromium.new_page()
        start = time.perf_counter()
        tab.goto(page.as_uri(), wait_until="load")
        load_s = time.perf_counter() - start
        chromium.close()
    return line + (
        f"; loaded in Chromium in {load_s:.2f} s (target < {REPORT_LOAD_S_TARGET:.0f} s: "
        f"{verdict(load_s < REPORT_LOAD_S_TARGET)})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=10_000, help="requests in the tiled run")
    parser.add_argument("--keep", type=Path, help="keep the seed and the tiled run here (reused when there)")
    parser.add_argument("--seed-requests", type=int, default=500, help="requests in the seed run")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        root = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="export_cost_")))
        root.mkdir(parents=True, exist_ok=True)
        if not (root / "seed" / files.SUMMARY).is_file():
            print(f"seed: {args.seed_requests} requests against the simulator …", file=sys.stderr)
            asyncio.run(seed_run(root / "seed", args.seed_requests))
        run_dir = root / f"n{args.requests}"
        Seed.read(root / "seed").build(args.requests, run_dir)
        timing, _ = time_finalize(run_dir, args.requests, repeats=2)
        share = timing.exports_s / (timing.finalize_s - timing.exports_s)
        print(f"{args.requests:,} requests")
        print(
            f"finalize: {timing.finalize_s:.2f} s, of which Parquet and dataset/ {timing.exports_s:.2f} s: "
            f"+{100 * share:.1f}% (target ≤ {100 * FINALIZE_SHARE_TARGET:.0f}%: {verdict(share <= FINALIZE_SHARE_TARGET)})"
        )
        print(otlp(run_dir))
        print(mlflow(run_dir, Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mlruns_")))))
        print(report(run_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
