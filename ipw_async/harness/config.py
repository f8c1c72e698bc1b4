"""Every option of a run: :class:`RunConfig`, its fields (what is sent, in ``send_options``; how
it is measured and kept, in ``measure_options``), and the rules they keep together.

``ipw-async run`` builds its flags from the fields that carry an :func:`~.._options.option`;
the fields without one (``runs_root``, ``dataset_seed``, ``tail_s``,
``abort_after_connect_errors``, ``sim``) are for Python callers and the sweep.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..client import ENDPOINTS
from ..energy.padding import parse_capture_sizes
from ..energy.settings import POWER_MODEL_NEEDS_FITTED, RULE_NAMES, parse_effects
from ..errors import RunError
from ..load import LoadSpec
from ..scoring import SCORERS
from ..sim import SimConfig
from ..traces import parse_price
from ..workload.agentic import PROTOCOLS
from ..workload.mcp_tools import parse_servers
from ..workload.tools import ToolLatency
from .measure_options import MeasureOptions
from .send_options import SendOptions
from .workloads import WORKLOADS


@dataclass
class RunConfig(MeasureOptions, SendOptions):
    """One benchmark run. The run's ``seed`` seeds arrivals, synthetic data and the simulator.
    (A dataclass lists a base's fields after those of the base named after it: what is sent
    comes first, as ``--help`` shows it.)"""

    @property
    def simulated(self) -> bool:
        return self.base_url is None

    def load_spec(self) -> LoadSpec:
        """The load (a --trace's own times, or 16 in flight unless told otherwise); raises
        RunError for an impossible one."""
        concurrency = self.concurrency
        if concurrency is None and self.rate is None and self.trace is None:
            concurrency = 16
        try:
            return LoadSpec(
                concurrency,
                self.rate,
                self.arrival,
                self.burstiness,
                self.max_concurrency,
                ramp=self.ramp,
                ramp_duration=self.ramp_duration,
                ramp_start=self.ramp_start,
                ramp_steps=self.ramp_steps,
                replay=self.trace is not None,
                speedup=self.speedup,
            )
        except ValueError as exc:
            raise RunError(str(exc)) from None

    def sim_config(self) -> SimConfig:
        """The built-in simulator's config: the run's seed seeds it, from Python as from the CLI.
        Every workload but single-turn requests gets prefix caching, as the servers they model
        (vLLM, SGLang) have on by default: a turn's history, a shared prefix, a trace's shared
        blocks are then not prefilled again."""
        engine = self.sim.engine
        if (self.workload != "single" or self.trace is not None) and not engine.prefix_cache:
            engine = dataclasses.replace(engine, prefix_cache=True)
        return dataclasses.replace(self.sim, seed=self.seed, engine=engine)

    def validate(self) -> LoadSpec:
        """Check every option that can be checked before anything starts; the load spec."""
        spec = self.load_spec()
        checks = (
            (self.endpoint in ENDPOINTS, f"--endpoint must be one of {', '.join(ENDPOINTS)}"),
            (self.max_queries is None or self.max_queries >= 1, "--max-queries must be at least 1"),
            (self.duration is None or self.duration > 0, "--duration must be a positive number of seconds"),
            (self.warmup >= 0, "--warmup cannot be negative"),
            (
                self.scorer is None or self.scorer in SCORERS,
                f"unknown scorer {self.scorer!r}; choose one of {', '.join(SCORERS)}",
            ),
            (self.sample_ms > 0, "--sample-ms must be positive"),
            (self.counter_probe_s >= 0, "--counter-probe-s cannot be negative"),
            (self.workload in WORKLOADS, f"--workload must be one of {', '.join(WORKLOADS)}"),
            (
                self.agent_protocol in PROTOCOLS,
                f"--agent-protocol must be one of {', '.join(PROTOCOLS)}",
            ),
            (self.max_turns >= 1, "--max-turns must be at least 1"),
            (
                self.workers == "auto" or (self.workers.isdigit() and int(self.workers) >= 1),
                "--workers must be a number of processes (at least 1) or auto",
            ),
            (self.task_timeout is None or self.task_timeout > 0, "--task-timeout must be positive"),
            (self.tool_timeout > 0, "--tool-timeout must be a positive number of seconds"),
            (
                self.workload == "agentic" or (self.tasks is None and not self.mcp),
                "--tasks and --mcp are for agentic runs: add --workload agentic",
            ),
            (
                self.trace is None or self.workload == "single",
                f"--trace is the workload: leave out --workload {self.workload}",
            ),
            (
                self.trace is None or self.dataset == "qa",
                "--trace is the workload: its prompts are made to its lengths; leave out --dataset",
            ),
            (
                self.trace is not None or (self.speedup == 1.0 and self.trace_format == "auto"),
                "--speedup and --trace-format are for a replay: add --trace FILE",
            ),
            (self.prefix_tokens >= 1, "--prefix-tokens must be at least 1"),
            (0 <= self.prefix_share <= 1, "--prefix-share must be a fraction from 0 to 1, e.g. 0.8"),
            (self.prefixes >= 1, "--prefixes must be at least 1"),
            (
                self.cache_salt is None or self.workload == "prefix" or self.trace is not None,
                "--cache-salt salts the prompts of --workload prefix or a --trace; add one of them",
            ),
            (
                self.attribution in RULE_NAMES,
                f"unknown attribution rule {self.attribution!r}; choose one of {', '.join(RULE_NAMES)}",
            ),
            (self.attribution != "steps" or self.power_model == "auto", POWER_MODEL_NEEDS_FITTED),
        )
        for ok, message in checks:
            if not ok:
                raise RunError(message)
        try:
            ToolLatency.parse(self.tool_latency)
            parse_servers(self.mcp)
            self.prices()
            parse_effects(self.power_model)
            parse_capture_sizes(self.capture_sizes)
        except ValueError as exc:
            raise RunError(str(exc)) from None
        return spec

    def prices(self) -> tuple[float, float] | None:
        """USD per input and per output token, from ``--price IN/OUT`` (per million)."""
        return parse_price(self.price)

    def public(self) -> dict[str, Any]:
        """The config as written to run.json and summary.json. A field that can hold a secret
        is written as its ``kept_as`` makes it (never the API key; a URL without its password
        or secret query; an MCP server without its secret options), and ``withheld`` names each
        field whose value lost something: ``--resume`` asks for those again."""
        out = dataclasses.asdict(self)
        withheld = []
        for f in dataclasses.fields(self):
            if "kept_as" in f.metadata:
                value = getattr(self, f.name)
                out[f.name] = f.metadata["kept_as"](value)
                if out[f.name] != value:
                    withheld.append(f.name)
        del out["api_key"]
        out["api_key_set"] = self.api_key is not None
        out["withheld"] = withheld
        if self.base_url is None:
            out["sim"] = dataclasses.asdict(self.sim_config())
        else:
            out.pop("sim")
        return out
