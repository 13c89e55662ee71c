"""Helpers shared by the tests (import them: ``from helpers import aiperf_cmd``); fixtures live in conftest.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def aiperf_cmd(*args: str) -> list[str]:
    """The CLI as a user runs it, from this interpreter (works with or without an installed script)."""
    return [sys.executable, "-m", "aiperf.cli", *args]


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``aiperf ARGS`` in a process of its own, as a user types it; ``timeout`` guards against a hang."""
    return subprocess.run(aiperf_cmd(*args), capture_output=True, text=True, env=cli_env(), timeout=timeout, cwd=REPO)


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


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
