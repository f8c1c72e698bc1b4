"""The simulator's OpenAI-compatible HTTP server (aiohttp): its routes, each request's reply
and faults decided, the engine fed, and the process's ready line."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from typing import Any

from aiohttp import web

from .agent import Reply, seeded_rng
from .answers import Responder
from .config import SimConfig
from .engine import Engine, SimRequest
from .faults import FaultStats, StreamFaults
from .responses import Completion, error_body

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
        self.app.add_routes(
            [
                web.post("/v1/chat/completions", self.chat),
                web.post("/v1/completions", self.completions),
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
        if device["power_w"] is not None:
            lines += [
                "# TYPE DCGM_FI_DEV_POWER_USAGE gauge",
                f"DCGM_FI_DEV_POWER_USAGE{{{gpu}}} {device['power_w']}",
            ]
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

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response(
                error_body("request body is not JSON", "invalid_request_error", 400), status=400
            )
        if body.get("model") != self.config.model:
            msg = f"The model `{body.get('model')}` does not exist."
            return web.json_response(error_body(msg, "NotFoundError", 404), status=404)
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
        refused = self._refusal(key, rng)
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
        completion = Completion(
            chat=chat,
            model=self.config.model,
            rid=f"{'chatcmpl' if chat else 'cmpl'}-{self._ids}",
            request=sim_request,
            caching=self.config.engine.prefix_cache,
            tool_call=reply.tool_call if chat else None,
        )
        try:
            if not body.get("stream"):
                return web.json_response(await completion.collect())
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            faults = self.config.faults
            at_token = StreamFaults.draw(faults, rng, len(reply.tokens))
            return await completion.stream(request, include_usage, at_token, faults.stall_s, self.stats)
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

    def _refusal(self, key: str, rng: random.Random) -> web.Response | None:
        """The injected HTTP error the request is refused with, if it is."""
        faults = self.config.faults
        if rng.random() < faults.http_error:
            self.stats.inject(key, "http_error")
            return web.json_response(error_body("simulated server error", "server_error", 500), status=500)
        if rng.random() < faults.rate_limit:
            self.stats.inject(key, "rate_limit")
            refused = error_body("simulated rate limit", "rate_limit_exceeded", 429)
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
