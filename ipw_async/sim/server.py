"""The simulator's HTTP server (aiohttp): OpenAI's chat, completions and Responses APIs and
Anthropic's Messages API over one engine; its routes, each request's reply and faults decided,
the engine fed, and the process's ready line."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .agent import Reply, seeded_rng, text_of
from .answers import Responder
from .config import SimConfig
from .engine import Engine, PrefixCache, SimRequest
from .faults import FaultStats, StreamFaults
from .responses import REPLIES, error_body

READY_PREFIX = "IPW_SIM_READY"


def count_tokens(text: str) -> int:
    """The simulator's tokenizer: a token per four characters, at least one."""
    return max(1, (len(text) + 3) // 4)


def _chat_prompt(messages: list[object], tools: object) -> str:
    """The text a chat request's tokens are counted and prefix-cached on: the tool list, then
    every message's content and tool calls, in order (so a longer history extends a shorter)."""
    parts = [json.dumps(tools)] if tools else []
    for m in messages:
        if isinstance(m, dict):
            parts.append(str(m.get("content") or ""))
            if m.get("tool_calls"):
                parts.append(json.dumps(m["tool_calls"]))
    return "\n".join(parts)


def _function(name: object, description: object = None, parameters: object = None) -> dict[str, object]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def _call(call_id: object, name: object, arguments: object) -> dict[str, object]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _chosen(choice: object) -> object:
    """A Responses or Messages ``tool_choice`` in chat's words: a named tool, ``required``
    (Anthropic's ``any``), or ``auto``/``none`` as they are."""
    if not isinstance(choice, dict):
        return choice
    if choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"any": "required"}.get(str(choice.get("type")), choice.get("type"))


def from_responses(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI Responses request as the chat request the responder reads: ``instructions``
    and the ``input`` items as messages (a function call joins the assistant message before
    it, as chat holds a turn's text and calls in one; its output is a tool message), its
    function tools, and ``max_output_tokens``."""
    given = body.get("input") or []
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            call = _call(item.get("call_id"), item.get("name"), item.get("arguments"))
            if messages and messages[-1]["role"] == "assistant":
                messages[-1]["tool_calls"] = [*(messages[-1].get("tool_calls") or ()), call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item.get("type") == "function_call_output":
            output = text_of(item.get("output"))
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        elif "role" in item:
            messages.append({"role": item["role"], "content": text_of(item.get("content"))})
    tools = [
        _function(t.get("name"), t.get("description"), t.get("parameters"))
        for t in body.get("tools") or ()
        if isinstance(t, dict) and t.get("type") == "function"
    ]
    return body | {
        "messages": messages,
        "tools": tools or None,
        "tool_choice": _chosen(body.get("tool_choice")),
        "max_tokens": body.get("max_output_tokens"),
    }


def from_messages(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request as the chat request the responder reads: ``system`` first,
    a message's ``tool_result`` blocks as tool messages before it, its text and ``tool_use``
    blocks as one chat message (text, then tool calls), its tools, and ``stop_sequences``."""
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": text_of(body["system"])})
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": text_of(content)}]
        text, calls = [], []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                calls.append(_call(block.get("id"), block.get("name"), json.dumps(block.get("input") or {})))
            elif block.get("type") == "tool_result":
                result = text_of(block.get("content"))
                messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": result})
            elif isinstance(block.get("text"), str):
                text.append(block["text"])
        if text or calls:
            said = {"role": message.get("role"), "content": "".join(text) or None}
            messages.append(said | ({"tool_calls": calls} if calls else {}))
    tools = [
        _function(t.get("name"), t.get("description"), t.get("input_schema"))
        for t in body.get("tools") or ()
        if isinstance(t, dict)
    ]
    return body | {
        "messages": messages,
        "tools": tools or None,
        "tool_choice": _chosen(body.get("tool_choice")),
        "stop": body.get("stop_sequences"),
    }


# Each API's route under /v1 and its request read as chat's (None: taken as it is)
_APIS: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]] | None]] = {
    "chat": ("/v1/chat/completions", None),
    "completions": ("/v1/completions", None),
    "responses": ("/v1/responses", from_responses),
    "messages": ("/v1/messages", from_messages),
}


class SimServer:
    """The routes of an OpenAI-compatible server over one simulated engine and device, and the
    simulator's own: its device readout, true energy and fault account."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.engine = Engine(config.engine)
        self.responder = Responder(config)
        self.stats = FaultStats()
        self._ids = 0
        self.app = web.Application()
        self.app.add_routes([web.post(path, self._route(api)) for api, (path, _) in _APIS.items()])
        self.app.add_routes(
            [
                # vLLM's path, at the root; under /v1 too, where a client's base URL points
                web.post("/reset_prefix_cache", self.reset_prefix_cache),
                web.post("/v1/reset_prefix_cache", self.reset_prefix_cache),
                web.get("/v1/models", self.models),
                web.get("/health", self.health),
                web.get("/sim/device", self.device),
                web.get("/sim/truth", self.truth),
                web.get("/sim/stats", self.fault_stats),
                web.get("/metrics", self.metrics),
            ]
        )
        self.app.on_startup.append(self._start)
        self.app.on_cleanup.append(self._stop)

    async def _start(self, _: web.Application) -> None:
        self.engine.start()

    async def _stop(self, _: web.Application) -> None:
        await self.engine.stop()

    async def health(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "simulated": True})

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.config.model, "object": "model", "owned_by": "ipw-async-simulator"}],
            }
        )

    async def device(self, _: web.Request) -> web.Response:
        return web.json_response(self.engine.device.readout())

    async def metrics(self, _: web.Request) -> web.Response:
        """Prometheus text, as a GPU host shows it: the device as DCGM exporter's fields, the
        engine as vLLM's gauges and counters."""
        device = self.engine.device.readout()
        engine = self.engine
        lines = []
        gpu = 'gpu="0",UUID="SIM-0",modelName="SIMULATED"'
        if device["energy_mj"] is not None:
            lines += [
                "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter",
                f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{gpu}}} {device['energy_mj']}",
            ]
        # as on a GPU of Ampere or newer: the instant field, and the power usage NVML averages
        for field, key in (
            ("DCGM_FI_DEV_POWER_USAGE_INSTANT", "power_w"),
            ("DCGM_FI_DEV_POWER_USAGE", "avg_power_w"),
        ):
            if device[key] is not None:
                lines += [f"# TYPE {field} gauge", f"{field}{{{gpu}}} {device[key]}"]
        model = f'model_name="{self.config.model}"'
        lines += [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{model}}} {len(engine.running)}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{model}}} {len(engine.waiting)}",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{model}}} {engine.generated_tokens}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def truth(self, _: web.Request) -> web.Response:
        return web.json_response(self.engine.truth())

    async def fault_stats(self, _: web.Request) -> web.Response:
        return web.json_response(self.stats.as_dict())

    async def reset_prefix_cache(self, _: web.Request) -> web.Response:
        """Forget every cached prompt prefix, as vLLM's ``POST /reset_prefix_cache`` does: the
        next requests prefill their whole prompts (a sweep's points start alike)."""
        caching = self.engine.cache is not None
        if caching:
            self.engine.cache = PrefixCache()
        return web.json_response({"reset": caching, "prefix_cache": caching})

    def _route(self, api: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self._generate(request, api)

        return handle

    async def _generate(self, request: web.Request, api: str) -> web.StreamResponse:
        chat = api != "completions"  # every other API takes messages
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response(
                error_body("request body is not JSON", "invalid_request_error", 400, api), status=400
            )
        if not isinstance(body, dict):
            return web.json_response(
                error_body("request body is not a JSON object", "invalid_request_error", 400, api), status=400
            )
        if body.get("model") != self.config.model:
            msg = f"The model `{body.get('model')}` does not exist."
            return web.json_response(error_body(msg, "NotFoundError", 404, api), status=404)
        if api == "messages" and body.get("max_tokens") is None:  # Anthropic's API has no default
            refused = error_body("max_tokens: Field required", "invalid_request_error", 400, api)
            return web.json_response(refused, status=400)
        as_chat = _APIS[api][1]
        if as_chat is not None:
            body = as_chat(body)
        messages = (body.get("messages") or []) if chat else []
        if chat:
            prompt = _chat_prompt(messages, body.get("tools"))
            prompt_tokens = count_tokens(prompt) + 4 * len(messages)
        else:
            prompt = str(body.get("prompt", ""))
            prompt_tokens = count_tokens(prompt)
        reply = self._reply(body, messages, prompt, chat)
        self._ids += 1
        key = request.headers.get("x-ipw-request-id") or f"sim-{self._ids}"
        rng = seeded_rng(self.config.seed, "faults", key, prompt)
        self.stats.requests += 1
        refused = self._refusal(key, rng, api)
        if refused is not None:
            return refused
        sim_request = SimRequest(
            key=key,
            prompt_tokens=prompt_tokens,
            tokens=reply.tokens,
            finish_reason=reply.finish,
            prompt=prompt,
        )
        self.engine.submit(sim_request)
        completion = REPLIES[api](
            model=self.config.model,
            number=self._ids,
            request=sim_request,
            caching=self.config.engine.prefix_cache,
            tool_call=reply.tool_call if chat else None,
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
        )
        try:
            if not body.get("stream"):
                return web.json_response(await completion.collect())
            faults = self.config.faults
            at_token = StreamFaults.draw(faults, rng, len(reply.tokens))
            return await completion.stream(request, at_token, faults.stall_s, self.stats)
        finally:
            if sim_request.finished_ns is None:  # ended early (a fault, the client gone): free its slot
                self.engine.abort(sim_request)

    def _reply(self, body: dict[str, Any], messages: list[object], prompt: str, chat: bool) -> Reply:
        """What the model answers, cut at the request's max_tokens."""
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 256)
        reply = self.responder.turn(messages, body, prompt, chat)
        if reply is None:
            ignore_eos = bool(body.get("ignore_eos"))
            tokens, finish = self.responder.tokens(prompt, chat, max_tokens, ignore_eos, stop)
            return Reply(tokens, finish)
        if len(reply.tokens) > max_tokens:
            return Reply(reply.tokens[:max_tokens], "length", reply.tool_call)
        return reply

    def _refusal(self, key: str, rng: random.Random, api: str) -> web.Response | None:
        """The injected HTTP error the request is refused with, if it is."""
        faults = self.config.faults
        if rng.random() < faults.http_error:
            self.stats.inject(key, "http_error")
            return web.json_response(
                error_body("simulated server error", "server_error", 500, api), status=500
            )
        if rng.random() < faults.rate_limit:
            self.stats.inject(key, "rate_limit")
            refused = error_body("simulated rate limit", "rate_limit_exceeded", 429, api)
            return web.json_response(refused, status=429, headers={"Retry-After": "1"})
        return None


async def serve(config: SimConfig, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve until cancelled; print the ready line (host and bound port) on stdout."""
    server = SimServer(config)
    runner = web.AppRunner(server.app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"{READY_PREFIX} {host} {bound}", flush=True)
    print(
        f"ipw-async simulator (SIMULATED server and device) serving model {config.model!r} "
        f"on http://{host}:{bound}/v1",
        file=sys.stderr,
        flush=True,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
