"""The built-in simulator: an OpenAI-compatible server and a simulated device (all SIMULATED)."""

from .config import SIM_MODEL, SimConfig
from .faults import FAULT_OUTCOMES, Faults
from .physics import EngineConfig, drawn_physics
from .process import SimulatorError, SimulatorProcess, simulator_apart
from .server import serve

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
