"""How a run's energy is to be attributed, as its user says it: the rule, the fitted rule's
effects, how context reads are shared, the capture sizes. Apart from the stages that act on
them, so that reading a run's options (the command line, a run's config) needs no solver.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .padding import AUTO, CaptureSizes, parse_capture_sizes

# the rules (attribution.RULES holds what each does), the effects a power model may have
# (parameters.PARAMETERS holds their parameters), and how a step's context reads are shared
RULE_NAMES = ("steps", "fitted", "tokens", "equal", "window")
EFFECTS = ("curve", "step", "padding", "context", "position", "lag", "drift")
CONTEXT_COSTS = ("shared", "own")
DEFAULT_CONTEXT_COST = "own"
POWER_MODEL_NEEDS_FITTED = (
    "--power-model sets the fitted rule's model of the device: add --attribution fitted "
    "(the steps rule fits step costs instead)"
)
DEFAULT_PREFILL_WEIGHT = 0.25  # a prompt token's work against an output token (prefill is batched)


@dataclass(frozen=True)
class AttributionConfig:
    rule: str = "steps"
    prefill_weight: float = DEFAULT_PREFILL_WEIGHT
    power_model: str = "auto"  # the fitted rule's effects: chosen by the run, or given (parse_effects)
    context_cost: str = DEFAULT_CONTEXT_COST  # the steps rule's context reads: each request's own, or shared by its step's decoders
    capture_sizes: str = AUTO  # the batch sizes decode graphs pad to (padding.parse_capture_sizes)
    baseline_w: float | None = None  # given idle power for accelerator meters
    baseline_window_ns: tuple[int, int] | None = None  # measure idle power over this window
    session_starts_ns: tuple[int, ...] = ()  # resumed sessions: no energy counted across the gap
    gap_factor: float = 4.0  # a telemetry gap longer than this × median spacing is imputed

    def __post_init__(self) -> None:
        if self.rule not in RULE_NAMES:
            raise ValueError(f"unknown attribution rule {self.rule!r}; choose one of {', '.join(RULE_NAMES)}")
        self.effects  # noqa: B018 (parsed once, here: raises ValueError, naming what it takes)
        self.capture  # noqa: B018 (likewise)
        if self.rule == "steps" and self.power_model != "auto":
            raise ValueError(POWER_MODEL_NEEDS_FITTED)
        if self.context_cost not in CONTEXT_COSTS:
            raise ValueError(
                f"unknown context cost {self.context_cost!r}; choose {' or '.join(CONTEXT_COSTS)}"
            )

    @cached_property
    def effects(self) -> frozenset[str] | None:
        """The fitted rule's effects as given (``power_model``); None: the run chooses them."""
        return parse_effects(self.power_model)

    @cached_property
    def capture(self) -> CaptureSizes | None:
        """The capture sizes as given; None: the step times choose them."""
        return parse_capture_sizes(self.capture_sizes)


def parse_effects(text: str) -> frozenset[str] | None:
    """A ``--power-model`` setting: ``auto`` (None: chosen by the run), ``linear`` (no effect),
    or effects joined by ``+`` (e.g. ``curve+lag``)."""
    if text == "auto":
        return None
    if text == "linear":
        return frozenset()
    effects = frozenset(text.split("+"))
    unknown = sorted(effects - set(EFFECTS))
    if unknown:
        raise ValueError(
            f"unknown power-model effect {unknown[0]!r}: give auto, linear, or effects joined by + "
            f"from {', '.join(EFFECTS)} (e.g. curve+lag)"
        )
    return effects
