"""A finished run as OpenTelemetry traces, sent over OTLP/HTTP (protobuf) to a collector.

Spans follow the OpenTelemetry GenAI semantic conventions where they name a figure:

- ``chat {model}`` (CLIENT), one per record, from the request's send to its stream closing (the
  last time the record holds when it never closed): ``gen_ai.operation.name``,
  ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``,
  ``gen_ai.usage.cache_read.input_tokens``, ``gen_ai.response.finish_reasons``,
  ``server.address``/``server.port``, ``http.response.status_code``, and for a request that did
  not succeed ``error.type`` with status ERROR. The records keep no response model, so
  ``gen_ai.response.model`` is never set. An event ``ipw_async.first_token`` (our namespace: the
  conventions define no such event) marks the first token-bearing chunk, with ``ipw_async.ttft_s``.
- ``invoke_agent {workload}`` (INTERNAL), one per task of an agentic or multi-turn run, from when
  the task was scheduled to when it ended: the parent of its turns' ``chat`` spans and of its
  ``execute_tool {name}`` spans (INTERNAL, ``gen_ai.tool.name``, ``error.type`` for a failed call).

Our own figures are under ``ipw_async.*``: ids, warm-up, timing metrics, and energy: the
attributed joules with their band and provenance, the headline meter(s) they sum, and each
meter's own joules under ``ipw_async.energy.by_meter.<meter>``. A figure the run did not measure
is left out, never sent as 0. Prompts, answers and tool arguments and outputs are not sent (the
conventions make content opt-in). Each request, or each task, is a trace of its own.

Records stamp ns since the run's start on its monotonic clock; ``run.json``'s clock anchor pairs
that start with a wall-clock time, which places every span in wall-clock time.
"""

from __future__ import annotations

import base64
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import polars as pl

from .._clock import NS, ClockAnchor
from ..records import end_ns
from ..rundir.manifest import Manifest, RunDirError
from ..rundir.read import RunDir
from ..telemetry.http import redact_url
from ..traces import COMPLETED, QueryTrace
from . import ExportError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, Span
    from opentelemetry.trace import Tracer

_TRACES_PATH = "/v1/traces"
_BATCH = 512  # spans per export request: well under collectors' usual 4 MiB request limit
_KINDS = ("chat", "invoke_agent", "execute_tool")

# span attribute <- records column, set where the column exists and the value is not null
_CHAT_COLUMNS = (
    ("gen_ai.usage.input_tokens", "prompt_tokens"),
    ("gen_ai.usage.output_tokens", "output_tokens"),
    ("gen_ai.usage.cache_read.input_tokens", "cached_prompt_tokens"),
    ("http.response.status_code", "http_status"),
    ("ipw_async.request_id", "request_id"),
    ("ipw_async.query_id", "query_id"),
    ("ipw_async.dataset", "dataset"),
    ("ipw_async.task_id", "task_id"),
    ("ipw_async.turn_index", "turn_index"),
    ("ipw_async.warmup", "warmup"),
    ("ipw_async.correct", "correct"),
    ("ipw_async.queue_s", "queue_s"),
    ("ipw_async.ttft_s", "ttft_s"),
    ("ipw_async.tpot_s", "tpot_s"),
    ("ipw_async.e2e_latency_s", "e2e_latency_s"),
    ("ipw_async.output_tokens_source", "output_tokens_source"),
    ("ipw_async.energy.joules", "energy_j"),
    ("ipw_async.energy.low_joules", "energy_low_j"),
    ("ipw_async.energy.high_joules", "energy_high_j"),
    ("ipw_async.energy.provenance", "energy_provenance"),
    ("ipw_async.power.watts", "power_w"),
)
# columns read beside those: the span's times and outcome
_CHAT_EXTRA = ("status", "error_type", "error_message", "finish_reason", "first_token_ns", "_start", "_end")


@dataclass(frozen=True)
class OtelExport:
    """What was sent: where to (credentials redacted) and how many spans of each kind."""

    endpoint: str
    spans: dict[str, int]


@dataclass
class _Run:
    """What the export reads of a run directory."""

    manifest: Manifest
    summary: dict[str, Any]
    records: pl.DataFrame
    tasks: list[dict[str, Any]]
    traces: dict[int, QueryTrace]  # per task id: the task's trace (its energy)


def export_otel(
    run_dir: RunDir | str | Path,
    endpoint: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
    service_name: str = "ipw-async",
) -> OtelExport:
    """Send a finished run's spans to the OTLP/HTTP collector at ``endpoint`` (a base URL such as
    ``http://localhost:4318``; ``/v1/traces`` is added unless it ends with it).

    ``headers`` go with every request (an API key), beside any in ``OTEL_EXPORTER_OTLP_HEADERS``
    (the SDK reads it; ``headers`` win); a user and password in the URL become basic auth. Raises :class:`ExportError` for a run that did not finish, a missing SDK, or an
    endpoint that does not take the spans within about ``timeout_s``. Writes nothing to the run.
    """
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON
    except ImportError:
        raise ExportError(
            "OpenTelemetry export needs the otel extra: pip install 'ipw-async[otel]'"
        ) from None
    url, auth, shown = _endpoint(endpoint)
    run = _read_run(run_dir if isinstance(run_dir, RunDir) else Path(run_dir))
    manifest = run.manifest
    resource = Resource.create(
        {
            "service.name": service_name,
            "ipw_async.run_id": manifest.run_id,
            "ipw_async.model": manifest.model,
            "ipw_async.simulated": manifest.simulated,
        }
        | ({"service.version": v} if (v := manifest.versions.get("ipw-async")) else {})
    )
    spans: list[ReadableSpan] = []

    class Collect(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            spans.append(span)

    # a provider of our own: the application's global one (and its sampler) is not ours to use
    provider = TracerProvider(resource=resource, sampler=ALWAYS_ON, shutdown_on_exit=False)
    provider.add_span_processor(Collect())
    _build(run, provider.get_tracer("ipw_async.export.otel", manifest.versions.get("ipw-async")))
    provider.shutdown()
    _send(spans, url, auth | dict(headers or {}), timeout_s, shown)
    counts = Counter(str((s.attributes or {}).get("gen_ai.operation.name")) for s in spans)
    return OtelExport(endpoint=redact_url(endpoint), spans={kind: counts[kind] for kind in _KINDS})


def _endpoint(endpoint: str) -> tuple[str, dict[str, str], str]:
    """The traces URL without credentials, the basic-auth header they make, and the URL to show."""
    given = endpoint if "://" in endpoint else f"http://{endpoint}"
    parts = urlsplit(given)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ExportError(
            f"{redact_url(endpoint)!r} is not an OTLP/HTTP endpoint; give one like http://localhost:4318"
        )
    path = parts.path.rstrip("/")
    if not path.endswith(_TRACES_PATH):
        path += _TRACES_PATH
    auth: dict[str, str] = {}
    if parts.username is not None:
        user_pass = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        auth["Authorization"] = "Basic " + base64.b64encode(user_pass.encode()).decode()
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return (
        parts._replace(netloc=netloc, path=path).geturl(),
        auth,
        redact_url(parts._replace(path=path).geturl()),
    )


def _read_run(run_dir: RunDir | Path) -> _Run:
    """The finished run's files, read only; a run cut short is an error naming the fix."""
    try:
        run = RunDir.open_finished(run_dir)
        manifest = run.require_manifest()
        assert run.summary is not None  # a finished run with a run.json has its summary
        return _Run(
            manifest=manifest,
            summary=run.summary,
            records=run.records,
            tasks=run.tasks,
            traces={t.task_id: t for t in run.traces or [] if t.task_id is not None},
        )
    except (RunDirError, OSError, ValueError) as exc:  # ValueError: a file cut short or not JSON
        raise ExportError(f"cannot export {run_dir}: {exc}") from None


def _wall_ns(anchor: ClockAnchor, t_ns: int) -> int:
    """A run-clock stamp (ns since the anchor's monotonic moment) as wall-clock epoch ns."""
    return anchor.to_unix_ns(anchor.monotonic_ns + t_ns)


def _set(attributes: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:  # missing is not zero: a null is left out
        attributes[key] = value


def _server(base_url: str | None) -> dict[str, Any]:
    if not base_url:
        return {}
    parts = urlsplit(base_url)
    if not parts.hostname:
        return {}
    return {
        "server.address": parts.hostname,
        "server.port": parts.port or (443 if parts.scheme == "https" else 80),
    }


def _build(run: _Run, tracer: Tracer) -> None:
    """Every span of the run, ended (the provider's processor collects them)."""
    manifest = run.manifest
    common = {
        "gen_ai.request.model": manifest.model,
        "ipw_async.run_id": manifest.run_id,
        "ipw_async.simulated": manifest.simulated,
    }
    tasks = _task_spans(run, tracer, common)
    _chat_spans(run, tracer, common, tasks)
    _tool_spans(run, tracer, common, tasks)
    for task in run.tasks:  # a task line is written when the task ends: it always has its end
        tasks[task["task_id"]].end(end_time=_wall_ns(manifest.anchor, task["ended_ns"]))


def _task_spans(run: _Run, tracer: Tracer, common: dict[str, Any]) -> dict[int, Span]:
    """Each task's ``invoke_agent`` span, started: its turns and tools are made inside it."""
    from opentelemetry.trace import SpanKind, Status, StatusCode

    manifest = run.manifest
    agent = str(manifest.config.get("workload") or manifest.workload["kind"])
    spans = {}
    for task in run.tasks:
        attributes = common | {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent}
        _task_attributes(attributes, task, run.traces.get(task["task_id"]))
        span = tracer.start_span(
            f"invoke_agent {agent}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=_wall_ns(manifest.anchor, task["scheduled_ns"]),
        )
        if task["outcome"] not in COMPLETED:
            span.set_status(Status(StatusCode.ERROR, f"the task ended {task['outcome']}"))
        spans[task["task_id"]] = span
    return spans


def _chat_spans(run: _Run, tracer: Tracer, common: dict[str, Any], tasks: dict[int, Span]) -> None:
    """One ``chat`` span per record, inside its task's span where it has one."""
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    manifest, anchor = run.manifest, run.manifest.anchor
    fixed = common | {"gen_ai.operation.name": "chat"} | _server(manifest.base_url)
    headline = run.summary.get("energy", {}).get("headline_meters")
    if headline:
        fixed["ipw_async.energy.meter"] = list(headline)
    records = run.records
    columns = [(key, column) for key, column in _CHAT_COLUMNS if column in records.columns]
    for meter in (c.removesuffix(".energy_j") for c in records.columns if c.endswith(".energy_j")):
        by = f"ipw_async.energy.by_meter.{meter}"
        columns += [(f"{by}.joules", f"{meter}.energy_j"), (f"{by}.provenance", f"{meter}.provenance")]
    frame = records.with_columns(
        # a request that was never sent still held its slot from when it was dispatched
        pl.coalesce("sent_ns", "dispatched_ns", "scheduled_ns").alias("_start"),
        pl.coalesce(end_ns(), "dispatched_ns", "scheduled_ns").alias("_end"),
    ).select(sorted({c for _, c in columns} | set(_CHAT_EXTRA)))
    name = f"chat {manifest.model}"
    for row in frame.iter_rows(named=True):
        attributes = dict(fixed)
        for key, column in columns:
            _set(attributes, key, row[column])
        if row["finish_reason"] is not None:
            attributes["gen_ai.response.finish_reasons"] = [row["finish_reason"]]
        failed = row["status"] != "ok"
        if failed:
            attributes["error.type"] = row["error_type"] or row["status"]
        parent = tasks.get(row["task_id"]) if row["task_id"] is not None else None
        span = tracer.start_span(
            name,
            context=trace.set_span_in_context(parent) if parent is not None else None,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=_wall_ns(anchor, row["_start"]),
        )
        if row["ttft_s"] is not None:
            span.add_event(
                "ipw_async.first_token",
                {"ipw_async.ttft_s": row["ttft_s"]},
                timestamp=_wall_ns(anchor, row["first_token_ns"]),
            )
        if failed:
            span.set_status(Status(StatusCode.ERROR, row["error_message"]))
        span.end(end_time=_wall_ns(anchor, row["_end"]))


def _tool_spans(run: _Run, tracer: Tracer, common: dict[str, Any], tasks: dict[int, Span]) -> None:
    """One ``execute_tool`` span per tool call, inside its task's span."""
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    anchor = run.manifest.anchor
    for task in run.tasks:
        context = trace.set_span_in_context(tasks[task["task_id"]])
        for turn in task["turns"]:
            for tool in turn["tools"]:
                attributes = common | {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool["name"],
                    "gen_ai.tool.type": "function",
                    "ipw_async.tool.latency_s": tool["latency_s"],
                    "ipw_async.turn_index": turn["turn_index"],
                }
                if not tool["ok"]:
                    attributes["error.type"] = "tool_error"
                start = tool["started_ns"]
                span = tracer.start_span(
                    f"execute_tool {tool['name']}",
                    context=context,
                    kind=SpanKind.INTERNAL,
                    attributes=attributes,
                    start_time=_wall_ns(anchor, start),
                )
                if not tool["ok"]:
                    span.set_status(Status(StatusCode.ERROR, tool["output"]))
                span.end(end_time=_wall_ns(anchor, start + round(tool["latency_s"] * NS)))


def _task_attributes(attributes: dict[str, Any], task: dict[str, Any], traced: QueryTrace | None) -> None:
    """A task's ids and outcome, and from its trace its tokens and energy."""
    for key, field in (
        ("ipw_async.task_id", "task_id"),
        ("ipw_async.query_id", "query_id"),
        ("ipw_async.dataset", "dataset"),
        ("ipw_async.warmup", "warmup"),
        ("ipw_async.correct", "correct"),
        ("ipw_async.outcome", "outcome"),
    ):
        _set(attributes, key, task[field])
    if task["outcome"] not in COMPLETED:
        attributes["error.type"] = task["outcome"]
    if traced is None:
        return
    attributes["ipw_async.turns"] = len(traced.turns)
    inputs = [t.input_tokens for t in traced.turns]
    outputs = [t.output_tokens for t in traced.turns]
    if inputs and None not in inputs:
        attributes["gen_ai.usage.input_tokens"] = sum(inputs)  # type: ignore[arg-type]
    if outputs and None not in outputs:
        attributes["gen_ai.usage.output_tokens"] = sum(outputs)  # type: ignore[arg-type]
    _set(attributes, "ipw_async.energy.joules", traced.energy_j)
    _set(attributes, "ipw_async.energy.tool_wait_device_joules", traced.tool_wait_device_j)


def _send(spans: list[ReadableSpan], url: str, headers: dict[str, str], timeout_s: float, shown: str) -> None:
    """Export in batches; the first batch the endpoint does not take ends the export."""
    import requests
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    answered: list[int] = []  # the HTTP status of each answer to the current batch
    session = requests.Session()
    session.hooks["response"].append(lambda response, *_, **__: answered.append(response.status_code))
    exporter = OTLPSpanExporter(endpoint=url, headers=headers, timeout=timeout_s, session=session)
    # the exporter logs each retry and failure; the ExportError below says it in one sentence
    log = logging.getLogger(OTLPSpanExporter.__module__)

    def quiet(_: logging.LogRecord) -> bool:
        return False

    log.addFilter(quiet)
    try:
        for start in range(0, len(spans), _BATCH):
            answered.clear()
            try:
                result = exporter.export(spans[start : start + _BATCH])
            except requests.RequestException:  # older SDKs let a connection error out of export
                result = SpanExportResult.FAILURE
            if result is not SpanExportResult.SUCCESS:
                raise ExportError(_refusal(shown, answered, timeout_s))
    finally:
        log.removeFilter(quiet)
        exporter.shutdown()


def _refusal(shown: str, answered: list[int], timeout_s: float) -> str:
    if not answered:
        return (
            f"no collector answered at {shown} (refused, or silent for {timeout_s:g} s): start an OTLP/HTTP collector "
            "there (usually port 4318) or give its URL"
        )
    status = answered[-1]
    if status in (401, 403):
        return (
            f"the OTLP endpoint {shown} refused the spans (HTTP {status}): give the headers it needs "
            "(an API key or token)"
        )
    if status in (404, 405):
        return (
            f"{shown} has no OTLP trace receiver (HTTP {status}): check the URL (a collector takes "
            "OTLP/HTTP on port 4318 by default)"
        )
    return (
        f"the OTLP endpoint {shown} answered HTTP {status} to the spans: check the collector's health "
        "and its logs"
    )
