"""A padded decode graph's buckets, replayed from the steps the client saw."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ipw_async.energy import request_windows
from ipw_async.energy.padding import (
    FIRST_LENGTH_BUCKET,
    POWERS_OF_TWO,
    VLLM,
    CaptureSizes,
    bucket,
    decode_graph,
    parse_capture_sizes,
    slot_replay,
)
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


def padded_buckets(steps: Steps, admitted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows and attention length of a graph over slots padded to powers of two."""
    slots, reach = slot_replay(steps, admitted)
    return POWERS_OF_TWO.pad(slots), bucket(reach, FIRST_LENGTH_BUCKET)


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
    # and the client's step times alone said the server pads slots to powers of two
    assert (inferred.graph["layout"], inferred.graph["capture_sizes"]) == ("slots", "pow2")
    assert inferred.graph["source"] == "inferred from step times"


def test_capture_sizes_pad_a_batch_to_the_next_captured_size_and_run_past_the_largest_as_it_is() -> None:
    rows = np.array([0.0, 1, 3, 9, 17, 200, 300, 600])
    assert POWERS_OF_TWO.pad(rows).tolist() == [0, 1, 4, 16, 32, 256, 512, 1024]
    assert VLLM.pad(rows).tolist() == [0, 1, 4, 16, 24, 200, 304, 600]
    assert parse_capture_sizes("none").pad(rows).tolist() == rows.tolist()  # type: ignore[union-attr]
    assert parse_capture_sizes("1,2,4,8,16").pad(rows).tolist() == [0, 1, 4, 16, 17, 200, 300, 600]  # type: ignore[union-attr]


def test_capture_sizes_are_named_listed_or_left_to_the_run_and_anything_else_is_refused() -> None:
    assert parse_capture_sizes("auto") is None
    assert parse_capture_sizes("vllm") is VLLM
    assert parse_capture_sizes(" 1,2,8 ") == CaptureSizes("1,2,8", (1, 2, 8))
    for bad in ("8,4", "0,1,2", "1,1,2", "eight", ""):
        with pytest.raises(ValueError, match="ascending batch sizes"):
            parse_capture_sizes(bad)


def _lived_steps(seed: int, n_steps: int = 600, n_requests: int = 500) -> Steps:
    """Decode-only steps of requests living random spans (so slots fragment and the batch
    moves over 1–100 rows), at 1 ms each until :func:`_timed` sets their times."""
    rng = np.random.default_rng(seed)
    first = rng.integers(0, n_steps, n_requests)
    last = np.minimum(first + rng.integers(5, 150, n_requests), n_steps - 1)
    req = np.concatenate([np.full(b - a + 1, i) for i, (a, b) in enumerate(zip(first, last, strict=True))])
    step = np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last, strict=True)])
    n = req.size
    return decoding_steps(
        np.zeros(n_steps), np.zeros(n_steps), req.tolist(), step.tolist(), [1.0] * n, [0.5] * n
    )


def _timed(steps: Steps, rows: np.ndarray, seed: int) -> Steps:
    """The steps, each lasting 8 ms + 0.05 ms a (padded) row, with 0.1 ms of noise."""
    ms = 8.0 + 0.05 * rows + np.random.default_rng(seed).normal(0.0, 0.1, steps.count)
    steps.end = np.cumsum(ms) * 1e6
    steps.start = steps.end - ms * 1e6
    return steps


@pytest.mark.parametrize(("layout", "ladder"), [("slots", POWERS_OF_TWO), ("dense", VLLM), ("slots", VLLM)])
def test_the_step_times_choose_the_padding_the_engine_ran(layout: str, ladder: CaptureSizes) -> None:
    """Known truth: steps whose times follow one layout's rows padded to one ladder. The run
    finds that padding among both layouts and every ladder, and says it inferred it."""
    steps = _lived_steps(1)
    admitted = np.arange(500, dtype=float)
    slots, _ = slot_replay(steps, admitted)
    unpadded = slots if layout == "slots" else steps.decode
    truth = ladder.pad(unpadded)
    rows, _, chosen = decode_graph(_timed(steps, truth, 2), admitted)
    assert (chosen["layout"], chosen["capture_sizes"]) == (layout, ladder.name)
    assert chosen["source"] == "inferred from step times" and np.array_equal(rows, truth)
    assert min(chosen["step_time_rms_ms"].values()) == chosen["step_time_rms_ms"][f"{layout} {ladder.name}"]


def test_step_times_that_do_not_tell_paddings_apart_keep_slots_and_powers_of_two() -> None:
    """Steps that all take 10 ms (a host-bound engine) say nothing of the padding: the run keeps
    the default and says so; given sizes are used whatever the times, the layout still chosen."""
    steps = _timed(_lived_steps(3), np.zeros(600), 4)
    admitted = np.arange(500, dtype=float)
    _, _, kept = decode_graph(steps, admitted)
    assert (kept["layout"], kept["capture_sizes"]) == ("slots", "pow2") and kept["source"].startswith("kept")
    rows, _, given = decode_graph(steps, admitted, VLLM)
    assert given["capture_sizes"] == "vllm" and given["source"].startswith("capture sizes given, layout kept")
    assert np.array_equal(rows, VLLM.pad(slot_replay(steps, admitted)[0]))
    few = _timed(_lived_steps(5, n_steps=20, n_requests=10), np.zeros(20), 6)
    assert decode_graph(few, np.arange(10, dtype=float))[2]["source"].startswith("assumed: ")
    given_few = decode_graph(few, np.arange(10, dtype=float), VLLM)[2]
    assert given_few["capture_sizes"] == "vllm" and given_few["source"].startswith(
        "capture sizes given, layout assumed"
    )


def test_sizes_that_pad_a_run_s_batches_alike_are_named_together() -> None:
    """A batch that never passes 8 rows pads to the same sizes under powers of two and vLLM's
    sizes: the run names both, since it could not tell them apart and need not."""
    steps = _lived_steps(7, n_requests=30)
    admitted = np.arange(30, dtype=float)
    slots, _ = slot_replay(steps, admitted)
    assert 4 < slots.max() <= 8
    _, _, chosen = decode_graph(_timed(steps, POWERS_OF_TWO.pad(slots), 8), admitted)
    assert (chosen["layout"], chosen["capture_sizes"], chosen["alike"]) == ("slots", "pow2", ["vllm"])
