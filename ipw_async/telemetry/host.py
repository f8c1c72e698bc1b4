"""Host CPU utilisation and memory through psutil."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from .base import Reading, SourceInfo, SourceUnavailable, TelemetrySource

_MIB = 1 << 20  # memory in MiB, as the GPU columns


def import_psutil(source: str) -> ModuleType:
    """psutil, or SourceUnavailable naming ``source`` if it is not installed."""
    try:
        return importlib.import_module("psutil")
    except ImportError as exc:
        raise SourceUnavailable(f"{source} needs psutil: {exc}; pip install psutil") from exc


class CpuUtilisation:
    """System-wide CPU utilisation (%) since the previous call, with a baseline of its own.

    psutil.cpu_percent(interval=None) keeps one baseline per thread; sources read from a shared
    worker pool would take each other's interval, and the second of two reads in one tick sees
    no elapsed time and reports 0 %. Same arithmetic as psutil's.
    """

    def __init__(self, psutil: ModuleType) -> None:
        self._cpu_times = psutil.cpu_times
        self._last = self._cpu_times()
        self._percent: float | None = None

    def percent(self) -> float | None:
        """Utilisation since the last call; the previous value when no clock tick has elapsed."""
        now = self._cpu_times()
        total = _total(now) - _total(self._last)
        if total <= 0:
            # Keep the old baseline so the next call covers the whole interval.
            return self._percent
        busy = total - (_idle(now) - _idle(self._last))
        self._last = now
        self._percent = min(100.0, max(0.0, 100.0 * busy / total))
        return self._percent


def _total(times: Any) -> float:
    # Linux counts guest time inside user/nice as well; psutil subtracts it the same way.
    return sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


def _idle(times: Any) -> float:
    return times.idle + getattr(times, "iowait", 0.0)


class PsutilSource(TelemetrySource):
    """Host CPU utilisation, memory in use and the harness's own RSS; no meters."""

    name = "psutil"

    def __init__(self, pid: int | None = None) -> None:
        self._psutil: ModuleType | None = None
        self._util: CpuUtilisation | None = None
        self._pid = pid  # the run's process, whose memory is reported (None: this one)
        self._process: Any = None

    def open(self) -> SourceInfo:
        psutil = import_psutil("the psutil source")
        self._psutil = psutil
        self._util = CpuUtilisation(psutil)
        self._process = psutil.Process(self._pid)
        return SourceInfo(
            columns=["cpu.util_pct", "mem.used_mb", "proc.rss_mb"],
            description=f"host: {psutil.cpu_count()} logical CPUs, "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB memory (psutil {psutil.__version__})",
        )

    def read(self) -> Reading:
        assert self._psutil is not None and self._util is not None, "read() before open()"
        values: dict[str, float | None] = {}
        try:
            values["cpu.util_pct"] = self._util.percent()
        except OSError:
            values["cpu.util_pct"] = None
        try:
            values["mem.used_mb"] = self._psutil.virtual_memory().used / _MIB
        except OSError:
            values["mem.used_mb"] = None
        try:
            values["proc.rss_mb"] = self._process.memory_info().rss / _MIB
        except (OSError, self._psutil.Error):
            values["proc.rss_mb"] = None
        return Reading(values)
