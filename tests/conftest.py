"""Shared fixtures: a real simulator process on loopback, and quick run configs."""

from __future__ import annotations

import atexit
import compileall
import contextlib
import fcntl
import functools
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO

import pytest

import ipw_async
from ipw_async.client import ClientConfig, StreamingClient
from ipw_async.harness import RunConfig
from ipw_async.records import RequestRecord
from ipw_async.results import finalize
from ipw_async.sim import EngineConfig, Faults, SimConfig, SimulatorProcess
from ipw_async.telemetry.base import Reading, SourceInfo
from ipw_async.telemetry.prometheus import PrometheusSource
from ipw_async.transport.scripted import Reply, ScriptedNetwork

# A fresh checkout compiles each module the first time a run imports it, mid-run: compiled
# first, that cannot hold up the accuracy tests (the first of them, on a fresh CI clone, saw
# its sampler's ticks up to 65 ms late; compiling was the likeliest cause found)
compileall.compile_dir(Path(ipw_async.__file__).parent, quiet=1)


class _Turns:
    """Under pytest-xdist: a test marked ``timing`` runs with no other test running beside it,
    the rest side by side. A reader-writer lock over files every worker opens: the gate lets a
    waiting ``timing`` test in before later tests (without it, two workers taking turns could
    keep the shared lock held for ever). A worker keeps the lock alone across consecutive
    ``timing`` tests: taken afresh for each, it waited each time for the other workers' tests
    then running to end."""

    def __init__(self) -> None:
        self._files: tuple[IO[str], IO[str]] | None = None
        self._alone = False

    def take(self, alone: bool) -> None:
        if self._files is not None and self._alone == alone:
            return
        self.give_back()
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
        if run is None:  # one process: every test runs alone already
            return
        base = Path(tempfile.gettempdir()) / f"ipw-async-tests-{run}"
        gate, lock = open(f"{base}.gate", "a"), open(f"{base}.lock", "a")  # noqa: SIM115
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        self._files, self._alone = (gate, lock), alone

    def give_back(self) -> None:
        if self._files is not None:
            for file in self._files:
                file.close()  # closing releases the lock
            self._files = None


_turns = _Turns()


def _timing(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("timing") is not None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with ``timing`` tests first, each file's ``timing`` tests first within it: the
    tests that run alone then come one after another at the start, when no long test of
    another worker is running for them to wait out (with --no-loadscope-reorder, xdist hands
    out files in this order; the others stay largest first, as its reorder had them)."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    order = sorted(files.values(), key=lambda tests: (not any(map(_timing, tests)), -len(tests)))
    items[:] = [item for tests in order for item in sorted(tests, key=lambda t: not _timing(t))]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # setup and teardown too: a module's simulator or Ray cluster starts in its first test's setup
    _turns.take(alone=_timing(item))
    try:
        return (yield)
    finally:
        if not (_timing(item) and _timing(nextitem)):
            _turns.give_back()


def fast_engine(**overrides: object) -> EngineConfig:
    """A quicker engine than the default so tests finish in seconds."""
    return EngineConfig(**{"step_base_ms": 4.0, "step_per_seq_ms": 0.05, **overrides})  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(SimConfig(engine=fast_engine(), output_median=16)) as process:
        yield process


@pytest.fixture(scope="session")
def faulty_sim() -> Iterator[SimulatorProcess]:
    faults = Faults(http_error=0.15, error_event=0.15, disconnect=0.15, malformed=0.15)
    with SimulatorProcess(SimConfig(engine=fast_engine(), faults=faults, output_median=16)) as process:
        yield process


SHORT_RUN = Path(__file__).parent / "data" / "short_run"  # a recorded simulator run, never finalized


@functools.cache
def _short_run_finished_once() -> Path:
    home = Path(tempfile.mkdtemp(prefix="ipw-async-short-run-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    finalize(shutil.copytree(SHORT_RUN, home / "short_run"))
    return home / "short_run"


def finished_short_run(dest: Path) -> Path:
    """A copy of the recorded short run at ``dest``, finished by this version's finalize: a
    complete run directory in seconds, with no run. Finished once a test process (its power
    model's selection takes seconds), then copied: a finished directory holds no path of its own."""
    shutil.copytree(_short_run_finished_once(), dest)
    return dest


def quick_config(tmp_path: Path, **overrides: object) -> RunConfig:
    config = RunConfig(
        output_dir=tmp_path / "run",
        max_queries=24,
        concurrency=4,
        baseline_s=0.2,
        tail_s=0.2,
        sim=SimConfig(engine=fast_engine(), output_median=16),
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


async def scripted_send(*replies: Reply, request_id: int = 0) -> tuple[RequestRecord, ScriptedNetwork]:
    """One request through the real client, transport and parser, answered by ``replies`` on
    a scripted network and clock (ns since the request went out)."""
    network = ScriptedNetwork(*replies)
    client = StreamingClient(
        ClientConfig(base_url="http://server.test/v1", max_connections=2), 0, network, network.clock
    )
    record = RequestRecord(request_id=request_id, query_id="q", dataset="d", prompt="p")
    try:
        await client.send(record, b"{}")
    finally:
        await client.aclose()
    return record, network


async def stream_record(events: list[tuple[int, bytes]], end_ns: int | None = None) -> RequestRecord:
    """A record filled from a scripted event stream, each event in its own chunk at its time."""
    record, _ = await scripted_send(Reply.sse(events, end_ns=end_ns))
    return record


@contextlib.contextmanager
def metrics_exporter(body: bytes) -> Iterator[tuple[str, list[str]]]:
    """A metrics exporter stand-in on loopback serving ``body`` (Prometheus text) to every GET:
    its root URL, and the targets it was asked for."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def scrape_once(url: str) -> tuple[PrometheusSource, SourceInfo, Reading]:
    """A Prometheus source at ``url``, opened, read once and closed: it, what it opened, its reading."""
    source = PrometheusSource(url)
    try:
        return source, source.open(), source.read()
    finally:
        source.close()
