"""Shared fixtures: a real simulator process on loopback, and quick run configs."""

from __future__ import annotations

import compileall
from collections.abc import Iterator
from pathlib import Path

import pytest

import ipw_async
from ipw_async.harness import RunConfig
from ipw_async.sim import EngineConfig, Faults, SimConfig, SimulatorProcess

# A fresh checkout compiles each module the first time a run imports it, mid-run: compiled
# first, that cannot hold up the accuracy tests (the first of them, on a fresh CI clone, saw
# its sampler's ticks up to 65 ms late; compiling was the likeliest cause found)
compileall.compile_dir(Path(ipw_async.__file__).parent, quiet=1)


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
