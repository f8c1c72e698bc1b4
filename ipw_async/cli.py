"""The ``ipw-async`` command line: a thin layer over the library functions."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from .runner import RunConfig, RunError, run_benchmark

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Benchmark LLM inference cost under concurrent load: latency, throughput and per-query energy.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
err = Console(stderr=True, highlight=False, soft_wrap=True)  # an error is one line, however long
_debug = False


@app.callback()
def _main(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show full tracebacks instead of one-line errors.")
    ] = False,
) -> None:
    global _debug
    _debug = debug


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def parse_params(items: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; a value that parses as JSON is used as JSON (numbers, true, lists)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"--param {item!r} is not key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _display(dashboard: bool, quiet: bool) -> Any:
    """The live dashboard on a terminal; plain lines in a log or pipe; nothing with --quiet."""
    from .progress import LinesDisplay

    if dashboard and not quiet and sys.stderr.isatty():
        from .dashboard import Dashboard

        return Dashboard()
    return LinesDisplay(quiet=quiet)


def execute(config: RunConfig, display: Any) -> int:
    """Run with one-line errors; the exit code says how it ended (0 ok, 1 partial, 2 unusable, 130 ^C)."""
    try:
        result = asyncio.run(run_benchmark(config, display))
    except RunError as exc:
        if _debug:
            raise
        err.print(f"[bold red]error:[/] {exc}")
        return 1 if "records kept" in str(exc) else 2
    except KeyboardInterrupt:
        err.print(
            "[yellow]interrupted:[/] the records measured so far are on disk (summary says complete: false)"
        )
        return 130
    return 0 if result.complete else 1


@app.command()
def run(
    ctx: typer.Context,
    base_url: Annotated[
        str | None,
        typer.Option(
            help="OpenAI-compatible API base, e.g. http://localhost:8000/v1. Omit to start the built-in simulator."
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model name to request; default: the server's first model.")
    ] = None,
    endpoint: Annotated[
        str, typer.Option(help="chat (/chat/completions) or completions (/completions).")
    ] = "chat",
    api_key: Annotated[
        str | None,
        typer.Option(
            help="API key (default: $OPENAI_API_KEY). Never written to any file or log.", show_default=False
        ),
    ] = None,
    dataset: Annotated[
        str,
        typer.Option(
            help="qa (built-in questions with answers), synthetic (controlled lengths), or a .jsonl/.csv/.parquet/.arrow file."
        ),
    ] = "qa",
    prompt_column: Annotated[
        str, typer.Option(help="Column holding the prompt in a dataset file.")
    ] = "prompt",
    answer_column: Annotated[
        str, typer.Option(help="Column holding the reference answer (optional).")
    ] = "answer",
    scorer: Annotated[
        str | None, typer.Option(help="exact, contains, numeric or choice; default: the dataset's.")
    ] = None,
    prompt_tokens: Annotated[int, typer.Option(help="synthetic: median prompt length in tokens.")] = 256,
    output_tokens: Annotated[int, typer.Option(help="synthetic: median output length in tokens.")] = 128,
    length_sigma: Annotated[
        float, typer.Option(help="synthetic: lognormal sigma of both lengths (0 = fixed).")
    ] = 0.5,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency", "-c", help="Closed loop: keep exactly N requests in flight (default 16)."
        ),
    ] = None,
    rate: Annotated[float | None, typer.Option(help="Open loop: send R requests per second instead.")] = None,
    arrival: Annotated[str, typer.Option(help="Open-loop arrivals: poisson, gamma or constant.")] = "poisson",
    burstiness: Annotated[
        float, typer.Option(help="Gamma shape: <1 burstier than Poisson, >1 more regular.")
    ] = 1.0,
    max_concurrency: Annotated[int | None, typer.Option(help="Open loop: cap on requests in flight.")] = None,
    warmup: Annotated[
        int, typer.Option(help="Requests to run first, flagged and left out of statistics.")
    ] = 0,
    max_queries: Annotated[
        int | None,
        typer.Option("--max-queries", "-n", help="Requests to measure (default: one pass over the dataset)."),
    ] = None,
    duration: Annotated[float | None, typer.Option(help="Stop sending after this many seconds.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for arrivals, synthetic data and the simulator.")] = 0,
    max_tokens: Annotated[
        int, typer.Option(help="max_tokens for each request (synthetic sets its own).")
    ] = 256,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 0.0,
    param: Annotated[
        list[str] | None,
        typer.Option(help="Extra request field key=value (JSON values allowed); repeatable."),
    ] = None,
    connect_timeout: Annotated[float, typer.Option(help="Seconds to wait for a connection.")] = 10.0,
    read_timeout: Annotated[float, typer.Option(help="Seconds to wait between bytes of a response.")] = 300.0,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir", "-o", help="Run directory (default ./runs/<UTC time>_<model>_<dataset>_<load>)."
        ),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace the files of an existing run directory.")] = False,
    telemetry: Annotated[
        str, typer.Option(help="auto, none, or a list from nvml,rapl,psutil,cpu-model,sim.")
    ] = "auto",
    gpus: Annotated[
        str | None, typer.Option(help="GPUs to measure by index or UUID, comma-separated (default all).")
    ] = None,
    sample_ms: Annotated[float, typer.Option(help="Telemetry sampling period in milliseconds.")] = 50.0,
    realtime_sampler: Annotated[
        bool,
        typer.Option(
            help="Ask the OS to run the sampler thread at real-time priority (needs root or "
            "CAP_SYS_NICE; refused quietly otherwise, and the summary says which it got)."
        ),
    ] = True,
    counter_probe_s: Annotated[
        float,
        typer.Option(
            help="Seconds of 2 ms reads, at the start and every 20 s, to learn when each energy "
            "counter updates so its reads are timed exactly (0: time them to the midpoint between reads)."
        ),
    ] = 1.0,
    baseline_s: Annotated[
        float, typer.Option(help="Seconds of idle power to measure before the run (0: none).")
    ] = 1.0,
    baseline_w: Annotated[
        float | None, typer.Option(help="Idle accelerator power in watts, instead of measuring it.")
    ] = None,
    attribution: Annotated[
        str,
        typer.Option(
            help="How overlapping queries share energy: tokens (by work), equal, or window (whole-window, over-counts)."
        ),
    ] = "tokens",
    prefill_weight: Annotated[
        float, typer.Option(help="tokens rule: work of a prompt token relative to an output token.")
    ] = 0.25,
    no_dashboard: Annotated[
        bool, typer.Option("--no-dashboard", help="Plain progress lines instead of the live dashboard.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress output; only errors.")] = False,
) -> None:
    """Stream requests at a fixed concurrency or arrival rate; measure latency and per-query energy.

    With no --base-url this starts the built-in simulator (a real HTTP server in its own
    process, with a simulated device) and labels everything as simulated.
    """
    config = config_from_options(ctx.params)
    raise typer.Exit(execute(config, _display(not no_dashboard, quiet)))


def config_from_options(p: dict[str, Any]) -> RunConfig:
    """A RunConfig from the ``run`` command's parsed options (also used by ``sweep``)."""
    config = RunConfig(
        base_url=p["base_url"],
        model=p["model"],
        endpoint=p["endpoint"],
        api_key=p["api_key"] or os.environ.get("OPENAI_API_KEY") or None,
        dataset=p["dataset"],
        prompt_column=p["prompt_column"],
        answer_column=p["answer_column"],
        scorer=p["scorer"],
        prompt_tokens=p["prompt_tokens"],
        output_tokens=p["output_tokens"],
        length_sigma=p["length_sigma"],
        concurrency=p["concurrency"],
        rate=p["rate"],
        arrival=p["arrival"],
        burstiness=p["burstiness"],
        max_concurrency=p["max_concurrency"],
        warmup=p["warmup"],
        max_queries=p["max_queries"],
        duration=p["duration"],
        seed=p["seed"],
        max_tokens=p["max_tokens"],
        temperature=p["temperature"],
        params=parse_params(p["param"] or []),
        connect_timeout=p["connect_timeout"],
        read_timeout=p["read_timeout"],
        output_dir=p["output_dir"],
        overwrite=p["overwrite"],
        telemetry=p["telemetry"],
        gpus=[g.strip() for g in p["gpus"].split(",")] if p["gpus"] else None,
        sample_ms=p["sample_ms"],
        realtime_sampler=p["realtime_sampler"],
        counter_probe_s=p["counter_probe_s"],
        baseline_s=p["baseline_s"],
        baseline_w=p["baseline_w"],
        attribution=p["attribution"],
        prefill_weight=p["prefill_weight"],
    )
    config.sim.seed = config.seed
    return config


def run_options(args: list[str]) -> dict[str, Any]:
    """Parse ``run`` options given to another command (``sweep`` passes them through)."""
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    with command.make_context("run", list(args)) as ctx:
        return dict(ctx.params)


@app.command()
def sim(
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port).")] = 8000,
    seed: Annotated[int, typer.Option(help="Seed for answers, lengths and faults.")] = 0,
    accuracy: Annotated[
        float, typer.Option(help="Probability of a right answer to a built-in QA question.")
    ] = 0.8,
    output_median: Annotated[
        int, typer.Option(help="Median answer length in tokens (when not ignore_eos).")
    ] = 48,
    max_batch: Annotated[int, typer.Option(help="Most sequences decoded together in one step.")] = 128,
    step_base_ms: Annotated[
        float, typer.Option(help="Duration of an engine step with an empty batch.")
    ] = 14.0,
    step_per_seq_ms: Annotated[float, typer.Option(help="Extra step time per sequence in the batch.")] = 0.12,
    step_per_prefill_token_ms: Annotated[
        float, typer.Option(help="Extra step time per prompt token prefilled.")
    ] = 0.03,
    prefill_budget: Annotated[
        int, typer.Option(help="Most prompt tokens prefilled in one step (chunked prefill).")
    ] = 2048,
    zero_delay: Annotated[
        bool, typer.Option(help="Steps take no time: measure the client, not the model.")
    ] = False,
    static_w: Annotated[float, typer.Option(help="Device idle (static) power in watts.")] = 70.0,
    dynamic_w: Annotated[float, typer.Option(help="Dynamic power of one decoding sequence in watts.")] = 28.0,
    work_exponent: Annotated[
        float, typer.Option(help="Dynamic power grows as work ** this (sub-linear).")
    ] = 0.6,
    prefill_work: Annotated[
        float, typer.Option(help="A prompt token's work relative to an output token.")
    ] = 0.3,
    counter_ms: Annotated[float, typer.Option(help="Energy counter update period in ms.")] = 100.0,
    device_telemetry: Annotated[
        str, typer.Option(help="What the device exposes: counter, power or avg-power.")
    ] = "counter",
    device_dropout_every: Annotated[
        int, typer.Option(help="The device answers nothing every Nth second (0: never), to test imputation.")
    ] = 0,
    fault_http_error: Annotated[float, typer.Option(help="Probability of HTTP 500 per request.")] = 0.0,
    fault_error_event: Annotated[
        float, typer.Option(help="Probability of an error event inside the stream.")
    ] = 0.0,
    fault_disconnect: Annotated[
        float, typer.Option(help="Probability of dropping the connection mid-stream.")
    ] = 0.0,
    fault_malformed: Annotated[
        float, typer.Option(help="Probability of one malformed (non-JSON) event.")
    ] = 0.0,
    fault_stall: Annotated[float, typer.Option(help="Probability of a mid-stream stall.")] = 0.0,
    fault_stall_s: Annotated[float, typer.Option(help="Length of a stall in seconds.")] = 2.0,
) -> None:
    """Serve the built-in SIMULATED OpenAI-compatible server and device until Ctrl-C."""
    from .sim import EngineConfig, Faults, SimConfig, serve

    if device_telemetry not in ("counter", "power", "avg-power"):
        raise fail("--device-telemetry must be counter, power or avg-power")
    config = SimConfig(
        engine=EngineConfig(
            max_batch=max_batch,
            step_base_ms=step_base_ms,
            step_per_seq_ms=step_per_seq_ms,
            step_per_prefill_token_ms=step_per_prefill_token_ms,
            prefill_budget_tokens=prefill_budget,
            zero_delay=zero_delay,
            static_w=static_w,
            dynamic_w=dynamic_w,
            work_exponent=work_exponent,
            prefill_work=prefill_work,
            counter_period_ms=counter_ms,
            telemetry=device_telemetry,
            dropout_every_s=device_dropout_every,
        ),
        faults=Faults(
            fault_http_error, fault_error_event, fault_disconnect, fault_malformed, fault_stall, fault_stall_s
        ),
        seed=seed,
        accuracy=accuracy,
        output_median=output_median,
    )
    try:
        asyncio.run(serve(config, host, port))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


from .analysis.commands import register as _register_analysis  # noqa: E402 - needs `app`

_register_analysis(app)


def main() -> None:
    try:
        app()
    except Exception as exc:  # the last line of defence: one sentence, not a traceback
        if _debug:
            raise
        err.print(f"[bold red]error:[/] {exc} (rerun with --debug for the traceback)")
        sys.exit(2)
