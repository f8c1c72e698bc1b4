"""Request bodies: what a workload sends, over the run's defaults, in the endpoint's API."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec


@dataclass(frozen=True)
class BodyDefaults:
    """What every streaming request carries unless its workload says otherwise: the model,
    max_tokens and temperature, and the user's ``--param`` values over everything.
    ``endpoint`` is the API the body is written for (:data:`ipw_async.client.ENDPOINTS`)."""

    model: str
    max_tokens: int = 256
    temperature: float | None = 0.0
    params: dict[str, Any] = field(default_factory=dict)
    endpoint: str = "chat"

    def encode(self, fields: dict[str, Any], max_tokens: int | None = None) -> bytes:
        """A streaming request body from ``fields`` (messages or prompt, tools, stop, …), the
        OpenAI chat fields a workload writes, in the endpoint's API."""
        limit = max_tokens or self.max_tokens
        body: dict[str, Any] = {"model": self.model, "stream": True}
        if self.endpoint == "responses":
            # hosted OpenAI keeps every response unless told not to: a benchmark would leave
            # thousands behind (``--param store=true`` keeps them)
            body["store"] = False
            body["max_output_tokens"] = limit
            fields = _responses(fields)
        elif self.endpoint == "messages":
            body["max_tokens"] = limit
            fields = _messages(fields)
        else:  # OpenAI's chat and completions: a stream's usage comes only when asked for
            body["stream_options"] = {"include_usage": True}
            body["max_tokens"] = limit
        if self.temperature is not None:
            body["temperature"] = self.temperature
        body.update(fields)
        body.update(self.params)
        return msgspec.json.encode(body)  # 9× json.dumps' speed: a cost every request pays


def _system(fields: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The system messages' text, joined, and the conversation without them: both APIs take the
    system prompt as a field of its own (Responses' ``instructions``, Messages' ``system``)."""
    messages = fields.get("messages", [])
    system = [str(m.get("content")) for m in messages if m.get("role") == "system"]
    return "\n\n".join(system), [m for m in messages if m.get("role") != "system"]


def _responses(fields: dict[str, Any]) -> dict[str, Any]:
    """OpenAI Responses: the system prompt is its ``instructions`` (the API's own field for it,
    as Messages' is ``system``), the conversation its ``input`` (chat's messages as they are,
    but an assistant's tool calls as ``function_call`` items and their results as
    ``function_call_output`` items), its tools are flat function specs, and it has no stop
    sequences (a reply runs to its end or ``max_output_tokens``)."""
    system, conversation = _system(fields)
    items: list[dict[str, Any]] = []
    for message in conversation:
        if message.get("role") == "tool":
            result = {"call_id": message.get("tool_call_id"), "output": message.get("content") or ""}
            items.append({"type": "function_call_output"} | result)
            continue
        calls = message.get("tool_calls") or []
        if message.get("content") or not calls:
            items.append({"role": message.get("role"), "content": message.get("content") or ""})
        for call in calls:
            function = call["function"]
            named = {"call_id": call["id"], "name": function["name"], "arguments": function["arguments"]}
            items.append({"type": "function_call"} | named)
    body: dict[str, Any] = {"input": items}
    if system:
        body["instructions"] = system
    if fields.get("tools"):
        body["tools"] = [_responses_tool(tool["function"]) for tool in fields["tools"]]
    return body | _rest(fields)


def _responses_tool(function: dict[str, Any]) -> dict[str, Any]:
    """A chat function spec as a Responses function tool. Responses enforces a strict schema
    unless told not to, and refuses one that is not written for it (every property required,
    ``additionalProperties: false``), so a spec that does not ask keeps chat's default."""
    return {"type": "function", "strict": False} | function


def _messages(fields: dict[str, Any]) -> dict[str, Any]:
    """Anthropic Messages: system messages go to the top-level ``system`` (its messages are only
    user and assistant turns), an assistant's tool calls are ``tool_use`` blocks and their
    results ``tool_result`` blocks of the next user turn, an empty answer is left out, tools
    take ``input_schema``, and stop sequences are ``stop_sequences``."""
    system, conversation = _system(fields)
    messages: list[dict[str, Any]] = []
    for message in conversation:
        role, content = message.get("role"), message.get("content")
        if role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id"),
                "content": content or "",
            }
            last = messages[-1] if messages else {}
            if last.get("role") == "user" and isinstance(last["content"], list):
                last["content"].append(block)  # one user turn holds every result of the calls before it
            else:
                messages.append({"role": "user", "content": [block]})
        elif message.get("tool_calls"):
            blocks = [{"type": "text", "text": content}] if content else []
            for call in message["tool_calls"]:
                function = call["function"]
                use = {"id": call["id"], "name": function["name"], "input": _input(function["arguments"])}
                blocks.append({"type": "tool_use"} | use)
            messages.append({"role": role, "content": blocks})
        elif content or role != "assistant":
            messages.append({"role": role, "content": content or ""})
        # else an empty answer (a reply cut while it reasoned): Anthropic refuses a turn with no
        # content, and joins the user turns either side of the one left out
    body: dict[str, Any] = {"messages": messages}
    if system:
        body["system"] = system
    if fields.get("stop"):
        body["stop_sequences"] = fields["stop"]
    if fields.get("tools"):
        body["tools"] = [_anthropic_tool(tool["function"]) for tool in fields["tools"]]
    return body | _rest(fields)


def _rest(fields: dict[str, Any]) -> dict[str, Any]:
    """What a workload sends besides the conversation, its tools and stop sequences: as it is."""
    return {k: v for k, v in fields.items() if k not in ("messages", "stop", "tools")}


def _input(arguments: str) -> dict[str, Any]:
    """A tool call's JSON arguments as the object a ``tool_use`` block's ``input`` is; arguments
    that are no JSON object (a model's mistake, already answered by the tool's error) give none."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _anthropic_tool(function: dict[str, Any]) -> dict[str, Any]:
    """A chat function spec as an Anthropic tool: its JSON schema is ``input_schema``."""
    tool = {"name": function["name"], "input_schema": function.get("parameters") or {"type": "object"}}
    return tool | ({"description": function["description"]} if function.get("description") else {})


def prompt_fields(prompt: str, chat: bool, stop: tuple[str, ...] = ()) -> dict[str, Any]:
    """One user prompt as the endpoint takes it: chat messages, or a completion prompt with
    its stop sequences."""
    if chat:
        return {"messages": [{"role": "user", "content": prompt}]}
    return {"prompt": prompt} | ({"stop": list(stop)} if stop else {})
