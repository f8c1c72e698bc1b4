"""What a simulator is started with: its engine, its faults, and how its model answers."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Self

from .._options import option
from .faults import Faults
from .physics import EngineConfig

SIM_MODEL = "sim-small"


@dataclass
class SimConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    faults: Faults = field(default_factory=Faults)
    seed: int = field(default=0, metadata=option("Seed for answers, lengths and faults."))
    accuracy: float = field(
        default=0.8, metadata=option("Probability of a right answer to a built-in QA question.")
    )
    output_median: int = field(
        default=48, metadata=option("Median answer length in tokens (when not ignore_eos).")
    )
    output_sigma: float = 0.6
    model: str = SIM_MODEL

    def to_json(self) -> str:
        """As the simulator's process is given it (``--config-json``)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Self:
        """The config :meth:`to_json` wrote, or a resumed run's as its run.json kept it."""
        raw = json.loads(text)
        return cls(engine=EngineConfig(**raw.pop("engine")), faults=Faults(**raw.pop("faults")), **raw)
