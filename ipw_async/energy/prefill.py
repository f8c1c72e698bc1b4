"""Whether a run tells what a prompt token weighs, and what to take where it does not.

A step at the power cap draws the same power whatever its prefill, so where most prefill ran
at the cap the weight the fit finds is an artefact of the rest of the model; where the fit's
weight lies outside what prompt tokens weigh on the servers we know, or is too uncertain, it
has made up for something else (a misplaced prompt, the meter's timing).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from .model import PowerModel
from .steps import Steps

# A prompt token's weight where the run cannot tell it because its prefill ran at the power
# cap: a device at its cap is compute-bound, and a prompt token takes the same FLOPs as a
# decode token (about 2 × parameters), so they weigh alike. Below the cap decode is
# memory-bound and a decode token costs more: there the fit finds the weight itself.
CAPPED_PREFILL_WEIGHT = 1.0
# the least and most a prompt token weighs against a decode token on the servers we know
LEAST_PREFILL_WEIGHT, MOST_PREFILL_WEIGHT = 0.1, 1.5
# Where more prefill than this ran at the cap even at that least weight, the run cannot tell a
# prompt token's weight. (At half, the default simulator at 256 streams, whose prompts
# mostly cap but whose lighter prefill steps identify the weight to 10%, was refused it.)
CAPPED_SHARE = 0.75
# Where more prefill than this ran at the cap at the fitted weight itself, the few steps below
# the cap are all that tell the weight (at 79%, those left identify it to 5% on exact steps).
FIT_CAPPED_SHARE = 0.9


def capped_share(model: PowerModel, steps: Steps, weight: float) -> float:
    """The share of prefill tokens in steps the model puts at the power cap, at ``weight``."""
    if not np.isfinite(model.cap_w):
        return 0.0
    at = replace(model, cap_w=float("inf"), prefill_weight=weight)
    raw = at.dynamic_w(at.step_work(steps))
    return float(steps.prefill[raw >= model.cap_w].sum()) / max(float(steps.prefill.sum()), 1e-9)


class PrefillWeight(NamedTuple):
    """The prompt token weight to use, a note where it is not the fit's, and whether it is only
    the default: a guess, where the capped cases' weights are reasoned from the cap."""

    weight: float
    note: str | None = None
    guessed: bool = False


def identified_prefill_weight(model: PowerModel, steps: Steps, error: float, default: float) -> PrefillWeight:
    """The prompt token weight to use, and a note where it is not the fit's."""
    w = model.prefill_weight
    capped = capped_share(model, steps, min(w, LEAST_PREFILL_WEIGHT))
    if capped > CAPPED_SHARE:
        return PrefillWeight(
            CAPPED_PREFILL_WEIGHT,
            f"prefill weight not identified ({capped:.0%} of prefill ran at the power cap): "
            f"{CAPPED_PREFILL_WEIGHT:g} taken, as compute-bound tokens cost alike",
        )
    if (at_fit := capped_share(model, steps, w)) > FIT_CAPPED_SHARE:
        # A weight that puts nearly all prefill at the cap fits as well as any larger one: the
        # meter has only the few steps below the cap to tell it by (at 256 streams, 97% capped,
        # those made it anything from 0.16 to 5.8 from run to run). What it does tell is a
        # least weight: one that caps that prefill as the fit found it.
        trial = np.geomspace(LEAST_PREFILL_WEIGHT, max(w, LEAST_PREFILL_WEIGHT), 32)
        shares = [capped_share(model, steps, x) for x in trial]
        least = float(trial[np.argmax(np.asarray(shares) >= FIT_CAPPED_SHARE)])
        kept = float(np.clip(max(default, least), LEAST_PREFILL_WEIGHT, MOST_PREFILL_WEIGHT))
        return PrefillWeight(
            kept,
            f"prefill weight not identified ({at_fit:.0%} of prefill at the power cap at the "
            f"fit's {w:.2g}, at least {least:.2g}): {kept:.2g} taken",
        )
    if not LEAST_PREFILL_WEIGHT <= w <= MOST_PREFILL_WEIGHT:
        return PrefillWeight(
            default,
            f"prefill weight not identified (the fit's {w:.2g} is outside "
            f"{LEAST_PREFILL_WEIGHT:g}–{MOST_PREFILL_WEIGHT:g}): default {default:g} kept",
            guessed=True,
        )
    if error > 0.5 * max(w, 0.1):
        note = f"prefill weight not identified (±{error:.2g}): default {default:g} kept"
        return PrefillWeight(default, note, guessed=True)
    return PrefillWeight(w)
