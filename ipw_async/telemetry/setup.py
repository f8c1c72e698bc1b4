"""The sources a run reads, opened as its options name them: this machine's, agents' and
scrapes', each skipped with its reason where it cannot be read."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .base import OpenSource, SourceUnavailable, TelemetrySource
from .http import redact_url
from .prometheus import PrometheusSource
from .remote import Agent
from .sim import SimDeviceSource
from .sources import available_source_names, make_source


@dataclass(frozen=True)
class RemoteAccess:
    """How agents and exporters are reached: credentials, the CA, the agents' schedule."""

    agent_token: str | None = field(default=None, repr=False)
    scrape_token: str | None = field(default=None, repr=False)
    ca_file: Path | None = None
    period_s: float = 0.05  # the agents stream a reading of each source this often
    probe_s: float = 1.0  # and probe their counters' grids for this long, every 20 s
    realtime: bool = True  # the threads following them ask for real-time scheduling


@dataclass
class TelemetrySetup:
    opened: list[OpenSource] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # source name -> why

    @property
    def simulated(self) -> bool:
        """Whether any energy it reads comes from a simulated device (ipw-async's simulator,
        here, through an agent or scraped): the run's figures are then simulated too."""
        return any(s.info.simulated for s in self.opened)

    def close(self) -> None:
        for s in self.opened:
            s.source.close()


def _importable(module: str) -> bool:
    """Whether ``module`` is there to import, without importing it."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _names(spec: str, simulated: bool, remote: bool) -> list[str]:
    if spec == "none":
        return []
    if spec == "auto":
        # The simulated device stands in for the GPU; a real GPU beside it would measure
        # something other than the simulated server; so would this machine's GPUs when the
        # server's are read through an agent or its exporter.
        if remote:
            return ["rapl", "psutil"]
        if simulated:
            return ["sim", "rapl", "psutil"]
        # AMD SMI only where its package is installed, so NVIDIA machines get no "skipped" line
        return ["nvml", "amdsmi", "rapl", "psutil"] if _importable("amdsmi") else ["nvml", "rapl", "psutil"]
    names = [n.strip() for n in spec.split(",") if n.strip()]
    valid = {*available_source_names(), "sim"}
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(
            f"unknown telemetry source {', '.join(unknown)}; choose auto, none or a list of "
            f"{', '.join(sorted(valid))}"
        )
    return names


def open_sources(
    spec: str,
    *,
    sim_root_url: str | None = None,
    gpus: Sequence[str] | None = None,
    agents: Sequence[str] = (),
    scrapes: Sequence[str] = (),
    access: RemoteAccess | None = None,
) -> TelemetrySetup:
    """Open what ``spec`` names (``auto``, ``none`` or a comma list), every source of each agent
    in ``agents`` and each Prometheus endpoint in ``scrapes`` (URLs), reached as ``access``
    says; unavailable ones are skipped with their reason (by URL, credentials left out). With
    ``auto``, a CPU power estimate stands in when RAPL is unavailable, and this machine's GPUs
    are left out where the URLs gave GPUs."""
    setup = TelemetrySetup()
    access = access or RemoteAccess()
    for url in agents:
        try:
            agent = Agent(
                url,
                token=access.agent_token,
                ca_file=access.ca_file,
                period_s=access.period_s,
                probe_s=access.probe_s,
                realtime=access.realtime,
            )
            remote: list[TelemetrySource] = list(agent.sources())
        except SourceUnavailable as exc:
            setup.skipped[redact_url(url)] = str(exc)
            continue
        setup.opened += [OpenSource(r, r.open()) for r in remote]
    for url in scrapes:
        try:
            scrape = PrometheusSource(url, token=access.scrape_token, ca_file=access.ca_file)
            setup.opened.append(OpenSource(scrape, scrape.open()))
        except SourceUnavailable as exc:
            setup.skipped[redact_url(url)] = str(exc)
    remote_gpus = any(m.accelerator for s in setup.opened for m in s.info.meters)
    names = _names(spec, sim_root_url is not None, remote_gpus)
    for name in names:
        if name == "sim":
            if sim_root_url is None:
                setup.skipped[name] = "no simulator in this run"
                continue
            source: TelemetrySource = SimDeviceSource(sim_root_url)
        else:
            source = make_source(name, gpus=gpus)
        try:
            setup.opened.append(OpenSource(source, source.open()))
        except SourceUnavailable as exc:
            setup.skipped[name] = str(exc)
    if spec == "auto" and "rapl" in setup.skipped:
        source = make_source("cpu-model")
        setup.opened.append(OpenSource(source, source.open()))
    return setup
