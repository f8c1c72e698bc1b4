"""The options of how a run is measured and kept: telemetry, energy attribution, output. The
other half of :class:`~ipw_async.harness.config.RunConfig`'s fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .._options import option
from ..energy.settings import CONTEXT_COSTS, DEFAULT_CONTEXT_COST, RULE_NAMES
from ..sim import SimConfig
from ..telemetry.process import SAMPLER_PLACES
from .kept import kept_as, urls_kept
from .panels import ENERGY, OUTPUT, TELEMETRY


def _gpu_list(text: str | None) -> list[str] | None:
    return [g.strip() for g in text.split(",") if g.strip()] if text else None


@dataclass
class MeasureOptions:
    """How a run is measured and where it is kept."""

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
        | kept_as(urls_kept),
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
        | kept_as(urls_kept),
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
    sampler: str = field(
        default="auto",
        metadata=option(
            "Where telemetry is read: process (a process of its own, started in about a second: its "
            "reads and counter probes take no CPU and no interpreter time from the client), thread "
            "(a thread of the run's process), or auto (a process where a GPU is read through NVML "
            "or AMD SMI or an exporter is scraped, whose every read costs a millisecond or more of "
            "a CPU; a thread otherwise). A source read through an agent keeps the sampler a thread.",
            panel=TELEMETRY,
            choices=SAMPLER_PLACES,
        ),
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
            choices=RULE_NAMES,
        ),
    )
    context_cost: str = field(
        default=DEFAULT_CONTEXT_COST,
        metadata=option(
            "The steps rule's cost of the context a decode step reads: own (each request's own "
            "reads, as paged attention does; attention padded to the batch's longest context is "
            "priced apart, per padded row and position, and shared) or shared (equally by the "
            "step's decoders, the context read too).",
            panel=ENERGY,
            choices=CONTEXT_COSTS,
        ),
    )
    capture_sizes: str = field(
        default="auto",
        metadata=option(
            "The batch sizes the server's decode graphs pad to, for the steps rule: auto (chosen by "
            "the run's step times, and said in the summary), pow2 (1, 2, 4, …), vllm (vLLM's "
            "default: 1, 2, 4, then multiples of 8), none, or the sizes themselves (e.g. 1,2,4,8,16,"
            "24,32: your server's cudagraph_capture_sizes).",
            panel=ENERGY,
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
            "meter intervals better), linear, or effects joined by + from curve, step, padding (a decode "
            "graph's padded rows), context, position, lag and drift (e.g. curve+lag), when you know what "
            "your device does.",
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
    require_valid: bool = field(
        default=False,
        metadata=option(
            "Exit 3 when the run's energy figures are not valid for publishing (summary.json's "
            "validity): a simulated device, a run that did not finish, energy without readings, a "
            "faulty counter, a remote clock known too loosely, over-saturation, or a check that "
            "could not be made. Everything measured is written first.",
            panel=OUTPUT,
        ),
    )
    # telemetry kept after the last request, so its energy is covered (a window more where a
    # meter reads power its device averaged over one)
    tail_s: float = 0.5
    abort_after_connect_errors: int = 16
    sim: SimConfig = field(default_factory=SimConfig)
