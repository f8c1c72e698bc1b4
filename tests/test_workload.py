"""The workload seam: any workload's units run through the same driver, requests and files."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from ipw_async import Query, WorkUnit, run_benchmark
from ipw_async.sim import SimulatorProcess
from ipw_async.workload import Requests
from ipw_async.workload.tools import Toolbox

from .conftest import quick_config


class AskTwice:
    """A trivial custom workload: each unit asks a question, then a follow-up."""

    name = "ask-twice"
    scorer = None

    def __init__(self, questions: list[str]) -> None:
        self.questions = questions
        self.performed: list[int] = []

    def size(self) -> int:
        return len(self.questions)

    def units(self, count: int | None, warmup: bool) -> Iterator[WorkUnit]:
        for i, question in enumerate(self.questions[:count]):
            yield WorkUnit(i, Query(f"q{i}", question), warmup)

    async def perform(self, unit: WorkUnit, requests: Requests, scheduled_ns: int) -> None:
        self.performed.append(unit.unit_id)
        for prompt in (unit.query.prompt, f"{unit.query.prompt} Are you sure?"):
            record = requests.new_record(unit, scheduled_ns, prompt)
            messages = [{"role": "user", "content": prompt}]
            await requests.request(record, requests.payload({"messages": messages}, max_tokens=8))


async def test_a_custom_workload_runs_through_the_seam(tmp_path: Path, sim: SimulatorProcess) -> None:
    workload = AskTwice([f"What is {i} + {i}?" for i in range(5)])
    config = quick_config(tmp_path, base_url=sim.base_url, max_queries=5, concurrency=2, telemetry="none")
    result = await run_benchmark(config, workload=workload)
    assert sorted(workload.performed) == [0, 1, 2, 3, 4]
    records = pl.read_ipc_stream(tmp_path / "run" / "records.arrow").sort("request_id")
    assert records.height == 10 and records.get_column("dataset").unique().to_list() == ["ask-twice"]
    by_query = records.group_by("query_id").agg(pl.col("prompt")).sort("query_id")
    assert by_query.get_column("query_id").to_list() == [f"q{i}" for i in range(5)]
    for question, prompts in zip(workload.questions, by_query.get_column("prompt").to_list(), strict=True):
        assert sorted(prompts) == sorted([question, f"{question} Are you sure?"])
    assert (records.get_column("status") == "ok").all()
    assert result.summary["dataset"] == "ask-twice" and result.summary["requests"]["measured"] == 10


@pytest.mark.parametrize(
    ("expression", "output"),
    [
        ("9**9**9**9", "error: result too large (more than 100 digits)"),
        ("((((9**64)**64)**64)**64)**64", "error: result too large (more than 100 digits)"),
        ("(10**60) * (10**60)", "error: result too large (more than 100 digits)"),
        ("(-8) ** (1/3)", "error: the result is not a real number"),
        ("1e308 * 10", "error: result too large"),
        ("-" * 100_000 + "1", "error: expression too deeply nested"),
        ("2**100", "1267650600228229401496703205376"),
        ("(17 * 23) + 41", "432"),
        ("7 / 2", "3.5"),
        ("2 ** -2", "0.25"),
        ("(-1) ** (10**99)", "1"),
    ],
)
async def test_the_calculator_bounds_its_numbers_and_says_so_as_its_result(
    expression: str, output: str
) -> None:
    start = time.perf_counter()
    result = await Toolbox().call("calculator", expression, random.Random(0), t0_ns=0, json_arguments=False)
    assert result.output == output
    assert result.ok is not output.startswith("error:")
    assert time.perf_counter() - start < 1.0  # refused before the number was built
