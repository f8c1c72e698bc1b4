"""The simulator as an agent for any tools a request offers, and as an LLM judge: real HTTP
against a simulator process, arguments checked against their tools' JSON schemas."""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from ipw_async.judging import JUDGE_PROMPT, verdict
from ipw_async.sim import SimConfig, SimulatorProcess
from ipw_async.sim.agent import MAX_CALLS, Agent
from ipw_async.sim.toolargs import example_arguments
from ipw_async.workload.tasks import builtin_tasks
from ipw_async.workload.tools import BUILTIN_TOOLS

from .conftest import fast_engine

SEED = 7


def _config(seed: int = SEED) -> SimConfig:
    return SimConfig(engine=fast_engine(zero_delay=True), seed=seed)


@pytest.fixture(scope="module")
def agent_sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(_config()) as process:
        yield process


# -- a small JSON-schema validator: what the tests hold the generated arguments to ------------


_TYPES: dict[str, Callable[[object], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _violations(value: Any, schema: Any, root: dict[str, Any]) -> list[str]:
    """What in ``value`` breaks ``schema`` (the keywords the tests' schemas use); [] when valid."""
    if schema is True or schema == {}:
        return []
    if "$ref" in schema:
        node: Any = root
        for part in filter(None, schema["$ref"][1:].split("/")):
            node = node[part]
        return _violations(value, node, root)
    errors: list[str] = []
    kinds = schema.get("type")
    if kinds is not None and not any(
        _TYPES[k](value) for k in ([kinds] if isinstance(kinds, str) else kinds)
    ):
        return [f"{value!r} is not {kinds}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{value!r} not in {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{value!r} != {schema['const']!r}")
    for sub in schema.get("allOf", []):
        errors += _violations(value, sub, root)
    if "anyOf" in schema and all(_violations(value, s, root) for s in schema["anyOf"]):
        errors.append(f"{value!r} matches no anyOf branch")
    if "oneOf" in schema and sum(not _violations(value, s, root) for s in schema["oneOf"]) != 1:
        errors.append(f"{value!r} does not match exactly one oneOf branch")
    if isinstance(value, dict):
        errors += [f"missing {name!r}" for name in schema.get("required", []) if name not in value]
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                errors += _violations(value[name], sub, root)
        if schema.get("additionalProperties") is False:
            errors += [f"extra {k!r}" for k in value if k not in schema.get("properties", {})]
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", math.inf):
            errors.append(f"{len(value)} items")
        if schema.get("uniqueItems") and len({json.dumps(v) for v in value}) < len(value):
            errors.append("repeated items")
        for item in value:
            errors += _violations(item, schema.get("items", True), root)
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{value!r} does not match {schema['pattern']}")
    if isinstance(value, str) and not schema.get("minLength", 0) <= len(value) <= schema.get(
        "maxLength", math.inf
    ):
        errors.append(f"{value!r} has length {len(value)}")
    if _TYPES["number"](value):
        bounds = [
            ("minimum", lambda b: value >= b),
            ("maximum", lambda b: value <= b),
            ("exclusiveMinimum", lambda b: value > b),
            ("exclusiveMaximum", lambda b: value < b),
        ]
        errors += [f"{value} breaks {k} {schema[k]}" for k, ok in bounds if k in schema and not ok(schema[k])]
        if "multipleOf" in schema and not (value / schema["multipleOf"]).is_integer():
            errors.append(f"{value} is not a multiple of {schema['multipleOf']}")
    return errors


def test_the_validator_catches_what_it_checks() -> None:
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer", "maximum": 3}}}
    assert _violations({"n": 2}, schema, schema) == []
    assert _violations({}, schema, schema) == ["missing 'n'"]
    assert _violations({"n": 4}, schema, schema) and _violations({"n": "2"}, schema, schema)


# -- tools with the shapes real tool specs have ----------------------------------------------

WEATHER = {
    "type": "object",
    "properties": {
        "location": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2, "maxLength": 40},
                "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "fields": {
            "type": "array",
            "items": {"type": "string", "enum": ["wind", "rain", "sun"]},
            "minItems": 2,
        },
        "hourly": {"type": "boolean"},
    },
    "required": ["location", "unit", "days", "fields"],
    "additionalProperties": False,
}
# as pydantic writes a model: $defs, $ref, Optional as anyOf with null, a const, a oneOf
SEARCH = {
    "$defs": {
        "Filter": {
            "type": "object",
            "properties": {"field": {"type": "string"}, "value": {"type": "number", "exclusiveMinimum": 0}},
            "required": ["field", "value"],
        }
    },
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 3},
        "filters": {"type": "array", "items": {"$ref": "#/$defs/Filter"}, "minItems": 1, "maxItems": 2},
        "page": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}], "default": None},
        "version": {"const": "v2"},
        "sort": {
            "oneOf": [{"type": "string", "enum": ["asc", "desc"]}, {"type": "integer", "multipleOf": 5}]
        },
        "score": {"type": "number", "minimum": 0.5, "exclusiveMaximum": 1},
    },
    "required": ["query", "filters", "version", "sort", "score"],
}
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH, "now": NO_ARGUMENTS}
TOOLS = [
    {"type": "function", "function": {"name": name, "description": f"The {name} tool.", "parameters": schema}}
    for name, schema in SCHEMAS.items()
]
QUESTIONS = [
    "What will the weather be in Lisbon this weekend?",
    "Find recent papers about sparse attention.",
    "How many moons does Jupiter have?",
    "Which train leaves Zurich for Milan first tomorrow?",
    "Summarise the news about the Rhine water level.",
    "When does the pharmacy on Elm Street open?",
]


def _result(name: str, turn: int) -> str:
    return f"{name} says {turn}\nsecond line the answer must not include"


def _send(base_url: str, body: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """One chat request, streamed or not: its tool call (id, name, arguments) or None, and its text."""
    body = {"model": "sim-small", **body}
    if not body.get("stream"):
        response = httpx.post(f"{base_url}/chat/completions", json=body, timeout=30)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        message = choice["message"]
        calls = message.get("tool_calls") or []
        assert choice["finish_reason"] == ("tool_calls" if calls else "stop")
        assert len(calls) <= 1
        call = {"id": calls[0]["id"], **calls[0]["function"]} if calls else None
        return call, message["content"] or ""
    text, call, finish = "", None, None
    with httpx.stream("POST", f"{base_url}/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            finish = choice["finish_reason"] or finish
            delta = choice["delta"]
            text += delta.get("content") or ""
            for piece in delta.get("tool_calls") or []:
                if "id" in piece:
                    call = {"id": piece["id"], "name": piece["function"]["name"], "arguments": ""}
                assert call is not None, "arguments streamed before the call was named"
                call["arguments"] += piece["function"]["arguments"]
    assert finish == ("tool_calls" if call else "stop")
    return call, text


def _converse(
    base_url: str, question: str, tools: list[Any], stream: bool = False
) -> tuple[list[dict[str, Any]], str]:
    """A task to its answer, as an agent loop runs it: each tool call answered by ``_result``."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You solve tasks with tools."},
        {"role": "user", "content": question},
    ]
    calls: list[dict[str, Any]] = []
    for turn in range(MAX_CALLS + 2):
        call, text = _send(base_url, {"messages": messages, "tools": tools, "stream": stream})
        if call is None:
            return calls, text
        calls.append(call)
        function = {"name": call["name"], "arguments": call["arguments"]}
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call["id"], "type": "function", "function": function}],
            },
            {"role": "tool", "tool_call_id": call["id"], "content": _result(call["name"], turn)},
        ]
    raise AssertionError(f"no answer after {len(calls)} calls")


@pytest.mark.parametrize("stream", [False, True])
def test_an_agent_calls_offered_tools_to_their_schemas_then_answers(
    agent_sim: SimulatorProcess, stream: bool
) -> None:
    counts, used = [], set()
    for question in QUESTIONS:
        calls, answer = _converse(agent_sim.base_url, question, TOOLS, stream)
        counts.append(len(calls))
        assert [c["id"] for c in calls] == [f"call_{i}" for i in range(len(calls))]
        for call in calls:
            used.add(call["name"])
            schema = SCHEMAS[call["name"]]
            arguments = json.loads(call["arguments"])
            assert _violations(arguments, schema, schema) == [], (call, question)
        last = len(calls) - 1
        assert answer.strip() == f"The answer is {calls[-1]['name']} says {last}."
    assert all(1 <= n <= MAX_CALLS for n in counts) and len(set(counts)) > 1  # seeded, not fixed
    assert used == set(SCHEMAS)


def test_the_same_seed_makes_the_same_calls(agent_sim: SimulatorProcess) -> None:
    question = QUESTIONS[0]
    first = _converse(agent_sim.base_url, question, TOOLS)
    assert _converse(agent_sim.base_url, question, TOOLS, stream=True) == first
    with SimulatorProcess(_config()) as again:
        assert _converse(again.base_url, question, TOOLS) == first
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": question}]}], "tools": TOOLS}
    assert _send(agent_sim.base_url, parts)[0] == first[0][0]  # content parts read as their text
    plans = {tuple(Agent(seed, 1.0, []).planned_calls(q) for q in QUESTIONS) for seed in range(4)}
    assert len(plans) > 1  # other seeds, other plans


def test_tool_choice_is_respected(agent_sim: SimulatorProcess) -> None:
    question = QUESTIONS[1]
    call, text = _send(agent_sim.base_url, _ask(question, tool_choice="none"))
    assert call is None and text.strip() == "The answer is unknown."
    for name in SCHEMAS:
        named = {"type": "function", "function": {"name": name}}
        call, _ = _send(agent_sim.base_url, _ask(question, tool_choice=named))
        assert call is not None and call["name"] == name
        assert _violations(json.loads(call["arguments"]), SCHEMAS[name], SCHEMAS[name]) == []
    # past its planned calls a model answers, unless a call is required
    done, _ = _converse(agent_sim.base_url, question, TOOLS)
    history = _ask(question)["messages"] + [{"role": "tool", "content": "ok"}] * len(done)
    assert _send(agent_sim.base_url, {"messages": history, "tools": TOOLS})[0] is None
    for choice in ("required", {"type": "function", "function": {"name": "now"}}):
        forced, _ = _send(agent_sim.base_url, {"messages": history, "tools": TOOLS, "tool_choice": choice})
        assert forced is not None and forced["id"] == f"call_{len(done)}"
    # a tool it was not offered is called all the same, with nothing to fill its arguments to
    absent = {"type": "function", "function": {"name": "absent"}}
    call, _ = _send(agent_sim.base_url, _ask(question, tool_choice=absent))
    assert call is not None and call["name"] == "absent" and call["arguments"] == "{}"


def _ask(question: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": question}], "tools": TOOLS, **extra}


def test_an_error_result_is_answered_as_unknown(agent_sim: SimulatorProcess) -> None:
    question = QUESTIONS[2]
    planned = Agent(SEED, 1.0, []).planned_calls(question)
    history = [{"role": "user", "content": question}] + [
        {"role": "tool", "content": "error: no such city"}
    ] * planned
    call, text = _send(agent_sim.base_url, {"messages": history, "tools": TOOLS})
    assert call is None and text.strip() == "The answer is unknown."


MALFORMED: list[Any] = [
    None,
    "not a schema",
    [],
    {},
    {"type": "object", "properties": "nonsense"},
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}},
        "required": ["n"],
    },
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 10**9}}, "required": ["s"]},
    {"type": "object", "properties": {"e": {"enum": []}}, "required": ["e"]},
    {"type": "object", "properties": {"x": {"type": "array", "minItems": "two"}}, "required": ["x"]},
]


@pytest.mark.parametrize("schema", MALFORMED)
def test_a_malformed_schema_is_called_with_no_arguments(agent_sim: SimulatorProcess, schema: Any) -> None:
    function: dict[str, Any] = {"name": "broken"} | ({} if schema is None else {"parameters": schema})
    junk = ["junk", {"type": "function"}, {"type": "function", "function": {"name": ""}}]
    tools = [*junk, {"type": "function", "function": function}]
    for stream in (False, True):
        call, _ = _send(agent_sim.base_url, _ask(QUESTIONS[3], tools=tools, stream=stream))
        assert call is not None and call["name"] == "broken" and json.loads(call["arguments"]) == {}


def test_only_unusable_tools_get_a_plain_answer(agent_sim: SimulatorProcess) -> None:
    call, text = _send(agent_sim.base_url, _ask(QUESTIONS[3], tools=[{"type": "function", "function": {}}]))
    assert call is None and text.strip() == "The answer is unknown."


def _one_string(name: str) -> dict[str, Any]:
    return {"type": "object", "properties": {name: {"type": "string"}}, "required": [name]}


def test_builtin_tasks_keep_their_plans(agent_sim: SimulatorProcess) -> None:
    tools = [
        {"type": "function", "function": {"name": t.name, "parameters": _one_string(t.parameter)}}
        for t in BUILTIN_TOOLS.values()
    ]
    for task in builtin_tasks()[:6]:
        step = task.plan[0]
        call, _ = _send(agent_sim.base_url, _ask(task.question, tools=tools))
        assert call is not None and call["name"] == step.tool
        assert json.loads(call["arguments"]) == {BUILTIN_TOOLS[step.tool].parameter: step.argument([])}


# -- the judge ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reference", "answer", "correct"),
    [
        ("42", "The answer is 42.", True),
        ("42", "The answer is 41.", False),
        ("1,234", "It comes to 1234", True),
        ("Paris", "I believe it is Paris.", True),
        ("Paris", "The answer is Lyon.", False),
        ("Mount Everest", "the answer is\nmount everest, at 8849 m", True),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_the_judge_grades_against_the_reference(
    agent_sim: SimulatorProcess, reference: str, answer: str, correct: bool, stream: bool
) -> None:
    prompt = JUDGE_PROMPT.format(question="Some question?", reference=reference, answer=answer)
    messages = [
        {"role": "system", "content": "You are a careful grader."},
        {"role": "user", "content": prompt},
    ]
    call, text = _send(agent_sim.base_url, {"messages": messages, "stream": stream})
    assert call is None and text.strip() == ("CORRECT" if correct else "INCORRECT")
    assert verdict(text) is correct


def test_a_judge_prompt_it_cannot_read_is_incorrect(agent_sim: SimulatorProcess) -> None:
    garbled = JUDGE_PROMPT.split("\n", 1)[0] + "\nsomething else entirely"
    call, text = _send(agent_sim.base_url, {"messages": [{"role": "user", "content": garbled}]})
    assert call is None and text.strip() == "INCORRECT"


# -- the argument generator on its own: many seeds, edge cases -------------------------------

EDGES: list[dict[str, Any]] = [
    WEATHER,
    SEARCH,
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 5}},
        "required": ["n"],
    },
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "multipleOf": 7, "minimum": 10, "maximum": 20}},
        "required": ["n"],
    },
    {
        "type": "object",
        "properties": {"x": {"type": "number", "minimum": 2, "maximum": 2}},
        "required": ["x"],
    },
    {
        "type": "object",
        "properties": {"x": {"type": ["null", "number"], "exclusiveMinimum": 0.1, "maximum": 0.11}},
        "required": ["x"],
    },
    {
        "type": "object",
        "properties": {"s": {"type": "string", "minLength": 50, "maxLength": 50}},
        "required": ["s"],
    },
    {"type": "object", "properties": {"s": {"type": "string", "maxLength": 0}}, "required": ["s"]},
    {
        "type": "object",
        "properties": {
            "t": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2, "uniqueItems": True}
        },
        "required": ["t"],
    },
    {"type": "object", "properties": {"t": {"type": "array", "maxItems": 0}}, "required": ["t"]},
    {
        "allOf": [
            {"properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"properties": {"b": {"type": "boolean"}}, "required": ["b"]},
        ]
    },
    {
        "type": "object",
        "properties": {"c": {"anyOf": [{"type": "integer", "minimum": 9, "maximum": 1}, {"type": "string"}]}},
        "required": ["c"],
    },
    {"type": "object", "required": ["undescribed"]},
    {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "$ref": "#/$defs/node",
    },
]


@pytest.mark.parametrize("schema", EDGES)
def test_generated_arguments_satisfy_their_schema(schema: dict[str, Any]) -> None:
    for seed in range(40):
        arguments = example_arguments(schema, random.Random(seed), "Where is the nearest library open late?")
        assert _violations(arguments, schema, schema) == [], (seed, arguments)


def test_strings_are_words_of_the_question_and_seeded() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    question = "Compare battery life of phones"
    for seed in range(20):
        first = example_arguments(schema, random.Random(seed), question)
        assert first == example_arguments(schema, random.Random(seed), question)
        assert set(first["q"].split()) <= set(question.split())
    assert example_arguments(
        {"type": "object", "properties": {"q": {"format": "date"}}, "required": ["q"]}, random.Random(0), ""
    ) == {"q": "2024-05-17"}
