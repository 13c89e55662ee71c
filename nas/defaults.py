"""The search's default settings, in one place: the run config (``aiperf.config``) reads them too.

A tiny module with no heavy imports, so that the config (loaded by every command) does not pay
for importing the search itself (SciPy and Optuna; the import time: benchmarks/RESULTS.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypedDict

KernelSize = Literal[1, 3, 5, 7]  # odd, so a deeper morph can start as an identity
Strategy = Literal["bayesian", "random"]


class Hparams(TypedDict):
    """The training hyperparameters of one trial (``nas.proposer.HPARAM_KEYS``)."""

    learning_rate: float
    batch_size: int
    weight_decay: float
    dropout: float
    kernel_size: KernelSize
    epochs: int


# Training hyperparameters a trial uses unless the search or the config says otherwise.
DEFAULT_HPARAMS: Hparams = {
    "learning_rate": 0.05,
    "batch_size": 128,
    "weight_decay": 5e-4,
    "dropout": 0.0,
    "kernel_size": 3,
    "epochs": 3,
}


@dataclass(frozen=True)
class HparamRanges:
    """The ranges TPE samples from when a trial re-tunes an architecture."""

    learning_rate: tuple[float, float] = (1e-3, 0.2)
    weight_decay: tuple[float, float] = (1e-6, 1e-2)
    dropout: tuple[float, float] = (0.0, 0.5)
    batch_sizes: tuple[int, ...] = (32, 64, 128, 256)
    kernel_sizes: tuple[KernelSize, ...] = (1, 3, 5)
    epochs: tuple[int, int] = (1, 4)


@dataclass(frozen=True)
class SearchDefaults:
    """How architectures are proposed."""

    strategy: Strategy = "bayesian"
    ucb_beta: float = 2.0
    retune_fraction: float = 0.25
    max_morphs_per_child: int = 2
    gp_window: int = 256
    candidates: int = 64


STRATEGIES: tuple[Strategy, ...] = ("bayesian", "random")
HPARAM_RANGES = HparamRanges()
SEARCH = SearchDefaults()
