"""A power meter's energy kept over stretches of readings (ipw_async.energy.pooling), against
known truths: sampling noise calls for long stretches, a load the model does not describe for
short ones."""

from __future__ import annotations

import numpy as np
import pytest

from ipw_async.energy.counter import VirtualCounter
from ipw_async.energy.pooling import POOL_LENGTHS_S, choose_pooling, pooled

NS = 1_000_000_000
PERIOD_S = 0.05  # a reading every 50 ms, as the sampler's default
STATIC_W = 120.0


def _run(
    seconds: float, noise: float, foreign_w: float = 0.0, seed: int = 0
) -> tuple[VirtualCounter, np.ndarray, np.ndarray]:
    """A power meter read every 50 ms over ``seconds``: the model's dynamic energy per interval
    (bursts of steps), the truth (static + that, + ``foreign_w`` from 20 to 30 s, a load the model
    does not describe) and what the readings integrate (the truth with ``noise`` relative
    sampling noise per interval)."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, seconds + 1e-9, PERIOD_S) * NS
    dt = np.diff(t) / NS
    modelled = rng.gamma(2.0, 150.0, t.size - 1) * dt  # 300 W of steps on average, bursty
    static_j = STATIC_W * dt
    mid = (t[:-1] + t[1:]) / 2 / NS
    truth = static_j + modelled + np.where((mid >= 20) & (mid < 30), foreign_w, 0.0) * dt
    measured = np.maximum(truth * (1 + noise * rng.standard_normal(truth.size)), 0.0)
    vc = VirtualCounter(t, np.concatenate(([0.0], np.cumsum(measured))), np.zeros(t.size - 1, dtype=bool))
    return vc, modelled, static_j


def test_sampling_noise_alone_is_averaged_over_long_stretches() -> None:
    """Readings that err 60% an interval around a model that is right: the held-out blocks are
    best predicted by the model over a long stretch, the noise averaged away."""
    vc, modelled, static_j = _run(120.0, noise=0.6)
    pooling = choose_pooling(vc, modelled, static_j)
    assert pooling is not None and pooling.length_s >= 32
    assert pooling.errors[pooling.length_s] < pooling.errors[POOL_LENGTHS_S[0]]


def test_a_load_the_model_does_not_describe_keeps_stretches_short() -> None:
    """The same run with 200 W the model knows nothing of for 10 s (another job on the GPU):
    a long stretch would spread it over the whole run, so the readings are kept near where
    they were drawn."""
    vc, modelled, static_j = _run(120.0, noise=0.1, foreign_w=200.0)
    pooling = choose_pooling(vc, modelled, static_j)
    assert pooling is not None and pooling.length_s <= 8
    assert pooling.errors[pooling.length_s] < pooling.errors[float("inf")] / 2


def test_a_run_too_short_to_hold_blocks_out_keeps_every_interval() -> None:
    vc, modelled, static_j = _run(5.0, noise=0.6)
    assert choose_pooling(vc, modelled, static_j) is None


@pytest.mark.parametrize("length_s", [4.0, float("inf")])
def test_stretches_conserve_the_energy_and_keep_what_is_imputed_apart(length_s: float) -> None:
    vc, _, _ = _run(20.0, noise=0.3)
    imputed = vc.imputed.copy()
    imputed[100:104] = True  # a telemetry gap, imputed
    vc = VirtualCounter(vc.t, vc.e, imputed)
    out = pooled(vc, length_s)
    assert set(out.t) <= set(vc.t) and out.t[0] == vc.t[0] and out.t[-1] == vc.t[-1]
    assert np.interp(out.t, vc.t, vc.e) == pytest.approx(out.e)  # the energy at every knot kept
    assert out.held is not None and out.held.sum() == vc.imputed.size
    # the gap's intervals stay stretches of their own, imputed; the rest is not
    assert out.imputed.sum() == 4 and np.all(out.held[out.imputed] == 1)
    assert np.all(out.held[~out.imputed] > 1)
