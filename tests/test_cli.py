"""The command line as a user meets it: help text, one-line errors, exit codes."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ipw_async._options import options_of
from ipw_async.cli import app
from ipw_async.harness import RunConfig

runner = CliRunner()


def test_run_help_explains_every_option() -> None:
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0
    options = options_of(RunConfig)
    lines = result.output.splitlines()
    for f, opt in options:
        flag = opt.flags[0] if opt.flags else "--" + f.name.replace("_", "-")
        # the flag's own row opens with its own help: first words shared by several helps
        # ("Seconds", "Open") would be found anywhere on the page
        row = [line for line in lines if re.match(rf"│\s+{re.escape(flag)}(?![\w-])", line)]
        assert row, flag
        assert " ".join(opt.help.split()[:3]) in " ".join(row[0].split()), f.name
        # listed in its own panel, and its choices listed where it takes a few
        panel = [i for i, line in enumerate(lines) if re.match(r"╭─ (\w+) ─", line)]
        at = lines.index(row[0])
        header = lines[max(i for i in panel if i < at)]
        assert header.startswith(f"╭─ {opt.panel} ─"), (f.name, header)
        if opt.choices:
            assert f"<{'|'.join(opt.choices)}>" in row[0], f.name
    assert {opt.panel for _, opt in options} == {"Target", "Workload", "Load", "Telemetry", "Energy", "Output"}
    for flag in ("--no-dashboard", "--quiet"):
        assert flag in result.output
    assert "simulator" in result.output
    # a field is left off the command line on purpose, never by accident
    flagless = {f.name for f in dataclasses.fields(RunConfig)} - {f.name for f, _ in options}
    assert flagless == {"runs_root", "dataset_seed", "tail_s", "abort_after_connect_errors", "sim"}


def test_help_prints_brackets_as_written_not_as_markup() -> None:
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "300", "NO_COLOR": "1"})
    assert "pip install 'ipw-async[mcp]'" in result.output


def test_version_prints_the_installed_version() -> None:
    from ipw_async import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"ipw-async {__version__}"


def test_a_value_outside_an_options_choices_is_refused_with_the_choices() -> None:
    result = runner.invoke(app, ["run", "--workload", "agentc"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 2
    assert "'agentc' is not one of 'single', 'agentic', 'conversation'" in result.output


def test_sim_help() -> None:
    result = runner.invoke(app, ["sim", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--fault-disconnect" in result.output and "SIMULATED" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["run", "--base-url", "http://127.0.0.1:9/v1", "-n", "2"],
            "cannot connect to http://127.0.0.1:9/v1",
        ),
        (["run", "--param", "no-equals"], "is not key=value"),
        (["run", "--dataset", "missing.csv"], "neither 'qa', 'synthetic' nor an existing file"),
        (["run", "--counter-probe-s", "-1"], "--counter-probe-s cannot be negative"),
    ],
)
def test_errors_are_one_line_with_exit_code_2(args: list[str], message: str, tmp_path: Path) -> None:
    result = runner.invoke(app, [*args, "-o", str(tmp_path / "r")], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_documented_command_runs_simulated_and_writes_runs_dir(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ipw_async", "run", "--concurrency", "16", "-n", "48", "--no-dashboard"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "SIMULATED" in proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.endswith("_sim-small_qa_sim_c16")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["complete"] and summary["requests"]["ok"] == 48
    assert "to queries" in proc.stderr and "idle" in proc.stderr  # the energy it measured, split
