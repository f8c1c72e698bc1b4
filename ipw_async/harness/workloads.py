"""The workloads a run can name: ``--workload NAME`` is one entry of :data:`WORKLOADS`, a builder
from the run's options. Adding a workload adds an entry here and nothing else. A ``--trace``
replaces them all: its requests or sessions are the workload."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ..errors import RunError
from ..workload import Dataset, DatasetError, Workload, resolve
from ..workload.agentic import Agentic
from ..workload.conversations import ConversationReplay, builtin_conversations, load_conversations
from ..workload.mcp_tools import McpTools
from ..workload.prefix import PrefixWorkload
from ..workload.replay import load_trace, trace_workload
from ..workload.single_turn import SingleTurn
from ..workload.taskfile import load_tasks
from ..workload.text import PromptText
from ..workload.tools import FunctionTools, Toolbox, ToolLatency


class WorkloadOptions(Protocol):
    """The run options a workload is built from (a :class:`~.config.RunConfig`)."""

    workload: str
    dataset: str
    endpoint: str
    prompt_column: str
    answer_column: str
    max_queries: int | None
    prompt_tokens: int
    output_tokens: int
    length_sigma: float
    seed: int
    dataset_seed: int | None
    tool_latency: str
    agent_protocol: str
    max_turns: int
    task_timeout: float | None
    tasks: Path | None
    mcp: list[str]
    tool_timeout: float
    prefix_tokens: int
    prefix_share: float
    prefixes: int
    cache_salt: str | None
    trace: Path | None
    trace_format: str
    speedup: float


def _text_seed(config: WorkloadOptions) -> int:
    """What seeds the text a run makes up: fixed over a sweep's repeats, as its dataset is."""
    return config.seed if config.dataset_seed is None else config.dataset_seed


def _chat(config: WorkloadOptions) -> bool:
    """Whether prompts go as messages: every API takes them but the completions one."""
    return config.endpoint != "completions"


def _dataset(config: WorkloadOptions) -> Dataset:
    return resolve(
        config.dataset,
        prompt_column=config.prompt_column,
        answer_column=config.answer_column,
        synthetic_n=config.max_queries or 512,
        prompt_tokens=config.prompt_tokens,
        output_tokens=config.output_tokens,
        length_sigma=config.length_sigma,
        seed=_text_seed(config),
    )


def _single(config: WorkloadOptions) -> Workload:
    return SingleTurn(_dataset(config), chat=_chat(config))


def _prefix(config: WorkloadOptions) -> Workload:
    text = PromptText(_text_seed(config), config.cache_salt)
    return PrefixWorkload(
        _dataset(config), _chat(config), text, config.prefix_tokens, config.prefix_share, config.prefixes
    )


def _agentic(config: WorkloadOptions) -> Workload:
    """The built-in tasks or --tasks FILE's, with the built-in tools run here or the tools of
    the --mcp servers (only theirs: --mcp builtin serves the built-in ones)."""
    if config.dataset != "qa":
        raise RunError(
            "--workload agentic runs the built-in tool tasks or those of --tasks FILE.jsonl; leave --dataset out"
        )
    source = McpTools(config.mcp, config.tool_timeout) if config.mcp else FunctionTools()
    return Agentic(
        Toolbox(source, ToolLatency.parse(config.tool_latency)),
        protocol=config.agent_protocol,
        endpoint=config.endpoint,
        max_turns=config.max_turns,
        task_timeout_s=config.task_timeout,
        seed=config.seed,
        tasks=None if config.tasks is None else load_tasks(config.tasks),
    )


def _conversation(config: WorkloadOptions) -> Workload:
    chat = _chat(config)
    if config.dataset == "qa":
        return ConversationReplay(builtin_conversations(), "qa-chat", chat)
    return ConversationReplay(load_conversations(config.dataset), Path(config.dataset).stem, chat)


# ``--workload NAME``: the one place a workload is named (the CLI's choices come from here)
WORKLOADS: dict[str, Callable[[WorkloadOptions], Workload]] = {
    "single": _single,
    "agentic": _agentic,
    "conversation": _conversation,
    "prefix": _prefix,
}


def workload_of(config: WorkloadOptions) -> Workload:
    """The workload a config describes: single-turn requests over its dataset, agentic tasks,
    replayed conversations, prefixed questions, or its --trace replayed."""
    build = WORKLOADS.get(config.workload)
    if build is None:
        raise RunError(f"--workload must be one of {', '.join(WORKLOADS)}")
    try:
        if config.trace is not None:
            trace = load_trace(config.trace, config.trace_format)
            return trace_workload(trace, _chat(config), _text_seed(config), config.speedup, config.cache_salt)
        return build(config)
    except DatasetError as exc:
        raise RunError(str(exc)) from None
