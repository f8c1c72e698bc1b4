"""The prefix-cache workload (shared prefixes hit, unique ones miss, in the share asked for) and
the sweep's prefix-cache reset before each run (done, not supported, kept)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import polars as pl
import pytest

from ipw_async import RunError, run_benchmark
from ipw_async.harness import RunConfig
from ipw_async.harness.sweep import PrefixResets, request_cache_reset, reset_url, run_sweep
from ipw_async.harness.workloads import workload_of
from ipw_async.sim import SimulatorProcess
from ipw_async.workload.prefix import shared_prefix

from .conftest import quick_config


def test_the_share_of_shared_prefixes_is_exact_and_they_take_turns() -> None:
    picks = [shared_prefix(i, 0.8, 3) for i in range(100)]
    shared = [k for k in picks if k is not None]
    assert len(shared) == 80
    assert shared[:7] == [0, 1, 2, 0, 1, 2, 0]
    # any stretch of units holds the share, within one
    assert all(7 <= sum(k is not None for k in picks[i : i + 10]) <= 9 for i in range(90))
    assert {shared_prefix(i, 0.0, 3) for i in range(20)} == {None}
    assert None not in {shared_prefix(i, 1.0, 3) for i in range(20)}


def test_prefix_units_say_which_prefix_and_salt_changes_the_text() -> None:
    config = RunConfig(workload="prefix", prefix_share=0.5, prefixes=2, prefix_tokens=64, max_queries=8)
    units = list(workload_of(config).units(6, False))
    assert [u.query.id.split(":")[0] for u in units] == ["unique", "shared0", "unique", "shared1", "unique", "shared0"]
    assert units[0].query.id == "unique:qa-0000"
    with pytest.raises(RunError, match="--prefix-share must be a fraction"):
        RunConfig(workload="prefix", prefix_share=1.5).validate()
    with pytest.raises(RunError, match="--cache-salt salts the prompts of --workload prefix or a --trace"):
        RunConfig(cache_salt="x").validate()


async def test_shared_prefixes_are_cached_after_their_first_use_and_unique_ones_never(tmp_path: Path) -> None:
    config = quick_config(
        tmp_path, workload="prefix", prefix_tokens=256, prefix_share=0.75, prefixes=2, max_queries=24, concurrency=2
    )
    result = await run_benchmark(config)
    frame = result.records.sort("request_id").with_columns(
        pl.col("query_id").str.split(":").list.first().alias("prefix")
    )
    assert frame.height == 24 and (frame.get_column("status") == "ok").all()
    counts = dict(frame.group_by("prefix").len().iter_rows())
    assert counts == {"unique": 6, "shared0": 9, "shared1": 9}
    unique = frame.filter(pl.col("prefix") == "unique")
    assert unique.get_column("cached_prompt_tokens").to_list() == [0] * 6
    hits = 0
    for _, group in frame.filter(pl.col("prefix") != "unique").group_by("prefix"):
        first_token = group.get_column("first_token_ns").to_list()
        for i, (sent, cached) in enumerate(group.select("sent_ns", "cached_prompt_tokens").iter_rows()):
            if any(t < sent for t in first_token[:i]):  # an earlier use had its prompt prefilled
                assert cached >= 256
                hits += 1
    assert hits >= 12
    assert (frame.get_column("prompt_tokens") > 256).all()


class _Resets(http.server.BaseHTTPRequestHandler):
    """A server that only counts POSTs of /reset_prefix_cache, answering ``status``."""

    status = 200
    calls: ClassVar[list[str]] = []  # each server's handler class gets its own list
    auth: ClassVar[list[str | None]] = []

    def do_POST(self) -> None:
        self.calls.append(self.path)
        self.auth.append(self.headers.get("Authorization"))
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def counting_server() -> Iterator[tuple[str, type[_Resets]]]:
    handler = type("Handler", (_Resets,), {"calls": [], "auth": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("status", "said"), [(200, "done"), (404, "not supported"), (501, "not supported")])
def test_a_sweep_resets_the_prefix_cache_before_each_run_where_the_server_can(
    tmp_path: Path, counting_server: tuple[str, type[_Resets]], status: int, said: str
) -> None:
    url, handler = counting_server
    handler.status = status
    notes: list[str] = []
    base = RunConfig(base_url=url, max_queries=2, telemetry="none", baseline_s=0, tail_s=0)
    # the runs fail (no chat API there): the sweep goes on, and resets before each one still
    result = run_sweep(base, [1, 2], None, 2, tmp_path / "sweep", {}, note=notes.append)
    assert result.summary["prefix_cache_reset"] == said
    assert (tmp_path / "sweep" / "sweep" / "summary.json").read_text().count(f'"prefix_cache_reset": "{said}"') == 1
    if status == 200:
        assert handler.calls == ["/reset_prefix_cache"] * 4 and notes == []
    else:  # asked once, told once
        assert handler.calls == ["/reset_prefix_cache"] and len(notes) == 1
        assert "cannot reset its prefix cache" in notes[0]
    handler.calls.clear()
    kept = run_sweep(base, [1], None, 1, tmp_path / "kept", {}, reset_prefix_cache=False)
    assert handler.calls == [] and kept.summary["prefix_cache_reset"] == "kept"


def test_a_failed_reset_is_noted_and_the_sweep_goes_on(
    tmp_path: Path, counting_server: tuple[str, type[_Resets]]
) -> None:
    url, handler = counting_server
    handler.status = 500
    notes: list[str] = []
    base = RunConfig(base_url=url, max_queries=2, telemetry="none", baseline_s=0, tail_s=0)
    result = run_sweep(base, [1, 2], None, 1, tmp_path / "sweep", {}, note=notes.append)
    assert result.summary["prefix_cache_reset"] == "failed: HTTP 500"
    assert len(handler.calls) == 2 and len(notes) == 1 and len(result.runs) == 2


def test_a_password_in_the_base_url_goes_as_basic_auth_and_never_into_a_note(
    counting_server: tuple[str, type[_Resets]],
) -> None:
    url, handler = counting_server
    with_password = url.replace("http://", "http://user:s3cret@")
    assert request_cache_reset(with_password, None) == "done"
    assert handler.calls == ["/reset_prefix_cache"] and handler.auth == ["Basic dXNlcjpzM2NyZXQ="]
    assert request_cache_reset(with_password, "sk-1", endpoint="messages") == "done"  # the key wins
    assert handler.auth[-1] is None  # messages send it as x-api-key, not Authorization
    notes: list[str] = []
    resets = PrefixResets(RunConfig(base_url="http://user:s3cret@127.0.0.1:9/v1"), True, notes.append)
    resets.before_run()  # nothing listens on port 9: a failure, noted without the password
    assert len(notes) == 1 and "s3cret" not in notes[0] and "s3cret" not in resets.summary


def test_the_simulator_resets_its_prefix_cache_on_request(sim: SimulatorProcess) -> None:
    assert reset_url("http://h:8000/v1/") == "http://h:8000/reset_prefix_cache"
    assert reset_url("http://h/gw/v1?key=k") == "http://h/gw/reset_prefix_cache?key=k"  # a gateway's key kept
    assert request_cache_reset(sim.base_url, None) == "done"
