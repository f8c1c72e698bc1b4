"""The sampler's own process (:mod:`.process`): ``python -m ipw_async.telemetry.sampler_child``,
its spec a line of JSON on stdin, its rows lines of JSON on stdout, until stdin ends."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import IO, Any

from .._clock import NS, now_ns
from .base import OpenSource, SourceUnavailable
from .sampler import Sampler
from .sources import from_recipe


def serve(spec: dict[str, Any], out: IO[str]) -> None:
    """The child: open the sources, tick until stdin ends, then the last reading and the cost."""
    lock = threading.Lock()

    def send(message: dict[str, Any]) -> None:
        with lock:
            out.write(json.dumps(message) + "\n")
            out.flush()

    opened = []
    try:
        for recipe, columns in zip(spec["recipes"], spec["columns"], strict=True):
            source = from_recipe(recipe)
            info = source.open()
            if info.columns != columns:  # the run's log was laid out for what it opened
                raise SourceUnavailable(f"{source.name} opened with other readings than the run's")
            opened.append(OpenSource(source, info))
    except (SourceUnavailable, ValueError) as exc:
        send(
            {"error": f"the sampler's process could not open its sources ({exc}): run with --sampler thread"}
        )
        return
    # its own cost from here: not its imports and the sources' opening, which a thread pays too
    began, cpu0 = now_ns(), time.process_time()
    sent: dict[str, int] = {}
    events: dict[str, dict[str, int]] = {}

    def on_row(row: dict[str, Any]) -> None:
        nonlocal events
        message: dict[str, Any] = {"row": row, "skipped": sampler.skipped, "scheduling": sampler.scheduling}
        grids = {
            ch: learned[sent.get(ch, 0) :]
            for ch, learned in sampler.grids.items()
            if len(learned) > sent.get(ch, 0)
        }
        if grids:
            message["grids"] = {ch: [g.as_dict() for g in new] for ch, new in grids.items()}
            sent.update({ch: len(sampler.grids[ch]) for ch in grids})
        if (now := sampler.counter_events()) != events:
            events = message["events"] = now
        send(message)

    sampler = Sampler(opened, spec["period_s"], spec["t0_ns"], spec["realtime"], spec["probe_s"], on_row)
    stop = threading.Event()
    failed: list[BaseException] = []

    def ticks() -> None:
        try:
            sampler.tick(stop)
        except BaseException as exc:  # said at once: the run stops following and ends this process
            failed.append(exc)
            send({"error": f"the sampler's process failed: {exc}"})

    ticker = threading.Thread(target=ticks, name="ipw-async-sampler", daemon=True)
    send({"ready": True})
    ticker.start()
    sys.stdin.read()  # until the run closes it, or is gone
    stop.set()
    ticker.join()
    if failed:
        return
    on_row(sampler.reading_now())  # the run's last
    # the whole process's CPU, not only its ticks': all of it is the sampler's
    cpu_s = time.process_time() - cpu0
    send({"end": {"cpu_s": cpu_s, "cpu_share": cpu_s / max((now_ns() - began) / NS, 1e-9)}})
    for s in opened:
        s.source.close()


if __name__ == "__main__":
    serve(json.loads(sys.stdin.readline()), sys.stdout)
