"""CPU package and DRAM energy from the Linux powercap RAPL interface (Intel, and AMD on recent kernels)."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .base import (
    CountedSource,
    CounterTracker,
    Meter,
    Quantity,
    Reading,
    SourceInfo,
    SourceUnavailable,
)

_PACKAGE_ZONE = re.compile(r"intel-rapl:(\d+)")
_SUB_ZONE = re.compile(r"intel-rapl:(\d+):(\d+)")
_READ_BYTES = 32  # energy_uj is at most 20 digits and a newline


@dataclass
class _Zone:
    """One RAPL domain found in the powercap tree."""

    channel: str
    path: Path


@dataclass
class _OpenZone:
    column: str
    fd: int
    tracker: CounterTracker


class RaplSource(CountedSource):
    """RAPL package and DRAM energy counters: channels ``rapl.package-N`` and ``rapl.dram-N``.

    The counters wrap at ``max_energy_range_uj`` (hundreds of kJ, minutes at full power);
    a wrap is detected as a decrease, so reads must come more often than once per wrap period.
    """

    name = "rapl"

    def __init__(self, root: Path = Path("/sys/class/powercap")) -> None:
        self.root = root
        self._open: list[_OpenZone] = []
        self.counters: dict[str, CounterTracker] = {}  # per channel; resets and wraps reach the summary

    def open(self) -> SourceInfo:
        if not self.root.is_dir():
            raise SourceUnavailable(
                f"no RAPL powercap interface at {self.root} "
                "(not an Intel/AMD Linux host, or powercap not mounted)"
            )
        zones = self._find_zones()
        if not zones:
            raise SourceUnavailable(f"no RAPL package zones under {self.root}")
        self._open = []
        self.counters = {}
        try:
            for zone in zones:
                self._open_zone(zone)
        except BaseException:
            self.close()
            raise
        channels = [z.channel for z in zones]
        return SourceInfo(
            columns=[z.column for z in self._open],
            meters=[Meter(channel=c, kind="counter", accelerator=False) for c in channels],
            description=f"RAPL energy counters: {', '.join(c.removeprefix('rapl.') for c in channels)}",
        )

    def read(self) -> Reading:
        values: dict[str, float | None] = {}
        for zone in self._open:
            try:
                # pread at offset 0 re-reads the sysfs attribute in one syscall (seek + read).
                raw = int(os.pread(zone.fd, _READ_BYTES, 0))
            except (OSError, ValueError):
                values[zone.column] = None
            else:
                values[zone.column] = zone.tracker.update(raw) / 1e6
        return Reading(values)

    def close(self) -> None:
        for zone in self._open:
            with contextlib.suppress(OSError):
                os.close(zone.fd)
        self._open = []

    def _find_zones(self) -> list[_Zone]:
        """Package zones in index order, each followed by its DRAM subzone if it has one."""
        zones: list[_Zone] = []
        packages = sorted(
            (int(m[1]), p) for p in self.root.iterdir() if (m := _PACKAGE_ZONE.fullmatch(p.name))
        )
        for index, package in packages:
            name = _read_name(package)
            # Other top-level zones (psys) cover the whole platform and would double count.
            if name is None or not name.startswith("package-"):
                continue
            zones.append(_Zone(channel=f"rapl.{name}", path=package))
            # sysfs nests subzones inside their package (and links them at the top); either will do.
            subzones = {
                int(m[2]): p
                for parent in (package, self.root)
                for p in parent.iterdir()
                if (m := _SUB_ZONE.fullmatch(p.name)) and int(m[1]) == index
            }
            for _, sub in sorted(subzones.items()):
                if _read_name(sub) == "dram":
                    index = name.removeprefix("package-")
                    zones.append(_Zone(channel=f"rapl.dram-{index}", path=sub))
                    break
        return zones

    def _open_zone(self, zone: _Zone) -> None:
        energy = zone.path / "energy_uj"
        try:
            fd = os.open(energy, os.O_RDONLY)
        except PermissionError as exc:
            raise SourceUnavailable(
                "RAPL energy counters need root on this kernel: run as root or "
                f"`sudo chmod a+r {self.root}/intel-rapl:*/energy_uj`"
            ) from exc
        except OSError as exc:
            raise SourceUnavailable(f"cannot open {energy}: {exc.strerror}") from exc
        tracker = CounterTracker(wrap_at=_read_int(zone.path / "max_energy_range_uj"))
        self._open.append(_OpenZone(column=f"{zone.channel}.{Quantity.ENERGY_J}", fd=fd, tracker=tracker))
        self.counters[zone.channel] = tracker
        try:
            int(os.pread(fd, _READ_BYTES, 0))
        except (OSError, ValueError) as exc:
            # Some VMs expose the files but fail every read.
            raise SourceUnavailable(f"cannot read {energy}: {exc}") from exc


def _read_name(zone: Path) -> str | None:
    try:
        return (zone / "name").read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None
