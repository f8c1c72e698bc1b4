"""What a run asks of its validity checks, as its user says it: the precision its means must
reach, and what over-saturation does. Apart from the checks, so that reading a run's options
needs no statistics library."""

from __future__ import annotations

OVERSATURATION_ACTIONS = ("flag", "stop")
# metric -> what it is the mean of (per query, over the batch's queries)
PRECISION_METRICS = ("j_per_query", "j_per_token", "ttft", "tpot", "e2e")


def parse_targets(items: list[str] | None) -> dict[str, float]:
    """``j_per_query=2%`` or ``ttft=0.05`` pairs: the relative half-width each metric must reach."""
    out: dict[str, float] = {}
    for item in items or []:
        metric, sep, text = item.replace(" ", "").partition("=")
        if not sep or metric not in PRECISION_METRICS:
            raise ValueError(
                f"cannot read the precision target {item!r}: give METRIC=PCT with METRIC one of "
                f"{', '.join(PRECISION_METRICS)}, e.g. j_per_query=2%"
            )
        try:
            value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise ValueError(f"the precision target {item!r} needs a share, e.g. {metric}=2%") from None
        if not 0 < value < 1:
            raise ValueError(f"the precision target {item!r} must lie between 0% and 100%")
        out[metric] = value
    return out
