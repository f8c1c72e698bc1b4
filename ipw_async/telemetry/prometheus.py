"""What GPU hosts already export, scraped as telemetry: DCGM exporter, AMD's Device Metrics
Exporter and the server's /metrics.

DCGM exporter's total-energy field (mJ) and AMD's (µJ) become a counter meter per GPU, like
NVML's, and their power field the power column (DCGM's ``POWER_USAGE`` is NVML's power usage,
the last second's average on Ampere and newer, and taken before the instant field); clocks and throttle reasons are logged beside. An inference server's own gauges and counters (vLLM's, llama.cpp's,
SGLang's: requests running and waiting, tokens, cache use) go into the telemetry log beside
them. A scrape carries no time of its own, so a reading is timed to the middle of the scrape
(the sampler's rule), and a counter the exporter refreshes slowly is re-timed by its learned
update grid, as any counter.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

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
from .nvml import power_usage_averaged

# Exporters' per-GPU fields: (quantity, scale to our unit). DCGM's GPUs are labelled gpu=,
# AMD's gpu_id= (and its names may carry an amd_ prefix).
DCGM_FIELDS = {
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (Quantity.ENERGY_J, 1e-3),  # mJ since the driver loaded
    "DCGM_FI_DEV_POWER_USAGE_INSTANT": (Quantity.POWER_W, 1.0),  # since DCGM 3.1
    # nvmlDeviceGetPowerUsage: averaged over the last second on Ampere and newer, GA100 aside,
    # told by the exporter's modelName label (instant on older GPUs, or where it has none)
    "DCGM_FI_DEV_POWER_USAGE": (Quantity.AVG_POWER_W, 1.0),
    "DCGM_FI_DEV_GPU_UTIL": (Quantity.UTIL_PCT, 1.0),
    "DCGM_FI_DEV_FB_USED": (Quantity.MEM_USED_MB, 1.0),
    "DCGM_FI_DEV_GPU_TEMP": (Quantity.TEMP_C, 1.0),
    "DCGM_FI_DEV_SM_CLOCK": (Quantity.SM_CLOCK_MHZ, 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": (Quantity.MEM_CLOCK_MHZ, 1.0),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": (Quantity.THROTTLE_REASONS, 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": (Quantity.THROTTLE_REASONS, 1.0),  # its name since DCGM 3.3
}
AMD_FIELDS = {
    "gpu_energy_consumed": (Quantity.ENERGY_J, 1e-6),  # µJ
    "gpu_package_power": (Quantity.POWER_W, 1.0),
    "gpu_power_usage": (Quantity.POWER_W, 1.0),  # older exporters' name for it
    "gpu_gfx_activity": (Quantity.UTIL_PCT, 1.0),
    "gpu_used_vram": (Quantity.MEM_USED_MB, 1.0),
    "gpu_junction_temperature": (Quantity.TEMP_C, 1.0),
}
SERVER_PREFIXES = ("vllm:", "llamacpp:", "sglang:")
HISTOGRAM_PARTS = ("_bucket", "_sum", "_count", "_created")

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition: (name, labels, value)."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:  # comments, blank lines
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        samples.append((name, dict(_LABEL.findall(labels or "")), number))
    return samples


SIMULATED_MODEL = "SIMULATED"


class PrometheusSource(CountedSource):
    """One scrape endpoint, e.g. DCGM exporter's ``http://gpu-host:9400/metrics``."""

    def __init__(
        self, url: str, timeout: float = 2.0, token: str | None = None, ca_file: Path | None = None
    ) -> None:
        where = endpoint(
            url,
            "a metrics URL",
            "http://gpu-host:9400/metrics",
            token=token,
            ca_file=ca_file,
            default_path="/metrics",
        )
        self.url = where.url
        self.label = where.label
        self.name = f"prometheus@{where.label}"
        self._target = where.target
        self._http = KeptAlive(where, timeout)
        self._columns: list[str] = []
        self.counters: dict[str, CounterTracker] = {}
        # a scrape opens as well from the sampler's own process (its credentials travel there
        # on a pipe, never in argv)
        self.recipe = {
            "name": "prometheus",
            "url": url,
            "token": token,
            "ca_file": None if ca_file is None else str(ca_file),
        }

    def _scrape(self) -> str:
        return self._http.get(self._target).decode("utf-8", "replace")

    def _values(self, text: str) -> dict[str, float]:
        values: dict[str, float] = defaultdict(float)
        for name, labels, value in parse(text):
            amd = AMD_FIELDS.get(name.removeprefix("amd_"))
            if name in DCGM_FIELDS:
                quantity, scale = DCGM_FIELDS[name]
                if quantity == Quantity.AVG_POWER_W and not power_usage_averaged(labels.get("modelName", "")):
                    quantity = Quantity.POWER_W
                gpu = f"gpu{labels.get('gpu', labels.get('UUID', '0'))}@{self.label}"
                values[f"{gpu}.{quantity}"] = value * scale
            elif amd is not None:
                quantity, scale = amd
                gpu = f"gpu{labels.get('gpu_id', '0')}@{self.label}"
                values[f"{gpu}.{quantity}"] = value * scale
            elif name.startswith(SERVER_PREFIXES) and not name.endswith(HISTOGRAM_PARTS):
                # summed over label sets (one per model, usually just one)
                values[f"server@{self.label}.{name.replace(':', '_')}"] += value
        return values

    def open(self) -> SourceInfo:
        try:
            text = self._scrape()
            values = self._values(text)
        except ERRORS as exc:
            raise SourceUnavailable(f"cannot scrape {self.url} ({exc})") from None
        if not values:
            raise SourceUnavailable(
                f"{self.url} shows no metric ipw-async reads (DCGM's or AMD's exporter's GPU fields, or a vLLM, "
                "llama.cpp or SGLang server's)"
            )
        self._columns = sorted(values)
        # a meter per GPU with energy (a counter) or power (integrated), whose power is the
        # device's average where the exporter has it, else its instant power
        metered = (Quantity.ENERGY_J, Quantity.POWER_W, Quantity.AVG_POWER_W)
        channels = dict.fromkeys(c.rsplit(".", 1)[0] for c in self._columns if c.rsplit(".", 1)[1] in metered)
        meters = []
        for channel in channels:
            kind = "counter" if f"{channel}.{Quantity.ENERGY_J}" in self._columns else "power"
            if kind == "counter":
                self.counters[channel] = CounterTracker()
            meters.append(
                Meter(channel, kind, accelerator=True, power_quantity=power_quantity(channel, self._columns))
            )
        gpus = len({m.channel for m in meters if m.channel.startswith("gpu")})
        server = sum(1 for c in self._columns if c.startswith("server@"))
        return SourceInfo(
            columns=self._columns,
            meters=meters,
            description=f"Prometheus {self.url}: {gpus} GPU(s) (DCGM or AMD exporter), {server} server metric(s)",
            # ipw-async's simulator shows its device as a GPU of this model name
            simulated=any(labels.get("modelName") == SIMULATED_MODEL for _, labels, _ in parse(text)),
        )

    def read(self) -> Reading:
        try:
            values = self._values(self._scrape())
        except ERRORS:
            return Reading(dict.fromkeys(self._columns))
        for channel, tracker in self.counters.items():
            column = f"{channel}.{Quantity.ENERGY_J}"
            if column in values:
                values[column] = tracker.update(values[column])
        return Reading({c: values.get(c) for c in self._columns})

    def close(self) -> None:
        self._http.close()
