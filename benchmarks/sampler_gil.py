"""Does a slow telemetry read on the sampler's thread stall the client's event loop?

The sampler reads its sources on a thread of its own (``ipw_async.telemetry.sampler``), and
the question behind moving it to a process of its own is whether those reads hold the GIL the
event loop needs. An NVML read costs about 3 ms of a CPU on an H100 host, and the counter
probe reads back to back. pynvml calls the driver through ``ctypes.CDLL``, which lets go of
the GIL for the call; psutil and sysfs reads parse text in Python, which does not.

This runs an event loop that does 0.5 ms of Python work per iteration and times a 1 ms sleep
(its lag: how late the loop ran the timer), while a thread beside it, under the switch
interval the sampler sets (0.5 ms), reads back to back with 2 ms between reads:

- ``no reads``: the thread only sleeps (the floor);
- ``C call, 3 ms``: a 3 ms call through ``ctypes.CDLL`` (libc's ``usleep``: how pynvml reads);
- ``Python, 3 ms``: 3 ms of Python bytecode (a read that parses in Python, at its worst);
- ``Python, 3 ms, own process``: the same reads in a process of their own, as
  ``--sampler process`` reads (``ipw_async.telemetry.process``).

Then how long one real read of that kind takes: a DCGM exporter's page for 8 GPUs (22 fields
each, as its default counters), parsed as ``--prometheus-url`` scrapes are parsed, in Python.

    python benchmarks/sampler_gil.py [--seconds 3] [--read-ms 3]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import multiprocessing
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event

import numpy as np

from ipw_async.telemetry.prometheus import parse
from ipw_async.telemetry.sampler import SWITCH_INTERVAL_S

LOOP_WORK_S = 0.0005  # the loop's own Python work per iteration
GAP_S = 0.002  # between the thread's reads, as the counter probe reads


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def reads_apart(stop: Event, read_s: float) -> None:
    """Python reads in a process of their own, as the sampler's process reads."""
    while not stop.is_set():
        spin(read_s)
        time.sleep(GAP_S)


async def loop_lag_ms(read: Callable[[], None] | float, seconds: float) -> tuple[float, float]:
    """The event loop's lag p50 and p99 (ms) over ``seconds`` while a thread calls ``read``
    (a float: Python reads that long, in a process of their own)."""
    stop: threading.Event | Event
    thread: threading.Thread | multiprocessing.process.BaseProcess
    if isinstance(read, float):
        spawn = multiprocessing.get_context("spawn")
        stop = spawn.Event()
        thread = spawn.Process(target=reads_apart, args=(stop, read), daemon=True)
    else:
        stop = threading.Event()
        call = read

        def reader() -> None:
            while not stop.is_set():
                call()
                time.sleep(GAP_S)

        thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    lags = []
    end = time.perf_counter() + seconds
    try:
        while time.perf_counter() < end:
            asked = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append((time.perf_counter() - asked - 0.001) * 1000)
            spin(LOOP_WORK_S)
    finally:
        stop.set()
        thread.join()
    p50, p99 = np.percentile(lags, [50, 99])
    return float(p50), float(p99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="each case's length")
    parser.add_argument("--read-ms", type=float, default=3.0, help="one read's length")
    args = parser.parse_args()
    libc = ctypes.CDLL(None)
    read_s = args.read_ms / 1000
    cases: dict[str, Callable[[], None] | float] = {
        "no reads": lambda: time.sleep(read_s),
        f"C call, {args.read_ms:g} ms": lambda: libc.usleep(int(args.read_ms * 1000)),
        f"Python, {args.read_ms:g} ms": lambda: spin(read_s),
        f"Python, {args.read_ms:g} ms, own process": read_s,
    }
    saved = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        print(f"{'reads on the thread':<28} {'loop lag p50':>13} {'loop lag p99':>13}")
        for name, read in cases.items():
            p50, p99 = asyncio.run(loop_lag_ms(read, args.seconds))
            print(f"{name:<28} {p50:>10.3f} ms {p99:>10.3f} ms")
    finally:
        sys.setswitchinterval(saved)
    text = dcgm_page(gpus=8)
    t0 = time.perf_counter()
    for _ in range(PARSES):
        list(parse(text))
    each_ms = (time.perf_counter() - t0) / PARSES * 1e3
    print(f"a DCGM exporter scrape, 8 GPUs ({len(text) / 1e3:.0f} kB), parsed in Python: {each_ms:.2f} ms")


PARSES = 200
DCGM_DEFAULT_FIELDS = (
    "SM_CLOCK", "MEM_CLOCK", "MEMORY_TEMP", "GPU_TEMP", "POWER_USAGE", "POWER_USAGE_INSTANT",
    "TOTAL_ENERGY_CONSUMPTION", "PCIE_REPLAY_COUNTER", "GPU_UTIL", "MEM_COPY_UTIL", "ENC_UTIL",
    "DEC_UTIL", "XID_ERRORS", "FB_FREE", "FB_USED", "NVLINK_BANDWIDTH_TOTAL", "VGPU_LICENSE_STATUS",
)  # fmt: skip
DCGM_PROFILING_FIELDS = (
    "GR_ENGINE_ACTIVE",
    "PIPE_TENSOR_ACTIVE",
    "DRAM_ACTIVE",
    "PCIE_TX_BYTES",
    "PCIE_RX_BYTES",
)


def dcgm_page(gpus: int) -> str:
    """A DCGM exporter's page: each field's help and type, then a labelled sample per GPU."""
    names = [f"DCGM_FI_DEV_{f}" for f in DCGM_DEFAULT_FIELDS] + [
        f"DCGM_FI_PROF_{f}" for f in DCGM_PROFILING_FIELDS
    ]
    lines = []
    for name in names:
        lines += [f"# HELP {name} {name}.", f"# TYPE {name} gauge"]
        for g in range(gpus):
            labels = (
                f'gpu="{g}",UUID="GPU-{g:08d}-0000-0000-0000-000000000000",device="nvidia{g}",'
                'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-host",DCGM_FI_DRIVER_VERSION="550.54.15"'
            )
            lines.append(f"{name}{{{labels}}} {1234.5 + g}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
