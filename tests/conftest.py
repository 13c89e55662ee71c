"""Shared fixtures: one real smoke run per test session (Ray + Keras + real digits), reused read-only."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import REPO, aiperf_cmd, cli_env, simulated_run


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A complete `aiperf run --config smoke` (about 45 s on 2 cores); tests must not modify its files."""
    results = tmp_path_factory.mktemp("smoke-results")
    proc = subprocess.run(
        aiperf_cmd("run", "--config", "smoke", "--set", f"run.results_dir={results}"),
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=600,
        cwd=REPO,
    )
    runs = [p for p in results.iterdir() if p.is_dir()]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(runs) == 1, runs
    return runs[0], proc


@pytest.fixture(scope="session")
def sim_run(tmp_path_factory) -> Path:
    """One simulated run shared by the results tests; tests must not modify it (copy it first)."""
    return simulated_run(tmp_path_factory.mktemp("sim") / "run")
