"""The machine a run ran on, as ``run.json`` records it: versions, host, and this boot (the
monotonic clock is continuous only within one)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for pkg in ("ipw-async", "httpx", "aiohttp", "polars", "pyarrow", "numpy", "nvidia-ml-py"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def boot_id() -> str | None:
    """This boot of this machine (Linux): the monotonic clock is only continuous within one."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def host() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "boot_id": boot_id(),
    }
