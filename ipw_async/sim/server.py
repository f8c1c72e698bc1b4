"""The simulator's OpenAI-compatible HTTP server (aiohttp), with seeded answers and faults."""

from __future__ import annotations

import asyncio
import json
import random
import re
import string
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .._clock import now_ns
from .._options import option
from ..judge import JUDGE_PROMPT
from ..scoring import contains, exact, numeric
from ..workload.datasets import qa_pairs, question_of
from .agent import Agent, Reply, as_tokens, seeded_rng, text_of
from .engine import Engine, SimRequest
from .physics import EngineConfig

SIM_MODEL = "sim-small"
READY_PREFIX = "IPW_SIM_READY"

_FILLER = [
    "Let",
    "me",
    "think",
    "about",
    "this",
    "step",
    "by",
    "step.",
    "The",
    "question",
    "asks",
    "for",
    "a",
    "short",
    "fact,",
    "so",
    "I",
    "recall",
    "what",
    "I",
    "know",
    "and",
    "check",
    "it",
    "against",
    "related",
    "facts",
    "before",
    "I",
    "answer.",
    "Considering",
    "the",
    "context",
    "carefully",
]


@dataclass
class Faults:
    """Probabilities (per request, seeded) of each injected failure."""

    http_error: float = field(
        default=0.0, metadata=option("Probability of HTTP 500 per request.", "--fault-http-error")
    )
    rate_limit: float = field(
        default=0.0,
        metadata=option("Probability of HTTP 429 with Retry-After per request.", "--fault-rate-limit"),
    )
    error_event: float = field(
        default=0.0,
        metadata=option("Probability of an error event inside the stream.", "--fault-error-event"),
    )
    disconnect: float = field(
        default=0.0,
        metadata=option("Probability of dropping the connection mid-stream.", "--fault-disconnect"),
    )
    malformed: float = field(
        default=0.0, metadata=option("Probability of one malformed (non-JSON) event.", "--fault-malformed")
    )
    stall: float = field(default=0.0, metadata=option("Probability of a mid-stream stall.", "--fault-stall"))
    stall_s: float = field(default=2.0, metadata=option("Length of a stall in seconds.", "--fault-stall-s"))


@dataclass
class SimConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    faults: Faults = field(default_factory=Faults)
    seed: int = field(default=0, metadata=option("Seed for answers, lengths and faults."))
    accuracy: float = field(
        default=0.8, metadata=option("Probability of a right answer to a built-in QA question.")
    )
    output_median: int = field(
        default=48, metadata=option("Median answer length in tokens (when not ignore_eos).")
    )
    output_sigma: float = 0.6
    model: str = SIM_MODEL


def count_tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4)


class Responder:
    """Decides what the model says: deterministic for a (seed, prompt) pair."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.answers = dict(qa_pairs())
        self._all_answers = sorted(set(self.answers.values()))
        self.agent = Agent(config.seed, config.accuracy, self._all_answers)

    def _answer(self, question: str, rng: random.Random) -> str:
        right = self.answers[question]
        if rng.random() < self.config.accuracy:
            return right
        if right.lstrip("-").isdigit():
            return str(int(right) + rng.choice((-2, -1, 1, 2, 10)))
        return rng.choice([a for a in self._all_answers if a != right])

    def tokens(
        self, prompt: str, chat: bool, max_tokens: int, ignore_eos: bool, stop: list[str]
    ) -> tuple[list[str], str]:
        """Output tokens and finish reason."""
        cfg = self.config
        rng = seeded_rng(cfg.seed, prompt)
        question = question_of(prompt)
        if ignore_eos or question not in self.answers:
            n = (
                max_tokens
                if ignore_eos
                else round(rng.lognormvariate(0, cfg.output_sigma) * cfg.output_median)
            )
            n = max(1, n)
            words = [" " + rng.choice(_FILLER) for _ in range(min(n, max_tokens))]
            return words, "length" if n >= max_tokens else "stop"
        answer = self._answer(question, rng)
        if chat:
            n = max(0, round(rng.lognormvariate(0, cfg.output_sigma) * cfg.output_median) - 4)
            words = [" " + w for w in _FILLER[: min(n, len(_FILLER))]]
            words += [f" {w}" for w in f"The answer is {answer}.".split()]
        else:
            words = [f" {w}" for w in answer.split()]
            if "\n" not in stop:
                words += ["\n", "Q:"]
        if len(words) > max_tokens:
            return words[:max_tokens], "length"
        return words, "stop"

    def turn(self, messages: list[object], body: dict[str, Any], prompt: str, chat: bool) -> Reply | None:
        """The reply the request's kind sets (a judge's verdict, a tool-calling or ReAct turn),
        or None for a plain answer."""
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        last = text_of(users[-1].get("content")) if users else ""
        tools = body.get("tools")
        return (
            judge_turn(last if chat else prompt)
            or (self.agent.tool_turn(messages, tools, body.get("tool_choice")) if tools else None)
            or self.agent.react_turn(prompt)
        )


def _fields_pattern(template: str) -> re.Pattern[str]:
    """A pattern that reads back the values filled into ``template``'s fields."""
    parts: list[str] = []
    seen: set[str] = set()
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if name:
            parts.append(f"(?P={name})" if name in seen else f"(?P<{name}>.*?)")
            seen.add(name)
    return re.compile("".join(parts), re.DOTALL)


_JUDGE_FIRST_LINE = JUDGE_PROMPT.split("\n", 1)[0]
_JUDGE_FIELDS = _fields_pattern(JUDGE_PROMPT.strip())
_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*")  # a reference that is a number is graded as one


def judge_turn(text: str) -> Reply | None:
    """A judge's verdict on a filled-in :data:`JUDGE_PROMPT` (recognised by its first line):
    CORRECT when the answer matches the reference, numerically when the reference is a
    number, else by containing it; None for any other prompt."""
    if not text.startswith(_JUDGE_FIRST_LINE):
        return None
    found = _JUDGE_FIELDS.fullmatch(text.strip())
    filled = found.groupdict() if found else {}
    answer, reference = filled.get("answer"), (filled.get("reference") or "").strip()
    if answer is None or not reference:
        right = False
    elif _NUMBER.fullmatch(reference):
        right = numeric(answer, reference)
    else:
        right = exact(answer, reference) or contains(answer, reference)
    return Reply(as_tokens("CORRECT" if right else "INCORRECT"), "stop")


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


# What each injected fault looks like to a client that records it: (error_type, HTTP status).
# A stall is a timeout only when it outlasts the client's read timeout.
FAULT_OUTCOMES: dict[str, tuple[str, int]] = {
    "http_error": ("http_error", 500),
    "rate_limit": ("http_error", 429),
    "error_event": ("stream_error", 200),
    "disconnect": ("disconnected", 200),
    "malformed": ("malformed_event", 200),
    "stall": ("timeout", 200),
}


@dataclass
class FaultStats:
    """The simulator's own account: requests received, streams it finished, and the first fault
    it injected into each request (by the harness's request id), the reference a reliability
    benchmark holds the harness's recorded outcomes against."""

    requests: int = 0
    completed: int = 0  # streams written to their [DONE]
    injected: dict[str, str] = field(default_factory=dict)

    def inject(self, key: str, kind: str) -> None:
        self.injected.setdefault(key, kind)

    def as_dict(self) -> dict[str, object]:
        counts: dict[str, int] = {}
        for kind in self.injected.values():
            counts[kind] = counts.get(kind, 0) + 1
        return {
            "requests": self.requests,
            "completed": self.completed,
            "injected": counts,
            "by_request": self.injected,
        }


def _error_body(message: str, kind: str, code: int) -> dict[str, object]:
    return {"error": {"message": message, "type": kind, "code": code}}


class SimServer:
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
                _error_body("request body is not JSON", "invalid_request_error", 400), status=400
            )
        if body.get("model") != self.config.model:
            msg = f"The model `{body.get('model')}` does not exist."
            return web.json_response(_error_body(msg, "NotFoundError", 404), status=404)
        messages = body.get("messages") or [] if chat else []
        if chat:
            prompt = _chat_prompt(messages, body.get("tools"))
            prompt_tokens = count_tokens(prompt) + 4 * len(messages)
        else:
            prompt = str(body.get("prompt", ""))
            prompt_tokens = count_tokens(prompt)
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 256)
        reply = self.responder.turn(messages, body, prompt, chat)
        if reply is None:
            tokens, finish = self.responder.tokens(
                prompt, chat, max_tokens, bool(body.get("ignore_eos")), stop
            )
            reply = Reply(tokens, finish)
        elif len(reply.tokens) > max_tokens:
            reply = Reply(reply.tokens[:max_tokens], "length", reply.tool_call)
        tokens, finish = reply.tokens, reply.finish
        self._ids += 1
        key = request.headers.get("x-ipw-request-id") or f"sim-{self._ids}"
        faults = self.config.faults
        rng = seeded_rng(self.config.seed, "faults", key, prompt)
        self.stats.requests += 1
        if rng.random() < faults.http_error:
            self.stats.inject(key, "http_error")
            return web.json_response(_error_body("simulated server error", "server_error", 500), status=500)
        if rng.random() < faults.rate_limit:
            self.stats.inject(key, "rate_limit")
            body = _error_body("simulated rate limit", "rate_limit_exceeded", 429)
            return web.json_response(body, status=429, headers={"Retry-After": "1"})
        sim_request = SimRequest(
            key=key, prompt_tokens=prompt_tokens, tokens=tokens, finish_reason=finish, prompt=prompt
        )
        self.engine.submit(sim_request)
        ctx = _Stream(
            chat=chat,
            model=self.config.model,
            rid=f"{'chatcmpl' if chat else 'cmpl'}-{self._ids}",
            request=sim_request,
            caching=self.config.engine.prefix_cache,
            tool_call=reply.tool_call if chat else None,
        )
        try:
            if not body.get("stream"):
                return web.json_response(await ctx.collect(sim_request))
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await ctx.stream(request, sim_request, include_usage, faults, rng, self.stats)
        finally:
            if sim_request.finished_ns is None:
                self.engine.abort(sim_request)


@dataclass
class _Stream:
    chat: bool
    model: str
    rid: str
    request: SimRequest
    caching: bool  # report cached prompt tokens, as servers with prefix caching do
    tool_call: tuple[str, str] | None = None  # (id, name): the tokens stream as its arguments

    @property
    def tokens(self) -> list[str]:
        return self.request.tokens

    @property
    def finish(self) -> str:
        return self.request.finish_reason

    def _chunk(
        self, text: str | None, finish: str | None, role: bool = False, header: bool = False
    ) -> dict[str, object]:
        if self.chat:
            delta: dict[str, object] = {"role": "assistant", "content": ""} if role else {}
            if text is not None and self.tool_call is not None:
                call: dict[str, object] = {"index": 0, "function": {"arguments": text}}
                if header:  # the first piece names the call, as OpenAI's stream does
                    call_id, name = self.tool_call
                    call = {
                        "index": 0,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": text},
                    }
                delta["tool_calls"] = [call]
            elif text is not None:
                delta["content"] = text
            choice: dict[str, object] = {"index": 0, "delta": delta, "finish_reason": finish}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish}
            kind = "text_completion"
        return self._envelope(kind, choice)

    def _envelope(self, kind: str, choice: dict[str, object]) -> dict[str, object]:
        return {
            "id": self.rid,
            "object": kind,
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
        }

    def _usage(self) -> dict[str, object]:
        prompt = self.request.prompt_tokens
        usage: dict[str, object] = {
            "prompt_tokens": prompt,
            "completion_tokens": len(self.tokens),
            "total_tokens": prompt + len(self.tokens),
        }
        if self.caching:
            usage["prompt_tokens_details"] = {"cached_tokens": self.request.cached_tokens}
        return usage

    async def collect(self, sim_request: SimRequest) -> dict[str, object]:
        parts = []
        while (token := await sim_request.out.get()) is not None:
            parts.append(token)
        text = "".join(parts)
        message: dict[str, object] = {"role": "assistant", "content": text}
        if self.tool_call is not None:
            call_id, name = self.tool_call
            function = {"name": name, "arguments": text}
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        choice: dict[str, object] = (
            {"index": 0, "message": message, "finish_reason": self.finish}
            if self.chat
            else {"index": 0, "text": text, "finish_reason": self.finish}
        )
        return self._envelope("chat.completion" if self.chat else "text_completion", choice) | {
            "usage": self._usage()
        }

    async def stream(
        self,
        request: web.Request,
        sim_request: SimRequest,
        include_usage: bool,
        faults: Faults,
        rng: random.Random,
        stats: FaultStats,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        n = len(self.tokens)
        fail_at = rng.randrange(n) if n else 0
        error_event = rng.random() < faults.error_event
        disconnect = rng.random() < faults.disconnect
        malformed = rng.random() < faults.malformed
        stall = rng.random() < faults.stall
        if self.chat:  # a role-only first chunk, as vLLM and llama.cpp send
            await resp.write(_sse(self._chunk(None, None, role=True)))
        # Token chunks go out through a fixed template: the per-token path of a zero-delay
        # benchmark must cost the server as little as the client.
        template = json.dumps(self._chunk("\x00", None)).replace("%", "%%").replace('"\\u0000"', "%s")
        template = "data: " + template[:-1] + ', "ipw_sent_ns": %d, "ipw_tokens": 1}\n\n'
        i = 0
        key = sim_request.key
        while (token := await sim_request.out.get()) is not None:
            if i == fail_at:
                if error_event:
                    stats.inject(key, "error_event")
                    await resp.write(_sse(_error_body("simulated engine failure", "server_error", 500)))
                    return resp
                if disconnect:
                    stats.inject(key, "disconnect")
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                if malformed:
                    stats.inject(key, "malformed")
                    await resp.write(b'data: {"choices": [{"delta": \n\n')
                if stall:
                    stats.inject(key, "stall")
                    await asyncio.sleep(faults.stall_s)
            if i == 0 and self.tool_call is not None:
                header = self._chunk(token, None, header=True) | {"ipw_sent_ns": now_ns(), "ipw_tokens": 1}
                await resp.write(_sse(header))
            else:
                await resp.write((template % (json.dumps(token), now_ns())).encode())
            i += 1
        await resp.write(_sse(self._chunk(None if self.chat else "", self.finish)))
        if include_usage:
            final = self._chunk(None, None)
            final["choices"] = []
            final["usage"] = self._usage()
            await resp.write(_sse(final))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        stats.completed += 1
        return resp


def _sse(payload: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


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
