"""Fixtures for the submission tests: two real, audited smoke runs, this machine's system description, a package.

Each is made once per session through the CLI, as a submitting centre would make it; tests must
not modify them (copy a package into ``tmp_path`` before tampering with it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, SMOKE_RUN_SETTINGS, aiperf_cmd, cli_env, made_once, run_cli
from submission_fixtures import AUDIT_SAMPLE, SITE


def _check(proc: subprocess.CompletedProcess, what: str) -> None:
    assert proc.returncode == 0, f"{what}: {proc.stdout[-3000:]}{proc.stderr[-3000:]}"


@pytest.fixture(scope="session")
def two_smoke_runs(tmp_path_factory, smoke_run) -> list[Path]:
    """Two complete smoke runs of one config, seeds 0 and 1, each audited (``aiperf audit --sample 2``).

    Seed 0 is a copy of the session's ``smoke_run`` (same settings): one real run fewer per session.
    """
    return made_once(tmp_path_factory, "submission-runs", lambda results: _two_smoke_runs(results, smoke_run[0]))


def _two_smoke_runs(results: Path, shared: Path) -> list[Path]:
    results.mkdir(parents=True, exist_ok=True)
    runs = [Path(shutil.copytree(shared, results / shared.name))]
    proc = subprocess.run(
        aiperf_cmd(
            "run", "--config", "smoke", "--set", f"run.results_dir={results}", "--set", "run.seed=1",
            *[arg for setting in SMOKE_RUN_SETTINGS for arg in ("--set", setting)],
        ),
        capture_output=True, text=True, env=cli_env(), timeout=600, cwd=REPO,
    )  # fmt: skip
    _check(proc, "aiperf run (seed 1)")
    runs += [p for p in results.iterdir() if p.is_dir() and p not in runs]
    for run in runs:
        _check(run_cli("audit", str(run), "--sample", AUDIT_SAMPLE, timeout=600), f"aiperf audit {run}")
    return runs


@pytest.fixture(scope="session")
def system_json(tmp_path_factory) -> Path:
    """``aiperf system --config smoke --site site.yaml -o system.json`` on this machine (Ray, ~10 s)."""
    return made_once(tmp_path_factory, "system", _system_json)


def _system_json(folder: Path) -> Path:
    site = folder / "site.yaml"
    site.write_text(json.dumps(SITE))  # JSON is YAML
    out = folder / "system.json"
    _check(run_cli("system", "--config", "smoke", "--site", str(site), "-o", str(out), timeout=300), "aiperf system")
    return out


@pytest.fixture(scope="session")
def package_dir(tmp_path_factory, two_smoke_runs, system_json) -> Path:
    """``aiperf package RUN1 RUN2 --system system.json -o DIR`` (and ``DIR.tar.gz`` beside it)."""

    def make(folder: Path) -> Path:
        out = folder / "example-smoke"
        proc = run_cli("package", *map(str, two_smoke_runs), "--system", str(system_json), "-o", str(out), timeout=300)
        _check(proc, "aiperf package")
        return out

    return made_once(tmp_path_factory, "package", make)
