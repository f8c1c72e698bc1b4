"""The options of what a run sends and how: the server it targets, the workload, the load.
Half of :class:`~ipw_async.harness.config.RunConfig`'s fields, in the order ``--help`` lists them."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._options import option
from ..client import ENDPOINTS, ClientConfig
from ..load import ARRIVALS, RAMPS
from ..scoring import SCORERS
from ..validity.options import OVERSATURATION_ACTIONS, PRECISION_METRICS, parse_targets
from ..workload.agentic import PROTOCOLS
from ..workload.body import BodyDefaults
from ..workload.replay import FORMATS
from .kept import kept_as, mcp_kept, never_kept, url_kept
from .panels import LOAD, TARGET, WORKLOAD
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


ANTHROPIC_KEY_ENV = "ANTHROPIC_API_KEY"  # where Anthropic's own clients look for the key
_CLIENT = ClientConfig(base_url="")  # the client's defaults are the run's
_BODY = BodyDefaults(model="")


@dataclass
class SendOptions:
    """What a run sends: the target server, the workload and the load."""

    base_url: str | None = field(
        default=None,
        metadata=option(
            "OpenAI-compatible API base, e.g. http://localhost:8000/v1. Omit to start the built-in simulator.",
            panel=TARGET,
        )
        | kept_as(url_kept),
    )
    model: str | None = field(
        default=None,
        metadata=option("Model name to request; default: the server's first model.", panel=TARGET),
    )
    endpoint: str = field(
        default=_CLIENT.endpoint,
        metadata=option(
            "chat (/chat/completions), completions (/completions), responses (OpenAI Responses, "
            "/responses) or messages (Anthropic Messages, /messages).",
            panel=TARGET,
            choices=ENDPOINTS,
        ),
    )
    api_key: str | None = field(
        default=None,
        repr=False,
        metadata=option(
            f"API key; with --endpoint messages, {ANTHROPIC_KEY_ENV} is read before OPENAI_API_KEY. "
            "Never written to any file or log.",
            envvar="OPENAI_API_KEY",
            parse=lambda key: key or None,
            show_default=False,
            panel=TARGET,
        )
        | kept_as(never_kept),
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
            "--concurrency and --rate count tasks), conversation (multi-turn chats replayed "
            "from --dataset FILE.jsonl, or built from the QA set) or prefix (each question after "
            "a long prefix, shared or its own: see --prefix-share).",
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
        | kept_as(mcp_kept),
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
    prefix_tokens: int = field(
        default=1024, metadata=option("prefix: tokens of each prompt's prefix.", panel=WORKLOAD)
    )
    prefix_share: float = field(
        default=0.8,
        metadata=option(
            "prefix: the fraction of requests whose prefix is one of the --prefixes shared ones "
            "(a cache hit once its first use is cached); the rest get a prefix of the same length "
            "of their own (a guaranteed miss), so one run measures cached and uncached prompt "
            "tokens. Record query ids say which: shared<k>:<id> or unique:<id>.",
            panel=WORKLOAD,
        ),
    )
    prefixes: int = field(default=4, metadata=option("prefix: how many shared prefixes.", panel=WORKLOAD))
    cache_salt: str | None = field(
        default=None,
        metadata=option(
            "Salt the text of this run's prefixes (--workload prefix) or trace prompts (--trace), "
            "so nothing an earlier run left in the server's prefix cache is hit. The text only: "
            "vLLM's cache_salt request field is sent only if you add it, --param cache_salt=TEXT.",
            show_default=False,
            panel=WORKLOAD,
        ),
    )
    trace: Path | None = field(
        default=None,
        metadata=option(
            "Replay this timestamped trace: each request at its time in the trace (over "
            "--speedup), its prompt and max_tokens the trace's lengths, Mooncake hash ids as shared "
            "prompt blocks. Replaces --concurrency and --rate; --max-queries N replays the first N "
            "entries. Formats: see --trace-format and docs/workloads.md.",
            show_default=False,
            panel=WORKLOAD,
        ),
    )
    trace_format: str = field(
        default="auto",
        metadata=option(
            "The --trace's format: mooncake (JSONL), burstgpt (CSV), azure (CSV: Azure LLM "
            "inference 2023/2024), sessions (JSONL, one conversation a line) or auto (by the "
            "file's extension and first line).",
            panel=WORKLOAD,
            choices=FORMATS,
        ),
    )
    speedup: float = field(
        default=1.0,
        metadata=option("Replay the --trace this many times faster (its think times too).", panel=LOAD),
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

    def __post_init__(self) -> None:
        # A Messages run reads Anthropic's variable, as Anthropic's clients do, from the CLI and
        # from Python alike: before OPENAI_API_KEY (the option's own variable, which an OpenAI key
        # in the environment would otherwise send to an Anthropic server), after --api-key
        if self.endpoint != "messages":
            return
        from_openai_env = self.api_key is not None and self.api_key == os.environ.get("OPENAI_API_KEY")
        if self.api_key is None or from_openai_env:
            self.api_key = os.environ.get(ANTHROPIC_KEY_ENV) or self.api_key
