"""How long ipw-async's processes take to start: each started afresh, its wall time to exit.

- ``ipw-async --help``: the command line, every command registered;
- ``ipw-async run --concurrency 0``: a bad option, refused in one line;
- the simulator's process (``python -m ipw_async.sim --help``: its imports, then argparse),
  which every run without ``--base-url`` starts;
- ``import ipw_async.client``: the streaming client alone, as a library user or a worker
  process imports it.

Each is run ``--repeats`` times; printed: the median and the range, in seconds, and the heavy
libraries each loads. The machine's speed sets the figures: compare them on one machine.

    python benchmarks/startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

HEAVY = ("scipy", "polars", "pyarrow", "aiohttp", "httpx", "numpy")
CASES = {
    "ipw-async --help": ["-m", "ipw_async", "--help"],
    "ipw-async run --concurrency 0 (refused)": ["-m", "ipw_async", "run", "--concurrency", "0"],
    "the simulator's process": ["-m", "ipw_async.sim", "--help"],
    "import ipw_async.client": ["-c", "import ipw_async.client"],
}
# what each case imports, read in a process of its own (the cases' own timings stay clean)
IMPORTS = {
    "ipw-async --help": "import ipw_async.cli",
    "ipw-async run --concurrency 0 (refused)": "import ipw_async.cli",
    "the simulator's process": "import ipw_async.sim.__main__",
    "import ipw_async.client": "import ipw_async.client",
}


def wall_s(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], capture_output=True, check=False)
    return time.perf_counter() - start


def heavy_loaded(statement: str) -> list[str]:
    code = f"import sys; {statement}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [m for m in HEAVY if m in loaded.stdout.split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="starts of each process (default 5)")
    args = parser.parse_args()
    wall_s(["-c", "import ipw_async.cli"])  # the first start compiles the bytecode: not counted
    print(f"{'process':42} {'median s':>9} {'range s':>13}  loads")
    for name, argv in CASES.items():
        times = [wall_s(argv) for _ in range(args.repeats)]
        spread = f"{min(times):.2f}–{max(times):.2f}"
        print(f"{name:42} {statistics.median(times):9.2f} {spread:>13}  {', '.join(heavy_loaded(IMPORTS[name]))}")


if __name__ == "__main__":
    main()
