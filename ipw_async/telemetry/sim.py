"""The simulator's device, read as NVML would be read: a counter in mJ, instant and average power,
temperature."""

from __future__ import annotations

import json

from .._clock import now_ns
from .base import (
    CountedSource,
    CounterTracker,
    Meter,
    Quantity,
    Reading,
    SourceInfo,
    SourceUnavailable,
    power_quantity,
)
from .http import ERRORS, KeptAlive, endpoint

# what /sim/device reports, as the columns it becomes
_FIELDS = {
    "energy_mj": Quantity.ENERGY_J,
    "power_w": Quantity.POWER_W,
    "avg_power_w": Quantity.AVG_POWER_W,
    "temperature_c": Quantity.TEMP_C,
}


class SimDeviceSource(CountedSource):
    """Reads ``GET /sim/device`` over one kept-alive connection (from the sampler's thread).

    The device stamps each readout on the shared monotonic clock, so the sample time is the
    device's, not the moment the HTTP answer came back.
    """

    name = "sim"

    def __init__(self, root_url: str, timeout: float = 2.0) -> None:
        self._http = KeptAlive(endpoint(root_url, "a simulator URL", "http://127.0.0.1:8000"), timeout)
        self.counter = CounterTracker()
        self.counters = {"sim": self.counter}  # its resets reach the summary and the counter check
        self._columns: list[str] = []
        self.recipe = {"name": "sim", "root_url": root_url}

    def _fetch(self) -> dict[str, float | None]:
        return json.loads(self._http.get("/sim/device"))

    def open(self) -> SourceInfo:
        try:
            first = self._fetch()
        except (*ERRORS, ValueError) as exc:
            raise SourceUnavailable(f"no simulated device at {self._http.endpoint.label} ({exc})") from None
        self._columns = [f"sim.{quantity}" for key, quantity in _FIELDS.items() if first.get(key) is not None]
        # a counter where it has one, else its power integrated: the one a GPU's would be
        kind = "counter" if first.get("energy_mj") is not None else "power"
        meters = []
        if kind == "counter" or first.get("power_w") is not None or first.get("avg_power_w") is not None:
            quantity = power_quantity("sim", self._columns)
            meters.append(Meter("sim", kind, accelerator=True, power_quantity=quantity))
        return SourceInfo(
            columns=self._columns,
            meters=meters,
            description="SIMULATED device: " + ", ".join(c.split(".", 1)[1] for c in self._columns),
            simulated=True,
        )

    def read(self) -> Reading:
        try:
            raw = self._fetch()
        except (*ERRORS, ValueError):
            return Reading({c: None for c in self._columns})
        values: dict[str, float | None] = {
            f"sim.{quantity}": raw.get(key) for key, quantity in _FIELDS.items()
        }
        energy_mj = raw.get("energy_mj")
        values[f"sim.{Quantity.ENERGY_J}"] = (
            None if energy_mj is None else self.counter.update(energy_mj / 1000)
        )
        t = raw.get("t_ns")
        return Reading(
            {c: values.get(c) for c in self._columns},
            t_ns=int(t) if isinstance(t, int | float) else now_ns(),
        )

    def close(self) -> None:
        self._http.close()
