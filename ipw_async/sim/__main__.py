"""``python -m ipw_async.sim --config-json …``: the simulator process that ``run`` starts."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from .process import config_from_json
from .server import serve


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ipw_async.sim")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--config-json", required=True)
    args = parser.parse_args()
    config = config_from_json(args.config_json)

    async def run() -> None:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        await serve(config, args.host, args.port)

    with contextlib.suppress(asyncio.CancelledError, KeyboardInterrupt):
        asyncio.run(run())


if __name__ == "__main__":
    main()
