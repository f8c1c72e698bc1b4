"""Secrets in URLs: one rule (:func:`redact_url`) for every file, log line, message and export,
and a warning where a credential crosses a network unencrypted."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipw_async.export import ExportError
from ipw_async.harness import RunConfig
from ipw_async.harness.setup import in_clear_warning
from ipw_async.sim import SimulatorProcess
from ipw_async.telemetry import RemoteAccess
from ipw_async.telemetry.http import in_clear, redact_url, redact_urls

from .conftest import finished_short_run, metrics_exporter, scrape_once


@pytest.mark.parametrize(
    ("url", "written"),
    [
        ("http://alice:pw@host:4318", "http://alice:***@host:4318"),
        ("https://TOKEN@collector.example/v1/traces", "https://***@collector.example/v1/traces"),
        ("http://gpu:9400/metrics?token=abc", "http://gpu:9400/metrics?token=***"),
        (
            "http://gpu:8000/v1?api-key=abc&api-version=2024-06",
            "http://gpu:8000/v1?api-key=***&api-version=2024-06",
        ),
        (
            "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sp=r&sig=AbC%2Bd%3D&se=2030-01-01",
            "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sp=r&sig=***&se=2030-01-01",
        ),
        (
            "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA&X-Amz-Date=20240101&X-Amz-Signature=ff",
            "https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Date=20240101&X-Amz-Signature=***",
        ),
        (
            "https://h/p?apiKey=1&x-goog-signature=2&Authorization=3&access_token=4&sslpassword=5",
            "https://h/p?apiKey=***&x-goog-signature=***&Authorization=***&access_token=***&sslpassword=***",
        ),
        ("http://h/p?model=x&limit=5", "http://h/p?model=x&limit=5"),  # no credential: as given
        ("http://h/p?author=me&keyword=k&max_tokens=9", "http://h/p?author=me&keyword=k&max_tokens=9"),
        ("http://h/p?token=abc#section", "http://h/p?token=***#section"),
        ("http://h/cb#access_token=abc&state=s", "http://h/cb#access_token=***&state=s"),
        ("http://h:9180", "http://h:9180"),
        ("http://[::1]:9400/metrics?TOKEN=abc", "http://[::1]:9400/metrics?TOKEN=***"),
        ("http://u:p@[fe80::1]:9400/", "http://u:***@[fe80::1]:9400/"),
        ("http://[::1/metrics?token=abc", "http://[::1/metrics?token=***"),  # urlsplit refuses it
        ("gpu-host:9400/metrics?token=abc", "gpu-host:9400/metrics?token=***"),  # no scheme
        ("postgresql://u:p@db/mlflow?sslpassword=q", "postgresql://u:***@db/mlflow?sslpassword=***"),
        ("sqlite:///tmp/mlflow.db", "sqlite:///tmp/mlflow.db"),
        ("http://h/?token&token=", "http://h/?token&token="),  # no value: nothing to hide
    ],
)
def test_redact_url_hides_userinfo_and_credential_parameters_only(url: str, written: str) -> None:
    assert redact_url(url) == written
    assert redact_url(written) == written  # already redacted: unchanged


def test_urls_in_a_message_are_redacted() -> None:
    message = "GET http://h/x?token=abc failed; 'https://u:pw@z/v1' too (see http://docs/page?id=3)"
    assert redact_urls(message) == (
        "GET http://h/x?token=*** failed; 'https://u:***@z/v1' too (see http://docs/page?id=3)"
    )


def test_credentials_over_plain_http_beyond_loopback_are_said_once() -> None:
    assert in_clear("http://gpu-host:9180") and in_clear("gpu-host:9180")
    assert not in_clear("https://gpu-host:9180")
    assert not any(in_clear(u) for u in ("http://127.0.0.2:1", "http://localhost:1", "http://[::1]:1"))
    config = RunConfig(
        base_url="http://secrets-test-server:8000/v1",
        api_key="sk-1",
        telemetry_url=[
            "http://secrets-test-gpu:9180",
            "https://secrets-test-gpu2:9180",
            "http://127.0.0.1:9180",
        ],
        prometheus_url=[
            "http://secrets-test-gpu:9400/metrics?token=abc",
            "http://secrets-test-gpu:9500/metrics",
        ],
    )
    access = RemoteAccess(agent_token="agent-1")
    line = in_clear_warning(config, str(config.base_url), access)
    assert line == (
        "sent unencrypted over plain http: the API key to http://secrets-test-server:8000/v1; "
        "the agent token to http://secrets-test-gpu:9180; "
        "the credentials in the URL to http://secrets-test-gpu:9400/metrics?token=*** "
        "(anyone on the network between can read them; https keeps them private)"
    )
    assert in_clear_warning(config, str(config.base_url), access) is None  # a sweep's next run
    bare = RunConfig(base_url="http://secrets-test-other:8000/v1")
    assert in_clear_warning(bare, str(bare.base_url), RemoteAccess()) is None  # nothing secret sent


@pytest.fixture
def exporter() -> Iterator[tuple[str, list[str]]]:
    """A DCGM exporter stand-in on loopback: its root URL, and the targets it was asked for."""
    with metrics_exporter(b'DCGM_FI_DEV_POWER_USAGE{gpu="0"} 120.5\n') as served:
        yield served


def test_a_metrics_url_query_is_sent_as_given_and_shown_redacted(exporter: tuple[str, list[str]]) -> None:
    root, asked = exporter
    source, info, reading = scrape_once(f"{root}/metrics?token=SECRET-Q&format=text")
    assert asked == ["/metrics?token=SECRET-Q&format=text"] * 2
    assert source.url == f"{root}/metrics?token=***&format=text"
    assert "SECRET-Q" not in info.description and source.url in info.description
    assert next(iter(reading.values.values())) == 120.5


def test_no_secret_in_a_url_reaches_the_run_directory_or_the_terminal(
    tmp_path: Path, sim: SimulatorProcess
) -> None:
    token, key, env_key = "SECRET123tok", "SECRET456key", "SECRET789env"
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ipw_async",
            "run",
            "--base-url",
            f"{sim.base_url}?api-key={key}",
            "--prometheus-url",
            f"{sim.root_url}/metrics?token={token}",
            "--telemetry",
            "none",
            "-n",
            "12",
            "-c",
            "4",
            "--baseline-s",
            "0",
            "--no-dashboard",
            "-o",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OPENAI_API_KEY": env_key},
    )
    assert proc.returncode == 0, proc.stderr
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {"run.json", "summary.json", "records.arrow", "telemetry.arrow"} <= {p.name for p in files}
    for where, data in [("stdout", proc.stdout.encode()), ("stderr", proc.stderr.encode())] + [
        (str(p), p.read_bytes()) for p in files
    ]:
        for secret in (token, key, env_key):
            assert secret.encode() not in data, (secret, where)
    config = json.loads((run_dir / "summary.json").read_text())["config"]
    assert config["base_url"] == f"{sim.base_url}?api-key=***"
    assert config["prometheus_url"] == [f"{sim.root_url}/metrics?token=***"]
    assert config["api_key_set"] is True
    assert f"Prometheus {sim.root_url}/metrics?token=***" in proc.stderr  # read, and said so


def test_an_otlp_endpoints_secret_stays_out_of_the_export_error(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from ipw_async.export.otel import export_otel

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ExportError) as caught:
        export_otel(
            finished_short_run(tmp_path / "run"),
            f"http://127.0.0.1:{port}?api-key=SECRET-OTEL&tenant=t1",
            timeout_s=1.0,
        )
    assert f"http://127.0.0.1:{port}/v1/traces?api-key=***&tenant=t1" in str(caught.value)
    assert "SECRET-OTEL" not in str(caught.value)


def test_a_resumed_run_asks_again_for_every_secret_run_json_kept_out(tmp_path: Path) -> None:
    from ipw_async.errors import RunError
    from ipw_async.harness.resume import _own_config

    secrets = {
        "base_url": "http://gpu:8000/v1?api-key=SECRET-1",
        "api_key": "sk-SECRET-2",
        "prometheus_url": ["http://dcgm:SECRET-3@gpu:9400/metrics"],
    }
    saved = RunConfig(**secrets, telemetry_url=["http://gpu:9180"], max_queries=7).public()  # type: ignore[arg-type]
    assert "SECRET" not in json.dumps(saved, default=str)
    assert saved["withheld"] == ["base_url", "api_key", "prometheus_url"]  # by field, not by a mark
    assert saved["telemetry_url"] == ["http://gpu:9180"]  # nothing secret: kept whole
    for name in secrets:  # each one left out of the resuming command stops it, naming its flag
        given = RunConfig(**{k: v for k, v in secrets.items() if k != name})  # type: ignore[arg-type]
        with pytest.raises(RunError, match=f"give it again with --{name.replace('_', '-')}"):
            _own_config(saved, given, tmp_path)
    again = _own_config(saved, RunConfig(**secrets), tmp_path)  # type: ignore[arg-type]
    assert {k: getattr(again, k) for k in secrets} == secrets
    assert again.max_queries == 7 and again.telemetry_url == ["http://gpu:9180"]


def test_a_messages_run_without_a_key_reads_anthropics_variable_and_never_writes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ipw_async.cli.options import parse_run_args, run_config

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-SECRET-4")
    config = run_config(parse_run_args(["--endpoint", "messages", "--base-url", "http://gpu:8000/v1"]))
    assert config.api_key == "sk-ant-SECRET-4"
    saved = config.public()
    assert saved["api_key_set"] is True and "SECRET-4" not in json.dumps(saved, default=str)
    assert "SECRET-4" not in repr(config)
    # another API does not read it; a key given comes first; an OpenAI key in the environment
    # never goes to a Messages server while Anthropic's is there, and stands in when it is not
    assert run_config(parse_run_args(["--endpoint", "chat"])).api_key is None
    assert RunConfig(endpoint="messages", api_key="sk-given").api_key == "sk-given"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    assert run_config(parse_run_args(["--endpoint", "messages"])).api_key == "sk-ant-SECRET-4"
    assert run_config(parse_run_args(["--endpoint", "chat"])).api_key == "sk-openai"
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    assert run_config(parse_run_args(["--endpoint", "messages"])).api_key == "sk-openai"
