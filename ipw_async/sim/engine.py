"""A continuous-batching inference engine and the device it runs on, both simulated.

Requests queue, join the running batch up to ``max_batch``, and advance in discrete steps.
A step prefills newly admitted prompts (up to a token budget, chunked) and decodes one token
for every running sequence; its duration grows with batch size, prefill tokens and (with
``step_per_context_ms``) the batch's context, so TTFT and per-token time respond to load as on
a real server.

The device (:mod:`.device`) draws a static power plus, during a step, ``step_w`` and a dynamic
power that grows sub-linearly with the step's work: a decoding sequence 1 + κ·context/1000, a
prompt token ``prefill_work`` × (1 + κp·position/1000). At ``max_w`` it clips, or stretches the
step. Each request's true energy follows accounting convention v2: an equal share of static
energy while it is on the server (with nothing on the server the static energy is idle), an
equal share of the part of every step's dynamic energy that ``step_w`` draws among the requests
in the step, and its work share of the rest. The device exposes what a GPU would: a
cumulative counter in whole mJ on a (jittered) grid, instantaneous and 1-second averaged power (both possibly lagging), temperature.

By default the device has a cost per step whatever its batch (not yet the H100's per-step energy, padded buckets and prefill forwards),
a meter that trails the device by 40 ms on a counter grid jittered by 2 ms, and steps that
stretch at the power limit; the other effects are off (:mod:`.physics`: :data:`ABSENT` turns
every one off, :func:`drawn_physics` draws them).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import deque
from dataclasses import dataclass, field

from .._clock import now_ns
from .device import Device
from .physics import MIN_CLOCK, EngineConfig

IDLE_RESET_S = 0.05  # how often an idle, warm device re-sets its (cooling) static power


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


Chunk = tuple[SimRequest, int, float]  # a prompt's chunk in a step: request, tokens, work
Row = tuple[SimRequest, float]  # a decoding sequence in a step: request, work
StepEntry = tuple[int, int, list[list[object]], list[list[object]], float, float]


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
        self._settled_static_j = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.steps = 0
        self.generated_tokens = 0  # every token streamed, for the /metrics counter
        self.cache = PrefixCache() if config.prefix_cache else None
        self.step_log: list[StepEntry] = []  # format: see truth()
        self._started_ns = now_ns()

    def start(self) -> None:
        self._started_ns = now_ns()
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

    def _positioned(self, first: int, tokens: int) -> float:
        """Prompt tokens at positions first, first+1, … weighted by 1 + κp·position/1000."""
        positions = tokens * first + tokens * (tokens - 1) / 2
        return tokens + self.config.prefill_position_work * positions / 1000

    def _step_plan(self) -> tuple[list[Chunk], list[Row], float, float]:
        """Admit, then plan one step: (prefill chunks, decoders, duration s, work units)."""
        cfg = self.config
        while self.waiting and len(self.running) < cfg.max_batch:
            admitted = self.waiting.popleft()
            if self.cache is not None:
                admitted.cached_tokens = self.cache.cached_tokens(admitted.prompt, admitted.prompt_tokens)
                admitted.prefilled = admitted.cached_tokens
            self.running.append(admitted)
        budget = cfg.prefill_budget_tokens
        prefill: list[Chunk] = []
        decode: list[Row] = []
        weighted = 0.0  # prompt tokens, weighted by position
        context = 0  # tokens of context the decoders read
        for r in self.running:
            if r.in_prefill:
                if budget > 0:
                    chunk = min(budget, r.prompt_tokens - r.prefilled)
                    budget -= chunk
                    # cached tokens were skipped, but they still set the chunk's positions
                    tokens = self._positioned(r.prefilled, chunk)
                    weighted += tokens
                    prefill.append((r, chunk, cfg.prefill_work * tokens))
            else:
                seq_context = r.prompt_tokens + r.emitted
                context += seq_context
                decode.append((r, 1.0 + cfg.context_work * seq_context / 1000))
        seqs = len(decode) + len(prefill)
        duration = 0.0
        if not cfg.zero_delay:
            duration = (
                (
                    cfg.step_base_ms
                    + cfg.step_per_seq_ms * seqs
                    + cfg.step_per_prefill_token_ms * weighted
                    + cfg.step_per_context_ms * context / 1000
                )
                / 1000
                * self._slowdown()
            )
        return prefill, decode, duration, sum(w for _, w in decode) + cfg.prefill_work * weighted

    def _slowdown(self) -> float:
        """The planted warm-up and level shift: how many times longer a step takes now."""
        cfg = self.config
        age = (now_ns() - self._started_ns) / 1e9
        factor = 1.0
        if age < cfg.slow_start_s:
            factor *= 1 + (cfg.slow_start_factor - 1) * (1 - age / cfg.slow_start_s)
        if cfg.slow_after_s and age >= cfg.slow_after_s:
            factor *= cfg.slow_after_factor
        return factor

    def _step_power(self, static_w: float, work: float, duration: float) -> tuple[float, float]:
        """The step's dynamic power and duration, given the power limit."""
        cfg = self.config
        if work <= 0:
            return 0.0, duration
        demanded = self._demanded(work)
        headroom = cfg.max_w - static_w
        if demanded <= headroom:
            return demanded, duration
        if cfg.power_limit == "stretch":
            # Clocks drop until the step fits: dynamic power goes as f·V² with V roughly as f,
            # so as f³, and time as 1/f. Clocks fall to MIN_CLOCK at most; beyond, power clips.
            clock = max((headroom / demanded) ** (1 / 3), MIN_CLOCK)
            duration /= clock
        return headroom, duration

    async def _loop(self) -> None:
        cfg = self.config
        device = self.device
        while True:
            if not self.running and not self.waiting:
                t = now_ns()
                self._settle(t, [], [], [], 0.0)
                device.set_power(t, 0.0)
                self._idle = True
                self._wake.clear()
                if cfg.thermal_leak_w > 0:  # static power is held per segment: re-set it as the die cools
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), IDLE_RESET_S)
                else:
                    await self._wake.wait()
                self._settle(now_ns(), [], [], [], 0.0)
                self._idle = False
                continue
            prefill, decode, duration, work = self._step_plan()
            start = now_ns()
            on_server = [*self.running, *self.waiting]
            self._settle(start, on_server, [], [], 0.0)
            static_w = device.static_at(start)
            dynamic_w, duration = self._step_power(static_w, work, duration)
            device.set_power(start, dynamic_w)
            await asyncio.sleep(duration)
            end = now_ns()
            self.steps += 1
            self._settle(end, on_server, prefill, decode, work, self._fixed_share(work))
            device.set_power(end, 0.0)
            if cfg.record_steps:
                chunks: list[list[object]] = [[r.key, c, w] for r, c, w in prefill]
                rows: list[list[object]] = [[r.key, w] for r, w in decode]
                self.step_log.append((start, end, chunks, rows, work, static_w))
            emitting = [r for r, _ in decode]
            for r, chunk, _ in prefill:
                r.prefilled += chunk
                if not r.in_prefill:  # the step that completes a prompt also yields its first token
                    emitting.append(r)
                    if self.cache is not None:
                        self.cache.add(r.prompt)
            for r in emitting:
                if r.finished_ns is not None:
                    continue
                r.out.put_nowait(r.tokens[r.emitted])
                r.emitted += 1
                self.generated_tokens += 1
                if r.emitted >= len(r.tokens):
                    r.out.put_nowait(None)
                    self.running.remove(r)
                    self._finish(r, end)

    def _demanded(self, work: float) -> float:
        """The dynamic power a step of this work asks of the device, before its power limit."""
        cfg = self.config
        return cfg.step_w + cfg.dynamic_w * work**cfg.work_exponent

    def _fixed_share(self, work: float) -> float:
        """The share of a step's dynamic energy its per-step power draws (the rest grows with
        work): the same share at a clipped or stretched limit, which scales both alike."""
        return self.config.step_w / self._demanded(work) if work > 0 else 0.0

    def _settle(
        self,
        t_ns: int,
        on_server: list[SimRequest],
        prefill: list[Chunk],
        decode: list[Row],
        work: float,
        fixed: float = 0.0,
    ) -> None:
        """Charge the device's true energy since the last settlement, so the truth adds up exactly.

        Static energy (as warm as the device is) goes equally to the requests on the server
        (idle when none); of the step's dynamic energy, the ``fixed`` share equally to the
        requests in the step and the rest by each one's share of its work (convention v2).
        """
        energy = self.device.energy_at(t_ns)
        static_j = self.device.static_energy_at(t_ns)
        delta = energy - self._settled_j
        static = static_j - self._settled_static_j
        self._settled_j = energy
        self._settled_static_j = static_j
        self._settled_ns = t_ns
        dynamic = delta - static
        if on_server:
            share = static / len(on_server)
            for r in on_server:
                r.energy_j += share
        else:
            self.idle_energy_j += static
        if work > 0:
            in_step = list(
                {id(r): r for r in [*(r for r, _ in decode), *(r for r, _, _ in prefill)]}.values()
            )
            # a request that decodes and prefills in the step is in it once
            for r in in_step:
                r.energy_j += fixed * dynamic / len(in_step)
            per_work = (1.0 - fixed) * dynamic / work
            for r, w in decode:
                r.energy_j += per_work * w
            for r, _, w in prefill:
                r.energy_j += per_work * w
        elif on_server:
            for r in on_server:
                r.energy_j += dynamic / len(on_server)
        else:
            self.idle_energy_j += dynamic

    def truth(self) -> dict[str, object]:
        """Each finished request's true energy, and the idle energy, for scoring attribution.

        ``total_j`` is the device's true energy; ``metered_total_j`` what its (lagging) meter
        integrated by then. With ``record_steps``, ``steps`` lists each engine step as
        ``(start_ns, end_ns, chunks, decoders, work, static_w)``: ``chunks`` as ``[request key,
        prompt tokens in the chunk, the chunk's work]``, ``decoders`` as ``[request key, its
        decode work]``, ``work`` the step's total and ``static_w`` the static power during it.
        """
        if self._idle:
            self._settle(now_ns(), [], [], [], 0.0)
        return {
            "requests": {k: r.energy_j for k, r in self.finished.items()},
            "idle_j": self.idle_energy_j,
            "total_j": self._settled_j,
            "metered_total_j": self.device.metered_energy_at(self._settled_ns),
            "counter_t0_ns": self.device.t0,  # the counter updates near t0 + k × period
            **({"steps": self.step_log} if self.config.record_steps else {}),
        }
