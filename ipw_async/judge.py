"""Scoring answers with an LLM judge: a fixed prompt, one word back.

The judge scores a *finished* run from its directory, after the measured window, the tail and
``finalize``: no telemetry is being recorded then, so its calls cannot be in the run's energy,
by construction (whatever server it is). :func:`judge_run` asks it about each measured answer
that has a reference, writes every call to ``judge.jsonl`` and finalizes the run again, which
puts the verdicts in ``correct`` (records, traces, summary) in place of the run's own scoring.
The prompt and how a verdict reads are :mod:`ipw_async.judging`'s, shared with the simulator.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import polars as pl

from ._loop import run as run_loop
from .client import api_url, error_message
from .errors import stop_signal
from .judging import JUDGE_PROMPT, PROMPT_ID, verdict
from .results import finalize
from .rundir import files
from .rundir.read import RunDir
from .telemetry.http import redact_url

REPLY_CHARS = 200  # of each reply kept in judge.jsonl: a verdict is one word
UNPARSEABLE = "the reply says neither CORRECT nor INCORRECT"


class JudgeError(Exception):
    """The judge cannot score the run; the message says what to do."""


@dataclass(frozen=True)
class Item:
    """One answer to judge: a measured record's, or a task's final answer."""

    question: str
    reference: str
    answer: str
    query_id: str
    request_id: int | None  # the record judged, or the call that gave the task's final answer
    task_id: int | None = None

    def line(self) -> dict[str, Any]:
        """Its line in judge.jsonl before the judge answers: nothing known yet."""
        return {
            "request_id": self.request_id,
            "task_id": self.task_id,
            "query_id": self.query_id,
            "verdict": None,
            "error": None,
            "reply": None,
            "latency_s": None,
            "prompt_tokens": None,
            "completion_tokens": None,
            "http_status": None,
        }


def items_to_judge(run: RunDir) -> tuple[str, list[Item]]:
    """What the judge scores, and whether those are ``tasks`` or ``requests``: each measured
    task's final answer where the run logged tasks (not its intermediate turns), else each
    measured record that succeeded; only those with a reference answer. Warm-up is never judged."""
    tasks = run.tasks
    if tasks:
        return "tasks", [
            Item(
                t["prompt"],
                t["reference"],
                t["answer"],
                t["query_id"],
                t["turns"][-1]["request_id"],
                t["task_id"],
            )
            for t in tasks
            if not t["warmup"] and t["reference"] is not None and t["answer"] is not None and t["turns"]
        ]
    rows = run.measured_records().filter(
        ~pl.col("warmup") & (pl.col("status") == "ok") & pl.col("reference").is_not_null()
    )
    return "requests", [
        Item(row["prompt"], row["reference"], row["answer"] or "", row["query_id"], row["request_id"])
        for row in rows.select("prompt", "reference", "answer", "query_id", "request_id").iter_rows(
            named=True
        )
    ]


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``URL[,model]`` as the URL and the model (None: the judge server's first)."""
    url, _, model = spec.partition(",")
    url = url.strip()
    if not url.startswith(("http://", "https://")):
        raise JudgeError(
            f"--judge {redact_url(url)!r} is not an http(s) URL; give one like http://localhost:8000/v1[,MODEL]"
        )
    return url, model.strip() or None


@dataclass
class JudgeResult:
    """What :func:`judge_run` did: each judge.jsonl line, and the re-finalized run's summary."""

    run_dir: Path
    lines: list[dict[str, Any]]
    summary: dict[str, Any]

    @property
    def section(self) -> dict[str, Any]:
        """The summary's ``judge`` section."""
        return self.summary["judge"]


def judge_run(
    run_dir: str | Path,
    url: str,
    model: str | None = None,
    *,
    api_key: str | None = None,
    concurrency: int = 8,
    timeout_s: float = 60.0,
    max_tokens: int = 16,
) -> JudgeResult:
    """Score a finished run's measured answers with the LLM judge at ``url`` (an OpenAI-compatible
    base, e.g. http://localhost:8000/v1), then finalize the run again with the verdicts.

    ``model`` defaults to the first of the judge's ``/models``. One non-streaming chat completion
    per answer, ``concurrency`` at a time, at temperature 0. The run is re-finalized with its
    own attribution settings (``finalize`` again afterwards for others); its energy figures do
    not change. Raises :class:`JudgeError` when the judge cannot be reached or there is nothing
    to judge, and RunDirError when the directory is not a finished run.
    """
    run = RunDir.open(run_dir)
    run_dir, manifest = run.path, run.require_manifest()
    if not run.finished:  # its answers may still be arriving, or its end was never recorded
        raise JudgeError(
            f"{run_dir} has no {files.SUMMARY}: judge a run once it has finished "
            "(or after `ipw-async recover` for one that died)"
        )
    if concurrency < 1:
        raise JudgeError(f"--concurrency {concurrency}: the judge needs at least 1 call at a time")
    kind, items = items_to_judge(run)
    if not items:
        raise JudgeError(f"{run_dir} has no measured answers with a reference answer, so nothing to judge")
    shown = redact_url(url)
    judged = _Judged(
        model,
        [item.line() for item in items],
        {
            "url": shown,
            "prompt_id": PROMPT_ID,
            "items": kind,
            "same_server": manifest.base_url is not None
            and shown.rstrip("/") == manifest.base_url.rstrip("/"),
            "concurrency": concurrency,
            "max_tokens": max_tokens,
            "judged_at": dt.datetime.now(dt.UTC).isoformat(),
        },
    )
    try:
        run_loop(_judge_all(judged, items, url, api_key, concurrency, timeout_s, max_tokens, shown))
    except KeyboardInterrupt as exc:
        if judged.model is None:
            raise
        # the verdicts so far are kept; the rest are null, and say why
        why = f"the judge was stopped ({stop_signal(exc).name}) before this answer"
        for line in judged.lines:
            if line["verdict"] is None and line["error"] is None:
                line["error"] = why
        judged.write(run_dir, interrupted=True)
        finalize(run_dir)
        raise
    judged.write(run_dir)
    return JudgeResult(run_dir, judged.lines, finalize(run_dir).summary)


@dataclass
class _Judged:
    """What judging has found so far: the model, each item's line, the file's header."""

    model: str | None
    lines: list[dict[str, Any]]  # one per item, in the items' order
    header: dict[str, Any]
    t0: float = field(default_factory=time.perf_counter)

    def write(self, run_dir: Path, interrupted: bool = False) -> None:
        header = {"model": self.model, **self.header}
        header |= {"duration_s": time.perf_counter() - self.t0, "interrupted": interrupted}
        files.write_jsonl(run_dir / files.JUDGE, [{"judge": header}, *self.lines])


async def _judge_all(
    judged: _Judged,
    items: list[Item],
    url: str,
    api_key: str | None,
    concurrency: int,
    timeout_s: float,
    max_tokens: int,
    shown: str,
) -> None:
    """The model judging, and each item's judge.jsonl line into ``judged`` as it comes."""
    # httpx, not the run's StreamingClient: that client streams events into a run's records and
    # fails a whole JSON body as not streaming, where a judge call wants one JSON completion.
    # The model list comes through the same client too, not list_models, so that both share the
    # judge's key, timeout, TLS and proxy settings, and its failures speak of --judge, where
    # list_models' speak of the run's --base-url.
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(headers=headers, timeout=timeout_s, limits=limits) as http:
        model = judged.model = judged.model or await _first_model(http, url, shown)
        # the first alone: a judge that cannot be reached is one error, not one per answer
        first = judged.lines[0] = await _ask(http, url, model, items[0], max_tokens)
        _check_reached(first, shown)
        pending = iter(range(1, len(items)))

        async def worker() -> None:
            # ``concurrency`` workers share one iterator: as many calls in flight, and as many
            # tasks alive, however many answers there are
            for i in pending:
                judged.lines[i] = await _ask(http, url, model, items[i], max_tokens)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _first_model(http: httpx.AsyncClient, url: str, shown: str) -> str:
    """The first model the judge lists."""
    try:
        response = await http.get(api_url(url, "/models"))
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise _unreachable(shown, type(exc).__name__) from None
    if response.status_code >= 400:
        raise JudgeError(
            f"the judge at {shown} answered GET /models with HTTP {response.status_code} "
            f"({error_message(response.content)}); check the URL and --api-key, or name the model: --judge URL,MODEL"
        )
    try:
        return str(response.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise JudgeError(f"the judge at {shown} lists no models; name one: --judge URL,MODEL") from None


def _unreachable(shown: str, why: str) -> JudgeError:
    return JudgeError(
        f"cannot reach the judge at {shown} ({why}): start it, or give --judge the URL[,MODEL] "
        "of a running OpenAI-compatible server"
    )


def _check_reached(line: dict[str, Any], shown: str) -> None:
    """Raise for a first call that shows the judge cannot score anything: unreachable, the key
    refused, or no such endpoint or model."""
    status = line["http_status"]
    if status is None:
        raise _unreachable(shown, line["error"])
    if status in (401, 403, 404):
        raise JudgeError(
            f"the judge at {shown} refused its first call ({line['error']}); "
            "check --judge URL[,MODEL] and --api-key"
        )


async def _ask(
    http: httpx.AsyncClient, url: str, model: str, item: Item, max_tokens: int
) -> dict[str, Any]:
    """One judge call: its line, with the verdict or why there is none (missing is not false)."""
    line = item.line()
    body = {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": JUDGE_PROMPT.format(
                    question=item.question, reference=item.reference, answer=item.answer
                ),
            }
        ],
        "stream": False,
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    t0 = time.perf_counter()
    try:
        response = await http.post(api_url(url, "/chat/completions"), json=body)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        line["error"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return line
    finally:
        line["latency_s"] = time.perf_counter() - t0
    line["http_status"] = response.status_code
    if response.status_code >= 400:
        line["error"] = f"HTTP {response.status_code}: {error_message(response.content)}"
        return line
    try:
        payload = response.json()
        reply = payload["choices"][0]["message"]["content"] or ""
        if not isinstance(reply, str):
            raise TypeError(reply)
    except (ValueError, KeyError, IndexError, TypeError):
        line["reply"] = response.text[:REPLY_CHARS]
        line["error"] = "the reply is not a chat completion"
        return line
    usage = payload.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    line |= {
        "reply": reply[:REPLY_CHARS],
        "verdict": verdict(reply),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
    }
    if line["verdict"] is None:
        line["error"] = UNPARSEABLE
    return line
