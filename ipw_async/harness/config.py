"""Every option of a run, in one place: the fields, their defaults, their help, their rules.

``ipw-async run`` builds its flags from the fields that carry an :func:`option`; the fields
without one (``runs_root``, ``dataset_seed``, ``tail_s``, ``abort_after_connect_errors``,
``sim``) are for Python callers and the sweep.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._options import option
from ..client import ClientConfig
from ..energy import RULES
from ..energy.attribute import POWER_MODEL_NEEDS_FITTED
from ..energy.fit import parse_effects
from ..energy.stepcost import CONTEXT_COSTS
from ..errors import RunError
from ..load import ARRIVALS, RAMPS, LoadSpec
from ..scoring import SCORERS
from ..sim import SimConfig
from ..telemetry.http import redact_url
from ..traces import parse_price
from ..validity.precision import PRECISION_METRICS, parse_targets
from ..validity.saturation import OVERSATURATION_ACTIONS
from ..workload.agentic import PROTOCOLS
from ..workload.body import BodyDefaults
from ..workload.mcp_tools import parse_servers, written
from ..workload.tools import ToolLatency
from .workloads import WORKLOADS


def parse_params(items: list[str] | None) -> dict[str, Any]:
    """``key=value`` pairs; a value that parses as JSON is used as JSON (numbers, true, lists)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--param {item!r} is not key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


_CLIENT = ClientConfig(base_url="")  # the client's defaults are the run's
_BODY = BodyDefaults(model="")

# --help's panels
TARGET, WORKLOAD, LOAD, TELEMETRY, ENERGY, OUTPUT = (
    "Target",
    "Workload",
    "Load",
    "Telemetry",
    "Energy",
    "Output",
)
ENDPOINTS = ("chat", "completions")


def _gpu_list(text: str | None) -> list[str] | None:
    return [g.strip() for g in text.split(",") if g.strip()] if text else None


def _never(value: Any) -> None:
    return None


def _url(url: str | None) -> str | None:
    return None if url is None else redact_url(url)


def _urls(urls: list[str]) -> list[str]:
    return [redact_url(u) for u in urls]


def _mcp(specs: list[str]) -> list[str]:
    return [written(s) for s in specs]


def kept_as(write: Callable[[Any], Any]) -> dict[str, Any]:
    """Field metadata for a field that can hold a secret: ``run.json`` keeps only what ``write``
    makes of its value (nothing, for ``_never``); a value it changed is listed in ``withheld``,
    and a resumed run asks for that field again."""
    return {"kept_as": write}


@dataclass
class RunConfig:
    """One benchmark run. The run's ``seed`` seeds arrivals, synthetic data and the simulator."""

    base_url: str | None = field(
        default=None,
        metadata=option(
            "OpenAI-compatible API base, e.g. http://localhost:8000/v1. Omit to start the built-in simulator.",
            panel=TARGET,
        )
        | kept_as(_url),
    )
    model: str | None = field(
        default=None,
        metadata=option("Model name to request; default: the server's first model.", panel=TARGET),
    )
    endpoint: str = field(
        default=_CLIENT.endpoint,
        metadata=option(
            "chat (/chat/completions) or completions (/completions).", panel=TARGET, choices=ENDPOINTS
        ),
    )
    api_key: str | None = field(
        default=None,
        repr=False,
        metadata=option(
            "API key. Never written to any file or log.",
            envvar="OPENAI_API_KEY",
            parse=lambda key: key or None,
            show_default=False,
            panel=TARGET,
        )
        | kept_as(_never),
    )
    dataset: str = field(
        default="qa",
        metadata=option(
            "qa (built-in questions with answers), synthetic (controlled lengths), or a .jsonl/.csv/.parquet/.arrow file.",
            panel=WORKLOAD,
        ),
    )
    workload: str = field(
        default="single",
        metadata=option(
            "single (one request per query), agentic (tool-using tasks over many turns; "
            "--concurrency and --rate count tasks) or conversation (multi-turn chats replayed "
            "from --dataset FILE.jsonl, or built from the QA set).",
            panel=WORKLOAD,
            choices=tuple(WORKLOADS),
        ),
    )
    agent_protocol: str = field(
        default="auto",
        metadata=option(
            "agentic: tools (OpenAI tool calling), react (text Action:/Observation:, for base "
            "models) or auto (tools on chat, react on completions).",
            panel=WORKLOAD,
            choices=PROTOCOLS,
        ),
    )
    max_turns: int = field(
        default=10, metadata=option("agentic: LLM calls a task may make before it gives up.", panel=WORKLOAD)
    )
    task_timeout: float | None = field(
        default=None,
        metadata=option("agentic: seconds after which a task starts no new turn.", panel=WORKLOAD),
    )
    tasks: Path | None = field(
        default=None,
        metadata=option(
            "agentic: run the tasks in this JSONL file instead of the built-in ones, one per line: "
            '{"problem": ..., "answer": ...} and optionally id, subject, tools, max_turns, scorer, '
            "metadata (see docs/agentic.md). Needs --workload agentic.",
            show_default=False,
            panel=WORKLOAD,
        ),
    )
    mcp: list[str] = field(
        default_factory=list,
        metadata=option(
            "agentic: call the tools of this MCP server instead of the built-in ones run in this "
            'process: a command that serves MCP on stdio ("npx -y @modelcontextprotocol/server-everything"), '
            "an http(s):// URL (streamable HTTP), or builtin (the built-in tools as an MCP server); "
            "repeatable. Needs pip install 'ipw-async[mcp]'.",
            cli_type=list[str] | None,
            parse=lambda specs: list(specs or []),
            panel=WORKLOAD,
        )
        | kept_as(_mcp),
    )
    tool_timeout: float = field(
        default=30.0,
        metadata=option(
            "agentic: seconds an MCP tool call may take; a call that takes longer is a tool error "
            "the model is told about.",
            panel=WORKLOAD,
        ),
    )
    tool_latency: str = field(
        default="0",
        metadata=option(
            "agentic: extra wait per tool call, to emulate remote tools: seconds (0.2), "
            "exp:MEAN or lognormal:MEDIAN,SIGMA.",
            panel=WORKLOAD,
        ),
    )
    prompt_column: str = field(
        default="prompt", metadata=option("Column holding the prompt in a dataset file.", panel=WORKLOAD)
    )
    answer_column: str = field(
        default="answer", metadata=option("Column holding the reference answer (optional).", panel=WORKLOAD)
    )
    scorer: str | None = field(
        default=None,
        metadata=option(
            "exact, contains, numeric or choice; default: the dataset's.",
            panel=WORKLOAD,
            choices=tuple(SCORERS),
        ),
    )
    prompt_tokens: int = field(
        default=256, metadata=option("synthetic: median prompt length in tokens.", panel=WORKLOAD)
    )
    output_tokens: int = field(
        default=128, metadata=option("synthetic: median output length in tokens.", panel=WORKLOAD)
    )
    length_sigma: float = field(
        default=0.5,
        metadata=option("synthetic: lognormal sigma of both lengths (0 = fixed).", panel=WORKLOAD),
    )
    concurrency: int | None = field(
        default=None,
        metadata=option(
            "Closed loop: keep exactly N requests in flight (default 16).", "--concurrency", "-c", panel=LOAD
        ),
    )
    rate: float | None = field(
        default=None, metadata=option("Open loop: send R requests per second instead.", panel=LOAD)
    )
    arrival: str = field(
        default="poisson",
        metadata=option("Open-loop arrivals: poisson, gamma or constant.", panel=LOAD, choices=ARRIVALS),
    )
    burstiness: float = field(
        default=1.0, metadata=option("Gamma shape: <1 burstier than Poisson, >1 more regular.", panel=LOAD)
    )
    max_concurrency: int | None = field(
        default=None, metadata=option("Open loop: cap on requests in flight.", panel=LOAD)
    )
    workers: str = field(
        default="1",
        metadata=option(
            "Processes that stream the load: 1 (this one), a number, or auto (by the cores and the "
            "concurrency). This one still schedules, samples and writes; use more than one when the "
            "client's CPU limits the run (its loop lag shows it).",
            panel=LOAD,
        ),
    )
    ray: str | None = field(
        default=None,
        metadata=option(
            "Run the --workers as Ray actors on the Ray cluster at this address (auto: the one "
            "`ray start` made here), spread over its nodes; auto workers: one per node. Needs "
            "ipw-async with its ray extra on every node.",
            show_default=False,
            panel=LOAD,
        ),
    )
    warmup: int = field(
        default=0, metadata=option("Requests to run first, flagged and left out of statistics.", panel=LOAD)
    )
    max_queries: int | None = field(
        default=None,
        metadata=option(
            "Requests to measure (default: one pass over the dataset).", "--max-queries", "-n", panel=LOAD
        ),
    )
    duration: float | None = field(
        default=None, metadata=option("Stop sending after this many seconds.", panel=LOAD)
    )
    ramp: str | None = field(
        default=None,
        metadata=option(
            "Reach --concurrency or --rate gradually instead of at once: linear, exponential, or "
            "steps (--ramp-steps equal stages), over --ramp-duration seconds, then hold.",
            panel=LOAD,
            choices=RAMPS,
            show_default=False,
        ),
    )
    ramp_duration: float = field(
        default=30.0, metadata=option("Seconds the --ramp takes to reach the target load.", panel=LOAD)
    )
    ramp_start: float | None = field(
        default=None,
        metadata=option(
            "The load the --ramp starts from (default: 1 request in flight, or a tenth of --rate).",
            panel=LOAD,
            show_default=False,
        ),
    )
    ramp_steps: int = field(default=4, metadata=option("Stages of --ramp steps.", panel=LOAD))
    on_oversaturation: str = field(
        default="flag",
        metadata=option(
            "When requests pile up faster than the server finishes them (in-flight and TTFT both "
            "rising significantly): flag (say so in the summary) or stop (end the run there).",
            panel=LOAD,
            choices=OVERSATURATION_ACTIONS,
        ),
    )
    until_precision: dict[str, float] = field(
        default_factory=dict,
        metadata=option(
            "Stop once a metric is known to this relative precision (95% interval half-width over "
            "the mean, from batch means), e.g. j_per_query=2%; metrics: "
            f"{', '.join(PRECISION_METRICS)}; repeatable; needs --duration or a dataset to stop at "
            "otherwise.",
            cli_type=list[str] | None,
            parse=parse_targets,
            panel=LOAD,
        ),
    )
    seed: int = field(
        default=0, metadata=option("Seed for arrivals, synthetic data and the simulator.", panel=LOAD)
    )
    dataset_seed: int | None = None  # synthetic lengths; default: seed (a sweep holds it fixed)
    max_tokens: int = field(
        default=_BODY.max_tokens,
        metadata=option("max_tokens for each request (synthetic sets its own).", panel=TARGET),
    )
    temperature: float | None = field(
        default=_BODY.temperature, metadata=option("Sampling temperature.", panel=TARGET)
    )
    params: dict[str, Any] = field(
        default_factory=dict,
        metadata=option(
            "Extra request field key=value (JSON values allowed); repeatable.",
            "--param",
            cli_type=list[str] | None,
            parse=parse_params,
            panel=TARGET,
        ),
    )
    connect_timeout: float = field(
        default=_CLIENT.connect_timeout, metadata=option("Seconds to wait for a connection.", panel=TARGET)
    )
    read_timeout: float = field(
        default=_CLIENT.read_timeout,
        metadata=option("Seconds to wait between bytes of a response.", panel=TARGET),
    )
    telemetry: str = field(
        default="auto",
        metadata=option("auto, none, or a list from nvml,amdsmi,rapl,psutil,cpu-model,sim.", panel=TELEMETRY),
    )
    telemetry_url: list[str] = field(
        default_factory=list,
        metadata=option(
            "An `ipw-async agent` on the GPU server's machine, e.g. http://gpu-host:9180; repeatable. "
            "Its GPUs become the run's energy meters, its clock aligned to this one's.",
            cli_type=list[str] | None,
            parse=lambda urls: list(urls or []),
            panel=TELEMETRY,
        )
        | kept_as(_urls),
    )
    prometheus_url: list[str] = field(
        default_factory=list,
        metadata=option(
            "A Prometheus endpoint to scrape as telemetry; repeatable: DCGM exporter "
            "(http://gpu-host:9400/metrics: per-GPU energy and power) or the server's own /metrics "
            "(vLLM, llama.cpp, SGLang: running and waiting requests, tokens).",
            cli_type=list[str] | None,
            parse=lambda urls: list(urls or []),
            panel=TELEMETRY,
        )
        | kept_as(_urls),
    )
    telemetry_token_file: Path | None = field(
        default=None,
        metadata=option(
            "File holding the token the agents in --telemetry-url were started with (sent as a "
            "bearer header, never written to any file or log); default: the IPW_ASYNC_AGENT_TOKEN "
            "environment variable's token, if set.",
            show_default=False,
            panel=TELEMETRY,
        ),
    )
    prometheus_token_file: Path | None = field(
        default=None,
        metadata=option(
            "File holding a bearer token for the --prometheus-url endpoints (an exporter behind an "
            "authenticating proxy; a user and password in the URL are sent as basic auth instead).",
            show_default=False,
            panel=TELEMETRY,
        ),
    )
    telemetry_ca_file: Path | None = field(
        default=None,
        metadata=option(
            "CA certificate (PEM) to verify https:// agents and exporters by, e.g. an agent's "
            "self-signed certificate (default: the system's CAs).",
            show_default=False,
            panel=TELEMETRY,
        ),
    )
    trust_counter: bool = field(
        default=False,
        metadata=option(
            "Use every energy counter even where the start-of-run check finds it stuck, running "
            "backwards or disagreeing with its own power readings (by default such a device's "
            "power is integrated instead, and the summary says why).",
            panel=TELEMETRY,
        ),
    )
    gpus: list[str] | None = field(
        default=None,
        metadata=option(
            "GPUs to measure by index or UUID, comma-separated (default all).",
            cli_type=str | None,
            parse=_gpu_list,
            panel=TELEMETRY,
        ),
    )
    sample_ms: float = field(
        default=50.0, metadata=option("Telemetry sampling period in milliseconds.", panel=TELEMETRY)
    )
    realtime_sampler: bool = field(
        default=True,
        metadata=option(
            "Ask the OS to run the sampler thread at real-time priority (needs root or "
            "CAP_SYS_NICE; refused quietly otherwise, and the summary says which it got).",
            panel=TELEMETRY,
        ),
    )
    counter_probe_s: float = field(
        default=1.0,
        metadata=option(
            "Seconds of 2 ms reads, at the start and every 20 s, to learn when each energy "
            "counter updates so its reads are timed exactly (twice as long while a counter's phase "
            "is not yet pinned to 0.2 ms; 0: time them to the midpoint between reads).",
            panel=TELEMETRY,
        ),
    )
    baseline_s: float = field(
        default=1.0,
        metadata=option("Seconds of idle power to measure before the run (0: none).", panel=ENERGY),
    )
    baseline_w: float | None = field(
        default=None,
        metadata=option("Idle accelerator power in watts, instead of measuring it.", panel=ENERGY),
    )
    attribution: str = field(
        default="steps",
        metadata=option(
            "How overlapping queries share energy: steps (each engine step inferred from token "
            "arrivals costs what a fit to the meter finds; static power and a step's own cost are "
            "shared equally, the rest goes to the query that caused it: convention v2), fitted (by "
            "a power model of the device, the rest by work), tokens (by token work, linearly), "
            "equal, or window (whole-window, over-counts).",
            panel=ENERGY,
            choices=tuple(RULES),
        ),
    )
    context_cost: str = field(
        default="shared",
        metadata=option(
            "The steps rule's cost of the context a decode step reads: shared (equally by the step's "
            "decoders, as where CUDA graphs pad attention to the batch's longest context) or own "
            "(each request's own reads, as paged attention without padding does).",
            panel=ENERGY,
            choices=CONTEXT_COSTS,
        ),
    )
    prefill_weight: float = field(
        default=0.25,
        metadata=option(
            "Work of a prompt token relative to an output token: the tokens rule's, and the fitted "
            "rule's where the run cannot identify it.",
            panel=ENERGY,
        ),
    )
    power_model: str = field(
        default="auto",
        metadata=option(
            "The fitted rule's model of the device (with --attribution fitted): auto (each effect kept where it predicts held-out "
            "meter intervals better), linear, or effects joined by + from curve, step, context, "
            "position, lag and drift (e.g. curve+lag), when you know what your device does.",
            panel=ENERGY,
        ),
    )
    output_dir: Path | None = field(
        default=None,
        metadata=option(
            "Run directory (default ./runs/<UTC time>_<model>_<dataset>_<load>).",
            "--output-dir",
            "-o",
            panel=OUTPUT,
        ),
    )
    runs_root: Path = Path("runs")
    resume: Path | None = field(
        default=None,
        metadata=option(
            "Continue the run in this directory that was killed or stopped: its finished queries "
            "are kept, the rest run with its own settings (other options but --api-key are ignored).",
            show_default=False,
            panel=OUTPUT,
        ),
    )
    overwrite: bool = field(
        default=False,
        metadata=option(
            "Replace an existing run directory's files (its analyses and plots too).", panel=OUTPUT
        ),
    )
    price: str | None = field(
        default=None,
        metadata=option(
            "USD per million input/output tokens, e.g. 0.15/0.60: adds cost to traces.", panel=OUTPUT
        ),
    )
    tail_s: float = 0.5  # telemetry kept after the last request, so its energy is covered
    abort_after_connect_errors: int = 16
    sim: SimConfig = field(default_factory=SimConfig)

    @property
    def simulated(self) -> bool:
        return self.base_url is None

    def load_spec(self) -> LoadSpec:
        """The load; raises RunError for an impossible one."""
        concurrency = self.concurrency
        if concurrency is None and self.rate is None:
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
            )
        except ValueError as exc:
            raise RunError(str(exc)) from None

    def sim_config(self) -> SimConfig:
        """The built-in simulator's config: the run's seed seeds it, from Python as from the CLI.
        Multi-turn workloads get prefix caching, as the servers they model (vLLM, SGLang) have
        on by default: a turn's history is then not prefilled again."""
        engine = self.sim.engine
        if self.workload != "single" and not engine.prefix_cache:
            engine = dataclasses.replace(engine, prefix_cache=True)
        return dataclasses.replace(self.sim, seed=self.seed, engine=engine)

    def validate(self) -> LoadSpec:
        """Check every option that can be checked before anything starts; the load spec."""
        spec = self.load_spec()
        checks = (
            (self.endpoint in ENDPOINTS, "--endpoint must be chat or completions"),
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
                self.attribution in RULES,
                f"unknown attribution rule {self.attribution!r}; choose one of {', '.join(RULES)}",
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
