"""OpenTelemetry export: real OTLP/HTTP requests to a receiver on loopback, decoded as a collector would."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from typer.testing import CliRunner

from ipw_async import run_benchmark
from ipw_async.cli import app
from ipw_async.cli.export import Exports
from ipw_async.export import ExportError
from ipw_async.export.otel import OtelExport, export_otel
from ipw_async.rundir import files
from ipw_async.rundir.manifest import Manifest
from ipw_async.rundir.read import RunDir
from ipw_async.telemetry.http import redact_url

from .conftest import SHORT_RUN, finished_short_run, quick_config


@dataclass
class Received:
    """One decoded span with its resource and the request's headers."""

    span: Span
    attributes: dict[str, Any]
    resource: dict[str, Any]
    headers: dict[str, str]


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver on loopback; ``status`` is what it answers."""

    url: str
    spans: list[Received] = field(default_factory=list)
    encodings: list[str | None] = field(default_factory=list)
    status: int = 200

    def take(self) -> list[Received]:
        out, self.spans = self.spans, []
        return out


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            encoding = self.headers.get("Content-Encoding")
            state.encodings.append(encoding)
            if state.status != 200 or self.path != "/v1/traces":
                self.send_response(state.status if state.status != 200 else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            request = ExportTraceServiceRequest.FromString(
                gzip.decompress(body) if encoding == "gzip" else body
            )
            headers = {k.lower(): v for k, v in self.headers.items()}
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        state.spans.append(Received(span, _attributes(span.attributes), resource, headers))
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finished_short_run(tmp_path_factory.mktemp("otel") / "short_run")


@pytest.fixture(scope="module")
def agentic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = quick_config(
        tmp_path_factory.mktemp("agentic"), workload="agentic", max_queries=6, concurrency=3
    )
    return asyncio.run(run_benchmark(config)).run_dir


def _digests(run_dir: Path) -> dict[str, str]:
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def _wall(run_dir: Path, t_ns: int) -> int:
    clock = files.read_json(run_dir / files.RUN)["clock"]
    return clock["t0_unix_ns"] + t_ns


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_chat_spans_carry_the_records(receiver: Receiver, short_run: Path) -> None:
    before = _digests(short_run)
    result = export_otel(short_run, receiver.url, headers={"x-api-key": "k1"})
    assert _digests(short_run) == before  # the run directory is only read
    records = files.read_arrow(short_run / files.RECORDS)
    manifest = Manifest.read(short_run)
    received = receiver.take()
    assert result == OtelExport(receiver.url, {"chat": records.height, "invoke_agent": 0, "execute_tool": 0})
    assert len(received) == records.height
    by_id = {r.attributes["ipw_async.request_id"]: r for r in received}
    assert {r.headers["x-api-key"] for r in received} == {"k1"}
    assert received[0].resource["service.name"] == "ipw-async"
    assert received[0].resource["ipw_async.run_id"] == manifest.run_id
    assert received[0].resource["ipw_async.model"] == "sim-small"
    assert len({r.span.trace_id for r in received}) == records.height  # a trace per request
    for row in records.iter_rows(named=True):
        got = by_id[row["request_id"]]
        span, attrs = got.span, got.attributes
        assert span.name == "chat sim-small" and span.kind == Span.SPAN_KIND_CLIENT
        assert not span.parent_span_id
        assert span.start_time_unix_nano == _wall(short_run, row["sent_ns"])
        assert span.end_time_unix_nano == _wall(short_run, row["closed_ns"])
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.request.model"] == "sim-small"
        assert attrs["gen_ai.usage.input_tokens"] == row["prompt_tokens"]
        assert attrs["gen_ai.usage.output_tokens"] == row["output_tokens"]
        assert attrs["server.address"] == "127.0.0.1" and attrs["server.port"] == 39969
        assert attrs["ipw_async.run_id"] == manifest.run_id
        assert attrs["ipw_async.query_id"] == row["query_id"]
        assert attrs["ipw_async.warmup"] == row["warmup"]
        assert attrs["ipw_async.simulated"] is False
        assert attrs["ipw_async.energy.joules"] == pytest.approx(row["energy_j"], rel=1e-12)
        assert attrs["ipw_async.energy.low_joules"] == pytest.approx(row["energy_low_j"], rel=1e-12)
        assert attrs["ipw_async.energy.high_joules"] == pytest.approx(row["energy_high_j"], rel=1e-12)
        assert attrs["ipw_async.energy.provenance"] == row["energy_provenance"]
        assert attrs["ipw_async.energy.meter"] == ["sim"]
        assert attrs["ipw_async.energy.by_meter.sim.joules"] == pytest.approx(row["sim.energy_j"], rel=1e-12)
        assert "gen_ai.response.model" not in attrs  # the records keep none
        assert span.status.code != Status.STATUS_CODE_ERROR and "error.type" not in attrs
        events = [e for e in span.events if e.name == "ipw_async.first_token"]
        if row["ttft_s"] is None:
            assert not events and "ipw_async.ttft_s" not in attrs
        else:
            assert len(events) == 1
            assert events[0].time_unix_nano == _wall(short_run, row["first_token_ns"])
            assert attrs["ipw_async.ttft_s"] == pytest.approx(row["ttft_s"])


def test_missing_figures_and_failures(receiver: Receiver, short_run: Path, tmp_path: Path) -> None:
    """A null is left out (never 0); a failed request is an ERROR span with its error type."""
    run = tmp_path / "run"
    shutil.copytree(short_run, run)
    records = files.read_arrow(run / files.RECORDS)
    failed = records.get_column("request_id")[3]
    records = records.with_columns(
        pl.when(pl.col("request_id") == failed).then(None).otherwise(pl.col(c)).alias(c)
        for c in ("energy_j", "first_token_ns", "ttft_s", "prompt_tokens", "sent_ns", "closed_ns")
    ).with_columns(
        pl.when(pl.col("request_id") == failed).then(pl.lit(v)).otherwise(pl.col(c)).alias(c)
        for c, v in (("status", "error"), ("error_type", "http_error"), ("error_message", "HTTP 500"))
    )
    files.write_frame(records, run / files.RECORDS)
    export_otel(run, receiver.url)
    got = {r.attributes["ipw_async.request_id"]: r for r in receiver.take()}[failed]
    row = records.filter(pl.col("request_id") == failed).row(0, named=True)
    for key in ("ipw_async.energy.joules", "ipw_async.ttft_s", "gen_ai.usage.input_tokens"):
        assert key not in got.attributes
    assert not got.span.events
    assert got.attributes["error.type"] == "http_error"
    assert got.span.status.code == Status.STATUS_CODE_ERROR and got.span.status.message == "HTTP 500"
    # never sent: the span starts when the request got its slot and ends where its record does
    assert got.span.start_time_unix_nano == _wall(run, row["dispatched_ns"])
    assert got.span.end_time_unix_nano == _wall(run, row["last_token_ns"])


def test_agentic_task_spans_parent_their_turns_and_tools(receiver: Receiver, agentic_run: Path) -> None:
    result = export_otel(agentic_run, receiver.url)
    received = receiver.take()
    records = files.read_arrow(agentic_run / files.RECORDS)
    tasks = RunDir.open(agentic_run).tasks
    tools = sum(len(turn["tools"]) for task in tasks for turn in task["turns"])
    assert tools > 0
    assert result.spans == {"chat": records.height, "invoke_agent": len(tasks), "execute_tool": tools}
    assert len(received) == records.height + len(tasks) + tools
    traces = {t["task_id"]: t for t in files.read_jsonl(agentic_run / files.TRACES)}
    agents = {
        r.attributes["ipw_async.task_id"]: r for r in received if r.span.name.startswith("invoke_agent")
    }
    for task in tasks:
        agent = agents[task["task_id"]]
        assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert agent.span.kind == Span.SPAN_KIND_INTERNAL and not agent.span.parent_span_id
        assert agent.span.start_time_unix_nano == _wall(agentic_run, task["scheduled_ns"])
        assert agent.span.end_time_unix_nano == _wall(agentic_run, task["ended_ns"])
        assert agent.attributes["ipw_async.energy.joules"] == pytest.approx(
            traces[task["task_id"]]["energy_j"]
        )
        children = [
            r
            for r in received
            if r.span.parent_span_id == agent.span.span_id and r.span.trace_id == agent.span.trace_id
        ]
        chats = [r for r in children if r.attributes["gen_ai.operation.name"] == "chat"]
        assert sorted(r.attributes["ipw_async.request_id"] for r in chats) == sorted(
            turn["request_id"] for turn in task["turns"]
        )
        calls = [r for r in children if r.attributes["gen_ai.operation.name"] == "execute_tool"]
        logged = [tool for turn in task["turns"] for tool in turn["tools"]]
        assert sorted(r.attributes["gen_ai.tool.name"] for r in calls) == sorted(t["name"] for t in logged)
        for call in calls:
            assert call.span.name == f"execute_tool {call.attributes['gen_ai.tool.name']}"
            assert call.attributes["ipw_async.tool.latency_s"] > 0
            assert call.span.end_time_unix_nano > call.span.start_time_unix_nano
        assert {t["started_ns"] for t in logged} == {
            c.span.start_time_unix_nano - _wall(agentic_run, 0) for c in calls
        }


def test_dead_endpoint_is_one_line_error_and_writes_nothing(short_run: Path) -> None:
    before = _digests(short_run)
    started = time.perf_counter()
    with pytest.raises(ExportError) as caught:
        export_otel(short_run, f"http://127.0.0.1:{_closed_port()}", timeout_s=2.0)
    assert time.perf_counter() - started < 5.0
    message = str(caught.value)
    assert "\n" not in message and "/v1/traces" in message and "collector" in message
    assert _digests(short_run) == before


def test_refusing_endpoint_names_the_status(receiver: Receiver, short_run: Path) -> None:
    receiver.status = 401
    try:
        with pytest.raises(ExportError, match="HTTP 401") as caught:
            export_otel(short_run, receiver.url, timeout_s=2.0)
    finally:
        receiver.status = 200
    assert "\n" not in str(caught.value)
    assert not receiver.take()


def test_credentials_in_the_url_become_basic_auth_and_are_redacted(
    receiver: Receiver, short_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")  # a collector takes gzip too
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=t1")  # the SDK's own, kept beside ours
    receiver.encodings.clear()
    url = receiver.url.replace("http://", "http://alice:s3cret@") + "/v1/traces"
    result = export_otel(short_run, url)
    assert "s3cret" not in result.endpoint and result.endpoint.startswith("http://alice:***@")
    received = receiver.take()
    assert received and {r.headers["authorization"] for r in received} == {"Basic YWxpY2U6czNjcmV0"}
    assert {r.headers["x-tenant"] for r in received} == {"t1"}
    assert set(receiver.encodings) == {"gzip"}


def test_unfinished_run_and_bad_url_say_what_to_do(receiver: Receiver, tmp_path: Path) -> None:
    run = tmp_path / "killed"
    shutil.copytree(SHORT_RUN, run)  # records and telemetry, no summary: as a kill leaves it
    with pytest.raises(ExportError, match="ipw-async recover"):
        export_otel(run, receiver.url)
    with pytest.raises(ExportError, match="not an OTLP/HTTP endpoint"):
        export_otel(run, "ftp://collector:4318")
    assert not receiver.take()


def test_failed_tool_call_and_unfinished_task_are_errors(
    receiver: Receiver, agentic_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(agentic_run, run)
    tasks = RunDir.open(run).tasks
    task = next(t for t in tasks if t["turns"][0]["tools"])
    task["outcome"] = "max_turns"
    task["turns"][0]["tools"][0] |= {"ok": False, "output": "error: calculator backend down"}
    (run / files.TASKS).write_text("".join(json.dumps(t) + "\n" for t in tasks))
    export_otel(run, receiver.url)
    received = receiver.take()
    agent = next(
        r
        for r in received
        if r.span.name.startswith("invoke_agent") and r.attributes["ipw_async.task_id"] == task["task_id"]
    )
    assert agent.span.status.code == Status.STATUS_CODE_ERROR
    assert agent.attributes["error.type"] == "max_turns" == agent.attributes["ipw_async.outcome"]
    failed = [r for r in received if r.attributes.get("error.type") == "tool_error"]
    assert len(failed) == 1 and failed[0].span.parent_span_id == agent.span.span_id
    assert failed[0].span.status.code == Status.STATUS_CODE_ERROR
    assert failed[0].span.status.message == "error: calculator backend down"
    others = [r for r in received if r.span.name.startswith("invoke_agent") and r is not agent]
    assert others and all(r.span.status.code != Status.STATUS_CODE_ERROR for r in others)


def test_endpoint_forms_and_missing_sdk(
    receiver: Receiver, short_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = receiver.url.removeprefix("http://")
    for endpoint in (bare, receiver.url + "/", receiver.url + "/v1/traces/"):
        assert export_otel(short_run, endpoint).endpoint == endpoint
        assert len(receiver.take()) == 48
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.resources", None)  # as if not installed
    with pytest.raises(ExportError, match=r"pip install 'ipw-async\[otel\]'"):
        export_otel(short_run, receiver.url)


def test_a_token_given_as_the_urls_user_is_redacted_too() -> None:
    assert (
        redact_url("https://TOKEN@collector.example/v1/traces") == "https://***@collector.example/v1/traces"
    )
    assert redact_url("http://alice:pw@host:4318") == "http://alice:***@host:4318"
    assert redact_url("http://host:4318") == "http://host:4318"


def test_run_exports_when_it_ends_and_a_dead_endpoint_only_warns(receiver: Receiver, tmp_path: Path) -> None:
    quick = ["run", "-n", "4", "-c", "2", "--baseline-s", "0", "--output-tokens", "8", "-q"]
    live = CliRunner().invoke(app, [*quick, "-o", str(tmp_path / "live"), "--otlp-endpoint", receiver.url])
    assert live.exit_code == 0, live.output
    chats = [r for r in receiver.take() if r.attributes.get("gen_ai.operation.name") == "chat"]
    assert len(chats) == files.read_arrow(tmp_path / "live" / files.RECORDS).height
    assert "OpenTelemetry: sent" in live.output

    dead = CliRunner().invoke(
        app, [*quick, "-o", str(tmp_path / "dead"), "--otlp-endpoint", f"http://127.0.0.1:{_closed_port()}"]
    )
    assert dead.exit_code == 0, dead.output  # the run itself is whole
    warnings = [line for line in dead.output.splitlines() if "export skipped" in line]
    assert len(warnings) == 1 and "OpenTelemetry" in warnings[0]
    assert (tmp_path / "dead" / files.SUMMARY).is_file() and (tmp_path / "dead" / "dataset").is_dir()


def test_export_otel_command(receiver: Receiver, short_run: Path) -> None:
    result = CliRunner().invoke(app, ["export", "otel", str(short_run), "--endpoint", receiver.url])
    assert result.exit_code == 0, result.output
    assert f"sent {files.read_arrow(short_run / files.RECORDS).height} chat spans" in result.output
    assert receiver.take()
    dead = CliRunner().invoke(
        app,
        [
            "export",
            "otel",
            str(short_run),
            "--endpoint",
            f"http://127.0.0.1:{_closed_port()}",
            "--timeout",
            "2",
        ],
    )
    assert dead.exit_code == 2 and dead.output.startswith("error:") and "Traceback" not in dead.output


def test_an_exporter_that_breaks_after_a_run_is_a_warning(
    short_run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("collector SDK bug")

    monkeypatch.setattr("ipw_async.export.otel.export_otel", broken)
    before = _digests(short_run)
    Exports(otlp_endpoint="http://127.0.0.1:4318")(short_run)  # returns: the run's exit code stands
    warning = capsys.readouterr().err.strip()
    assert warning.startswith("OpenTelemetry export failed: collector SDK bug") and "\n" not in warning
    assert _digests(short_run) == before
