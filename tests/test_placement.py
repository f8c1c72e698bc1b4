"""Where prompts ran: an engine's token budget read from its first tokens, first come, first served."""

from __future__ import annotations

import numpy as np
import pytest

from ipw_async.energy.placement import PromptQueue, TokenBudget, infer_budget
from ipw_async.energy.steps import _busy_after


def _queue(room: np.ndarray, first: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """The step each prompt finishes in, one step and one prompt at a time (what an engine does)."""
    done = np.full(tokens.size, -1)
    left = tokens.astype(float).copy()
    head = 0
    for k, capacity in enumerate(room):
        while head < tokens.size and first[head] <= k and capacity > 0:
            take = min(capacity, left[head])
            left[head] -= take
            capacity -= take
            if left[head] <= 0:
                done[head] = k
                head += 1
    return done


def _engine(rng: np.random.Generator, budget: int, with_decode: bool, n: int = 1000):
    """Arrivals of mixed prompts at an engine that fills ``budget`` tokens a step (less its decode
    tokens ``with_decode``): each prompt's first step and the step of its first token."""
    steps = 4000
    first = np.sort(rng.integers(0, steps // 8, n))  # busy enough that prompts queue
    tokens = rng.lognormal(np.log(900), 0.8, n).round().clip(16, 8000)
    decode = rng.integers(0, 64, steps).astype(float)
    room = np.maximum(budget - decode, 0.0) if with_decode else np.full(steps, float(budget))
    return decode, first, _queue(room, first, tokens), tokens


def test_one_pass_serves_prompts_as_a_step_by_step_queue_does() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        room = rng.choice([0.0, 300.0, 2048.0], size=200)
        first = np.sort(rng.integers(0, 150, 60))
        tokens = rng.integers(1, 3000, 60).astype(float)
        expected = _queue(room, first, tokens)
        served = PromptQueue.of(first, tokens, room.size).finishing(room)
        finished = expected >= 0  # the queue's last prompts may outlast the steps
        assert np.array_equal(served[finished], expected[finished])


@pytest.mark.parametrize(("budget", "with_decode"), [(2048, False), (3278, False), (4096, True), (1367, True)])
def test_the_budget_is_read_from_first_tokens(budget: int, with_decode: bool) -> None:
    decode, first, last, tokens = _engine(np.random.default_rng(budget), budget, with_decode)
    found = infer_budget(decode, first, last, tokens)
    assert found is not None and found.with_decode == with_decode
    assert found.tokens == pytest.approx(budget, rel=0.02) and found.agreement >= 0.99


def test_no_budget_where_first_tokens_follow_none() -> None:
    decode, first, _, tokens = _engine(np.random.default_rng(5), 2048, False)
    # prompts served in no order a budget explains: each first token a random wait after arrival
    shuffled = first + np.random.default_rng(6).integers(0, 40, first.size)
    assert infer_budget(decode, first, shuffled, tokens) is None


def test_no_budget_where_too_few_prompts_waited_to_tell_one() -> None:
    decode, first, last, tokens = _engine(np.random.default_rng(7), 100_000, False, n=30)
    assert np.count_nonzero(first < last) < 10
    assert infer_budget(decode, first, last, tokens) is None


def test_the_room_a_budget_leaves_is_less_the_decode_tokens_only_where_they_share_it() -> None:
    decode = np.array([0.0, 10.0, 3000.0])
    assert TokenBudget(2048, False, 1.0).room(decode).tolist() == [2048, 2048, 2048]
    assert TokenBudget(2048, True, 1.0).room(decode).tolist() == [2048, 2038, 0]


def test_an_engine_with_a_prompt_waiting_is_busy_after_a_step_that_decoded_nothing() -> None:
    # steps end every 10 ms; only step 3 decoded. A prompt sent at 5 ms ran in steps 0-2 (first
    # token in 2): after steps 0 and 1 the engine went straight on, though neither decoded. One
    # sent at 35 ms (first token in 4) waited through no step's end; one that never got a token
    # (-1) tells nothing
    end = np.array([10.0, 20.0, 30.0, 40.0, 50.0]) * 1e6
    sent = np.array([5.0, 35.0, 1.0]) * 1e6
    busy = _busy_after(end, np.array([3]), sent, np.array([2, 4, -1]))
    assert busy.tolist() == [True, True, False, True, False]
