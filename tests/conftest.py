"""Shared fixtures: one real smoke run per test session (Ray + Keras + real digits), reused read-only."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest
from helpers import REPO, SMOKE_RUN_SETTINGS, aiperf_cmd, cli_env, made_once, simulated_run


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): one test process more than the box has cores, within its memory.

    The slow tests start real runs that spend much of their time waiting (for Ray and framework
    start-up, budgets, a killed node's silence), so one process per core leaves the cores idle:
    on the 2-core VM the suite kept them 88 % busy on two processes and finished its engine and
    ledger tests in 447 s on three against 576 s on two (benchmarks/RESULTS.md). A real run holds
    up to ~4 GiB (Ray, two framework workers), hence the memory cap.
    """
    import psutil

    cores = psutil.cpu_count(logical=True) or 1
    return max(1, min(cores + 1, psutil.virtual_memory().total // (4 * 2**30)))


# The files that cost the most worker time, most first (pytest --durations=0 on the 2-core VM, 2026-12-07).
LONGEST_FILES = (
    "cluster/test_real_slurm.py",
    "cluster/test_multinode.py",
    "engine/test_streaming_run.py",
    "cluster/test_control_plane.py",
    "submission/test_package.py",
    "cluster/test_compile_ahead_run.py",
    "test_llm_run.py",
    "engine/test_output_safety.py",
    "engine/test_repeat.py",
    "submission/test_list.py",
    "engine/test_audit.py",
    "families/language/test_lm_model.py",
    "cluster/test_node_agent.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first, then those with the most slow tests (stable: each file's tests stay together).

    ``--dist loadfile`` hands files out in this order: the long ones start at once and the short
    ones fill the gaps at the end, instead of one long file running on alone while the others idle.
    """
    here = Path(__file__).parent
    rank = {here / name: k for k, name in enumerate(LONGEST_FILES)}
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: (rank.get(item.path, len(rank)), -slow[item.path]))


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
