"""The failures the simulator injects (seeded, per request), and its own account of them."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .._options import option


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


@dataclass(frozen=True)
class StreamFaults:
    """The faults one stream meets, all at its token ``at``."""

    at: int
    error_event: bool
    disconnect: bool
    malformed: bool
    stall: bool

    @classmethod
    def draw(cls, faults: Faults, rng: random.Random, n_tokens: int) -> StreamFaults:
        # always the same draws in the same order: a seed injects the same faults run after run
        at = rng.randrange(n_tokens) if n_tokens else 0
        error_event = rng.random() < faults.error_event
        disconnect = rng.random() < faults.disconnect
        malformed = rng.random() < faults.malformed
        stall = rng.random() < faults.stall
        return cls(at, error_event, disconnect, malformed, stall)


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
