"""The built-in simulator: an OpenAI-compatible server and a simulated device (all SIMULATED).

The public names load their module on first use: the simulator's own process imports its
server, not the harness's side (the process that starts it, httpx) nor the run's accounting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

_EXPORTS: dict[str, str] = {
    "SIM_MODEL": "config",
    "SimConfig": "config",
    "FAULT_OUTCOMES": "faults",
    "Faults": "faults",
    "EngineConfig": "physics",
    "drawn_physics": "physics",
    "SimulatorError": "process",
    "SimulatorProcess": "process",
    "simulator_apart": "process",
    "serve": "server",
}

__all__ = [
    "FAULT_OUTCOMES",
    "SIM_MODEL",
    "EngineConfig",
    "Faults",
    "SimConfig",
    "SimulatorError",
    "SimulatorProcess",
    "drawn_physics",
    "serve",
    "simulator_apart",
]

if TYPE_CHECKING:
    from .config import SIM_MODEL, SimConfig
    from .faults import FAULT_OUTCOMES, Faults
    from .physics import EngineConfig, drawn_physics
    from .process import SimulatorError, SimulatorProcess, simulator_apart
    from .server import serve

__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())
