"""A continuous-batching inference engine and the device it runs on, both simulated.

Requests queue, join the running batch up to ``max_batch``, and advance in discrete steps.
A step prefills newly admitted prompts (up to a token budget, chunked) and decodes one token
for every running sequence; its duration grows with batch size and prefill tokens, so TTFT
and per-token time respond to load as on a real server.

The device draws ``static_w`` plus a dynamic power that grows sub-linearly with the step's
work (decode tokens + ``prefill_work`` × prefill tokens). Each request's true energy is its
work share of the dynamic energy of every step plus an equal share of static energy while it
is on the server; with nothing on the server the static energy is idle. The device exposes
what a GPU would: a cumulative counter in whole mJ that updates every ``counter_period_ms``,
instantaneous power and 1-second averaged power.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import math
import random
from collections import deque
from dataclasses import dataclass, field

from .._clock import NS, now_ns
from .._options import option

TELEMETRY_KINDS = ("counter", "power", "avg-power")


@dataclass
class EngineConfig:
    max_batch: int = field(default=128, metadata=option("Most sequences decoded together in one step."))
    step_base_ms: float = field(
        default=14.0, metadata=option("Duration of an engine step with an empty batch.")
    )
    step_per_seq_ms: float = field(
        default=0.12, metadata=option("Extra step time per sequence in the batch.")
    )
    step_per_prefill_token_ms: float = field(
        default=0.03, metadata=option("Extra step time per prompt token prefilled.")
    )
    prefill_budget_tokens: int = field(
        default=2048,
        metadata=option("Most prompt tokens prefilled in one step (chunked prefill).", "--prefill-budget"),
    )
    zero_delay: bool = field(
        default=False, metadata=option("Steps take no time: measure the client, not the model.")
    )
    # device
    static_w: float = field(default=70.0, metadata=option("Device idle (static) power in watts."))
    dynamic_w: float = field(
        default=28.0, metadata=option("Dynamic power of one decoding sequence in watts.")
    )
    work_exponent: float = field(
        default=0.6, metadata=option("Dynamic power grows as work ** this (sub-linear).")
    )
    prefill_work: float = field(
        default=0.3, metadata=option("A prompt token's work relative to an output token.")
    )
    max_w: float = 700.0
    counter_period_ms: float = field(
        default=100.0, metadata=option("Energy counter update period in ms.", "--counter-ms")
    )
    telemetry: str = field(
        default="counter",
        metadata=option("What the device exposes: counter, power or avg-power.", "--device-telemetry"),
    )
    # every Nth second the device answers nothing (0: never): gaps that force imputation
    dropout_every_s: int = field(
        default=0,
        metadata=option(
            "The device answers nothing every Nth second (0: never), to test imputation.",
            "--device-dropout-every",
        ),
    )

    prefix_cache: bool = field(
        default=False,
        metadata=option(
            "Cache prompt prefixes: leading blocks of a prompt seen before cost no prefill "
            "(as vLLM's automatic prefix caching)."
        ),
    )

    record_steps: bool = field(
        default=False,
        metadata=option(
            "Keep every engine step (when it ran, each prompt's chunk, the decoders, its work) "
            "in /sim/truth, to judge attribution step by step."
        ),
    )

    def __post_init__(self) -> None:
        if self.telemetry not in TELEMETRY_KINDS:
            raise ValueError(f"--device-telemetry must be one of {', '.join(TELEMETRY_KINDS)}")


def drawn_physics(seed: int, **fixed: object) -> EngineConfig:
    """A server and device drawn at random from ``seed``: the simulator as a family, so an
    attribution rule is judged on physics it was not tuned to. ``fixed`` pins fields."""
    rng = random.Random(seed)

    def log_uniform(low: float, high: float) -> float:
        return math.exp(rng.uniform(math.log(low), math.log(high)))

    drawn: dict[str, object] = {
        "work_exponent": rng.uniform(0.5, 1.0),
        "prefill_work": rng.uniform(0.1, 1.5),
        "static_w": rng.uniform(30.0, 150.0),
        "dynamic_w": rng.uniform(10.0, 60.0),
        "step_base_ms": rng.uniform(5.0, 30.0),
        "step_per_seq_ms": log_uniform(0.06, 0.24),
        "step_per_prefill_token_ms": log_uniform(0.015, 0.06),
        "prefill_budget_tokens": round(log_uniform(512, 8192)),
        "counter_period_ms": log_uniform(10.0, 500.0),
        "prefix_cache": rng.random() < 0.5,
    }
    return EngineConfig(**(drawn | fixed))  # type: ignore[arg-type]


@dataclass(eq=False)
class SimRequest:
    key: str
    prompt_tokens: int
    tokens: list[str]  # output tokens in order
    finish_reason: str
    prompt: str = ""  # what the prefix cache keys on
    arrived_ns: int = field(default_factory=now_ns)
    cached_tokens: int = 0  # prompt tokens the prefix cache had: never prefilled
    prefilled: int = 0
    emitted: int = 0
    energy_j: float = 0.0
    finished_ns: int | None = None
    # per step: token texts produced, or None when the request ends/aborts
    out: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.prompt_tokens


class Device:
    """Energy as a piecewise-linear function of time, with GPU-like readouts."""

    HISTORY_NS = 3 * NS

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.t0 = now_ns()
        self._starts: deque[int] = deque([self.t0])  # segment start times
        self._energy: deque[float] = deque([0.0])  # energy at each segment start
        self._power: deque[float] = deque([config.static_w])  # power over each segment

    def set_power(self, t_ns: int, power_w: float) -> None:
        """From t_ns on the device draws power_w."""
        e = self.energy_at(t_ns)
        self._starts.append(t_ns)
        self._energy.append(e)
        self._power.append(power_w)
        while len(self._starts) > 2 and self._starts[1] < t_ns - self.HISTORY_NS:
            self._starts.popleft()
            self._energy.popleft()
            self._power.popleft()

    def energy_at(self, t_ns: int) -> float:
        i = max(0, bisect.bisect_right(self._starts, t_ns) - 1)
        return self._energy[i] + self._power[i] * max(0, t_ns - self._starts[i]) / NS

    def power_at(self, t_ns: int) -> float:
        return self._power[max(0, bisect.bisect_right(self._starts, t_ns) - 1)]

    def readout(self) -> dict[str, float | int | None]:
        """What the device reports now, as NVML would."""
        t = now_ns()
        period = int(self.config.counter_period_ms * 1e6)
        t_update = t - (t - self.t0) % period if period > 0 else t
        window = min(NS, t - self.t0)
        avg = (self.energy_at(t) - self.energy_at(t - window)) / (window / NS) if window > 0 else None
        mode = self.config.telemetry
        every = self.config.dropout_every_s
        if every and ((t - self.t0) // NS) % every == every - 1:
            return {"t_ns": t, "energy_mj": None, "power_w": None, "avg_power_w": None}
        return {
            "t_ns": t,
            "energy_mj": math.floor(self.energy_at(t_update) * 1000) if mode == "counter" else None,
            "power_w": self.power_at(t) if mode in ("counter", "power") else None,
            "avg_power_w": avg if mode in ("counter", "avg-power") else None,
        }


class PrefixCache:
    """Prompt prefixes in blocks of ``BLOCK_TOKENS``: a block is cached with every block before it."""

    BLOCK_TOKENS = 16
    BLOCK_CHARS = 4 * BLOCK_TOKENS  # the simulator counts a token per 4 characters

    def __init__(self) -> None:
        self._blocks: set[bytes] = set()

    def _keys(self, prompt: str) -> list[bytes]:
        h = hashlib.blake2b(digest_size=16)
        keys = []
        for start in range(0, len(prompt) - self.BLOCK_CHARS + 1, self.BLOCK_CHARS):
            h.update(prompt[start : start + self.BLOCK_CHARS].encode())
            keys.append(h.copy().digest())
        return keys

    def cached_tokens(self, prompt: str, prompt_tokens: int) -> int:
        """Leading prompt tokens found; at least one token is always computed (for logits)."""
        found = 0
        for key in self._keys(prompt):
            if key not in self._blocks:
                break
            found += 1
        return max(0, min(found * self.BLOCK_TOKENS, prompt_tokens - 1))

    def add(self, prompt: str) -> None:
        self._blocks.update(self._keys(prompt))


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = Device(config)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.idle_energy_j = 0.0
        self.finished: dict[str, SimRequest] = {}
        self._idle = True
        self._settled_ns = self.device.t0
        self._settled_j = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.steps = 0
        self.generated_tokens = 0  # every token streamed, for the /metrics counter
        self.cache = PrefixCache() if config.prefix_cache else None
        # per step: start and end (ns), [request, prompt tokens] chunks, decoding requests, work
        self.step_log: list[tuple[int, int, list[tuple[str, int]], list[str], float]] = []

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def submit(self, request: SimRequest) -> None:
        self.waiting.append(request)
        self._wake.set()

    def abort(self, request: SimRequest) -> None:
        """The client went away: stop working on it (its energy so far stays its own)."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._finish(request, now_ns())

    def _finish(self, request: SimRequest, t_ns: int) -> None:
        if request.finished_ns is None:
            request.finished_ns = t_ns
            self.finished[request.key] = request

    def _step_plan(self) -> tuple[list[tuple[SimRequest, int]], list[SimRequest], float, float]:
        """Admit, then plan one step: (prefill chunks, decoders, duration s, work units)."""
        cfg = self.config
        while self.waiting and len(self.running) < cfg.max_batch:
            admitted = self.waiting.popleft()
            if self.cache is not None:
                admitted.cached_tokens = self.cache.cached_tokens(admitted.prompt, admitted.prompt_tokens)
                admitted.prefilled = admitted.cached_tokens
            self.running.append(admitted)
        budget = cfg.prefill_budget_tokens
        prefill: list[tuple[SimRequest, int]] = []
        decode: list[SimRequest] = []
        for r in self.running:
            if r.in_prefill:
                if budget > 0:
                    chunk = min(budget, r.prompt_tokens - r.prefilled)
                    budget -= chunk
                    prefill.append((r, chunk))
            else:
                decode.append(r)
        p_tokens = sum(c for _, c in prefill)
        seqs = len(decode) + len(prefill)
        duration = 0.0
        if not cfg.zero_delay:
            duration = (
                cfg.step_base_ms + cfg.step_per_seq_ms * seqs + cfg.step_per_prefill_token_ms * p_tokens
            ) / 1000
        return prefill, decode, duration, len(decode) + cfg.prefill_work * p_tokens

    def _dynamic_power(self, work: float) -> float:
        cfg = self.config
        return min(cfg.max_w - cfg.static_w, cfg.dynamic_w * work**cfg.work_exponent) if work > 0 else 0.0

    async def _loop(self) -> None:
        cfg = self.config
        device = self.device
        while True:
            if not self.running and not self.waiting:
                t = now_ns()
                self._settle(t, [], [], [], 0.0)
                device.set_power(t, cfg.static_w)
                self._idle = True
                self._wake.clear()
                await self._wake.wait()
                self._settle(now_ns(), [], [], [], 0.0)
                self._idle = False
                continue
            prefill, decode, duration, work = self._step_plan()
            start = now_ns()
            on_server = [*self.running, *self.waiting]
            self._settle(start, on_server, [], [], 0.0)
            device.set_power(start, cfg.static_w + self._dynamic_power(work))
            await asyncio.sleep(duration)
            end = now_ns()
            self.steps += 1
            self._settle(end, on_server, prefill, decode, work)
            device.set_power(end, cfg.static_w)
            if cfg.record_steps:
                self.step_log.append(
                    (start, end, [(r.key, c) for r, c in prefill], [r.key for r in decode], work)
                )
            for r, chunk in prefill:
                r.prefilled += chunk
                if not r.in_prefill:  # the step that completes a prompt also yields its first token
                    decode.append(r)
                    if self.cache is not None:
                        self.cache.add(r.prompt)
            for r in decode:
                if r.finished_ns is not None:
                    continue
                r.out.put_nowait(r.tokens[r.emitted])
                r.emitted += 1
                self.generated_tokens += 1
                if r.emitted >= len(r.tokens):
                    r.out.put_nowait(None)
                    self.running.remove(r)
                    self._finish(r, end)

    def _settle(
        self,
        t_ns: int,
        on_server: list[SimRequest],
        prefill: list[tuple[SimRequest, int]],
        decode: list[SimRequest],
        work: float,
    ) -> None:
        """Charge the device's energy since the last settlement, so the truth adds up exactly.

        Static energy goes equally to the requests on the server (idle when none), the rest
        to the step's work: a decode token one unit, a prefill token ``prefill_work``.
        """
        energy = self.device.energy_at(t_ns)
        delta = energy - self._settled_j
        self._settled_j = energy
        static = min(delta, self.config.static_w * (t_ns - self._settled_ns) / NS)
        self._settled_ns = t_ns
        dynamic = delta - static
        if on_server:
            share = static / len(on_server)
            for r in on_server:
                r.energy_j += share
        else:
            self.idle_energy_j += static
        if work > 0:
            per_work = dynamic / work
            for r in decode:
                r.energy_j += per_work
            for r, chunk in prefill:
                r.energy_j += per_work * self.config.prefill_work * chunk
        elif on_server:
            for r in on_server:
                r.energy_j += dynamic / len(on_server)
        else:
            self.idle_energy_j += dynamic

    def truth(self) -> dict[str, object]:
        """Each finished request's true energy, and the idle energy, for scoring attribution."""
        if self._idle:
            self._settle(now_ns(), [], [], [], 0.0)
        return {
            "requests": {k: r.energy_j for k, r in self.finished.items()},
            "idle_j": self.idle_energy_j,
            "total_j": self._settled_j,
            "counter_t0_ns": self.device.t0,  # the counter updates at t0 + k × period
            **({"steps": self.step_log} if self.config.record_steps else {}),
        }
