"""What a run opens before its load starts: the simulator, the server's model, the telemetry
sources and the client's settings."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlsplit

import anyio

from ..client import ClientConfig, list_models
from ..errors import RunError
from ..sim import SimConfig, SimulatorProcess
from ..telemetry import RemoteAccess, TelemetrySetup, open_sources
from ..telemetry.http import AGENT_TOKEN_ENV, carries_credentials, in_clear, read_token, redact_url
from .config import RunConfig


@contextlib.asynccontextmanager
async def simulator(config: SimConfig) -> AsyncIterator[SimulatorProcess]:
    sim = SimulatorProcess(config)
    try:
        await anyio.to_thread.run_sync(sim.start)
    except Exception as exc:
        raise RunError(str(exc)) from None
    try:
        yield sim
    finally:
        await anyio.to_thread.run_sync(sim.stop)


async def serving_model(config: RunConfig, base_url: str) -> str:
    """The model the run asks for, checked against what the server lists."""
    models = await list_models(base_url, config.api_key, timeout=config.connect_timeout, endpoint=config.endpoint)
    shown = redact_url(base_url)
    if config.model is None:
        if not models:
            raise RunError(f"{shown} serves no models; name one with --model")
        return models[0]
    if models and config.model not in models:
        raise RunError(f"model {config.model!r} is not served at {shown}; available: {', '.join(models)}")
    return config.model


async def open_telemetry(
    config: RunConfig, sim: SimulatorProcess | None, base_url: str, note: Callable[[str], None]
) -> TelemetrySetup:
    """The run's telemetry sources, each said (opened or skipped and why); a source the user
    named that cannot be read stops the run before it starts."""
    try:
        access = remote_access(config)
        telemetry = await anyio.to_thread.run_sync(
            lambda: open_sources(
                config.telemetry,
                sim_root_url=sim_root(config, sim, base_url),
                gpus=config.gpus,
                agents=config.telemetry_url,
                scrapes=config.prometheus_url,
                access=access,
            )
        )
    except ValueError as exc:
        raise RunError(str(exc)) from None
    asked = [redact_url(u) for u in (*config.telemetry_url, *config.prometheus_url)]
    missing = [telemetry.skipped[url] for url in asked if url in telemetry.skipped]
    if missing:  # asked for the server's own meters: a run without them would measure nothing
        telemetry.close()
        raise RunError(missing[0])
    if sim is not None:
        note("SIMULATED run: built-in simulator server and simulated device (no real GPU measured)")
    elif telemetry.simulated:
        note("SIMULATED run: its energy is read from a simulated device (no real GPU measured)")
    for s in telemetry.opened:
        note(f"telemetry {s.source.name}: {s.info.description or ', '.join(s.info.columns)}")
    for name, reason in telemetry.skipped.items():
        note(f"telemetry {name} skipped: {reason}")
    if sim is None and telemetry.opened and not asked and not is_local(base_url):
        note(
            f"telemetry measures this machine; the server at {redact_url(base_url)} may be elsewhere "
            "(run `ipw-async agent` there and give --telemetry-url)"
        )
    if warning := in_clear_warning(config, base_url, access):
        note(warning)
    return telemetry


_WARNED_IN_CLEAR: set[str] = set()  # what was said already: a sweep's runs say it once


def in_clear_warning(config: RunConfig, base_url: str, access: RemoteAccess) -> str | None:
    """One line naming each credential of the run that crosses a network unencrypted (plain
    http to a host that is not this machine) and was not named before in this process; None
    when there is none."""
    sent = [
        (base_url, config.api_key, "the API key"),
        *((url, access.agent_token, "the agent token") for url in config.telemetry_url),
        *((url, access.scrape_token, "the metrics token") for url in config.prometheus_url),
    ]
    said = []
    for url, token, what in sent:
        if not in_clear(url) or not (token or carries_credentials(url)):
            continue
        line = f"{what if token else 'the credentials in the URL'} to {redact_url(url)}"
        if line not in _WARNED_IN_CLEAR:
            _WARNED_IN_CLEAR.add(line)
            said.append(line)
    if not said:
        return None
    return (
        f"sent unencrypted over plain http: {'; '.join(said)} "
        "(anyone on the network between can read them; https keeps them private)"
    )


def remote_access(config: RunConfig) -> RemoteAccess:
    """Credentials and schedule for the run's agents and exporters; ValueError for an
    unreadable token file."""

    def token(path: Path | None, env: str | None) -> str | None:
        if path is not None:
            return read_token(path)
        return (os.environ.get(env) or "").strip() or None if env else None

    return RemoteAccess(
        agent_token=token(config.telemetry_token_file, AGENT_TOKEN_ENV),
        scrape_token=token(config.prometheus_token_file, None),
        ca_file=config.telemetry_ca_file,
        period_s=config.sample_ms / 1000,
        probe_s=config.counter_probe_s,
        realtime=config.realtime_sampler,
    )


def client_config(c: RunConfig, base_url: str, pool_size: int) -> ClientConfig:
    return ClientConfig(
        base_url=base_url,
        endpoint=c.endpoint,
        api_key=c.api_key,
        connect_timeout=c.connect_timeout,
        read_timeout=c.read_timeout,
        max_connections=pool_size,
    )


def sim_root(config: RunConfig, sim: SimulatorProcess | None, base_url: str) -> str | None:
    """Where the simulated device answers: ours, or a standalone ``ipw-async sim`` named in --telemetry."""
    if sim is not None:
        return sim.root_url
    if "sim" in config.telemetry.split(","):
        parts = urlsplit(base_url)
        return f"{parts.scheme}://{parts.netloc}"
    return None


def is_local(base_url: str) -> bool:
    host = urlsplit(base_url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.") or host == socket.gethostname()
