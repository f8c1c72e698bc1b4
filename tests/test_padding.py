"""A padded decode graph's buckets, replayed from the steps the client saw."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ipw_async.energy import request_windows
from ipw_async.energy.padding import padded_buckets
from ipw_async.energy.steps import Steps, steps_of
from ipw_async.rundir.read import RunDir

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "h100-8b-graphs"


def entries(steps: list[dict[int, float]], prefill: dict[int, int] | None = None) -> Steps:
    """Steps from each step's decoders {request: context read}, and prompts {request: step}."""
    req, step, decode, context = [], [], [], []
    for k, decoders in enumerate(steps):
        for r, reach in decoders.items():
            req.append(r), step.append(k), decode.append(1.0), context.append(reach / 1000)
    for r, k in (prefill or {}).items():
        req.append(r), step.append(k), decode.append(0.0), context.append(0.0)
    n = len(steps)
    return decoding_steps(
        np.arange(n, dtype=float), np.arange(n, dtype=float) + 1, req, step, decode, context
    )


def decoding_steps(
    start: np.ndarray,
    end: np.ndarray,
    req: list[int],
    step: list[int],
    decode: list[float],
    context: list[float],
) -> Steps:
    """Steps of these times whose entries decode ``decode`` tokens reading ``context`` (thousands)."""
    zeros = np.zeros(len(req))
    return Steps(
        start,
        end,
        np.bincount(step, weights=decode, minlength=start.size),
        np.zeros(start.size),
        np.array(req),
        np.array(step),
        np.array(decode),
        zeros,
        np.array(context),
        zeros,
    )


def test_a_step_runs_every_slot_to_its_highest_decoder_and_the_longest_context() -> None:
    """Five requests take slots 0-4; when only the one in slot 4 decodes, the graph still runs
    8 rows. A request arriving after slot 0 is freed takes it (the lowest), so a step it decodes
    alone in runs one row, at the bucket its context reaches."""
    steps = entries(
        [
            {0: 100, 1: 100, 2: 100, 3: 100, 4: 100},
            {0: 101, 4: 600},
            {4: 601},
            {5: 3000},
        ],
        prefill={5: 2},
    )
    rows, length = padded_buckets(steps, np.arange(6, dtype=float))
    assert rows.tolist() == [8, 8, 8, 1]
    assert length.tolist() == [128, 1024, 1024, 4096]


def test_requests_first_seen_in_one_step_take_slots_in_the_order_they_were_sent() -> None:
    """Requests 0 and 1 start together; request 1 was sent first, so it holds slot 0, and
    request 0 decoding alone later runs two rows."""
    steps = entries([{0: 10, 1: 10}, {0: 11}])
    rows, _ = padded_buckets(steps, np.array([2.0, 1.0]))
    assert rows.tolist() == [2, 2]
    rows, _ = padded_buckets(steps, np.array([1.0, 2.0]))
    assert rows.tolist() == [2, 1]


def test_no_decoder_no_graph() -> None:
    steps = entries([{}, {0: 50}], prefill={0: 0})
    rows, length = padded_buckets(steps, np.zeros(1))
    assert rows.tolist() == [0, 1] and length.tolist() == [0, 128]


def _server_steps(log: dict, t0_ns: int, index: dict[str, int], lo: float, hi: float) -> Steps:
    """The server's own steps over [lo, hi] (run clock, ns), its requests as the run's indices."""
    prompt = {r["rid"]: r["prompt_tokens"] for r in log["requests"]}
    done: dict[str, int] = {}
    start, end, req, step, context, decode = [], [], [], [], [], []
    for s in log["steps"]:
        a, b = s["start"] * 1e9 - t0_ns, s["end"] * 1e9 - t0_ns
        if not lo <= b <= hi:
            continue
        k = len(start)
        start.append(a), end.append(b)
        for rid in s["decode"]:
            done[rid] = done.get(rid, 0) + 1
            req.append(index[rid]), step.append(k), decode.append(1.0)
            context.append((prompt[rid] + done[rid]) / 1000)
        for rid in s["prefill"]:
            req.append(index[rid]), step.append(k), decode.append(0.0), context.append(0.0)
    return decoding_steps(np.array(start), np.array(end), req, step, decode, context)


@pytest.mark.skipif(
    not TRACES.is_dir(), reason="the real traces (../shared/traces) are not beside this clone"
)
def test_on_a_real_h100_run_the_client_s_replay_is_the_server_s_buckets() -> None:
    """The Poisson H100 run's inferred steps, replayed, give the padded batch and attention
    bucket that the server's own step log does, in every step with a decoder: the client
    sees all that slot allocation needs (each request's first and last step)."""
    run = RunDir.open(TRACES / "pois" / "run")
    requests = request_windows(run.measured_records())
    inferred = steps_of(requests)
    t0 = json.loads((TRACES / "pois" / "run" / "run.json").read_text())["clock"]["t0_monotonic_ns"]
    ids = [str(r) for r in requests.get_column("request_id").to_list()]
    position = {r: i for i, r in enumerate(ids)}
    index = {}
    for line in (TRACES / "pois" / "request_map.csv").read_text().splitlines()[1:]:
        request_id, rid = line.split(",")[:2]
        index[rid] = position[request_id]
    log = json.loads((TRACES / "steps.json").read_text())
    lo, hi = inferred.end.min() - 5e6, inferred.end.max()
    server = _server_steps(log, t0, index, lo, hi)
    arrive = {index[r["rid"]]: r["arrive"] for r in log["requests"] if r["rid"] in index}
    admitted = np.array([arrive[i] for i in range(len(ids))])
    theirs = padded_buckets(server, admitted)
    ours = (inferred.padded_rows, inferred.padded_length)
    # each inferred step ends when its tokens reach the client: under 1 ms after the server's step
    # in 99% of steps, 6 ms at most
    matched = np.searchsorted(server.end, inferred.end, side="right") - 1
    assert np.all(inferred.end - server.end[matched] < 10e6)
    decoding = inferred.decode > 0
    assert decoding.sum() > 2000 and server.count == inferred.count
    assert np.array_equal(ours[0][decoding], theirs[0][matched[decoding]])
    assert np.array_equal(ours[1][decoding], theirs[1][matched[decoding]])
    assert len(set(ours[0][decoding].tolist())) > 4  # fragmented slots: many buckets, not one
