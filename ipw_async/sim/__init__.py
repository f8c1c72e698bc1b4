"""The built-in simulator: an OpenAI-compatible server and a simulated device (all SIMULATED)."""

from .physics import EngineConfig, drawn_physics
from .process import SimulatorError, SimulatorProcess
from .server import FAULT_OUTCOMES, SIM_MODEL, Faults, SimConfig, serve

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
]
