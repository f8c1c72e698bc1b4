"""The LLM judge: real runs against the simulator, judged over real HTTP by a scripted judge on
loopback, after the run; the verdicts land in records, traces and summary, and the run's
energy is what it was."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from aiohttp import web
from typer.testing import CliRunner

from ipw_async import QueryTrace, finalize, run_benchmark
from ipw_async.analysis.accuracy import accuracy_report
from ipw_async.cli import app
from ipw_async.judge import PROMPT_ID, UNPARSEABLE, JudgeError, judge_run, parse_spec, verdict
from ipw_async.rundir import files
from ipw_async.rundir.read import RunDir

from .conftest import quick_config

runner = CliRunner()
DEAD = "http://127.0.0.1:9/v1"  # the discard port: nothing listens, the connection is refused
SECRET = "sk-judge-secret-0123456789"

# what the judge is asked, read back out of its prompt
_ASKED = re.compile(
    r"Reference answer: (.*)\nAnswer to grade: (.*)\nIs the answer to grade correct", re.DOTALL
)

Rule = Callable[[str, str], "str | int"]  # (reference, answer) → the reply, or an HTTP status


def by_reference(reference: str, _answer: str) -> str | int:
    """The test's rule: references before M are correct, whatever the answer says."""
    return "CORRECT" if reference < "M" else "INCORRECT"


class ScriptedJudge:
    """An OpenAI-compatible judge on loopback, in a thread of its own: it answers by ``rule``,
    counts its calls and keeps each body and Authorization header it was sent."""

    def __init__(self) -> None:
        self.rule: Rule = by_reference
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.hang_after: int | None = None  # calls answered before it stops answering
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._runner: web.AppRunner = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result()

    async def _start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def calls(self) -> int:
        return len(self.bodies)

    def reset(self, rule: Rule = by_reference) -> None:
        self.rule, self.bodies, self.auth, self.hang_after = rule, [], [], None

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "scripted-judge", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        self.auth.append(request.headers.get("Authorization"))
        while self.hang_after is not None and self.calls > self.hang_after:  # until reset
            await asyncio.sleep(0.05)
        asked = _ASKED.search(body["messages"][0]["content"])
        assert asked is not None, "not the judge prompt"
        reply = self.rule(asked.group(1), asked.group(2))
        if isinstance(reply, int):
            return web.json_response({"error": {"message": "the judge is overloaded"}}, status=reply)
        return web.json_response(
            {
                "object": "chat.completion",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 60, "completion_tokens": 2, "total_tokens": 62},
            }
        )

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


@pytest.fixture(scope="module")
def judge() -> Iterator[ScriptedJudge]:
    server = ScriptedJudge()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _fresh_rule(judge: ScriptedJudge) -> None:
    judge.reset()


@pytest.fixture(scope="module")
def single_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real single-turn run on the built-in simulator: qa questions, 2 warm-up, 12 measured."""
    config = quick_config(tmp_path_factory.mktemp("single"), max_queries=12, warmup=2, baseline_s=0, tail_s=0)
    return asyncio.run(run_benchmark(config)).run_dir


@pytest.fixture(scope="module")
def agentic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = quick_config(
        tmp_path_factory.mktemp("agentic"),
        workload="agentic",
        max_queries=6,
        warmup=1,
        baseline_s=0,
        tail_s=0,
    )
    return asyncio.run(run_benchmark(config)).run_dir


def copy(run_dir: Path, tmp_path: Path) -> Path:
    """A run of its own for a test to judge."""
    return Path(shutil.copytree(run_dir, tmp_path / "run"))


def records(run_dir: Path) -> pl.DataFrame:
    return files.read_arrow(run_dir / files.RECORDS)


def summary(run_dir: Path) -> dict[str, Any]:
    return files.read_json(run_dir / files.SUMMARY)


def test_verdict_reads_the_first_verdict_word() -> None:
    assert verdict("CORRECT") is True
    assert verdict("incorrect.") is False
    assert verdict("**Correct**") is True
    assert verdict("The answer is INCORRECT, not CORRECT") is False  # the first one counts
    assert verdict("CORRECT\n\nINCORRECT") is True
    for reply in ("", "Yes", "INCORRECTLY", "correctness", "C-O-R-R-E-C-T"):
        assert verdict(reply) is None, reply


def test_a_judge_spec_is_a_url_and_an_optional_model() -> None:
    assert parse_spec("http://h:8000/v1") == ("http://h:8000/v1", None)
    assert parse_spec("http://h:8000/v1,org/judge-7b") == ("http://h:8000/v1", "org/judge-7b")
    with pytest.raises(JudgeError, match="not an http"):
        parse_spec("h:8000/v1,model")


def test_records_follow_the_judge_and_energy_stays_as_measured(
    single_run: Path, judge: ScriptedJudge, tmp_path: Path
) -> None:
    run_dir = copy(single_run, tmp_path)
    before, summary_before = records(run_dir), summary(run_dir)
    telemetry = (run_dir / files.TELEMETRY).read_bytes()
    result = judge_run(run_dir, judge.url)

    after = records(run_dir)
    measured = after.filter(
        ~pl.col("warmup") & (pl.col("status") == "ok") & pl.col("reference").is_not_null()
    )
    # one call per measured answer with a reference: warm-up is not judged
    assert judge.calls == measured.height == 12 and after.filter(pl.col("warmup")).height == 2
    for row in measured.iter_rows(named=True):
        assert row["correct"] is (row["reference"] < "M"), row["reference"]
    # warm-up keeps the run's own verdicts; every record keeps its own beside the judge's
    warm = after.filter(pl.col("warmup"))
    assert (
        warm.get_column("correct").to_list()
        == before.filter(pl.col("warmup")).get_column("correct").to_list()
    )
    assert after.get_column("inline_correct").to_list() == before.get_column("correct").to_list()
    # the judge's calls are not in the measured energy: the same figures, the telemetry untouched
    assert after.get_column("energy_j").to_list() == before.get_column("energy_j").to_list()
    assert summary(run_dir)["energy"] == summary_before["energy"]
    assert (run_dir / files.TELEMETRY).read_bytes() == telemetry
    # each call as the judge saw it: one prompt, not streamed, temperature 0, the listed model
    body = judge.bodies[0]
    assert (body["stream"], body["temperature"], body["model"]) == (False, 0, "scripted-judge")
    assert body["max_tokens"] <= 16 and body["messages"][0]["content"].startswith("You are grading")

    judged = summary(run_dir)
    section = judged["judge"]
    expected = int(measured.get_column("correct").sum())
    assert judged["scorer"] == "judge" and section["run_scorer"] == "exact"
    assert section["verdicts"] == {"correct": expected, "incorrect": 12 - expected, "unscored": 0}
    assert (section["model"], section["url"], section["prompt_id"]) == (
        "scripted-judge",
        judge.url,
        PROMPT_ID,
    )
    assert section["latency_s"]["p50"] > 0 and section["latency_s"]["p95"] >= section["latency_s"]["p50"]
    assert section["prompt_tokens"] == 60 * 12 and section["completion_tokens"] == 2 * 12
    assert "not in the run's energy" in section["energy"] and section["same_server"] is False
    assert judged["accuracy"] == {"scored": 12, "correct": expected, "accuracy": expected / 12}
    assert result.section == section
    # traces and the analysis follow: accuracy, and IPJ over the same energy
    traces = {t.turns[0].request_id: t for t in QueryTrace.load_jsonl(run_dir / files.TRACES)}
    assert all(traces[r["request_id"]].correct is r["correct"] for r in after.iter_rows(named=True))
    report = accuracy_report(RunDir.open(run_dir))
    assert (report["correct"], report["scored"]) == (expected, 12)
    assert report["energy"]["sim"]["ipj"] == pytest.approx(
        expected / 12 / report["energy"]["sim"]["energy_j"]["mean"]
    )


def test_an_answer_the_judge_cannot_score_is_null_with_the_reason(
    single_run: Path, judge: ScriptedJudge, tmp_path: Path
) -> None:
    run_dir = copy(single_run, tmp_path)
    measured = records(run_dir).filter(~pl.col("warmup")).get_column("reference").to_list()
    overloaded, rambling = measured[1], measured[2]

    def flaky(reference: str, answer: str) -> str | int:
        if reference == overloaded:
            return 500
        return "I would rather not say" if reference == rambling else by_reference(reference, answer)

    judge.reset(flaky)
    judge_run(run_dir, judge.url, concurrency=3)
    frame = records(run_dir).filter(~pl.col("warmup"))
    for row in frame.iter_rows(named=True):
        if row["reference"] == overloaded:
            assert row["correct"] is None and row["judge_error"] == "HTTP 500: the judge is overloaded"
        elif row["reference"] == rambling:
            assert row["correct"] is None and row["judge_error"] == UNPARSEABLE
        else:
            assert row["correct"] is (row["reference"] < "M") and row["judge_error"] is None
    lines = files.read_jsonl(run_dir / files.JUDGE)
    assert lines[0]["judge"]["prompt_id"] == PROMPT_ID and len(lines) == 13
    failed = [line for line in lines[1:] if line["verdict"] is None]
    assert {line["http_status"] for line in failed} == {500, 200}
    assert all(line["reply"] == "I would rather not say" for line in failed if line["http_status"] == 200)
    section = summary(run_dir)["judge"]
    unscored = frame.get_column("correct").null_count()
    assert section["verdicts"]["unscored"] == unscored == len(failed)
    assert sum(section["errors"].values()) == unscored
    # missing is not zero: unscored answers are left out of accuracy, not counted wrong
    assert summary(run_dir)["accuracy"]["scored"] == 12 - unscored
    traces = [t for t in QueryTrace.load_jsonl(run_dir / files.TRACES) if t.correct is None and not t.warmup]
    assert {t.judge_error for t in traces} == {"HTTP 500: the judge is overloaded", UNPARSEABLE}


def test_finalize_again_keeps_the_verdicts_and_without_judge_jsonl_the_run_is_its_own(
    single_run: Path, judge: ScriptedJudge, tmp_path: Path
) -> None:
    run_dir = copy(single_run, tmp_path)
    own = records(run_dir).get_column("correct").to_list()
    judge_run(run_dir, judge.url)
    judged = records(run_dir).get_column("correct").to_list()
    finalize(run_dir)
    assert records(run_dir).get_column("correct").to_list() == judged
    (run_dir / files.JUDGE).unlink()
    finalize(run_dir)
    assert records(run_dir).get_column("correct").to_list() == own
    assert "judge" not in summary(run_dir) and summary(run_dir)["scorer"] == "exact"
    assert "inline_correct" not in records(run_dir).columns


def test_an_agentic_run_is_judged_on_each_tasks_final_answer(
    agentic_run: Path, judge: ScriptedJudge, tmp_path: Path
) -> None:
    run_dir = copy(agentic_run, tmp_path)
    before = records(run_dir)
    tasks = {t["task_id"]: t for t in RunDir.open(run_dir).tasks}
    answered = [t for t in tasks.values() if not t["warmup"] and t["answer"] is not None]
    assert len(answered) == 6 and len(tasks) == 7
    judge.reset(lambda reference, answer: "CORRECT" if answer.strip() == reference else "INCORRECT")
    judge_run(run_dir, judge.url)

    # one call per measured task, on its final answer: not its intermediate turns, not warm-up
    assert judge.calls == 6
    asked = {_ASKED.search(b["messages"][0]["content"]).group(2) for b in judge.bodies}  # type: ignore[union-attr]
    assert asked == {t["answer"] for t in answered}
    traces = {t.task_id: t for t in QueryTrace.load_jsonl(run_dir / files.TRACES)}
    after = records(run_dir)
    for task in answered:
        expected = task["answer"].strip() == task["reference"]
        assert traces[task["task_id"]].correct is expected
        final = after.filter(pl.col("request_id") == task["turns"][-1]["request_id"])
        assert final.get_column("correct").to_list() == [expected]
    # intermediate turns are scored by no one, as before
    final_ids = {t["turns"][-1]["request_id"] for t in tasks.values()}
    middle = after.filter(~pl.col("request_id").is_in(list(final_ids)))
    assert middle.get_column("correct").null_count() == middle.height
    judged = summary(run_dir)
    assert judged["judge"]["items"] == "tasks" and judged["judge"]["judged"] == 6
    assert judged["tasks"]["correct"] == sum(t["answer"].strip() == t["reference"] for t in answered)
    assert after.get_column("energy_j").to_list() == before.get_column("energy_j").to_list()


def test_a_task_the_judge_cannot_score_is_left_out_of_task_success(
    agentic_run: Path, judge: ScriptedJudge, tmp_path: Path
) -> None:
    run_dir = copy(agentic_run, tmp_path)
    answered = [t for t in RunDir.open(run_dir).tasks if not t["warmup"] and t["answer"] is not None]
    garbled = {answered[0]["answer"], answered[1]["answer"]}
    judge.reset(lambda reference, answer: "no idea" if answer in garbled else "CORRECT")
    judge_run(run_dir, judge.url)
    tasks = summary(run_dir)["tasks"]
    unscored = sum(t["answer"] in garbled for t in answered)
    assert tasks["unscored"] == unscored >= 1
    # missing is not zero: the rate is over the tasks the judge scored, all correct here
    assert tasks["correct"] == len(answered) - unscored and tasks["success_rate"] == 1.0


def test_the_judges_api_key_reaches_the_judge_and_no_file(
    single_run: Path, judge: ScriptedJudge, tmp_path: Path
) -> None:
    run_dir = copy(single_run, tmp_path)
    judge_run(run_dir, judge.url, "named-model", api_key=SECRET)
    assert set(judge.auth) == {f"Bearer {SECRET}"} and judge.bodies[0]["model"] == "named-model"
    judge.reset()
    judge_run(run_dir, judge.url.replace("http://", "http://user:pw-secret-987@"))  # basic auth
    assert len(set(judge.auth)) == 1 and judge.auth[0].startswith("Basic ")  # type: ignore[union-attr]
    assert summary(run_dir)["judge"]["url"] == judge.url.replace("http://", "http://user:***@")
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert SECRET.encode() not in data and b"pw-secret-987" not in data, path


def test_a_judge_that_cannot_be_reached_changes_nothing(single_run: Path, tmp_path: Path) -> None:
    run_dir = copy(single_run, tmp_path)
    before = (run_dir / files.SUMMARY).read_bytes()
    for model in (None, "named-model"):  # refused at GET /models, or at the first call
        with pytest.raises(JudgeError, match=re.escape(f"cannot reach the judge at {DEAD}")):
            judge_run(run_dir, DEAD, model)
    assert not (run_dir / files.JUDGE).exists() and (run_dir / files.SUMMARY).read_bytes() == before


def test_a_run_still_going_or_without_answers_to_judge_is_refused(
    single_run: Path, judge: ScriptedJudge, tmp_path: Path
) -> None:
    run_dir = copy(single_run, tmp_path)
    (run_dir / files.SUMMARY).unlink()
    with pytest.raises(JudgeError, match="judge a run once it has finished"):
        judge_run(run_dir, judge.url)
    finalize(run_dir)
    frame = files.read_arrow(run_dir / files.MEASURED).with_columns(pl.lit(None, pl.String).alias("reference"))
    files.write_frame(frame, run_dir / files.MEASURED)  # what the run measured: no references
    with pytest.raises(JudgeError, match="nothing to judge"):
        judge_run(run_dir, judge.url)
    assert judge.calls == 0


def test_a_judge_on_the_runs_own_server_is_said_so(sim: Any, judge: ScriptedJudge, tmp_path: Path) -> None:
    """The judge may be the server that was measured: judged after the run, it is not in the
    energy, and the summary says whose it was."""
    config = quick_config(
        tmp_path, base_url=sim.base_url, max_queries=4, baseline_s=0, tail_s=0, telemetry="none"
    )
    run_dir = asyncio.run(run_benchmark(config)).run_dir
    judge_run(run_dir, sim.base_url, max_tokens=4)
    section = summary(run_dir)["judge"]
    assert section["same_server"] is True and "run's own server" in section["server"]
    assert section["judged"] == 4


def test_the_judge_command_prints_its_table(single_run: Path, judge: ScriptedJudge, tmp_path: Path) -> None:
    run_dir = copy(single_run, tmp_path)
    result = runner.invoke(
        app,
        ["judge", str(run_dir), "--judge", f"{judge.url},cli-judge", "--concurrency", "2"],
        env={"COLUMNS": "200", "OPENAI_API_KEY": SECRET},
    )
    assert result.exit_code == 0, result.output
    assert f"judged by cli-judge at {judge.url}" in result.output
    assert re.search(r"requests judged\W+12", result.output) and "accuracy" in result.output
    assert set(judge.auth) == {f"Bearer {SECRET}"}
    assert SECRET not in result.output


def test_the_judge_command_fails_in_one_line_for_a_dead_judge(single_run: Path, tmp_path: Path) -> None:
    run_dir = copy(single_run, tmp_path)
    result = runner.invoke(app, ["judge", str(run_dir), "--judge", DEAD], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert result.output.startswith("error: cannot reach the judge at http://127.0.0.1:9/v1")
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.parametrize("alive", [True, False])
def test_run_with_judge_judges_after_the_run(alive: bool, judge: ScriptedJudge, tmp_path: Path) -> None:
    url = judge.url if alive else DEAD
    args = ["run", "-n", "6", "--baseline-s", "0", "--no-dashboard", "--quiet", "-o", str(tmp_path / "r")]
    result = runner.invoke(app, [*args, "--judge", url], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    judged = summary(tmp_path / "r")
    if alive:
        assert judge.calls == 6 and judged["scorer"] == "judge" and judged["judge"]["judged"] == 6
        assert "requests judged" in result.output
    else:
        (warning,) = [line for line in result.output.splitlines() if "judge skipped" in line]
        assert "cannot reach the judge" in warning and "exit code 0" in warning
        assert judged["scorer"] == "exact" and not (tmp_path / "r" / files.JUDGE).exists()


def test_a_judge_spec_that_is_no_url_stops_the_run_before_it_starts(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["run", "-o", str(tmp_path / "r"), "--judge", "judge-7b"], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 2 and "is not an http(s) URL" in result.output
    assert not (tmp_path / "r").exists()


def test_judge_jsonl_has_a_header_then_one_line_per_item(
    single_run: Path, judge: ScriptedJudge, tmp_path: Path
) -> None:
    run_dir = copy(single_run, tmp_path)
    judge_run(run_dir, judge.url)
    header, *lines = (json.loads(line) for line in (run_dir / files.JUDGE).read_text().splitlines())
    assert set(header["judge"]) >= {"model", "url", "prompt_id", "items", "same_server", "judged_at"}
    ids = records(run_dir).filter(~pl.col("warmup")).get_column("request_id").to_list()
    assert [line["request_id"] for line in lines] == ids
    assert all(line["http_status"] == 200 and line["latency_s"] > 0 for line in lines)
    assert {line["reply"] for line in lines} <= {"CORRECT", "INCORRECT"}


@pytest.mark.parametrize(
    ("judge_url", "run_server", "given", "sent"),
    [
        ("http://gpu:8000/v1", "http://gpu:8000/v1", None, "run-key"),  # the run's own server
        ("https://judge.example/v1", "http://gpu:8000/v1", None, None),  # elsewhere: not its key
        ("https://judge.example/v1", None, None, None),  # the simulator's run
        ("https://judge.example/v1", "http://gpu:8000/v1", "judge-key", "judge-key"),
    ],
)
def test_run_judge_takes_the_runs_key_only_to_the_runs_own_server(
    judge_url: str, run_server: str | None, given: str | None, sent: str | None
) -> None:
    from ipw_async.cli.judge import Judging

    options = {"judge": judge_url, "base_url": run_server, "api_key": "run-key", "judge_api_key": given}
    judging = Judging.from_options(options)
    assert judging is not None and judging.api_key == sent


def test_ctrl_c_while_judging_keeps_the_verdicts_made_so_far(
    single_run: Path, judge: ScriptedJudge, tmp_path: Path
) -> None:
    run_dir = copy(single_run, tmp_path)
    judge.hang_after = 4
    command = [
        sys.executable,
        "-m",
        "ipw_async",
        "judge",
        str(run_dir),
        "--judge",
        judge.url,
        "--concurrency",
        "1",
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while judge.calls <= 4:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    header, *lines = [json.loads(line) for line in (run_dir / files.JUDGE).read_text().splitlines()]
    assert header["judge"]["interrupted"] is True and len(lines) == 12
    assert [line["verdict"] is not None for line in lines] == [True] * 4 + [False] * 8
    assert all(line["error"].startswith("the judge was stopped") for line in lines[4:])
    # the run is finalized with what was judged: 4 scored, the rest null and not counted
    frame = records(run_dir).filter(~pl.col("warmup"))
    assert frame["correct"].drop_nulls().len() == 4
    assert frame["judge_error"].drop_nulls().len() == 8
    judge.reset()  # the call it hangs on returns
