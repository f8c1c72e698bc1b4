"""``judge``, and ``run --judge``: score a finished run's answers with an LLM judge, after its
measured window (so the judge's calls are not in its energy)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import Stopped
from ..harness.panels import OUTPUT
from ..rundir.manifest import RunDirError
from ._common import Debug, err, fail, finish_first, out

if TYPE_CHECKING:  # the judge and the finisher it runs again load when a judge is asked for
    from ..judge import JudgeResult

_JUDGE_HELP = (
    "Score the answers with an LLM judge at this OpenAI-compatible URL, after the run "
    "(its calls are not in the run's energy); the model after a comma, else the judge's first."
)


def verdict_table(result: JudgeResult) -> Table:
    """The verdicts in a few rows: counts, why some are unscored, accuracy, the judge's cost."""
    from ..report import ms

    section, summary = result.section, result.summary
    verdicts = section["verdicts"]
    table = Table(
        title=f"judged by {section['model']} at {section['url']} (prompt {section['prompt_id']})",
        show_header=False,
        title_justify="left",
    )
    table.add_column(style="bold")
    table.add_column()
    table.add_row(f"{section['items']} judged", str(section["judged"]))
    table.add_row("correct", str(verdicts["correct"]))
    table.add_row("incorrect", str(verdicts["incorrect"]))
    reasons = "; ".join(f"{reason} ×{n}" for reason, n in section["errors"].items())
    table.add_row("unscored (null)", f"{verdicts['unscored']}" + (f" ({reasons})" if reasons else ""))
    if section["items"] == "tasks":
        rate = summary["tasks"]["success_rate"]
        table.add_row("task success", "—" if rate is None else f"{rate:.1%}")
    else:
        accuracy = summary["accuracy"]["accuracy"]
        table.add_row("accuracy", "—" if accuracy is None else f"{accuracy:.1%}")
    agreement = section["agreement_with_run_scorer"]
    if agreement["compared"]:
        table.add_row("agrees with the run's scorer", f"{agreement['agree']} of {agreement['compared']}")
    latency = section["latency_s"]
    table.add_row("judge latency p50 / p95", f"{ms(latency['p50'])} / {ms(latency['p95'])}")
    table.add_row("energy", "the judge's calls came after the measured window: not in the run's energy")
    return table


def judge(
    run_dir: Annotated[
        Path, typer.Argument(help="A finished run directory written by `ipw-async run`.", show_default=False)
    ],
    spec: Annotated[
        str,
        typer.Option(
            "--judge",
            metavar="URL[,MODEL]",
            help="The judge: an OpenAI-compatible URL, e.g. http://localhost:8000/v1, and a model "
            "after a comma (default: the judge's first).",
            show_default=False,
        ),
    ],
    api_key: Annotated[
        str | None,
        typer.Option(envvar="OPENAI_API_KEY", help="The judge's API key. Never written to any file or log."),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Judge calls at a time.")] = 8,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each judge call.")] = 60.0,
) -> None:
    """Score a finished run's measured answers with an LLM judge, then finalize it again.

    Each measured answer with a reference (an agentic task's final answer) gets one call; the
    verdicts go to judge.jsonl and replace the run's own scoring in records, traces and
    summary (null, with the reason, where the judge could not score). The judge runs after the
    run's measured window, so its calls are not in the run's energy.
    """
    from ..judge import JudgeError, judge_run, parse_spec

    finish_first(run_dir)  # a run cut short is judged as recover finishes it
    try:
        url, model = parse_spec(spec)
        result = judge_run(run_dir, url, model, api_key=api_key, concurrency=concurrency, timeout_s=timeout)
    except Stopped as exc:
        err.print(f"[yellow]stopped by {exc.signal.name}:[/] the verdicts so far are in {run_dir}")
        raise typer.Exit(128 + exc.signal) from None
    except (JudgeError, RunDirError) as exc:
        raise fail(str(exc)) from None
    out.print(verdict_table(result))


JUDGE_PARAMETERS = [
    inspect.Parameter(
        "judge",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            str | None, typer.Option(metavar="URL[,MODEL]", help=_JUDGE_HELP, rich_help_panel=OUTPUT)
        ],
    ),
    inspect.Parameter(
        "judge_api_key",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            str | None,
            typer.Option(
                help="The judge's API key (default: the run's --api-key, when the judge is on the run's server). "
                "Never written to any file or log.",
                show_default=False,
                rich_help_panel=OUTPUT,
            ),
        ],
    ),
]


@dataclass(frozen=True)
class Judging:
    """``run --judge``: the judge, scoring the run once it has finished, before its exports."""

    url: str
    model: str | None
    api_key: str | None

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> Judging | None:
        """The judge asked for, checked before the run starts; None for none."""
        if options.get("judge") is None:
            return None
        from ..judge import JudgeError, parse_spec

        try:
            url, model = parse_spec(options["judge"])
        except JudgeError as exc:
            raise fail(str(exc)) from None
        key = options.get("judge_api_key")
        if key is None and _same_origin(url, options.get("base_url") or options.get("upstream")):
            key = options.get("api_key")  # the run's own key goes only where the run's calls go
        return cls(url, model, key)

    def __call__(self, run_dir: Path, code: int) -> None:
        """Judge the run; a judge that fails is one warning line: the run, its exit ``code`` and
        its files (with its own scoring) stand."""
        from ..judge import JudgeError, judge_run

        try:
            result = judge_run(run_dir, self.url, self.model, api_key=self.api_key)
        except (JudgeError, RunDirError) as exc:
            _skipped(str(exc), run_dir, code)
        except Exception as exc:  # the run's files are whole: a judge's fault stays a warning
            if Debug.on:
                raise
            _skipped(f"{exc} (rerun with --debug for the traceback)", run_dir, code)
        else:
            out.print(verdict_table(result))


def _same_origin(url: str, other: str | None) -> bool:
    if other is None:
        return False
    a, b = urlsplit(url), urlsplit(other)
    return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port)


def _skipped(why: str, run_dir: Path, code: int) -> None:
    err.print(
        f"[yellow]judge skipped:[/] {escape(why)}; the run's files are kept, scored by its own "
        f"scorer (exit code {code}); judge it later: ipw-async judge {escape(str(run_dir))} --judge URL"
    )


def register(app: typer.Typer) -> None:
    app.command("judge")(judge)
