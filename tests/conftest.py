"""Shared fixtures: one real smoke run per test session (Ray + Keras + real digits), reused read-only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def aiperf_cmd(*args: str) -> list[str]:
    """The CLI as a user runs it, from this interpreter (works with or without an installed script)."""
    return [sys.executable, "-m", "aiperf.cli", *args]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


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


SIM_DATASET = {
    "name": "digits-sim", "num_classes": 10, "input_shape": [8, 8, 1], "train_images": 1438, "eval_images": 359,
    "split": {"method": "stratified", "seed": 0, "disjoint": True}, "fingerprint": "0" * 64,
}  # fmt: skip


def simulated_run(run_dir: Path) -> Path:
    """A complete run directory from the real master and search on a simulated 2-node pool (~2 s)."""
    from aiperf.config import load_config
    from aiperf.engine.scaling import SimulationSettings, simulate_run
    from nas import zoo

    cfg = load_config("smoke", ["run.time_budget_s=120"])
    sim = SimulationSettings(workers_per_node=2, device_ops_per_s=3e8, startup_s=0.5)
    simulate_run(cfg, 2, run_dir, zoo.small_resnet((8, 8, 1), 10, width=8), SIM_DATASET, sim)
    return run_dir


@pytest.fixture(scope="session")
def sim_run(tmp_path_factory) -> Path:
    """One simulated run shared by the results tests; tests must not modify it (copy it first)."""
    return simulated_run(tmp_path_factory.mktemp("sim") / "run")


TINY_IMAGENET = {"classes": 4, "train_per_class": 24, "val_per_class": 6, "min_side": 12, "max_side": 48, "bad": 2}


@pytest.fixture(scope="session")
def imagenet_tree(tmp_path_factory) -> Path:
    """A tiny ImageNet-layout tree from `aiperf make-imagenet`: quirks, 2 undecodable files, TFRecord
    shards in ``tfrecord/`` (a few seconds); tests must not modify it (copy it first)."""
    from aiperf.datasets.generate import GenerateSpec, generate_imagenet

    root = tmp_path_factory.mktemp("imagenet") / "tree"
    generate_imagenet(root, GenerateSpec(**TINY_IMAGENET, to_tfrecord=True, train_shards=3, val_shards=2))
    return root
