"""The simulator behaves like a batching server: load slows it, and its truth adds up."""

from __future__ import annotations

import asyncio
import time

import httpx

from ipw_async.sim import SimConfig, SimulatorProcess, drawn_physics
from ipw_async.workload.datasets import builtin_qa

from .conftest import fast_engine


async def _ttfts(base_url: str, n: int) -> list[float]:
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=n)) as client:

        async def one(i: int) -> float:
            body = {"model": "sim-small", "prompt": f"p{i} " * 200, "max_tokens": 10, "stream": True}
            start = time.perf_counter()
            async with client.stream("POST", f"{base_url}/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        return time.perf_counter() - start
            raise AssertionError("no token")

        return list(await asyncio.gather(*(one(i) for i in range(n))))


async def test_ttft_grows_with_load_and_truth_adds_up() -> None:
    with SimulatorProcess(SimConfig(engine=fast_engine(max_batch=16))) as sim:
        alone = min(await _ttfts(sim.base_url, 1))
        loaded = sorted(await _ttfts(sim.base_url, 48))
        truth = httpx.get(f"{sim.root_url}/sim/truth").json()
    assert loaded[len(loaded) // 2] > 2 * alone  # queueing behind a batch of 16
    assert len(truth["requests"]) == 49
    total = sum(truth["requests"].values()) + truth["idle_j"]
    assert abs(total - truth["total_j"]) < 1e-6 * truth["total_j"]


def test_answers_are_seeded_and_mostly_right() -> None:
    qa = builtin_qa().queries[:40]
    with SimulatorProcess(SimConfig(engine=fast_engine(zero_delay=True), accuracy=0.8)) as sim:
        answers = [
            httpx.post(
                f"{sim.base_url}/completions",
                json={"model": "sim-small", "prompt": q.prompt, "stop": ["\n"], "max_tokens": 8},
            ).json()["choices"][0]["text"]
            for q in qa
        ]
        again = httpx.post(
            f"{sim.base_url}/completions", json={"model": "sim-small", "prompt": qa[0].prompt, "stop": ["\n"]}
        ).json()["choices"][0]["text"]
        models = httpx.get(f"{sim.base_url}/models").json()
        health = httpx.get(f"{sim.root_url}/health").json()
    right = sum(a.strip() == q.reference for a, q in zip(answers, qa, strict=True))
    assert 0.6 * len(qa) <= right < len(qa)
    assert again == answers[0]
    assert models["data"][0]["id"] == "sim-small"
    assert health["simulated"] is True


def test_device_counter_is_quantised_and_periodic() -> None:
    config = SimConfig(engine=fast_engine(counter_period_ms=200.0))
    # read back to back: many reads fall within one 200 ms update
    with SimulatorProcess(config) as sim, httpx.Client() as client:
        readings = [client.get(f"{sim.root_url}/sim/device").json() for _ in range(40)]
    energies = [r["energy_mj"] for r in readings]
    assert all(isinstance(e, int) for e in energies)
    assert energies == sorted(energies)
    assert len(set(energies)) < len(energies)  # stale between 200 ms updates
    assert readings[-1]["power_w"] == 70.0  # idle: static power only


def _usage(base_url: str, prompt: str) -> dict[str, object]:
    body = {"model": "sim-small", "prompt": prompt, "max_tokens": 4}
    return httpx.post(f"{base_url}/completions", json=body, timeout=30).json()["usage"]


def test_prefix_cache_skips_the_prefill_of_a_prompt_seen_before() -> None:
    shared = "You are a careful assistant. " * 40  # 1,160 characters: 18 blocks of 16 tokens
    engine = fast_engine(prefix_cache=True, step_per_prefill_token_ms=0.2, prefill_budget_tokens=64)
    with SimulatorProcess(SimConfig(engine=engine)) as sim:
        first = _usage(sim.base_url, shared + "Question one?")
        second = _usage(sim.base_url, shared + "Question two?")
        other = _usage(sim.base_url, "Something else entirely. " * 40)
        truth = httpx.get(f"{sim.root_url}/sim/truth").json()
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = second["prompt_tokens_details"]["cached_tokens"]  # type: ignore[index]
    assert cached == 18 * 16 and cached < second["prompt_tokens"]  # type: ignore[operator]
    assert other["prompt_tokens_details"] == {"cached_tokens": 0}
    # the cached prompt was cheaper: no prefill steps for its shared part
    first_j, second_j, _ = (truth["requests"][k] for k in sorted(truth["requests"], key=lambda k: int(k[4:])))
    assert second_j < 0.7 * first_j


def test_without_prefix_cache_usage_reports_no_cached_tokens(sim: SimulatorProcess) -> None:
    assert "prompt_tokens_details" not in _usage(sim.base_url, "hello " * 100)


def test_physics_drawn_from_a_seed() -> None:
    a, b, again = drawn_physics(1), drawn_physics(2), drawn_physics(1)
    assert a == again and a != b
    draws = [drawn_physics(seed) for seed in range(200)]
    assert all(0.5 <= d.work_exponent <= 1.0 and 30 <= d.static_w <= 150 for d in draws)
    assert all(512 <= d.prefill_budget_tokens <= 8192 and 10 <= d.counter_period_ms <= 500 for d in draws)
    assert {d.prefix_cache for d in draws} == {True, False}
    assert drawn_physics(1, static_w=99.0).static_w == 99.0  # a pinned field stays put
