"""The software a score was made with: versions from package metadata and the source commit.

Read from installed packages' metadata rather than by importing them, so describing a node
costs milliseconds and never starts a framework (the master and ``aiperf system`` stay fast).
"""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

from aiperf import DISTRIBUTION

# What ``software_versions`` names -> the distribution whose version it is (ours is published under its own name).
VERSIONED = {"aiperf": DISTRIBUTION} | {
    name: name for name in ("keras", "tensorflow", "jax", "jaxlib", "torch", "ray", "numpy", "optuna")
}
UNKNOWN_COMMIT = "unknown"


def software_versions(backend: str) -> dict[str, str]:
    """Python, the backend's name, and the version of each package in :data:`VERSIONED` that is installed."""
    out = {"python": platform.python_version(), "backend": backend}
    for name, distribution in VERSIONED.items():
        try:
            out[name] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return out


# The CUDA runtime libraries pip installs beside a framework (jax[cuda12], torch, tensorflow[and-cuda]).
CUDA_LIBRARIES = {
    "cuda_runtime": ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime"),
    "cudnn": ("nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "nvidia-cudnn"),
    "cublas": ("nvidia-cublas-cu12", "nvidia-cublas-cu13", "nvidia-cublas"),
    "nccl": ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl"),
}


def cuda_libraries() -> dict[str, str]:
    """Versions of the CUDA runtime libraries installed as Python packages (none on a CPU-only install)."""
    out = {}
    for name, distributions in CUDA_LIBRARIES.items():
        for distribution in distributions:
            try:
                out[name] = metadata.version(distribution)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


def source_commit(package_dir: str | Path | None = None) -> str:
    """The git commit this code was run from (``+dirty`` with uncommitted changes to tracked files),
    or ``unknown`` outside a checkout (an installed wheel) or without git."""
    root = Path(package_dir) if package_dir is not None else Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return UNKNOWN_COMMIT
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN_COMMIT
    return f"{head}+dirty" if head and dirty else head or UNKNOWN_COMMIT
