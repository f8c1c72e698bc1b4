"""The APIs agents use beside chat: OpenAI's Responses (/responses) and Anthropic's Messages
(/messages). Their event streams read into the same record fields as chat's, with events split
across reads and usage only at the end; each API's request body; a run over each against the
simulator; and Anthropic's own client measured through the recording proxy."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import polars as pl
import pytest
from aiohttp import web

from ipw_async import run_benchmark
from ipw_async.client import (
    ClientConfig,
    EventStream,
    MessagesParser,
    ResponsesParser,
    ServerUnreachable,
    StreamingClient,
    StreamParser,
    list_models,
)
from ipw_async.harness import RunConfig
from ipw_async.harness.send_options import parse_params
from ipw_async.proxy.call import read_call
from ipw_async.records import ErrorType, RequestRecord, Status
from ipw_async.sim import SimConfig
from ipw_async.sim.server import SimServer
from ipw_async.transport.scripted import Reply, ScriptedNetwork
from ipw_async.workload.body import BodyDefaults

from .conftest import fast_engine, quick_config

MS = 1_000_000


def _event(name: str, payload: dict[str, Any]) -> bytes:
    """One SSE event as both APIs send it: an ``event:`` line naming it, then its data."""
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()


def _read(parser: type[StreamParser], pieces: list[tuple[int, bytes]]) -> RequestRecord:
    """A record filled by ``parser`` from body bytes that arrived as ``pieces`` (time, bytes)."""
    record = RequestRecord(request_id=0, query_id="q", dataset="d", prompt="p")
    reader = parser(record)
    events = EventStream(reader, 0)
    for t, data in pieces:
        events.receive(t, data)
    events.end()
    reader.close()
    return record


def _cut(data: bytes, *marks: tuple[int, bytes]) -> list[tuple[int, bytes]]:
    """``data`` as reads: each mark (time, text) ends a read just after ``text`` (its first
    occurrence after the previous cut); the rest arrives with the last mark."""
    pieces, start = [], 0
    for t, text in marks:
        end = data.index(text, start) + len(text)
        pieces.append((t, data[start:end]))
        start = end
    pieces[-1] = (pieces[-1][0], pieces[-1][1] + data[start:])
    return pieces


# -- OpenAI Responses: the events of a reasoning model that answers and calls a function --------
_RESPONSE = {"id": "resp_1", "object": "response", "model": "gpt-4.1", "output": [], "usage": None}
RESPONSES_STREAM = b"".join(
    [
        _event("response.created", {"type": "response.created", "sequence_number": 0,
                                     "response": _RESPONSE | {"status": "in_progress"}}),
        _event("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                              "item": {"id": "rs_1", "type": "reasoning", "summary": []}}),
        _event("response.reasoning_summary_text.delta", {
            "type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0,
            "summary_index": 0, "delta": "Weather asked."}),
        _event("response.output_item.added", {
            "type": "response.output_item.added", "output_index": 1,
            "item": {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
        _event("response.output_text.delta", {"type": "response.output_text.delta", "item_id": "msg_1",
                                              "output_index": 1, "content_index": 0, "delta": "Let me check",
                                              "logprobs": []}),
        _event("response.output_text.delta", {"type": "response.output_text.delta", "item_id": "msg_1",
                                              "output_index": 1, "content_index": 0, "delta": " Paris.",
                                              "logprobs": []}),
        _event("response.output_item.added", {
            "type": "response.output_item.added", "output_index": 2,
            "item": {"id": "fc_1", "type": "function_call", "status": "in_progress", "arguments": "",
                     "call_id": "call_abc", "name": "get_weather"}}),
        _event("response.function_call_arguments.delta", {
            "type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 2,
            "delta": '{"location":'}),
        _event("response.function_call_arguments.delta", {
            "type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 2,
            "delta": '"Paris"}'}),
        _event("response.function_call_arguments.done", {
            "type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": 2,
            "arguments": '{"location":"Paris"}'}),
        _event("response.completed", {"type": "response.completed", "response": _RESPONSE | {
            "status": "completed", "incomplete_details": None,
            "usage": {"input_tokens": 37, "input_tokens_details": {"cached_tokens": 32}, "output_tokens": 11,
                      "output_tokens_details": {"reasoning_tokens": 4}, "total_tokens": 48}}}),
    ]
)  # fmt: skip


def test_a_responses_stream_split_across_reads_fills_the_record_as_chat_does() -> None:
    pieces = _cut(
        RESPONSES_STREAM,
        (1 * MS, b'"delta": "Wea'),  # the reasoning delta's event split mid-string
        (5 * MS, b'"delta": "Let me check"'),
        (9 * MS, b'"delta": "{\\"location\\":"}\n'),  # one LF of the blank line in this read
        (20 * MS, b'"output_tokens": 11'),  # the usage's event split: its end comes last
        (21 * MS, b""),
    )
    record = _read(ResponsesParser, pieces)
    assert record.status is Status.OK, record.error_message
    assert record.first_event_ns == 1 * MS
    assert record.first_token_ns == 5 * MS  # the reasoning delta; response.created is no token
    # reasoning, two text deltas, two argument deltas: one chunk each, at the read that ended it
    assert record.chunk_ns == [5 * MS, 9 * MS, 9 * MS, 20 * MS, 20 * MS]
    assert record.reasoning == "Weather asked." and record.answer == "Let me check Paris."
    assert record.tool_calls == [
        {"id": "call_abc", "name": "get_weather", "arguments": '{"location":"Paris"}'}
    ]
    assert record.finish_reason == "completed"
    assert (record.prompt_tokens, record.cached_prompt_tokens, record.output_tokens) == (37, 32, 11)
    assert record.output_tokens_source == "usage"


@pytest.mark.parametrize(
    ("last", "status", "finish", "error"),
    [
        # cut at max_output_tokens: a finished reply, as chat's "length"
        (_event("response.incomplete", {"type": "response.incomplete", "response": _RESPONSE | {
            "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
            "usage": {"input_tokens": 9, "output_tokens": 2}}}),
         Status.OK, "max_output_tokens", None),
        (_event("response.failed", {"type": "response.failed", "response": _RESPONSE | {
            "status": "failed", "error": {"code": "server_error", "message": "The model crashed."}}}),
         Status.ERROR, "failed", "The model crashed."),
        (_event("error", {"type": "error", "code": "rate_limit_exceeded", "message": "Slow down.", "param": None}),
         Status.ERROR, None, "Slow down."),
    ],
)  # fmt: skip
def test_a_response_cut_or_failed_mid_stream(
    last: bytes, status: Status, finish: str | None, error: str | None
) -> None:
    start = RESPONSES_STREAM[: RESPONSES_STREAM.index(b"event: response.output_item.added")]
    text = _event(
        "response.output_text.delta", {"type": "response.output_text.delta", "output_index": 0, "delta": "Hi"}
    )
    record = _read(ResponsesParser, [(1 * MS, start), (2 * MS, text), (3 * MS, last)])
    assert record.status is status and record.finish_reason == finish and record.answer == "Hi"
    if error is None:
        assert (record.prompt_tokens, record.output_tokens) == (9, 2)
    else:
        assert record.error_type is ErrorType.STREAM and record.error_message == error


# -- Anthropic Messages: thinking, text and a tool_use block, with cached prompt tokens -----------
MESSAGES_STREAM = b"".join(
    [
        _event("message_start", {"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "claude-sonnet-4-5",
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 25, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 2000,
                      "output_tokens": 1}}}),
        _event("content_block_start", {"type": "content_block_start", "index": 0,
                                       "content_block": {"type": "thinking", "thinking": ""}}),
        _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "thinking_delta", "thinking": "The user wants weather."}}),
        _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}}),
        _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _event("ping", {"type": "ping"}),
        _event("content_block_start", {"type": "content_block_start", "index": 1,
                                       "content_block": {"type": "text", "text": ""}}),
        _event("content_block_delta", {"type": "content_block_delta", "index": 1,
                                       "delta": {"type": "text_delta", "text": "Checking"}}),
        _event("content_block_delta", {"type": "content_block_delta", "index": 1,
                                       "delta": {"type": "text_delta", "text": " now."}}),
        _event("content_block_stop", {"type": "content_block_stop", "index": 1}),
        _event("content_block_start", {"type": "content_block_start", "index": 2, "content_block": {
            "type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {}}}),
        _event("content_block_delta", {"type": "content_block_delta", "index": 2,
                                       "delta": {"type": "input_json_delta", "partial_json": ""}}),
        _event("content_block_delta", {"type": "content_block_delta", "index": 2,
                                       "delta": {"type": "input_json_delta", "partial_json": '{"location": "Par'}}),
        _event("content_block_delta", {"type": "content_block_delta", "index": 2,
                                       "delta": {"type": "input_json_delta", "partial_json": 'is"}'}}),
        _event("content_block_stop", {"type": "content_block_stop", "index": 2}),
        _event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                                 "usage": {"output_tokens": 89}}),
        _event("message_stop", {"type": "message_stop"}),
    ]
)  # fmt: skip


def test_a_messages_stream_read_byte_by_byte_counts_cached_tokens_in_the_prompt() -> None:
    data = MESSAGES_STREAM.replace(b"\n", b"\r\n")  # CRLF line ends, each byte its own read
    record = _read(MessagesParser, [(i, data[i : i + 1]) for i in range(len(data))])
    assert record.status is Status.OK, record.error_message

    def ends(text: bytes) -> int:  # the read that completed the event holding ``text``
        return data.index(b"\r\n\r\n", data.index(text)) + 3

    assert record.first_token_ns == ends(b"thinking_delta")  # message_start and block starts are no tokens
    assert record.chunk_ns == [ends(b"thinking_delta"), ends(b'"Checking"'), ends(b'" now."'),
                               ends(b"Par"), ends(b'is\\"}')]  # fmt: skip
    assert record.reasoning == "The user wants weather." and record.answer == "Checking now."
    assert record.tool_calls == [
        {"id": "toolu_01", "name": "get_weather", "arguments": '{"location": "Paris"}'}
    ]
    assert record.finish_reason == "tool_use"
    # Anthropic's input_tokens leaves out the cache: the prompt is all three, the cache read is cached
    assert (record.prompt_tokens, record.cached_prompt_tokens) == (25 + 100 + 2000, 2000)
    assert (
        record.output_tokens == 89 and record.output_tokens_source == "usage"
    )  # message_delta's, not message_start's 1


def test_a_messages_error_event_fails_the_record_and_a_stream_without_message_stop_is_cut() -> None:
    start = MESSAGES_STREAM[: MESSAGES_STREAM.index(b"event: content_block_stop")]
    overloaded = _event(
        "error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )
    record = _read(MessagesParser, [(1 * MS, start), (2 * MS, overloaded)])
    assert record.status is Status.ERROR and record.error_type is ErrorType.STREAM
    assert record.error_message == "Overloaded" and record.reasoning == "The user wants weather."
    cut = _read(MessagesParser, [(1 * MS, start)])
    assert cut.error_type is ErrorType.DISCONNECT and cut.first_token_ns == 1 * MS


def test_a_message_delta_that_leaves_counts_out_keeps_message_starts() -> None:
    # a server that sends the cumulative input count at the end, but not the cache counts
    final = b'"usage": {"output_tokens": 89}'
    assert final in MESSAGES_STREAM
    data = MESSAGES_STREAM.replace(
        final, b'"usage": {"input_tokens": 25, "cache_read_input_tokens": null, "output_tokens": 90}'
    )
    record = _read(MessagesParser, [(1 * MS, data)])
    assert (record.prompt_tokens, record.cached_prompt_tokens) == (25 + 100 + 2000, 2000)
    assert record.output_tokens == 90


@pytest.mark.parametrize(
    ("parser", "data", "said"),
    [
        (ResponsesParser, b'data: {"type": "response.output_text.delta", "output_index": "first"}\n\n',
         "event does not have the OpenAI Responses shape"),
        (MessagesParser, b'data: {"type": "content_block_delta", "delta": {"text": 7}}\n\n',
         "event does not have the Anthropic Messages shape"),
        (MessagesParser, b'event: message_start\ndata: {"type": "message_st\n\n', "event is not JSON"),
    ],
)  # fmt: skip
def test_an_event_of_the_wrong_shape_fails_the_record_naming_its_api(
    parser: type[StreamParser], data: bytes, said: str
) -> None:
    record = _read(parser, [(1 * MS, data)])
    assert record.error_type is ErrorType.MALFORMED and record.error_message.startswith(said)


def test_a_responses_event_it_does_not_read_never_fails_the_record() -> None:
    # an event kind this parser skips, whose delta is an object rather than text
    kind = "response.mcp_call_arguments.delta"
    other = _event(kind, {"type": kind, "output_index": 1, "delta": {"key": "iron"}})
    end = RESPONSES_STREAM.index(b"event: response.completed")
    record = _read(ResponsesParser, [(1 * MS, RESPONSES_STREAM[:end] + other + RESPONSES_STREAM[end:])])
    assert record.status is Status.OK, record.error_message
    assert record.answer == "Let me check Paris." and record.output_tokens == 11


async def test_a_messages_call_sends_anthropics_headers_and_keeps_an_http_400s_message() -> None:
    refusal = (
        b'{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}'
    )
    network = ScriptedNetwork(Reply.body(400, refusal))
    config = ClientConfig(base_url="http://s.test/v1", endpoint="messages", api_key="sk-ant-secret")
    client = StreamingClient(config, 0, network, network.clock)
    record = RequestRecord(request_id=0, query_id="q", dataset="d", prompt="p")
    await client.send(record, b"{}")
    await client.aclose()
    head = network.requests[0].partition(b"\r\n\r\n")[0]
    assert head.startswith(b"POST /v1/messages HTTP/1.1\r\n")
    assert b"x-api-key: sk-ant-secret\r\n" in head and b"anthropic-version: 2023-06-01\r\n" in head
    assert b"authorization" not in head.lower()  # the key goes once, where Anthropic reads it
    assert record.error_type is ErrorType.HTTP and record.http_status == 400
    assert record.error_message == "HTTP 400: max_tokens: Field required"


def test_each_api_gets_its_own_body_and_params_go_over_everything() -> None:
    fields = {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "stop": ["\nObservation:"],
    }

    def body(endpoint: str) -> dict[str, Any]:
        defaults = BodyDefaults("m", 64, 0.0, {"temperature": 0.7}, endpoint)
        return json.loads(defaults.encode(fields))

    assert body("responses") == {
        "model": "m", "stream": True, "store": False, "max_output_tokens": 64, "temperature": 0.7,
        "instructions": "Be brief.", "input": [{"role": "user", "content": "Hi"}],
    }  # fmt: skip
    assert body("messages") == {
        "model": "m", "stream": True, "max_tokens": 64, "temperature": 0.7, "system": "Be brief.",
        "messages": [{"role": "user", "content": "Hi"}], "stop_sequences": ["\nObservation:"],
    }  # fmt: skip
    assert (
        body("chat")["stream_options"] == {"include_usage": True} and body("chat")["stop"] == fields["stop"]
    )


def test_a_responses_body_asks_not_to_be_stored_unless_a_param_says_so() -> None:
    def stored(params: list[str]) -> object:
        defaults = BodyDefaults("m", 8, params=parse_params(params), endpoint="responses")
        return json.loads(defaults.encode({"messages": [{"role": "user", "content": "Hi"}]}))["store"]

    assert stored([]) is False and stored(["store=true"]) is True
    assert "store" not in json.loads(BodyDefaults("m", 8).encode({"prompt": "Hi"}))  # OpenAI stores chat only when asked


def test_a_tool_calling_turn_is_written_in_each_apis_words() -> None:
    lookup = {"name": "lookup", "description": "Look a fact up.", "parameters": {"type": "object"}}
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"key": "iron"}'},
    }
    fields = {
        "messages": [
            {"role": "system", "content": "Use the tools."},
            {"role": "user", "content": "Atomic number of iron?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "26"},
        ],
        "tools": [{"type": "function", "function": lookup}],
    }

    def body(endpoint: str) -> dict[str, Any]:
        return json.loads(BodyDefaults("m", 64, None, endpoint=endpoint).encode(fields))

    assert body("responses")["instructions"] == "Use the tools."
    assert body("responses")["input"] == [
        {"role": "user", "content": "Atomic number of iron?"},
        {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"key": "iron"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "26"},
    ]
    # strict: Responses' default is to enforce the schema, chat's is not to
    assert body("responses")["tools"] == [{"type": "function", "strict": False} | lookup]
    messages = body("messages")
    assert messages["system"] == "Use the tools." and messages["messages"] == [
        {"role": "user", "content": "Atomic number of iron?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "lookup", "input": {"key": "iron"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "26"}]},
    ]  # fmt: skip
    assert messages["tools"] == [
        {"name": "lookup", "input_schema": {"type": "object"}, "description": "Look a fact up."}
    ]


def test_an_empty_answer_in_a_history_is_left_out_of_a_messages_body() -> None:
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": ""},  # a reply cut while it reasoned
        {"role": "user", "content": "Still there?"},
    ]
    body = json.loads(BodyDefaults("m", 8, endpoint="messages").encode({"messages": history}))
    assert body["messages"] == [history[0], history[2]]


# -- the simulator and real runs ------------------------------------------------------------------
@asynccontextmanager
async def _serving(app: web.Application) -> AsyncIterator[str]:
    """``app`` served on a loopback port while the block runs: its root URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("endpoint", "sent"),
    [
        ("messages", {"x-api-key": "sk-ant-1", "anthropic-version": "2023-06-01", "authorization": None}),
        ("chat", {"x-api-key": None, "anthropic-version": None, "authorization": "Bearer sk-ant-1"}),
    ],
)
async def test_list_models_asks_with_the_key_as_the_endpoints_api_sends_it(
    endpoint: str, sent: dict[str, str | None]
) -> None:
    seen: list[dict[str, str | None]] = []

    async def models(request: web.Request) -> web.Response:
        seen.append({name: request.headers.get(name) for name in sent})
        return web.json_response({"data": [{"id": "claude-x", "type": "model"}], "has_more": False})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    async with _serving(app) as root:
        assert await list_models(f"{root}/v1", "sk-ant-1", endpoint=endpoint) == ["claude-x"]
    assert seen == [sent]


@pytest.mark.parametrize(
    ("endpoint", "says"), [("messages", "ANTHROPIC_API_KEY"), ("chat", "OPENAI_API_KEY")]
)
async def test_a_refused_key_names_the_variable_the_endpoints_api_reads(endpoint: str, says: str) -> None:
    async def refuse(_: web.Request) -> web.Response:
        return web.json_response({"error": "bad key"}, status=401)

    app = web.Application()
    app.router.add_get("/v1/models", refuse)
    async with _serving(app) as root:
        with pytest.raises(ServerUnreachable, match=f"set --api-key or {says}"):
            await list_models(f"{root}/v1", "sk-wrong", endpoint=endpoint)


async def test_the_simulator_reports_cached_tokens_each_apis_way_and_resets_its_cache() -> None:
    server = SimServer(SimConfig(engine=fast_engine(prefix_cache=True), output_median=8))
    system = "You answer questions about geography, briefly and exactly. " * 8
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Capital of Peru?"}]
    async with _serving(server.app) as root, httpx.AsyncClient(timeout=10) as http:

        async def usage(endpoint: str) -> dict[str, Any]:
            body = json.loads(
                BodyDefaults("sim-small", 8, endpoint=endpoint).encode({"messages": messages})
            )
            reply = await http.post(f"{root}/v1/{endpoint}", json=body | {"stream": False})
            assert reply.status_code == 200, reply.text
            return reply.json()["usage"]

        first, again = await usage("messages"), await usage("messages")
        assert first["cache_read_input_tokens"] == 0
        assert again["cache_read_input_tokens"] > 0
        assert again["input_tokens"] + again["cache_read_input_tokens"] == first["input_tokens"]
        assert (await usage("responses"))["input_tokens_details"]["cached_tokens"] > 0
        reset = await http.post(f"{root}/reset_prefix_cache")
        assert reset.status_code == 200 and reset.json()["reset"] is True
        assert (await usage("responses"))["input_tokens_details"]["cached_tokens"] == 0
        # Anthropic's API has no default max_tokens, and neither has the simulator's
        unbounded = await http.post(f"{root}/v1/messages", json={"model": "sim-small", "messages": messages})
        assert unbounded.status_code == 400
        refusal = {"type": "invalid_request_error", "message": "max_tokens: Field required"}
        assert unbounded.json()["error"] == refusal


@pytest.mark.parametrize(("endpoint", "finished"), [("responses", "completed"), ("messages", "end_turn")])
async def test_a_run_over_each_api_records_ttft_tokens_and_cached_tokens(
    tmp_path: Path, endpoint: str, finished: str
) -> None:
    # the built-in QA prompts share a few-shot preamble: a prefix-caching server skips it
    config = quick_config(
        tmp_path,
        endpoint=endpoint,
        concurrency=4,
        sim=SimConfig(engine=fast_engine(prefix_cache=True), output_median=16),
    )
    result = await run_benchmark(config)
    frame = result.records.sort("request_id")
    assert (frame["status"] == "ok").all(), frame["error_message"].drop_nulls().to_list()
    assert (frame["finish_reason"] == finished).all()  # read as the API words it
    assert frame["ttft_s"].null_count() == 0 and (frame["ttft_s"] > 0).all()
    assert (frame["output_tokens_source"] == "usage").all() and (frame["output_tokens"] > 0).all()
    cached = frame["cached_prompt_tokens"].to_list()
    prompts = frame["prompt_tokens"].to_list()
    assert cached[0] == 0 and all(0 < c < p for c, p in zip(cached[4:], prompts[4:], strict=True))
    assert frame["correct"].mean() > 0.5  # the answer text was read whole, and scored
    assert abs(result.summary["energy"]["meters"]["sim"]["conservation_error"]) < 1e-9


@pytest.mark.parametrize(
    "last",
    [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "26"}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "26"}]}]},
        {"type": "function_call_output", "call_id": "call_1", "output": "26"},
    ],
)  # fmt: skip
def test_the_proxy_records_a_tool_results_text_as_the_calls_prompt(last: dict[str, Any]) -> None:
    field = "input" if "call_id" in last else "messages"
    assert read_call(json.dumps({field: [last]}).encode(), ask_usage=False).prompt() == "26"


# -- Anthropic's own client through the recording proxy --------------------------------------------
async def test_anthropics_client_through_the_proxy_is_measured(tmp_path: Path) -> None:
    from ipw_async.proxy import run_proxy

    config = RunConfig(
        output_dir=tmp_path / "run",
        baseline_s=0.2,
        tail_s=0.2,
        duration=60,
        sim=SimConfig(engine=fast_engine(prefix_cache=True), output_median=16),
    )
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    run = asyncio.create_task(run_proxy(config, port=0, ready=ready.set_result))
    await asyncio.wait({run, ready}, return_when=asyncio.FIRST_COMPLETED)
    # Anthropic's SDK adds /v1 itself
    client = anthropic.AsyncAnthropic(
        base_url=ready.result().removesuffix("/v1"), api_key="sk-test", max_retries=0
    )
    system = "You are a terse assistant who knows geography well. " * 6
    ask = [{"role": "user", "content": "What is the capital of France?"}]
    finals = []
    for _ in range(2):  # the second finds the system prompt in the prefix cache
        async with client.messages.stream(
            model="sim-small", max_tokens=64, system=system, messages=ask
        ) as stream:
            finals.append(await stream.get_final_message())
    tool = {"name": "lookup", "description": "Look a fact up.",
            "input_schema": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}  # fmt: skip
    whole = await client.messages.create(model="sim-small", max_tokens=64, tools=[tool], messages=ask)
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.create(model="no-such-model", max_tokens=8, messages=ask)
    await client.close()
    run.cancel()
    await run

    records = pl.read_ipc_stream(tmp_path / "run" / "records.arrow").sort("request_id").to_dicts()
    assert len(records) == 4
    for record, final in zip(records, finals, strict=False):
        usage = final.usage
        assert record["status"] == "ok" and record["ttft_s"] is not None and record["ttft_s"] > 0
        assert record["answer"] == final.content[0].text and record["finish_reason"] == final.stop_reason
        assert record["output_tokens"] == usage.output_tokens
        assert record["prompt_tokens"] == usage.input_tokens + (usage.cache_read_input_tokens or 0)
        assert record["cached_prompt_tokens"] == usage.cache_read_input_tokens
    assert records[0]["cached_prompt_tokens"] == 0 and records[1]["cached_prompt_tokens"] > 0
    assert records[0]["prompt"] == "What is the capital of France?"  # the call's last user turn
    called = records[2]
    assert whole.stop_reason == "tool_use" and called["ttft_s"] is None  # a whole reply has no first token
    assert [c["name"] for c in called["tool_calls"]] == ["lookup"] and called[
        "output_tokens"
    ] == whole.usage.output_tokens
    failed = records[3]
    assert failed["error_type"] == "http_error" and "no-such-model" in failed["error_message"]
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert b"sk-test" not in path.read_bytes(), path


@pytest.mark.parametrize(("endpoint", "called"), [("responses", "completed"), ("messages", "tool_use")])
async def test_agentic_tool_calling_runs_over_each_api(tmp_path: Path, endpoint: str, called: str) -> None:
    result = await run_benchmark(quick_config(tmp_path, workload="agentic", endpoint=endpoint, max_queries=6))
    records = result.records
    assert (records["status"] == "ok").all(), records["error_message"].drop_nulls().to_list()
    # the model called tools, streamed in the API's events, and the tasks went on from their results
    assert records.filter(pl.col("tool_calls").list.len() > 0)["finish_reason"].unique().to_list() == [called]
    tasks = [json.loads(line) for line in (result.run_dir / "tasks.jsonl").read_text().splitlines()]
    assert len(tasks) == 6 and all(t["outcome"] == "answered" and len(t["turns"]) >= 2 for t in tasks)
