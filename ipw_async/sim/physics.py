"""The simulated server's physics: the engine's step times and the device's power, static,
meter and limits (:class:`EngineConfig`), the effects a real device has, and random draws of
them for testing attribution over a family of devices.

The default device is H100-shaped, from a steady-state probe of an 8B-shaped model (CUDA graphs
over padded decode buckets, chunked eager prefill) on one H100 80GB
(``shared/traces/h100-8b-graphs/physics.json``). Dynamic energy, above the probe's 72.7 W idle,
is 2.225 J per decode step + 0.01277 J per padded row + 2.249e-5 J per padded row per KV
position, and 0.841 J per prefill chunk + 0.01368 J per prompt token + 1.02e-6 J per token per
position the chunk reaches. Step times are least-squares fits to the same probe and GPU-bound
(the probe's server was host-bound in prefill; the simulator is not): 8.0 ms + 0.014 ms per
padded row + 0.046 ms per 1000 KV positions over the padded batch (8.0 ms at one row of 512
positions and 21.9 ms at 128 × 2048, against the probe's 7.6 and 21.8 ms), and 0.021 ms per
prompt token (a 512-token chunk alone 18.8 ms, 2,048 tokens 51 ms, against 16.7 and 55 ms).
Idle static is 72.7 W; with the clocks up, while serving, it is 124 W, what the H100 runs'
baseline windows read (123.5–125.5 W, SM at 1980 MHz); the runs' fits of their meters found
that static with the probe's dynamic costs at 0.9–1.35 times their value. Taken together the
two count the clocks' ~51 W twice in a step's power, and a step here is a little shorter than
the probe's: a full 2,048-token prefill step asks ~775 W and stretches 4% at the 700 W limit
(the probe's drew 677 W). The power-law curve and per-step power of earlier versions are off
by default (:data:`CLASSIC` is that device).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from .._options import option
from ..energy.padding import AUTO, parse_capture_sizes

TELEMETRY_KINDS = ("counter", "power", "avg-power")
COUNTER_FAULTS = ("none", "stuck", "backwards")
POWER_LIMITS = ("clip", "stretch")
MIN_CLOCK = 0.4  # the least share of its clock a device at its power limit drops to (~800 of 1980 MHz)
FIRST_LENGTH_BUCKET = 128  # the shortest attention length a padded decode graph runs


@dataclass
class EngineConfig:
    max_batch: int = field(
        default=128,
        metadata=option("Most sequences decoded together in one step (the engine's KV slots)."),
    )
    step_base_ms: float = field(
        default=8.0, metadata=option("Duration of an engine step with an empty batch.")
    )
    step_per_seq_ms: float = field(
        default=0.014,
        metadata=option("Extra step time per sequence in the batch (per padded row with --padded-buckets)."),
    )
    step_per_prefill_token_ms: float = field(
        default=0.021, metadata=option("Extra step time per prompt token prefilled.")
    )
    prefill_budget_tokens: int = field(
        default=2048,
        metadata=option("Most prompt tokens prefilled in one step (chunked prefill).", "--prefill-budget"),
    )
    zero_delay: bool = field(
        default=False, metadata=option("Steps take no time: measure the client, not the model.")
    )
    padded_buckets: bool = field(
        default=True,
        metadata=option(
            "Decode as a CUDA graph over padded buckets: requests take the lowest free slot, and "
            "a step runs slots 0 to the highest decoding one, padded to a power of two (at most "
            "--max-batch), at an attention length padded to 128, 256, … by the longest context. "
            "Padded rows cost work, energy and time as real ones."
        ),
    )
    capture_sizes: str = field(
        default="pow2",
        metadata=option(
            "The batch sizes the padded decode graphs were captured at: pow2, vllm (1, 2, 4, then "
            "multiples of 8) or the sizes (e.g. 1,2,4,8,16); a batch past the largest runs as it is."
        ),
    )
    dense_batch: bool = field(
        default=False,
        metadata=option(
            "With --padded-buckets, keep the batch dense as vLLM's persistent batch does: a step "
            "pads its decoders' count, and each row reads its own context (no padded length)."
        ),
    )
    # device
    static_w: float = field(default=72.7, metadata=option("Device idle (static) power in watts."))
    clocks_up_w: float = field(
        default=51.3,
        metadata=option(
            "Static power added while the device's clocks are up: from the server's start or "
            "its last step until --clock-down-s idle (0: static is idle static throughout)."
        ),
    )
    clock_down_s: float = field(
        default=10.0, metadata=option("Seconds idle after which the clocks drop to idle static.")
    )
    decode_step_j: float = field(
        default=2.225, metadata=option("Dynamic energy of a decode step, whatever its batch, J.")
    )
    decode_row_j: float = field(
        default=0.01277, metadata=option("Dynamic energy per decode row (padded row), J.")
    )
    decode_row_kv_j: float = field(
        default=2.249e-5,
        metadata=option("Dynamic energy per decode row (padded row) per KV position it reads, J."),
    )
    prefill_forward_j: float = field(
        default=0.841,
        metadata=option("Dynamic energy of each prompt chunk's forward pass, whatever its size, J."),
    )
    prefill_token_j: float = field(
        default=0.01368, metadata=option("Dynamic energy per prompt token prefilled, J.")
    )
    prefill_token_kv_j: float = field(
        default=1.02e-6,
        metadata=option("Dynamic energy per prompt token per position its chunk reaches (tokens × end), J."),
    )
    dynamic_w: float = field(
        default=0.0, metadata=option("Dynamic power of one decoding sequence in watts (the curve).")
    )
    work_exponent: float = field(
        default=0.6, metadata=option("Dynamic power grows as work ** this (sub-linear).")
    )
    prefill_work: float = field(
        default=0.3, metadata=option("A prompt token's work relative to an output token.")
    )
    max_w: float = field(default=700.0, metadata=option("Device power limit in watts."))
    power_limit: str = field(
        default="stretch",
        metadata=option(
            "At the power limit: clip (power capped, steps as long as ever) or stretch (clocks "
            "drop, to 40% at most: steps last longer at the limit's power)."
        ),
    )
    step_w: float = field(
        default=0.0,
        metadata=option("Power drawn while any step runs, whatever its batch (weight streaming, launches)."),
    )
    context_work: float = field(
        default=0.0,
        metadata=option("Extra work of a decoding sequence per 1000 tokens of its context (KV cache reads)."),
    )
    step_per_context_ms: float = field(
        default=0.046,
        metadata=option(
            "Extra step time per 1000 tokens of context across the batch (the padded batch at "
            "its padded length with --padded-buckets)."
        ),
    )
    prefill_position_work: float = field(
        default=0.0,
        metadata=option("Extra work (and time) of a prompt token per 1000 tokens of position in its prompt."),
    )
    meter_lag_ms: float = field(
        default=40.0, metadata=option("Time constant of the meter's lag behind the device's power, ms.")
    )
    counter_jitter_ms: float = field(
        default=2.0,
        metadata=option("Each counter update lands up to this many ms off its grid (fixed per update)."),
    )
    thermal_leak_w: float = field(
        default=0.0, metadata=option("Static power added by a fully warm die, W (0: static never drifts).")
    )
    thermal_tau_s: float = field(
        default=20.0, metadata=option("Time constant of the die warming and cooling, s.")
    )
    counter_period_ms: float = field(
        default=100.0, metadata=option("Energy counter update period in ms.", "--counter-ms")
    )
    telemetry: str = field(
        default="counter",
        metadata=option("What the device exposes: counter, power or avg-power.", "--device-telemetry"),
    )
    counter_fault: str = field(
        default="none",
        metadata=option(
            "A fault of the energy counter, as real ones have: stuck (it never moves) or backwards "
            "(every tenth update it reads an older value), to test the run's counter check.",
            choices=COUNTER_FAULTS,
        ),
    )
    # every Nth second the device answers nothing (0: never): gaps that force imputation
    dropout_every_s: int = field(
        default=0,
        metadata=option(
            "The device answers nothing every Nth second (0: never), to test imputation.",
            "--device-dropout-every",
        ),
    )

    slow_start_s: float = field(
        default=0.0,
        metadata=option(
            "Steps run slow for this many seconds after the server starts (kernels compiling, "
            "caches warming), by --slow-start-factor at first, fading linearly (0: never)."
        ),
    )
    slow_start_factor: float = field(
        default=2.0, metadata=option("How many times longer a step takes at the server's start.")
    )
    slow_after_s: float = field(
        default=0.0,
        metadata=option(
            "From this many seconds after the server starts, every step takes --slow-after-factor "
            "times as long: a throttled or shared device (0: never)."
        ),
    )
    slow_after_factor: float = field(
        default=1.5, metadata=option("How many times longer a step takes after --slow-after-s.")
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
        if self.counter_fault not in COUNTER_FAULTS:
            raise ValueError(f"--counter-fault must be one of {', '.join(COUNTER_FAULTS)}")
        if self.power_limit not in POWER_LIMITS:
            raise ValueError(
                f"--power-limit must be one of {', '.join(POWER_LIMITS)}, not {self.power_limit!r}"
            )
        if self.max_w <= self.static_w + self.thermal_leak_w + self.clocks_up_w:
            raise ValueError(
                f"--max-w ({self.max_w:g} W) must exceed the warm static power with the clocks up "
                f"({self.static_w:g} + {self.thermal_leak_w:g} + {self.clocks_up_w:g} W)"
            )
        if self.capture_sizes == AUTO:
            raise ValueError(
                "--capture-sizes: a simulated engine captures pow2, vllm or given sizes, not auto"
            )
        parse_capture_sizes(self.capture_sizes)
        if self.thermal_tau_s <= 0:
            raise ValueError("--thermal-tau-s must be positive")
        negative = [name for name in (*_EFFECT_AMOUNTS, "clock_down_s") if getattr(self, name) < 0]
        if negative:
            raise ValueError(f"cannot be negative: {', '.join(negative)}")


# The default device before it was H100-shaped (ipw-async 0.3): static plus a power-law curve in
# the step's work and a per-step power, longer steps, no padding, no per-step or per-chunk energy.
CLASSIC: dict[str, object] = {
    "step_base_ms": 14.0,
    "step_per_seq_ms": 0.12,
    "step_per_prefill_token_ms": 0.03,
    "step_per_context_ms": 0.0,
    "padded_buckets": False,
    "static_w": 70.0,
    "clocks_up_w": 0.0,
    "decode_step_j": 0.0,
    "decode_row_j": 0.0,
    "decode_row_kv_j": 0.0,
    "prefill_forward_j": 0.0,
    "prefill_token_j": 0.0,
    "prefill_token_kv_j": 0.0,
    "dynamic_w": 28.0,
    "work_exponent": 0.6,
    "prefill_work": 0.3,
    "step_w": 60.0,
}

# every effect field at its absent value, over the classic device: the device as it was before
# any effect existed (its curve, static and step times), whatever the default device has
ABSENT: dict[str, object] = CLASSIC | {
    "step_w": 0.0,
    "context_work": 0.0,
    "step_per_context_ms": 0.0,
    "prefill_position_work": 0.0,
    "meter_lag_ms": 0.0,
    "counter_jitter_ms": 0.0,
    "thermal_leak_w": 0.0,
    "thermal_tau_s": 20.0,
    "max_w": 700.0,
    "power_limit": "clip",
}
_EFFECT_AMOUNTS = (
    "step_w",
    "context_work",
    "step_per_context_ms",
    "prefill_position_work",
    "meter_lag_ms",
    "counter_jitter_ms",
    "thermal_leak_w",
    "decode_step_j",
    "decode_row_j",
    "decode_row_kv_j",
    "prefill_forward_j",
    "prefill_token_j",
    "prefill_token_kv_j",
    "clocks_up_w",
)

# one representative setting per effect, each within drawn_physics' ranges (the H100's values)
EFFECTS: dict[str, dict[str, object]] = {
    "step": {"step_w": 60.0},
    "context": {"context_work": 0.3, "step_per_context_ms": 0.02},
    "position": {"prefill_position_work": 0.2},
    "lag": {"meter_lag_ms": 50.0},
    "jitter": {"counter_jitter_ms": 2.0},
    "thermal": {"thermal_leak_w": 30.0, "thermal_tau_s": 20.0},
    "stretch": {"max_w": 300.0, "power_limit": "stretch"},
    "graph": {"decode_step_j": 2.225},
    "rows": {"decode_row_j": 0.01277, "decode_row_kv_j": 2.249e-5},
    "padded": {"padded_buckets": True},
    "forward": {"prefill_forward_j": 0.841},
    "tokens": {"prefill_token_j": 0.01368, "prefill_token_kv_j": 1.02e-6},
    "serving": {"clocks_up_w": 51.3},
}


def effects_of(config: EngineConfig) -> list[str]:
    """The names (keys of :data:`EFFECTS`) of the real-device effects present in ``config``."""
    present = {
        "step": config.step_w > 0,
        "context": config.context_work > 0 or config.step_per_context_ms > 0,
        "position": config.prefill_position_work > 0,
        "lag": config.meter_lag_ms > 0,
        "jitter": config.counter_jitter_ms > 0,
        "thermal": config.thermal_leak_w > 0,
        "stretch": config.power_limit == "stretch",
        "graph": config.decode_step_j > 0,
        "rows": config.decode_row_j > 0 or config.decode_row_kv_j > 0,
        "padded": config.padded_buckets,
        "forward": config.prefill_forward_j > 0,
        "tokens": config.prefill_token_j > 0 or config.prefill_token_kv_j > 0,
        "serving": config.clocks_up_w > 0,
    }
    return [name for name in EFFECTS if present[name]]


def drawn_physics(seed: int, *, effects: bool = True, **fixed: object) -> EngineConfig:
    """A server and device drawn at random from ``seed``: the simulator as a family, so an
    attribution rule is tested over a family of physics. Each real-device effect is
    present in about 60% of draws, the H100's (per-step, per-row, per-chunk and per-token
    energy, padded buckets, the serving static) in about half (none with ``effects=False``);
    padded graphs capture powers of two or vLLM's sizes, over slots or a dense batch, alike.
    ``fixed`` pins fields."""
    rng = random.Random(seed)

    def log_uniform(low: float, high: float, rng: random.Random = rng) -> float:
        return math.exp(rng.uniform(math.log(low), math.log(high)))

    drawn: dict[str, object] = {
        **ABSENT,  # an effect not drawn is absent, whatever the default device has
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
    if effects:
        # streams of their own, so the draws above (and the first effects' below) stay what
        # they were before each family of effects existed
        fx = random.Random(seed + 1_000_003)
        h100 = random.Random(seed + 2_000_003)
        period = float(fixed.get("counter_period_ms", drawn["counter_period_ms"]))  # type: ignore[arg-type]
        static = float(fixed.get("static_w", drawn["static_w"]))  # type: ignore[arg-type]
        if fx.random() < 0.6:
            drawn["step_w"] = fx.uniform(10.0, 120.0)
        if fx.random() < 0.6:
            drawn["context_work"] = log_uniform(0.05, 1.0, fx)
            drawn["step_per_context_ms"] = log_uniform(0.005, 0.05, fx)
        if fx.random() < 0.6:
            drawn["prefill_position_work"] = fx.uniform(0.05, 0.5)
        if fx.random() < 0.6:
            drawn["meter_lag_ms"] = fx.uniform(10.0, 100.0)
        if fx.random() < 0.6:
            drawn["counter_jitter_ms"] = fx.uniform(0.5, min(5.0, period / 4))
        if fx.random() < 0.6:
            drawn["thermal_leak_w"] = fx.uniform(5.0, 60.0)
            drawn["thermal_tau_s"] = fx.uniform(5.0, 60.0)
        if h100.random() < 0.5:
            drawn["decode_step_j"] = log_uniform(0.5, 4.0, h100)
        if h100.random() < 0.5:
            drawn["decode_row_j"] = log_uniform(0.005, 0.03, h100)
            drawn["decode_row_kv_j"] = log_uniform(0.5e-5, 5e-5, h100)
        drawn["padded_buckets"] = h100.random() < 0.5
        if h100.random() < 0.5:
            drawn["prefill_forward_j"] = log_uniform(0.2, 2.0, h100)
        if h100.random() < 0.5:
            drawn["prefill_token_j"] = log_uniform(0.005, 0.03, h100)
            drawn["prefill_token_kv_j"] = log_uniform(0.3e-6, 3e-6, h100)
        if h100.random() < 0.5:
            drawn["clocks_up_w"] = static * h100.uniform(0.0, 0.8)  # serving static 1.0–1.8 × idle
        serving = float(fixed.get("clocks_up_w", drawn["clocks_up_w"]))  # type: ignore[arg-type]
        if fx.random() < 0.5:
            drawn["max_w"] = static + serving + fx.uniform(150.0, 600.0)
            drawn["power_limit"] = "stretch" if fx.random() < 0.5 else "clip"
        # padded graphs as vLLM captures and lays them out, in half the draws each
        graphs = random.Random(seed + 3_000_003)
        drawn["capture_sizes"] = "vllm" if graphs.random() < 0.5 else "pow2"
        drawn["dense_batch"] = graphs.random() < 0.5
    return EngineConfig(**(drawn | fixed))  # type: ignore[arg-type]
