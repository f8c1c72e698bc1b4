"""The streaming client: metric definitions on scripted events, and failures over real HTTP."""

from __future__ import annotations

import itertools
import json

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipw_async._clock import now_ns
from ipw_async.client import ClientConfig, ServerUnreachable, StreamingClient, list_models
from ipw_async.records import RECORD_SCHEMA, ErrorType, RequestRecord, Status, record_row, records_frame
from ipw_async.sim import SimulatorProcess
from ipw_async.transport.scripted import Reply, ScriptedNetwork, chunk
from ipw_async.workload.body import BodyDefaults, prompt_fields
from ipw_async.workload.datasets import Query

from .conftest import scripted_send, stream_record

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


async def scripted() -> RequestRecord:
    return await stream_record(
        [
            (5 * MS, chat_event(role=True, content="")),  # role-only: not a token
            (40 * MS, chat_event("Hello")),
            (55 * MS, chat_event(" world")),
            (85 * MS, chat_event("!")),
            (90 * MS, chat_event(finish="stop")),
            (91 * MS, usage_event(12, 3)),  # usage-only: not a token
            (92 * MS, b"data: [DONE]"),
        ],
        end_ns=93 * MS,
    )


async def test_metric_definitions_on_scripted_events() -> None:
    record = await scripted()
    assert record.status is Status.OK
    assert record.sent_ns == 0 and record.headers_ns == 5 * MS
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


def test_records_frame_holds_every_field_a_row_gives() -> None:
    """The writer's column-at-a-time table holds what each record's row says, nulls,
    empty streams, tool calls and enums included."""
    streamed = RequestRecord(request_id=1, query_id="q1", dataset="d", prompt="p", sent_ns=10 * MS)
    streamed.chunk_ns = [20 * MS, 25 * MS, 40 * MS]
    streamed.chunk_tokens = [1, 2, 1]
    streamed.chunk_server_ns = [19 * MS, None, 39 * MS]
    streamed.first_token_ns, streamed.last_token_ns = 20 * MS, 40 * MS
    streamed.tool_calls = [{"id": "c1", "name": "add", "arguments": None}]
    streamed.reasoning, streamed.correct = "think", True
    failed = RequestRecord(
        request_id=2,
        query_id="q2",
        dataset="d",
        prompt="p",
        warmup=True,
        status=Status.ERROR,
        error_type=ErrorType.TIMEOUT,
        error_message="no byte",
    )
    frame = records_frame(
        [streamed, failed, RequestRecord(request_id=3, query_id="q3", dataset="d", prompt="")]
    )
    assert frame.schema == RECORD_SCHEMA
    assert (
        frame.to_dicts()
        == pl.DataFrame(
            [record_row(r) for r in (streamed, failed)] + [record_row(RequestRecord(3, "q3", "d", ""))],
            schema=RECORD_SCHEMA,
        ).to_dicts()
    )
    first = frame.row(0, named=True)
    assert first["itl_s"] == pytest.approx([0.005, 0.015]) and first["chunk_server_ns"] == [
        19 * MS,
        None,
        39 * MS,
    ]
    assert first["tool_calls"] == [{"id": "c1", "name": "add", "arguments": None}]
    assert frame.row(1, named=True)["error_type"] == "timeout" and frame.row(2, named=True)["itl_s"] == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 10**6), max_size=5), max_size=6))
def test_inter_token_latencies_in_a_batch_are_each_records_own(gaps: list[list[int]]) -> None:
    # built for the whole batch at once: each record's must still be its own (a record of one
    # token or none has none, and none spans two records)
    records = [
        RequestRecord(i, f"q{i}", "d", "", chunk_ns=list(itertools.accumulate(g, initial=i * MS))[1:])
        for i, g in enumerate(gaps)
    ]
    assert records_frame(records).get_column("itl_s").to_list() == [r.itl_s for r in records]


async def test_no_token_gives_null_ttft_not_zero() -> None:
    record = await stream_record(
        [(3 * MS, chat_event(role=True)), (4 * MS, usage_event(5, 0)), (5 * MS, b"data: [DONE]")]
    )
    assert record.ttft_s is None and record.e2e_latency_s is None and record.tpot_s is None
    assert record.output_tokens == 0
    assert record_row(record)["ttft_s"] is None


async def test_one_token_has_no_tpot() -> None:
    record = await stream_record(
        [(3 * MS, chat_event("x")), (4 * MS, usage_event(5, 1)), (5 * MS, b"data: [DONE]")]
    )
    assert record.ttft_s == pytest.approx(0.003)
    assert record.tpot_s is None


async def test_error_object_inside_http_200_stream_is_a_failure() -> None:
    error = b'data: {"error": {"message": "engine died", "type": "server_error"}}'
    record = await stream_record([(3 * MS, chat_event("x")), (4 * MS, error)])
    assert record.status is Status.ERROR
    assert record.error_type is ErrorType.STREAM
    assert "engine died" in (record.error_message or "")


async def test_stream_ending_without_done_or_finish_is_a_disconnect() -> None:
    record = await stream_record([(3 * MS, chat_event("x"))])
    assert record.status is Status.ERROR and record.error_type is ErrorType.DISCONNECT


async def test_malformed_event_is_recorded() -> None:
    record = await stream_record(
        [(3 * MS, b'data: {"choices": [{"delta": '), (4 * MS, chat_event("x", finish="stop"))]
    )
    assert record.error_type is ErrorType.MALFORMED
    assert record.answer == "x"  # the rest of the stream is still read


async def test_an_event_of_the_wrong_shape_says_where() -> None:
    record = await stream_record(
        [(3 * MS, b'data: {"choices": [{"index": "zero"}]}'), (4 * MS, b"data: [DONE]")]
    )
    assert record.error_type is ErrorType.MALFORMED
    assert "choices[0].index" in (record.error_message or "")


STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def test_an_event_split_across_reads_has_the_time_of_the_read_that_completed_it() -> None:
    first, second = chat_event("Hello") + b"\n\n", chat_event(" you", finish="stop") + b"\n\n"
    body = chunk(first[:20]) + chunk(first[20:] + second[:7])
    record, _ = await scripted_send(
        Reply(
            [
                (1 * MS, STREAM_HEAD),
                (10 * MS, body[:9]),
                (20 * MS, body[9:]),
                (30 * MS, chunk(second[7:]) + b"0\r\n\r\n"),
            ]
        )
    )
    assert record.status is Status.OK, record.error_message
    assert record.chunk_ns == [20 * MS, 30 * MS]
    assert record.answer == "Hello you"


async def test_many_events_in_one_read_share_its_time() -> None:
    events = b"".join(chat_event(w) + b"\n\n" for w in ("a", "b", "c")) + b"data: [DONE]\n\n"
    record, _ = await scripted_send(Reply([(2 * MS, STREAM_HEAD + chunk(events) + b"0\r\n\r\n")]))
    assert record.chunk_ns == [2 * MS] * 3 and record.answer == "abc"


async def test_a_character_split_between_chunks_and_crlf_line_ends_survive() -> None:
    raw = json.dumps(
        {"choices": [{"index": 0, "delta": {"content": "héllo 世界"}, "finish_reason": "stop"}]},
        ensure_ascii=False,
    )
    wire = b"data: " + raw.encode() + b"\r\n\r\n"
    cut = wire.index("世".encode()) + 1  # inside the character's three bytes
    record, _ = await scripted_send(
        Reply(
            [
                (1 * MS, STREAM_HEAD + chunk(wire[:cut])),
                (2 * MS, chunk(wire[cut:-1])),
                (3 * MS, chunk(wire[-1:]) + b"0\r\n\r\n"),
            ]
        )
    )
    assert record.status is Status.OK, record.error_message
    # the CR that ended the second read waited for its LF: the event completed at 3 ms
    assert record.answer == "héllo 世界" and record.chunk_ns == [3 * MS]


async def test_a_server_closing_mid_event_keeps_what_came_before() -> None:
    record, _ = await scripted_send(
        Reply(
            [(1 * MS, STREAM_HEAD + chunk(chat_event("one") + b"\n\n")), (2 * MS, chunk(b'data: {"cho'))],
            close=True,
        )
    )
    assert record.status is Status.ERROR and record.error_type is ErrorType.DISCONNECT
    assert record.answer == "one" and record.chunk_ns == [1 * MS]
    assert record.closed_ns == 2 * MS


async def test_an_http_1_0_body_ends_at_the_close() -> None:
    head = b"HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    events = chat_event("x", finish="stop") + b"\n\ndata: [DONE]\n\n"
    record, _ = await scripted_send(Reply([(1 * MS, head), (4 * MS, events)], close=True))
    assert record.status is Status.OK, record.error_message
    assert record.answer == "x" and record.chunk_ns == [4 * MS]


async def test_a_body_that_ignores_stream_true_is_named() -> None:
    record, _ = await scripted_send(Reply.body(200, b'{"choices": [{"message": {"content": "hi"}}]}'))
    assert record.error_type is ErrorType.NOT_STREAMING and "ignored stream=true" in (
        record.error_message or ""
    )


async def test_an_error_status_keeps_the_servers_message() -> None:
    record, _ = await scripted_send(Reply.body(429, b'{"error": {"message": "slow down"}}'))
    assert record.http_status == 429 and record.error_type is ErrorType.HTTP
    assert record.error_message == "HTTP 429: slow down"


async def test_a_request_sent_as_the_server_closed_a_pooled_connection_is_sent_again() -> None:
    done = [(1 * MS, chat_event("x", finish="stop")), (2 * MS, b"data: [DONE]")]
    network = ScriptedNetwork(Reply.sse(done), Reply.hang_up(), Reply.sse(done))
    client = StreamingClient(ClientConfig(base_url="http://s.test/v1"), 0, network, network.clock)
    records = [RequestRecord(request_id=i, query_id="q", dataset="d", prompt="p") for i in range(2)]
    for record in records:
        await client.send(record, b"{}")
    await client.aclose()
    assert [r.status for r in records] == [Status.OK, Status.OK]
    assert [r.reconnects for r in records] == [0, 1]
    assert network.opened == 2 and len(network.requests) == 3


async def test_a_hang_up_after_the_request_could_have_run_is_an_outcome() -> None:
    done = [(1 * MS, chat_event("x", finish="stop")), (2 * MS, b"data: [DONE]")]
    late = Reply.hang_up(at_ns=200 * MS)  # long enough for a server to have run it
    network = ScriptedNetwork(Reply.sse(done), late, Reply.sse(done))
    client = StreamingClient(ClientConfig(base_url="http://s.test/v1"), 0, network, network.clock)
    records = [RequestRecord(request_id=i, query_id="q", dataset="d", prompt="p") for i in range(2)]
    for record in records:
        await client.send(record, b"{}")
    await client.aclose()
    assert records[1].status is Status.ERROR and records[1].error_type is ErrorType.DISCONNECT
    assert records[1].reconnects == 0 and "without a response" in (records[1].error_message or "")


async def test_a_refused_connection_is_a_connect_error() -> None:
    network = ScriptedNetwork(refuse=True)
    client = StreamingClient(ClientConfig(base_url="http://s.test/v1"), 0, network, network.clock)
    record = RequestRecord(request_id=0, query_id="q", dataset="d", prompt="p")
    await client.send(record, b"{}")
    assert record.error_type is ErrorType.CONNECT and "Connection refused" in (record.error_message or "")


async def test_the_request_carries_the_key_and_id_but_the_record_never_the_key() -> None:
    network = ScriptedNetwork(Reply.sse([(1 * MS, chat_event("x", finish="stop"))]))
    config = ClientConfig(base_url="http://s.test/v1", api_key="sk-secret-123")
    client = StreamingClient(config, 0, network, network.clock)
    record = RequestRecord(request_id=7, query_id="q", dataset="d", prompt="p")
    await client.send(record, b'{"model": "m"}')
    head, _, body = network.requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nhost: s.test\r\n")
    assert b"authorization: Bearer sk-secret-123" in head and b"x-ipw-request-id: 7" in head
    assert body == b'{"model": "m"}' and b"content-length: 14" in head
    assert "sk-secret" not in json.dumps(record_row(record), default=str)


async def _send(base_url: str, query: Query, request_id: int = 0, **client: object) -> RequestRecord:
    t0 = now_ns()
    c = StreamingClient(ClientConfig(base_url=base_url, max_connections=4, **client), t0)  # type: ignore[arg-type]
    try:
        record = RequestRecord(request_id=request_id, query_id=query.id, dataset="t", prompt=query.prompt)
        await c.send(
            record, BodyDefaults("sim-small").encode(prompt_fields(query.prompt, True), query.max_tokens)
        )
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
    await c.send(record, BodyDefaults("no-such-model").encode(prompt_fields("x", True)))
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


async def test_a_base_url_query_is_sent_after_the_path_and_never_shown() -> None:
    network = ScriptedNetwork(Reply.sse([(1 * MS, chat_event("x", finish="stop"))]))
    config = ClientConfig(base_url="http://s.test/openai/v1/?api-version=2024-06&api-key=sk-q-789")
    client = StreamingClient(config, 0, network, network.clock)
    record = RequestRecord(request_id=0, query_id="q", dataset="d", prompt="p")
    await client.send(record, b"{}")
    await client.aclose()
    assert network.requests[0].startswith(
        b"POST /openai/v1/chat/completions?api-version=2024-06&api-key=sk-q-789 HTTP/1.1\r\n"
    )
    assert repr(config) == (
        "ClientConfig(base_url='http://s.test/openai/v1/?api-version=2024-06&api-key=***', endpoint='chat')"
    )
    assert "sk-q-789" not in repr(ClientConfig(base_url="http://me:sk-q-789@s.test/v1"))


async def test_list_models_takes_a_query_and_its_errors_never_show_a_secret(sim: SimulatorProcess) -> None:
    assert await list_models(f"{sim.base_url}?api-key=sk-q-789", None) == ["sim-small"]
    with pytest.raises(ServerUnreachable) as refused:
        await list_models("http://127.0.0.1:9/v1?token=sk-q-789", None, timeout=2)
    with pytest.raises(ServerUnreachable) as invalid:
        await list_models("localhost:8000/v1?token=sk-q-789", None)
    assert "http://127.0.0.1:9/v1?token=***" in str(refused.value)
    assert "sk-q-789" not in str(refused.value) + str(invalid.value)
