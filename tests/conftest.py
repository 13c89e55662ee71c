"""Shared fixtures: one real smoke run per test session (Ray + Keras + real digits), reused read-only."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import REPO, SMOKE_RUN_SETTINGS, aiperf_cmd, cli_env, made_once, simulated_run, two_trial_smoke_run


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A complete `aiperf run --config smoke` of 8 trials (about 40 s on 2 cores; settings: ``SMOKE_RUN_SETTINGS``);
    tests must not modify its files (the submission tests audit a copy of it)."""
    return made_once(tmp_path_factory, "smoke-results", _smoke_run)


def _smoke_run(results: Path) -> tuple[Path, subprocess.CompletedProcess]:
    proc = subprocess.run(
        aiperf_cmd(
            "run",
            "--config",
            "smoke",
            *("--set", f"run.results_dir={results}"),
            *[arg for setting in SMOKE_RUN_SETTINGS for arg in ("--set", setting)],
        ),
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
    return made_once(tmp_path_factory, "sim", lambda folder: simulated_run(folder / "run"))


TINY_IMAGENET = {"classes": 4, "train_per_class": 24, "val_per_class": 6, "min_side": 12, "max_side": 48, "bad": 2}


@pytest.fixture(scope="session")
def imagenet_tree(tmp_path_factory) -> Path:
    """A tiny ImageNet-layout tree from `aiperf make-imagenet`: quirks, 2 undecodable files, TFRecord
    shards in ``tfrecord/`` (a few seconds); tests must not modify it (copy it first)."""
    from aiperf.datasets.generate import GenerateSpec, generate_imagenet

    def make(folder: Path) -> Path:
        spec = GenerateSpec(**TINY_IMAGENET, to_tfrecord=True, train_shards=3, val_shards=2)
        generate_imagenet(folder / "tree", spec)
        return folder / "tree"

    return made_once(tmp_path_factory, "imagenet", make)


# Trainer settings away from their defaults: an audit of this run must train with the run's, not its own.
AUDITED_RUN_SETTINGS = ("train.compiled_models=1", "dataset.decode_threads=2", "model.bn_momentum=0.95")


@pytest.fixture(scope="session")
def audited_run(tmp_path_factory) -> Path:
    """A real 2-trial smoke run with stored weights (``AUDITED_RUN_SETTINGS``), shared read-only by the tests
    that audit or forge a copy of it (tests/engine/test_audit.py, test_bounded_weights.py)."""
    return made_once(tmp_path_factory, "audited-run", lambda folder: two_trial_smoke_run(folder, *AUDITED_RUN_SETTINGS))
