"""The streaming client: metric definitions on scripted events, and failures over real HTTP."""

from __future__ import annotations

import json

import pytest

from ipw_async._clock import now_ns
from ipw_async.client import ClientConfig, ServerUnreachable, StreamingClient, apply_events, list_models
from ipw_async.records import ErrorType, RequestRecord, Status, record_row
from ipw_async.sim import SimulatorProcess
from ipw_async.workload.datasets import Query

MS = 1_000_000


def chat_event(content: str | None = None, role: bool = False, finish: str | None = None) -> bytes:
    delta: dict[str, str] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    return (
        b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode()
    )


def usage_event(prompt: int, completion: int) -> bytes:
    body = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    return b"data: " + json.dumps(body).encode()


def scripted() -> RequestRecord:
    record = RequestRecord(request_id=0, query_id="q", dataset="d", prompt="p", sent_ns=0)
    events = [
        (5 * MS, chat_event(role=True, content="")),  # role-only: not a token
        (40 * MS, chat_event("Hello")),
        (55 * MS, chat_event(" world")),
        (85 * MS, chat_event("!")),
        (90 * MS, chat_event(finish="stop")),
        (91 * MS, usage_event(12, 3)),  # usage-only: not a token
        (92 * MS, b"data: [DONE]"),
    ]
    apply_events(record, events)
    record.closed_ns = 93 * MS
    return record


def test_metric_definitions_on_scripted_events() -> None:
    record = scripted()
    assert record.status is Status.OK
    assert record.first_event_ns == 5 * MS
    assert record.ttft_s == pytest.approx(0.040)  # the role-only chunk did not count
    assert record.e2e_latency_s == pytest.approx(0.085)  # last token chunk, not [DONE]
    assert record.stream_time_s == pytest.approx(0.093)
    assert record.e2e_latency_s - record.ttft_s == pytest.approx(sum(record.itl_s))
    assert record.itl_s == pytest.approx([0.015, 0.030])
    assert record.output_tokens == 3 and record.output_tokens_source == "usage"
    assert record.prompt_tokens == 12
    assert record.tpot_s == pytest.approx((0.085 - 0.040) / 2)
    assert record.answer == "Hello world!"
    assert record.finish_reason == "stop"


def test_no_token_gives_null_ttft_not_zero() -> None:
    record = RequestRecord(request_id=0, query_id="q", dataset="d", prompt="p", sent_ns=0)
    apply_events(
        record, [(3 * MS, chat_event(role=True)), (4 * MS, usage_event(5, 0)), (5 * MS, b"data: [DONE]")]
    )
    assert record.ttft_s is None and record.e2e_latency_s is None and record.tpot_s is None
    assert record.output_tokens == 0
    assert record_row(record)["ttft_s"] is None


def test_one_token_has_no_tpot() -> None:
    record = RequestRecord(request_id=0, query_id="q", dataset="d", prompt="p", sent_ns=0)
    apply_events(record, [(3 * MS, chat_event("x")), (4 * MS, usage_event(5, 1)), (5 * MS, b"data: [DONE]")])
    assert record.ttft_s == pytest.approx(0.003)
    assert record.tpot_s is None


def test_error_object_inside_http_200_stream_is_a_failure() -> None:
    record = RequestRecord(request_id=0, query_id="q", dataset="d", prompt="p", sent_ns=0)
    error = b'data: {"error": {"message": "engine died", "type": "server_error"}}'
    apply_events(record, [(3 * MS, chat_event("x")), (4 * MS, error)])
    assert record.status is Status.ERROR
    assert record.error_type is ErrorType.STREAM
    assert "engine died" in (record.error_message or "")


def test_stream_ending_without_done_or_finish_is_a_disconnect() -> None:
    record = RequestRecord(request_id=0, query_id="q", dataset="d", prompt="p", sent_ns=0)
    apply_events(record, [(3 * MS, chat_event("x"))])
    assert record.status is Status.ERROR and record.error_type is ErrorType.DISCONNECT


def test_malformed_event_is_recorded() -> None:
    record = RequestRecord(request_id=0, query_id="q", dataset="d", prompt="p", sent_ns=0)
    apply_events(
        record, [(3 * MS, b'data: {"choices": [{"delta": '), (4 * MS, chat_event("x", finish="stop"))]
    )
    assert record.error_type is ErrorType.MALFORMED
    assert record.answer == "x"  # the rest of the stream is still read


async def _send(base_url: str, query: Query, request_id: int = 0, **client: object) -> RequestRecord:
    t0 = now_ns()
    c = StreamingClient(ClientConfig(base_url=base_url, max_connections=4, **client), t0)  # type: ignore[arg-type]
    try:
        record = RequestRecord(request_id=request_id, query_id=query.id, dataset="t", prompt=query.prompt)
        await c.send(record, c.payload("sim-small", c.prompt_fields(query.prompt), query.max_tokens))
        return record
    finally:
        await c.aclose()


async def test_real_stream_stamps_every_chunk(sim: SimulatorProcess) -> None:
    record = await _send(sim.base_url, Query(id="a", prompt="tell me something", max_tokens=20))
    assert record.status is Status.OK, record.error_message
    assert record.http_status == 200
    assert record.sent_ns is not None and record.headers_ns is not None and record.first_token_ns is not None
    assert record.sent_ns <= record.headers_ns <= record.first_event_ns <= record.first_token_ns  # type: ignore[operator]
    assert record.chunk_count == record.output_tokens  # the simulator sends one token per chunk
    assert record.output_tokens_source == "usage"
    # the server stamped each chunk on the same clock, before the client did
    delays_ms = [(c - s) / MS for c, s in zip(record.chunk_ns, record.chunk_server_ns, strict=True)]
    assert all(0 < d < 1000 for d in delays_ms)


async def test_http_error_is_recorded(sim: SimulatorProcess) -> None:
    t0 = now_ns()
    c = StreamingClient(ClientConfig(base_url=sim.base_url, max_connections=2), t0)
    record = RequestRecord(request_id=1, query_id="a", dataset="t", prompt="x")
    await c.send(record, c.payload("no-such-model", c.prompt_fields("x")))
    await c.aclose()
    assert record.status is Status.ERROR and record.error_type is ErrorType.HTTP
    assert record.http_status == 404 and "does not exist" in (record.error_message or "")


async def test_faults_mid_stream_become_typed_errors(faulty_sim: SimulatorProcess) -> None:
    kinds = set()
    for i in range(40):
        record = await _send(faulty_sim.base_url, Query(id=f"q{i}", prompt=f"prompt {i}", max_tokens=12), i)
        kinds.add(record.error_type)
        if record.error_type is ErrorType.DISCONNECT:
            assert record.closed_ns is not None
    assert {ErrorType.HTTP, ErrorType.STREAM, ErrorType.DISCONNECT, ErrorType.MALFORMED} <= kinds
    assert None in kinds  # and some requests went through


async def test_dead_port_is_a_connect_error() -> None:
    record = await _send("http://127.0.0.1:9/v1", Query(id="a", prompt="x"), connect_timeout=2.0)
    assert record.status is Status.ERROR and record.error_type is ErrorType.CONNECT


async def test_read_timeout_is_a_timeout(tmp_path: object) -> None:
    from ipw_async.sim import Faults, SimConfig

    from .conftest import fast_engine

    config = SimConfig(engine=fast_engine(), faults=Faults(stall=1.0, stall_s=3.0))
    with SimulatorProcess(config) as stalled:
        record = await _send(stalled.base_url, Query(id="a", prompt="x", max_tokens=8), read_timeout=0.5)
    assert record.status is Status.ERROR and record.error_type is ErrorType.TIMEOUT


async def test_list_models_errors_are_actionable() -> None:
    with pytest.raises(ServerUnreachable, match=r"cannot connect.*simulator"):
        await list_models("http://127.0.0.1:9/v1", None, timeout=2)
    with pytest.raises(ServerUnreachable, match="expected http"):
        await list_models("localhost:8000/v1", None)


async def test_api_key_is_sent_as_bearer_but_never_in_repr(sim: SimulatorProcess) -> None:
    config = ClientConfig(base_url=sim.base_url, api_key="sk-secret-123")
    assert "sk-secret" not in repr(config)
    assert await list_models(sim.base_url, "sk-secret-123") == ["sim-small"]


def test_only_a_request_that_never_ran_is_sent_again() -> None:
    from ipw_async.client import _describe, _stale

    def chained(outer: Exception, inner: BaseException) -> Exception:
        outer.__cause__ = inner
        return outer

    import aiohttp
    import httpx

    closing = chained(
        httpx.ConnectTimeout("Can not write request body"), aiohttp.ClientConnectionResetError("closing")
    )
    hung_up = chained(httpx.ConnectTimeout("Server disconnected"), aiohttp.ServerDisconnectedError())
    assert _stale(closing, quick=False)
    assert _stale(hung_up, quick=True)  # a hang-up at once, with no response: a stale connection
    assert not _stale(hung_up, quick=False)  # later, the server may have run it: an outcome
    assert _describe(hung_up).startswith("ServerDisconnectedError")  # not httpx's ConnectTimeout
