"""What the server's prefix cache did in a run: TTFT and energy of the requests that hit it and
of those that missed, and what one more input token costs, cached and uncached.

A request *hit* when the server reported cached prompt tokens for it (OpenAI's
``usage.prompt_tokens_details.cached_tokens``, as vLLM and SGLang report it; Anthropic's
``cache_read_input_tokens``), and *missed* when it reported none. A server that reports no
cached tokens at all leaves the split missing, with its reason: zero would claim it missed.

The per-token figures are one least-squares fit over the measured requests that succeeded::

    energy_j = j_per_request + j_per_uncached_token · uncached + j_per_cached_token · cached
               + j_per_output_token · output

so each is what one more token of its kind adds to a request's energy with the others held
(and ``j_saved_per_cached_token`` their difference, what caching saves),
its static share included (a token that keeps the request on the server longer costs its
share of the static power too). Its interval is 95% from heteroskedasticity-robust (HC1)
errors (a long request's energy varies more), widened to the same fit through each request's
attribution band (``energy_low_j``, ``energy_high_j``): the attribution's own uncertainty
is not sampling noise and does not shrink with more requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from scipy import stats

from ..rundir.read import HEADLINE, RunDir
from .columns import column

CONFIDENCE = 0.95
# The fit's coefficients: per request, per prompt token (as uncached), what a cached token saves
# of that, per output token. Each figure reported is a combination of them: a cached token costs
# an uncached one's less what caching saves. Fitting the saving itself keeps it resolved when
# the prompts are all about as long (a prefix and a short question), where the hit/miss
# contrast pins the saving but not what an uncached token costs apart from the request.
FIGURES: dict[str, tuple[float, float, float, float]] = {
    "j_per_request": (1, 0, 0, 0),
    "j_per_uncached_token": (0, 1, 0, 0),
    "j_per_cached_token": (0, 1, -1, 0),
    "j_saved_per_cached_token": (0, 0, 1, 0),
    "j_per_output_token": (0, 0, 0, 1),
}
ALIKE = 0.05  # prompt lengths whose coefficient of variation is below this are "all alike"
UNRESOLVED = {
    True: "the prompts' lengths vary too little to tell a token's cost from the request's: vary "
    "them, e.g. --dataset synthetic --length-sigma 0.8",
    False: "this meter does not resolve one input token's cost (its interval holds zero)",
}
NO_CACHE_REPORT = (
    "the server reported no cached prompt tokens (usage.prompt_tokens_details.cached_tokens): "
    "the split by cache hit is missing"
)


def cache_report(run: RunDir) -> dict[str, Any]:
    """The contents of ``analysis/cache.json``: the requests by cache hit, and per meter what
    an uncached, a cached and an output token cost."""
    ok = run.ok
    cached = column(ok, "cached_prompt_tokens")
    if ok.is_empty() or cached.null_count() == ok.height:
        reason = "no measured request succeeded" if ok.is_empty() else NO_CACHE_REPORT
        return {"groups": None, "per_token": None, "reason": reason}
    known = ok.filter(cached.is_not_null() & column(ok, "prompt_tokens").is_not_null())
    hit = column(known, "cached_prompt_tokens") > 0
    return {
        "groups": {"hit": _group(known.filter(hit)), "miss": _group(known.filter(~hit))},
        "per_token": {meter: token_costs(known, meter) for meter in _meters(run)},
        "unreported": ok.height - known.height,
        "reason": None,
        "notes": "hit: the server reported cached prompt tokens for the request; per_token: "
        "energy_j = j_per_request + j_per_uncached_token·uncached + j_per_cached_token·cached + "
        "j_per_output_token·output (j_saved_per_cached_token: uncached less cached), least squares "
        "over measured requests that succeeded; low/high: "
        "the 95% interval (HC1 errors) widened to the same fit through the attribution band",
    }


def _meters(run: RunDir) -> list[str]:
    """The headline and each meter, except a meter that is the whole headline (the same fit twice)."""
    sole = (run.summary or {}).get("energy", {}).get("headline_meters", [])
    return [m for m in run.energy_meters if not (len(sole) == 1 and m == sole[0])]


def _group(frame: pl.DataFrame) -> dict[str, Any]:
    prompt = column(frame, "prompt_tokens")
    energy = column(frame, "energy_j")
    ttft = column(frame, "ttft_s").drop_nulls()
    with_energy = energy.is_not_null()
    input_tokens = prompt.filter(with_energy).sum()
    return {
        "requests": frame.height,
        "prompt_tokens_mean": prompt.mean(),
        "cached_share": _ratio(column(frame, "cached_prompt_tokens").sum(), prompt.sum()),
        "ttft_p50_s": ttft.quantile(0.5) if ttft.len() else None,
        "ttft_p95_s": ttft.quantile(0.95) if ttft.len() else None,
        "energy_j_mean": energy.mean(),
        "j_per_input_token": _ratio(energy.sum(), input_tokens) if with_energy.any() else None,
    }


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else float(numerator) / float(denominator)


def token_costs(requests: pl.DataFrame, meter: str = HEADLINE) -> dict[str, Any]:
    """The per-token fit of one meter's attributed energy over ``requests`` (each with its prompt
    and cached token counts known); a figure null with the reason where the data cannot say."""
    prefix = "" if meter == HEADLINE else f"{meter}."
    energy = column(requests, f"{prefix}energy_j").to_numpy()
    prompt = column(requests, "prompt_tokens").to_numpy()
    use = np.isfinite(energy) & np.isfinite(_design(requests, np.ones(requests.height, dtype=bool))).all(axis=1)
    design = _design(requests, use)
    reason = _unidentified(design)
    if reason is not None:
        return {"n": int(use.sum()), "reason": reason} | dict.fromkeys([*FIGURES, "cached_over_uncached"])
    fitted = _fit(design, energy[use])
    bounds = [_bound_fit(requests, f"{prefix}energy_{side}_j", use) for side in ("low", "high")]
    out: dict[str, Any] = {"n": int(use.sum()), "r2": fitted.r2, "reason": None}
    for name, weights in FIGURES.items():
        if not fitted.estimable(weights):
            out[name] = None
            continue
        estimate, half = fitted.figure(weights)
        ends = [estimate - half, estimate + half, *(b.figure(weights)[0] for b in bounds if b is not None)]
        out[name] = {"estimate": estimate, "low": min(ends), "high": max(ends)}
    if out["j_per_uncached_token"] is None or out["j_per_uncached_token"]["low"] <= 0:
        out["j_per_uncached_token"] = out["j_per_cached_token"] = None
        lengths = prompt[use]
        out["reason"] = UNRESOLVED[bool(np.std(lengths) < ALIKE * np.mean(lengths))]
    out["cached_over_uncached"] = _ratio_band(out["j_per_cached_token"], out["j_per_uncached_token"])
    return out


def _bound_fit(requests: pl.DataFrame, name: str, use: np.ndarray) -> _Fit | None:
    """The same fit through one side of the attribution band, over the rows that have it; None
    where no row has it or too few do (the band is then the interval alone)."""
    if name not in requests.columns:
        return None
    values = column(requests, name).to_numpy()
    have = use & np.isfinite(values)
    design = _design(requests, have)
    return None if _unidentified(design) is not None else _fit(design, values[have])


def _design(requests: pl.DataFrame, rows: np.ndarray) -> np.ndarray:
    """The fit's design matrix over ``rows``: 1, prompt tokens, −cached tokens, output tokens
    (the coefficients of FIGURES' combinations)."""
    prompt, cached, output = (
        column(requests, name).to_numpy()[rows] for name in ("prompt_tokens", "cached_prompt_tokens", "output_tokens")
    )
    return np.column_stack([np.ones(int(rows.sum())), prompt, -cached, output])


def _unidentified(design: np.ndarray) -> str | None:
    """Why the fit cannot separate its terms, or None."""
    n, terms = design.shape
    if n <= terms:
        return f"{n} requests with energy: the fit of {terms} terms needs more"
    hit = design[:, 2] < 0
    if not hit.any() or hit.all():
        return "needs requests that hit the prefix cache and requests that missed it"
    return None


@dataclass(frozen=True)
class _Fit:
    beta: np.ndarray
    covariance: np.ndarray  # heteroskedasticity-robust (HC1)
    projection: np.ndarray  # onto the design's row space: what the data can tell apart
    t: float  # the interval's t quantile
    r2: float | None

    def estimable(self, weights: tuple[float, ...]) -> bool:
        """Whether the data determine this combination (every prompt one length: the saving
        is, but not a token's cost apart from the request's)."""
        w = np.asarray(weights, dtype=float)
        return bool(np.allclose(self.projection @ w, w, atol=1e-6))

    def figure(self, weights: tuple[float, ...]) -> tuple[float, float]:
        """A combination of the coefficients and its interval's half-width."""
        w = np.asarray(weights, dtype=float)
        return float(w @ self.beta), self.t * float(np.sqrt(max(float(w @ self.covariance @ w), 0.0)))


def _fit(design: np.ndarray, y: np.ndarray) -> _Fit:
    """Least squares with HC1 errors (a long request's energy varies more)."""
    n, terms = design.shape
    beta, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ beta
    inverse = np.linalg.pinv(design.T @ design)
    meat = (design * residual[:, None] ** 2).T @ design
    spread = float(np.sum((y - y.mean()) ** 2))
    return _Fit(
        beta=beta,
        covariance=inverse @ meat @ inverse * n / (n - terms),
        projection=np.linalg.pinv(design) @ design,
        t=float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - terms)),
        r2=1.0 - float(residual @ residual) / spread if spread > 0 else None,
    )


def _ratio_band(
    cached: dict[str, float] | None, uncached: dict[str, float] | None
) -> dict[str, float | None] | None:
    """What a cached token costs as a share of an uncached one; its band only where the
    uncached cost is known to be positive (else any ratio is possible)."""
    if cached is None or uncached is None:
        return None
    estimate = _ratio(cached["estimate"], uncached["estimate"]) if uncached["estimate"] > 0 else None
    if uncached["low"] <= 0:
        return {"estimate": estimate, "low": None, "high": None}
    ends = [c / u for c in (cached["low"], cached["high"]) for u in (uncached["low"], uncached["high"])]
    return {"estimate": estimate, "low": min(ends), "high": max(ends)}
