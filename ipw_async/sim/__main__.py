"""``python -m ipw_async.sim --config-json …``: the simulator process that ``run`` starts."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os

from .._loop import run as run_loop
from .config import SimConfig
from .server import serve


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ipw_async.sim")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--config-json", required=True)
    parser.add_argument(
        "--parent-pid", type=int, default=None, help="stop when this process is gone (even killed with -9)"
    )
    parser.add_argument("--cpus", default=None, help="run on these CPU cores only, e.g. 3 or 2,3 (Linux)")
    args = parser.parse_args()
    if args.cpus:
        os.sched_setaffinity(0, {int(core) for core in args.cpus.split(",")})
    config = SimConfig.from_json(args.config_json)

    async def run() -> None:
        if args.parent_pid is not None:
            asyncio.get_running_loop().create_task(_orphan_watch(args.parent_pid))
        await serve(config, args.host, args.port)

    # the harness stops its simulator with SIGTERM: the simulator's normal end
    with contextlib.suppress(KeyboardInterrupt):
        run_loop(run())


async def _orphan_watch(parent: int, period_s: float = 0.1) -> None:
    """Exit once the harness that started the simulator is gone: nobody is left to serve and it
    has nothing to save. Polling the parent pid works where the death signal cannot:
    PR_SET_PDEATHSIG fires when the *thread* that forked exits, and the harness starts the
    simulator from a worker thread that may end mid-run."""
    while os.getppid() == parent:
        await asyncio.sleep(period_s)
    os._exit(0)


if __name__ == "__main__":
    main()
