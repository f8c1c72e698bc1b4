"""A continuous-batching inference engine and the device it runs on, both simulated.

Requests queue, take the lowest free of ``max_batch`` slots, and advance in discrete steps. A
step prefills newly admitted prompts (up to a token budget, chunked: each prompt's chunk a
forward of its own) and decodes one token for every running sequence; its duration grows with
the rows decoded, prefill tokens and the KV positions the decoders read, so TTFT and per-token
time respond to load as on a real server. With ``padded_buckets`` the decode is a CUDA graph
over padded buckets: it runs slots 0 to the highest decoding one, padded to the next captured
batch size (``capture_sizes``: a power of two by default), each row at the attention length of
the longest context padded to 128, 256, …; padded rows take time and energy as real ones, so
one decoder in slot 100 costs what 128 do. With ``dense_batch`` the batch is kept dense, as
vLLM's persistent batch is: a step pads its decoders' count, each row reading its own context.

The device (:mod:`.device`) draws a static power (raised by ``clocks_up_w`` while its clocks
are up) and, for the step's work, a dynamic energy: the decode graph's (``decode_step_j`` +
``decode_row_j`` per row + ``decode_row_kv_j`` per row per KV position), each chunk's
(``prefill_forward_j`` + ``prefill_token_j`` per token + ``prefill_token_kv_j`` per token per
position the chunk reaches), and power while the step runs: ``step_w`` plus a curve that grows
sub-linearly with the step's work (a decoding sequence 1 + κ·context/1000, a prompt token
``prefill_work`` × (1 + κp·position/1000)). At ``max_w`` it clips, or stretches the step. The
device works for the step's duration and then waits, at static power, for the engine's loop.

Each request's true energy follows accounting convention v2: an equal share of static energy
(clocks up or not) while it is on the server (with nothing on the server the static energy is
idle); of each step's dynamic energy, the decode graph's equally among the requests decoding in
it (but each row's reads of its own context, where attention is not padded, its own), each chunk's (its forward's fixed part too) to the request prefilled, the part ``step_w``
draws equally among the requests in the step and the curve's by each one's share of its work.
Clipping or stretching scales every part alike. The device exposes what a GPU would: a
cumulative counter in whole mJ on a (jittered) grid, instantaneous and 1-second averaged power
(both possibly lagging), temperature.

By default the engine and device are H100-shaped (:mod:`.physics` says where the numbers come
from): padded buckets, the per-step, per-row, per-chunk and per-token energies, clocks up while
serving, a meter that trails the device by 40 ms on a counter grid jittered by 2 ms, and steps
that stretch at the power limit; the other effects are off (:data:`.physics.ABSENT` turns every
one off, :func:`.physics.drawn_physics` draws them, :data:`.physics.CLASSIC` is the earlier
default).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .._clock import NS, now_ns
from ..energy.padding import POWERS_OF_TWO, parse_capture_sizes
from .device import Device
from .physics import FIRST_LENGTH_BUCKET, MIN_CLOCK, EngineConfig

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
    slot: int = -1  # its KV slot while running
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


def bucket(n: int, first: int) -> int:
    """The smallest of first, 2·first, 4·first, … that holds ``n``."""
    size = first
    while size < n:
        size *= 2
    return size


@dataclass
class Step:
    """One planned step: what it computes, how long it takes at full clocks, and the dynamic
    energy each request in it causes then (convention v2)."""

    prefill: list[Chunk]
    decode: list[Row]
    duration: float  # s
    work: float  # the curve's work units
    caused: dict[SimRequest, float]  # J

    @property
    def demanded_w(self) -> float:
        """The dynamic power the step asks of the device, before its power limit."""
        return sum(self.caused.values()) / self.duration if self.duration > 0 else 0.0


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = Device(config)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self._slots: list[SimRequest | None] = [None] * config.max_batch
        self._capture = parse_capture_sizes(config.capture_sizes) or POWERS_OF_TWO
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
        if request.slot >= 0 and self._slots[request.slot] is request:
            self._slots[request.slot] = None
        if request.finished_ns is None:
            request.finished_ns = t_ns
            self.finished[request.key] = request

    def _positioned(self, first: int, tokens: int) -> float:
        """Prompt tokens at positions first, first+1, … weighted by 1 + κp·position/1000."""
        positions = tokens * first + tokens * (tokens - 1) / 2
        return tokens + self.config.prefill_position_work * positions / 1000

    def _admit(self) -> None:
        """Waiting requests, first come first served, into the lowest free slots."""
        while self.waiting and None in self._slots:
            admitted = self.waiting.popleft()
            admitted.slot = self._slots.index(None)
            self._slots[admitted.slot] = admitted
            if self.cache is not None:
                admitted.cached_tokens = self.cache.cached_tokens(admitted.prompt, admitted.prompt_tokens)
                admitted.prefilled = admitted.cached_tokens
            self.running.append(admitted)

    def _decode_shape(self, decoders: list[SimRequest], contexts: list[int]) -> tuple[int, int]:
        """The rows the decode computes and the KV positions they read: padded to the next
        captured size, slots 0 to the highest decoding one each at the longest context's length
        bucket, or (a dense batch) the decoders each at its own context."""
        if not decoders:
            return 0, 0
        if not self.config.padded_buckets:
            return len(decoders), sum(contexts)
        if self.config.dense_batch:
            return int(self._capture.pad(np.array([len(decoders)]))[0]), sum(contexts)
        rows = min(
            int(self._capture.pad(np.array([max(r.slot for r in decoders) + 1]))[0]), self.config.max_batch
        )
        return rows, rows * bucket(max(contexts), FIRST_LENGTH_BUCKET)

    def _step_plan(self) -> Step:
        """Admit, then plan one step."""
        cfg = self.config
        self._admit()
        budget = cfg.prefill_budget_tokens
        prefill: list[Chunk] = []
        chunk_j: list[float] = []
        decoders: list[SimRequest] = []
        contexts: list[int] = []  # each decoder's tokens of context
        weighted = 0.0  # prompt tokens, weighted by position
        for r in self.running:
            if r.in_prefill:
                if budget > 0:
                    chunk = min(budget, r.prompt_tokens - r.prefilled)
                    budget -= chunk
                    # cached tokens were skipped, but they still set the chunk's positions
                    tokens = self._positioned(r.prefilled, chunk)
                    weighted += tokens
                    prefill.append((r, chunk, cfg.prefill_work * tokens))
                    reach = r.prefilled + chunk
                    chunk_j.append(
                        cfg.prefill_forward_j + chunk * (cfg.prefill_token_j + cfg.prefill_token_kv_j * reach)
                    )
            else:
                decoders.append(r)
                contexts.append(r.prompt_tokens + r.emitted)
        rows, kv = self._decode_shape(decoders, contexts)
        if cfg.padded_buckets and not cfg.dense_batch:  # every row is alike: its decoders share its work
            decode = [(r, (rows + cfg.context_work * kv / 1000) / len(decoders)) for r in decoders]
        else:  # a dense batch's padded rows are shared, each row's own reads its own
            pad = (rows - len(decoders)) / len(decoders) if decoders else 0.0
            decode = [
                (r, 1.0 + pad + cfg.context_work * c / 1000) for r, c in zip(decoders, contexts, strict=True)
            ]
        duration = 0.0
        if not cfg.zero_delay:
            duration = (
                (
                    cfg.step_base_ms
                    + cfg.step_per_seq_ms * (rows + len(prefill))
                    + cfg.step_per_prefill_token_ms * weighted
                    + cfg.step_per_context_ms * kv / 1000
                )
                / 1000
                * self._slowdown()
            )
        work = sum(w for _, w in decode) + cfg.prefill_work * weighted
        caused = self._caused(prefill, chunk_j, decode, rows, kv, work, duration)
        return Step(prefill, decode, duration, work, caused)

    def _caused(
        self,
        prefill: list[Chunk],
        chunk_j: list[float],
        decode: list[Row],
        rows: int,
        kv: int,
        work: float,
        duration: float,
    ) -> dict[SimRequest, float]:
        """Each request's part of the step's dynamic energy at full clocks (convention v2)."""
        cfg = self.config
        caused: dict[SimRequest, float] = {}
        for (r, _, _), j in zip(prefill, chunk_j, strict=True):
            caused[r] = caused.get(r, 0.0) + j
        if decode and (cfg.dense_batch or not cfg.padded_buckets):  # each row reads its own context
            graph = cfg.decode_step_j + cfg.decode_row_j * rows
            for r, _ in decode:
                own = cfg.decode_row_kv_j * (r.prompt_tokens + r.emitted)
                caused[r] = caused.get(r, 0.0) + graph / len(decode) + own
        elif decode:
            graph = cfg.decode_step_j + cfg.decode_row_j * rows + cfg.decode_row_kv_j * kv
            for r, _ in decode:
                caused[r] = caused.get(r, 0.0) + graph / len(decode)
        if work > 0:
            # a request that decodes and prefills in the step is in it once
            in_step = list(dict.fromkeys([*(r for r, _ in decode), *(r for r, _, _ in prefill)]))
            fixed = cfg.step_w * duration / len(in_step)
            per_work = cfg.dynamic_w * work**cfg.work_exponent * duration / work
            for r in in_step:
                caused[r] = caused.get(r, 0.0) + fixed
            for r, w in [*decode, *((r, w) for r, _, w in prefill)]:
                caused[r] += per_work * w
        return caused

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

    def _step_power(self, static_w: float, demanded_w: float, duration: float) -> tuple[float, float]:
        """The step's dynamic power and duration, given the power limit."""
        cfg = self.config
        headroom = cfg.max_w - static_w
        if demanded_w <= headroom:
            return demanded_w, duration
        if cfg.power_limit == "stretch":
            # Clocks drop until the step fits: dynamic power goes as f·V² with V roughly as f,
            # so as f³, and time as 1/f. Clocks fall to MIN_CLOCK at most; beyond, power clips.
            clock = max((headroom / demanded_w) ** (1 / 3), MIN_CLOCK)
            duration /= clock
        return headroom, duration

    def _idle_wait_s(self, t_ns: int) -> float | None:
        """How long an idle engine may wait before the device's held static power must be set
        again (a warm die cooling, the clocks dropping); None: until a request comes."""
        waits = [IDLE_RESET_S] if self.config.thermal_leak_w > 0 else []
        drop = self.device.clocks_drop_ns()
        if drop is not None:
            waits.append(max(0.0, (drop - t_ns) / NS))
        return min(waits, default=None)

    async def _loop(self) -> None:
        cfg = self.config
        device = self.device
        free = 0  # when the last step's work ends: a timer firing early must not start before
        while True:
            if not self.running and not self.waiting:
                t = max(now_ns(), free)
                self._settle(t, [])
                device.set_power(t, 0.0)
                self._idle = True
                self._wake.clear()
                wait = self._idle_wait_s(t)
                if wait is None:
                    await self._wake.wait()
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), wait)
                self._settle(now_ns(), [])
                self._idle = False
                continue
            step = self._step_plan()
            start = max(now_ns(), free)
            on_server = [*self.running, *self.waiting]
            self._settle(start, on_server)
            dynamic_w, duration = self._step_power(
                device.static_at(start, working=True), step.demanded_w, step.duration
            )
            # the device works for the step's duration, then waits at static power for this
            # loop to wake: a late wake-up costs no dynamic energy, so the step's is exact
            worked = free = start + round(duration * NS)
            static_w = device.set_power(start, dynamic_w, until_ns=worked)
            await asyncio.sleep(duration)
            end = max(now_ns(), worked)  # a timer may fire a hair early: the whole step is in
            self.steps += 1
            self._settle(end, on_server, step.caused)
            if cfg.record_steps:
                chunks: list[list[object]] = [[r.key, c, w] for r, c, w in step.prefill]
                rows: list[list[object]] = [[r.key, w] for r, w in step.decode]
                caused = [[r.key, j] for r, j in step.caused.items()]
                self.step_log.append((start, worked, chunks, rows, step.work, static_w, dynamic_w, caused))
            emitting = [r for r, _ in step.decode]
            for r, chunk, _ in step.prefill:
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

    def _settle(
        self, t_ns: int, on_server: list[SimRequest], caused: dict[SimRequest, float] | None = None
    ) -> None:
        """Charge the device's true energy since the last settlement, so the truth adds up exactly.

        Static energy (clocks up or not, as warm as the device is) goes equally to the requests
        on the server (idle when none); a step's dynamic energy in proportion to what each
        request ``caused`` of it at full clocks (convention v2; the power limit scales every
        part alike).
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
        total = sum(caused.values()) if caused else 0.0
        if caused and total > 0:
            for r, j in caused.items():
                r.energy_j += dynamic * j / total
        elif on_server:
            for r in on_server:
                r.energy_j += dynamic / len(on_server)
        else:
            self.idle_energy_j += dynamic

    def truth(self) -> dict[str, object]:
        """Each finished request's true energy, and the idle energy, for scoring attribution.

        ``total_j`` is the device's true energy; ``metered_total_j`` what its (lagging) meter
        integrated by then. With ``record_steps``, ``steps`` lists each engine step as
        ``(start_ns, end_ns, chunks, decoders, work, static_w, dynamic_w, caused)``: ``end_ns``
        when the device finished its work (its tokens stream when the engine's loop wakes, a
        little later), ``chunks`` as ``[request key, prompt tokens in the chunk, the chunk's
        work]``, ``decoders`` as ``[request key, its decode work]`` (padded: the graph's work
        shared equally), ``work`` the step's total, ``static_w`` the static power during it,
        ``dynamic_w`` the power above it (after the power limit) and ``caused`` as ``[request
        key, the joules it caused at full clocks]``: the step's split by convention v2.
        """
        if self._idle:
            self._settle(now_ns(), [])
        return {
            "requests": {k: r.energy_j for k, r in self.finished.items()},
            "idle_j": self.idle_energy_j,
            "total_j": self._settled_j,
            "metered_total_j": self.device.metered_energy_at(self._settled_ns),
            "counter_t0_ns": self.device.t0,  # the counter updates near t0 + k × period
            **({"steps": self.step_log} if self.config.record_steps else {}),
        }
