"""Which workload ``aiperf run`` and ``aiperf plan`` run when no ``--config`` is named (issue 44, item 3).

The embedded default (MNIST's 28x28 digits) is sized for the 2-core box a newcomer tries first; on a
GPU its trials are too small to keep the device busy, so the score would measure Python and the
compiler. On a host with GPUs the same command runs the built-in ``gpu`` workload instead, the one
measured to fill a GPU (aiperf/configs/gpu.yaml says by how much), and the plan says which and why.

The choice reads this host's GPUs (nvidia-smi, as the node probe does) before anything starts: the
master runs on a node of the machine it measures, so a CPU-only head of a GPU cluster is the one case it
misses, and the plan then says so in a note (:func:`mismatch_note`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib.util import find_spec

from aiperf.config import DEFAULT_CONFIG, Config, load_config
from aiperf.training.backend import NvidiaGpu, nvidia_gpus

DEVICE_CONFIG = "gpu"


@dataclass(frozen=True, slots=True)
class WorkloadChoice:
    """The built-in config chosen for this host, the overrides the choice adds, and why."""

    config: str
    why: str
    for_gpus: bool  # chosen for a host with GPUs
    overrides: tuple[str, ...] = ()  # applied before the user's --set, which win


def choose_workload(gpus: Sequence[NvidiaGpu], jax_installed: bool) -> WorkloadChoice:
    """The workload for a host with ``gpus`` (none: the embedded default)."""
    if not gpus:
        return WorkloadChoice(DEFAULT_CONFIG, "no --config and no GPU on this host: the embedded default", False)
    names = sorted({g["name"] for g in gpus})
    what = f"{len(gpus)}x {names[0]}" if len(names) == 1 else f"{len(gpus)} GPUs ({', '.join(names)})"
    why = (
        f"no --config and {what} on this host: the language workload, the one measured to fill a GPU "
        "(the embedded default's 28x28 digits leave it idle)"
    )
    if jax_installed:
        return WorkloadChoice(DEVICE_CONFIG, why, True)
    return WorkloadChoice(
        DEVICE_CONFIG, why + "; on TensorFlow, JAX is not installed", True, ("model.backend=tensorflow",)
    )


def this_hosts_choice() -> WorkloadChoice:
    """:func:`choose_workload` for the GPUs this process sees and the backends it has."""
    return choose_workload(nvidia_gpus(), jax_installed=find_spec("jax") is not None)


def chosen_config(config: str | None, overrides: Sequence[str]) -> tuple[Config, WorkloadChoice | None]:
    """The config a command runs: the named one, else the one chosen for this host (with its choice)."""
    if config is not None:
        return load_config(config, list(overrides)), None
    choice = this_hosts_choice()
    return load_config(choice.config, [*choice.overrides, *overrides]), choice


def mismatch_note(choice: WorkloadChoice | None, cluster_has_gpus: bool) -> str | None:
    """A note where the cluster's devices are not this host's: the choice was made for the wrong kind."""
    if choice is None or choice.for_gpus == cluster_has_gpus:
        return None
    if cluster_has_gpus:
        return (
            f"the workload was chosen for this host, which has no GPU, but the cluster has GPUs: "
            f"--config {DEVICE_CONFIG} runs the workload that fills them"
        )
    return f"the workload was chosen for this host's GPUs, but no GPU trains a trial: --config {DEFAULT_CONFIG}"
