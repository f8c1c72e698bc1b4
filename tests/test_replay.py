"""Trace replay: each format's parser on sample lines from its documentation, a bad line named by
its number, the replay's schedule computed exactly, shared prefix blocks as shared text, and
short replays against the simulator that come back with the trace's lengths and times."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ipw_async import RunError, run_benchmark
from ipw_async._clock import now_ns
from ipw_async.harness import RunConfig
from ipw_async.harness.measuring import planned
from ipw_async.harness.workloads import workload_of
from ipw_async.load import LoadSpec, drive, replay_times
from ipw_async.workload import DatasetError, Query, WorkUnit
from ipw_async.workload.replay import TraceReplay, load_trace
from ipw_async.workload.replay.formats import SessionTurn, azure_time_ns
from ipw_async.workload.text import PromptText

from .conftest import quick_config

NS = 1_000_000_000
CHAT_TEMPLATE_TOKENS = 4  # the simulator counts a chat message's template as 4 tokens

# the first lines of Mooncake's conversation trace, as its README shows them
MOONCAKE = [
    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [*range(46, 58), 2050, 2051]},
    {"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [*range(46, 58), 2052]},
]
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,217,634,Conversation log
"""
AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:50.9951690,879,8
"""


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mooncake_lines_become_requests_with_their_blocks(tmp_path: Path) -> None:
    trace = load_trace(_jsonl(tmp_path / "conversation_trace.jsonl", MOONCAKE))
    assert trace.format == "mooncake" and trace.name == "conversation_trace" and len(trace) == 2
    first, second = trace.requests
    assert (first.offset_ns, first.input_tokens, first.output_tokens) == (0, 6955, 52)
    assert second.offset_ns == 3_053 * 1_000_000 and second.offset_s == pytest.approx(3.053)
    assert first.blocks[:12] == second.blocks[:12] == tuple(range(46, 58))
    assert first.blocks[12:] == (2050, 2051)


def test_burstgpt_skips_and_counts_the_traces_failures(tmp_path: Path) -> None:
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text(BURSTGPT)
    trace = load_trace(path)
    assert trace.format == "burstgpt" and trace.skipped == 1
    assert [(r.offset_ns, r.input_tokens, r.output_tokens) for r in trace.requests] == [
        (0, 472, 18),
        (113 * NS, 417, 217),
    ]


def test_azure_timestamps_keep_all_seven_fractional_digits(tmp_path: Path) -> None:
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    path.write_text(AZURE)
    trace = load_trace(path)
    assert trace.format == "azure"
    assert [r.offset_ns for r in trace.requests] == [0, 4_314_579_000, 4_314_579_000]
    assert [r.input_tokens for r in trace.requests] == [374, 396, 879]  # a tie keeps the file's order
    assert azure_time_ns("2023-11-16 18:15:46.6805901") - azure_time_ns("2023-11-16 18:15:46.68059") == 100


def test_azure_2024_timestamps_carry_their_utc_offset(tmp_path: Path) -> None:
    path = tmp_path / "AzureLLMInferenceTrace_code_1week.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,2048,28\n"
        "2024-05-10 02:00:01.5+02:00,512,9\n"  # the same instant as 00:00:01.5 UTC
    )
    trace = load_trace(path)
    assert trace.format == "azure"
    assert [r.offset_ns for r in trace.requests] == [0, 1_490_070_000]
    assert azure_time_ns("2024-05-10 00:00:00+00:00") == azure_time_ns("2024-05-10 00:00:00")


def test_a_csv_saved_with_a_byte_order_mark_reads_as_one_without(tmp_path: Path) -> None:
    path = tmp_path / "BurstGPT_excel.csv"
    path.write_bytes(b"\xef\xbb\xbf" + BURSTGPT.encode())
    assert [r.input_tokens for r in load_trace(path).requests] == [472, 417]


def test_skipped_entries_are_counted_by_their_cause_and_said_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "burstgpt.csv"
    path.write_text(BURSTGPT + "130,ChatGPT,0,12,12,API log\n131,GPT-4,80,0,80,API log\n")
    trace = load_trace(path)
    assert trace.skipped == 3 and dict(trace.skipped_by) == {"Response tokens": 2, "Request tokens": 1}
    assert trace.skipped_note() == (
        "skipped 3 failed requests of burstgpt.csv (2 with 0 Response tokens, 1 with 0 Request tokens)"
    )
    assert trace.describe() == {
        "file": "burstgpt.csv",
        "format": "burstgpt",
        "entries": 2,
        "skipped": 3,
        "skipped_by": {"Response tokens": 2, "Request tokens": 1},
    }
    path.write_text(BURSTGPT)
    assert load_trace(path).skipped_note() == "skipped 1 failed request of burstgpt.csv (0 Response tokens)"
    whole = _jsonl(tmp_path / "m.jsonl", MOONCAKE)
    assert load_trace(whole).skipped_note() is None and load_trace(whole).describe()["skipped_by"] == {}


def test_sessions_carry_their_turns_think_times_and_ids(tmp_path: Path) -> None:
    rows = [
        {"session_id": "b", "timestamp": 12.5, "turns": [{"input_length": 40, "output_length": 8}]},
        {
            "session_id": "a",
            "timestamp": 10.0,
            "turns": [
                {"input_length": 900, "output_length": 120},
                {"input_length": 60, "output_length": 200, "think_s": 8.0},
            ],
        },
    ]
    trace = load_trace(_jsonl(tmp_path / "chats.jsonl", rows))
    assert trace.format == "sessions"
    assert [(s.session_id, s.offset_ns) for s in trace.sessions] == [("a", 0), ("b", 2_500_000_000)]
    assert trace.sessions[0].turns == (SessionTurn(900, 120, 0.0), SessionTurn(60, 200, 8.0))


@pytest.mark.parametrize(
    ("name", "text", "fmt", "message"),
    [
        (
            "mooncake.jsonl",
            "".join(json.dumps(MOONCAKE[0]) + "\n" for _ in range(16)) + '{"timestamp": 1, "input_length": -3}\n',
            "mooncake",
            "mooncake.jsonl line 17: input_length must be a whole number",
        ),
        ("mooncake.jsonl", json.dumps(MOONCAKE[0]) + "\n{not json\n", "mooncake", "line 2: not valid JSON"),
        ("b.csv", BURSTGPT.replace("118,GPT-4", "soon,GPT-4"), "burstgpt", "b.csv line 4: Timestamp must be a number"),
        ("a.csv", AZURE.replace("18:15:50.9951690,396", "18:15:50.99x,396"), "azure", "a.csv line 3: TIMESTAMP"),
        (
            "s.jsonl",
            '{"timestamp": 0, "turns": [{"input_length": 5, "output_length": 2}, {"input_length": 5}]}\n',
            "sessions",
            "s.jsonl line 1: turn 2: output_length is missing$",
        ),
        (
            "s.jsonl",
            '{"timestamp": 0, "turns": [{"input_length": 5, "output_length": 2}, {"input_length": 5, "output_length": 2}]}\n',
            "sessions",
            "s.jsonl line 1: turn 2: think_s is missing$",
        ),
        ("b.csv", "Timestamp,Model\n5,ChatGPT\n", "burstgpt", "b.csv line 1: no column Request tokens"),
        ("b.csv", BURSTGPT.replace("118,GPT-4,417", "118,GPT-4"), "burstgpt", "b.csv line 4: 5 fields where the header has 6"),
        ("m.jsonl", '{"timestamp": 1, "output_length": 3}\n', "mooncake", "m.jsonl line 1: input_length is missing$"),
        ("m.jsonl", '{"input_length": 1, "output_length": 3}\n', "mooncake", "m.jsonl line 1: timestamp is missing$"),
        (
            "m.jsonl",
            '{"timestamp": Infinity, "input_length": 1, "output_length": 3}\n',
            "mooncake",
            "m.jsonl line 1: timestamp must be a non-negative number, not inf",
        ),
        ("a.csv", AZURE.replace("18:15:50.9951690,396", "18:15:60.1,396"), "azure", "a.csv line 3: TIMESTAMP .* not a date"),
    ],
)
def test_a_bad_line_is_named_by_the_file_and_its_number(
    tmp_path: Path, name: str, text: str, fmt: str, message: str
) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(DatasetError, match=message):
        load_trace(tmp_path / name, fmt)


def test_a_trace_with_nothing_to_replay_or_an_unknown_shape_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="cannot tell its trace format"):
        load_trace(tmp_path / "empty.jsonl")
    with pytest.raises(DatasetError, match="no requests to replay"):
        load_trace(tmp_path / "empty.jsonl", "mooncake")
    (tmp_path / "failed.csv").write_text(BURSTGPT.splitlines()[0] + "\n45,ChatGPT,1087,0,1087,Conversation log\n")
    with pytest.raises(DatasetError, match="every one failed in the trace"):
        load_trace(tmp_path / "failed.csv")


def test_a_bad_trace_stops_the_run_before_it_starts_in_one_line(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "t.jsonl", [MOONCAKE[0], {"timestamp": "x"}])
    with pytest.raises(RunError, match=r"^\S*t.jsonl line 2: timestamp must be a number, not 'x'$"):
        workload_of(RunConfig(trace=path))
    with pytest.raises(RunError, match="leave out --concurrency and --rate"):
        RunConfig(trace=path, concurrency=4).validate()
    with pytest.raises(RunError, match="--speedup and --trace-format are for a replay"):
        RunConfig(speedup=2.0).validate()
    with pytest.raises(RunError, match=r"--trace is the workload: .* leave out --dataset"):
        RunConfig(trace=path, dataset="synthetic").validate()


def test_replay_times_are_the_offsets_over_the_speedup_from_the_start() -> None:
    offsets = [0, 27_482_000_000, 30_535_000_001, 30_535_000_001]
    units = [WorkUnit(i, Query(str(i), "p"), at_ns=at) for i, at in enumerate(offsets)]
    start = 1_000
    timed = list(replay_times(iter(units), 2.0, start))
    assert [u for u, _ in timed] == units
    assert [t for _, t in timed] == [1_000, 1_000 + 13_741_000_000, 1_000 + 15_267_500_000, 1_000 + 15_267_500_000]
    # a warm-up took the first entries: the measured part's clock starts at its first unit
    assert [t for _, t in replay_times(iter(units[1:]), 0.5, 0)] == [0, 6_106_000_002, 6_106_000_002]
    with pytest.raises(TypeError, match="carry their arrival time"):
        list(replay_times(iter([WorkUnit(0, Query("0", "p"))]), 1.0, 0))
    assert LoadSpec(replay=True, speedup=2.0).label == "trace-x2"


def test_equal_block_ids_give_equal_text_and_the_trace_lengths_on_the_simulators_count(tmp_path: Path) -> None:
    trace = load_trace(_jsonl(tmp_path / "m.jsonl", MOONCAKE))
    replay = TraceReplay(trace, chat=True, text=PromptText(seed=3))
    first, second = (u.query for u in replay.units(None, False))
    block = 512 * 4  # characters of a 512-token block: a token is four characters to the simulator
    assert len(first.prompt) == 6955 * 4 and len(second.prompt) == 6472 * 4
    assert first.prompt[: 12 * block] == second.prompt[: 12 * block]  # hash ids 46..57
    assert first.prompt[12 * block : 13 * block] != second.prompt[12 * block : 13 * block]  # 2050 vs 2052
    assert (first.max_tokens, second.max_tokens) == (52, 26)
    assert first.extra_body == {}  # nothing server-specific unless --param adds it
    # the same seed makes the same text anywhere; another seed or a salt makes other text
    again = next(TraceReplay(trace, chat=True, text=PromptText(seed=3)).units(1, False)).query.prompt
    assert again == first.prompt
    for other in (PromptText(seed=4), PromptText(seed=3, salt="run-2")):
        assert next(TraceReplay(trace, True, other).units(1, False)).query.prompt[:64] != first.prompt[:64]


async def test_the_driver_replays_at_the_units_times_until_its_deadline() -> None:
    offsets_ms = [5, 15, 15, 35, 900]  # the last is past the deadline: the trace is cut there
    units = [WorkUnit(i, Query(str(i), "p"), at_ns=ms * 1_000_000) for i, ms in enumerate(offsets_ms)]
    seen: list[tuple[int, int, int]] = []  # unit, scheduled, started

    async def execute(unit: WorkUnit, scheduled_ns: int) -> None:
        seen.append((unit.unit_id, scheduled_ns, now_ns()))

    start = now_ns()
    await drive(LoadSpec(replay=True, speedup=0.5), iter(units), execute, np.random.default_rng(0), start + 200_000_000)
    assert sorted(u for u, _, _ in seen) == [0, 1, 2, 3]  # units 1 and 2 are due together: either first
    scheduled = [t for _, t, _ in sorted(seen)]
    assert [t - scheduled[0] for t in scheduled] == [0, 20_000_000, 20_000_000, 60_000_000]
    assert all(started >= due for _, due, started in seen)  # never early


async def test_max_concurrency_still_gates_a_replay_and_its_wait_shows_as_lateness() -> None:
    units = [WorkUnit(i, Query(str(i), "p"), at_ns=0) for i in range(3)]  # all due at once
    starts: list[int] = []
    due: list[int] = []

    async def execute(unit: WorkUnit, scheduled_ns: int) -> None:
        starts.append(now_ns())
        due.append(scheduled_ns)
        await asyncio.sleep(0.02)

    spec = LoadSpec(replay=True, max_concurrency=1)
    await drive(spec, iter(units), execute, np.random.default_rng(0))
    assert len(set(due)) == 1  # one due time ...
    assert all(b - a >= 20_000_000 for a, b in itertools.pairwise(starts))  # ... one at a time
    assert starts[2] - due[2] >= 40_000_000  # the third waited for two before it


def _trace(path: Path, n: int, gap_ms: int) -> Path:
    """``n`` Mooncake entries ``gap_ms`` apart, every other one after a shared two-block prefix."""
    rows = []
    for i in range(n):
        shared = [1, 2] if i % 2 else []
        rows.append(
            {
                "timestamp": 1_000 + i * gap_ms,
                "input_length": 512 * len(shared) + 100 + i,
                "output_length": 6 + i % 5,
                "hash_ids": [*shared, 1_000 + i],
            }
        )
    return _jsonl(path, rows)


async def test_a_replay_against_the_simulator_keeps_the_traces_lengths_and_times(tmp_path: Path) -> None:
    path = _trace(tmp_path / "mooncake.jsonl", 24, 60)
    config = quick_config(tmp_path, trace=path, speedup=2.0, concurrency=None, max_queries=20)
    result = await run_benchmark(config)
    assert result.complete and (tmp_path / "run").is_dir()
    frame = result.records.sort("request_id")
    trace = load_trace(path)
    assert frame.height == 20  # the first 20 entries
    assert frame.get_column("query_id").to_list() == [f"mooncake-{i:06d}" for i in range(20)]
    # scheduled at the trace's times over the speedup, exactly; dispatched no earlier
    scheduled = frame.get_column("scheduled_ns").to_numpy()
    assert (scheduled - scheduled[0]).tolist() == [r.offset_ns // 2 for r in trace.requests[:20]]
    assert (frame.get_column("dispatched_ns").to_numpy() >= scheduled).all()
    inputs = [r.input_tokens for r in trace.requests[:20]]
    for tokens, wanted in zip(frame.get_column("prompt_tokens").to_list(), inputs, strict=True):
        assert wanted <= tokens <= wanted + CHAT_TEMPLATE_TOKENS
    outputs = frame.get_column("output_tokens").to_list()
    assert all(o <= r.output_tokens for o, r in zip(outputs, trace.requests, strict=False))
    # the shared blocks hit the simulator's prefix cache once the first of them was prefilled
    cached = frame.get_column("cached_prompt_tokens").to_list()
    assert [c for c in cached[::2]] == [0] * 10  # every even entry has only its own block
    assert all(c >= 1024 for c in cached[3::2])


class _Notes:
    """A display that keeps the run's notes."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    async def run(self, state: object) -> None:
        await asyncio.Event().wait()

    def finish(self, result: object) -> None:
        pass

    def note(self, message: str) -> None:
        self.notes.append(message)


async def test_a_replay_says_once_what_it_skipped_and_run_json_and_the_summary_keep_it(tmp_path: Path) -> None:
    path = tmp_path / "burstgpt.csv"
    path.write_text(BURSTGPT.replace("118,", "0.2,"))
    display = _Notes()
    # its entries 4.8 s apart: replayed 20 times faster
    config = quick_config(tmp_path, trace=path, speedup=20.0, concurrency=None, max_queries=None)
    result = await run_benchmark(config, display)
    assert result.records.height == 2
    skipped = [n for n in display.notes if "failed request" in n]
    assert skipped == ["note: skipped 1 failed request of burstgpt.csv (0 Response tokens)"]
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["workload"]["trace"] == {
        "file": "burstgpt.csv",
        "format": "burstgpt",
        "entries": 2,
        "skipped": 1,
        "skipped_by": {"Response tokens": 1},
    }
    assert result.summary["trace"] == run["workload"]["trace"]


async def test_a_sessions_replay_sends_each_turn_its_think_time_after_the_last_answer(tmp_path: Path) -> None:
    rows = [
        {
            "session_id": f"user-{i}",
            "timestamp": i * 0.1,
            "turns": [
                {"input_length": 200, "output_length": 5},
                {"input_length": 30, "output_length": 5, "think_s": 0.4},
                {"input_length": 30, "output_length": 5, "think_s": 0.2},
            ],
        }
        for i in range(4)
    ]
    config = quick_config(tmp_path, trace=_jsonl(tmp_path / "chats.jsonl", rows), speedup=2.0, concurrency=None)
    result = await run_benchmark(config)
    frame = result.records.sort("task_id", "turn_index")
    assert frame.height == 12 and frame.get_column("status").unique().to_list() == ["ok"]
    assert frame.group_by("query_id").len().sort("query_id").get_column("query_id").to_list() == [
        f"user-{i}" for i in range(4)
    ]
    firsts = frame.filter(pl.col("turn_index") == 0).get_column("scheduled_ns").to_numpy()
    assert (firsts - firsts[0]).tolist() == [i * 50_000_000 for i in range(4)]
    for _, session in frame.group_by("task_id"):
        ends = session.get_column("closed_ns").to_list()
        due = session.get_column("scheduled_ns").to_list()
        for k, think in ((1, 0.2), (2, 0.1)):  # the trace's think time over the speedup
            assert due[k] - ends[k - 1] == pytest.approx(think * NS, abs=20_000_000)  # not 0, not twice
        # each turn sends the history before it: prompts grow, and the history is cached
        prompts = session.get_column("prompt_tokens").to_list()
        assert 200 <= prompts[0] <= 200 + CHAT_TEMPLATE_TOKENS and prompts[1] > 230 and prompts[2] > prompts[1]
        assert session.get_column("cached_prompt_tokens").to_list()[2] > 200


def test_a_replay_plans_its_entries_less_those_its_warm_up_takes(tmp_path: Path) -> None:
    # each entry is sent once: the warm-up's come out of the trace, not on top of it
    config = quick_config(tmp_path, trace=_jsonl(tmp_path / "m.jsonl", MOONCAKE), concurrency=None, max_queries=None)
    config.warmup = 1
    assert planned(config, workload_of(config)) == len(MOONCAKE) - 1 == 1
    config.trace = None
    config.dataset = "synthetic"
    config.max_queries = 8  # a dataset is cycled: its warm-up comes on top
    assert planned(config, workload_of(config)) == 8
