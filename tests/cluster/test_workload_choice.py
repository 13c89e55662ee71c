"""With no --config, the host's devices choose the workload (issue 44, item 3), and the plan says which and why."""

from __future__ import annotations

import os
import subprocess

from helpers import REPO, aiperf_cmd, cli_env
from test_plan import node

from aiperf.cluster import workload_choice
from aiperf.cluster.plan import format_plan, make_plan
from aiperf.cluster.workload_choice import WorkloadChoice, choose_workload, chosen_config
from aiperf.config import load_config
from aiperf.ledger.schema import PlanHeader

GiB = 2**30


def _gpu(name: str = "NVIDIA H200", index: int = 0) -> dict:
    return {"index": index, "name": name, "memory_bytes": 141 * GiB, "compute_capability": (9, 0), "driver": "570"}


def test_a_host_without_gpus_runs_the_embedded_default():
    choice = choose_workload([], jax_installed=True)
    assert (choice.config, choice.for_gpus, choice.overrides) == ("default", False, ())
    assert "no GPU" in choice.why


def test_a_gpu_host_runs_the_language_workload_sized_for_a_gpu():
    choice = choose_workload([_gpu(index=k) for k in range(8)], jax_installed=True)
    assert (choice.config, choice.for_gpus, choice.overrides) == ("gpu", True, ())
    assert "8x NVIDIA H200" in choice.why
    cfg = load_config(choice.config)
    assert cfg.family == "language" and cfg.model.backend == "jax"
    default = load_config("default")
    assert cfg.run.time_budget_s == default.run.time_budget_s, "the same command lasts as long on either host"
    # sized for a device: a trial's steps carry far more work than the CPU language workload's
    cpu = load_config("llm")
    assert cfg.lm.batch_size * cfg.lm.seq_len >= 8 * cpu.lm.batch_size * cpu.lm.seq_len
    assert cfg.lm.seed.width >= 4 * cpu.lm.seed.width


def test_without_jax_the_gpu_workload_runs_on_tensorflow_and_says_so():
    choice = choose_workload([_gpu(), _gpu("NVIDIA A100-SXM4-80GB", 1)], jax_installed=False)
    assert choice.overrides == ("model.backend=tensorflow",)
    assert "2 GPUs (NVIDIA A100-SXM4-80GB, NVIDIA H200)" in choice.why and "JAX is not installed" in choice.why


def test_a_named_config_is_never_replaced_and_the_users_settings_win(monkeypatch):
    gpu_host = WorkloadChoice("gpu", "a GPU host", True, ("model.backend=tensorflow",))
    monkeypatch.setattr(workload_choice, "this_hosts_choice", lambda: gpu_host)
    cfg, choice = chosen_config("smoke", ["run.max_trials=3"])
    assert choice is None and cfg.run.name == "smoke" and cfg.run.max_trials == 3
    cfg, choice = chosen_config(None, ["model.backend=torch"])
    assert choice is gpu_host and cfg.run.name == "gpu" and cfg.model.backend == "torch"


def test_the_plan_states_the_choice_and_a_cluster_whose_devices_differ_from_this_hosts():
    gpu_host = choose_workload([_gpu()], jax_installed=True)
    cfg = load_config(gpu_host.config)
    plan = make_plan([node("gpu", 16, 1)], cfg, gpu_host)
    assert plan.workload == "gpu" and not any("chosen" in n for n in plan.notes)
    assert f"  workload: gpu ({gpu_host.why})" in format_plan(plan).splitlines()
    recorded = PlanHeader(**plan.to_dict())
    assert (recorded.workload, recorded.workload_why) == ("gpu", gpu_host.why)
    # the head has GPUs, the trials do not (Ray schedules none): the plan says the choice was wrong
    assert any("no GPU trains a trial" in n for n in make_plan([node("cpu", 16)], cfg, gpu_host).notes)
    cpu_head = choose_workload([], jax_installed=True)
    wrong = make_plan([node("head", 4), node("gpu", 16, 8)], load_config("default"), cpu_head)
    assert any("--config gpu" in n for n in wrong.notes)
    named = make_plan([node("gpu", 16, 1)], cfg)
    assert named.workload == "" and "workload:" not in format_plan(named)


def test_aiperf_plan_on_a_host_whose_nvidia_smi_lists_a_gpu(tmp_path):
    """End to end: nvidia-smi on PATH lists an H200; Ray (which finds no CUDA device here) schedules none."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "NVIDIA H200, 143771, 9.0, 570.86.15"\n')
    fake.chmod(0o755)
    env = {**cli_env(), "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        aiperf_cmd("plan"), capture_output=True, text=True, env=env, cwd=REPO, timeout=180
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "backend jax" in lines[0], lines[0]  # jax is installed with the test extras
    assert any(line.startswith("  workload: gpu (no --config and 1x NVIDIA H200 on this host") for line in lines)
    assert any("1 GPUs detected but Ray schedules 0" in line for line in lines)
    assert any("chosen for this host's GPUs, but no GPU trains a trial" in line for line in lines)


def test_the_plan_says_how_trials_are_sized_and_the_gpu_workload_sizes_them_by_the_device():
    gpu = make_plan([node("gpu", 16, 1)], load_config("gpu"))
    assert gpu.trial_sizing == "epochs of 5 s at each worker's measured ceiling (lm.steps_per_epoch auto)"
    assert f"  trials: {gpu.trial_sizing}" in format_plan(gpu).splitlines()
    assert PlanHeader(**gpu.to_dict()).trial_sizing == gpu.trial_sizing
    fixed = make_plan([node("box", 2)], load_config("llm"))
    assert fixed.trial_sizing == "epochs of 50 steps (lm.steps_per_epoch)"
    assert make_plan([node("box", 2)], load_config("smoke")).trial_sizing.startswith("epochs of one pass")
