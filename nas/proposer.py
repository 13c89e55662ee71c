"""The seam between the master and the search: something that proposes the next trial.

The master assigns trial ids and calls :meth:`Proposer.ask` whenever a worker will soon be
free; it reports every completed epoch with :meth:`Proposer.tell` (``final=False``) and the
trial's end with ``final=True``; failed or cancelled trials are dropped with
:meth:`Proposer.forget`. On ``--resume`` the master replays the ledger through
:meth:`Proposer.restore` so the search state is rebuilt without re-running anything.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from nas.graph import Graph
from nas.morph import Morph


class TrialKind(enum.StrEnum):
    """Why a trial was proposed; recorded as ``trial_start.kind`` (a plain string in the ledger)."""

    SEED = "seed"  # the seed architecture, trained first
    ARCH = "arch"  # a new architecture: morphs of an earlier trial's
    TUNE = "tune"  # an earlier architecture again, with hyperparameters from TPE


@dataclass
class TrialProposal:
    """What to train next.

    ``parent`` is the trial whose architecture ``morphs`` were applied to (lineage; None for
    the seed). ``inherit`` is the trial whose trained weights the child starts from, or None
    to start from a fresh initialisation (e.g. when the parent has not finished yet).
    ``hparams`` holds every training hyperparameter the trainer uses (see HPARAM_KEYS).
    """

    graph: Graph
    kind: TrialKind
    hparams: dict[str, Any]
    parent: str | None = None
    inherit: str | None = None
    morphs: tuple[Morph, ...] = ()
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def epochs(self) -> int:
        return int(self.hparams["epochs"])


# The hyperparameters every proposal carries; the trainer must use each of them.
HPARAM_KEYS = ("learning_rate", "batch_size", "weight_decay", "dropout", "kernel_size", "epochs")


P = TypeVar("P")  # what a proposal is: TrialProposal for image networks, LMTrialProposal for language models


class Proposer(ABC, Generic[P]):
    """Proposes trials and learns from their results."""

    @abstractmethod
    def ask(self, trial_id: str) -> P:
        """Propose the trial the master will run under ``trial_id`` (now pending)."""

    @abstractmethod
    def tell(self, trial_id: str, value: float, final: bool) -> None:
        """Report the best validation accuracy of ``trial_id`` so far; ``final`` when it ended."""

    @abstractmethod
    def forget(self, trial_id: str) -> None:
        """``trial_id`` failed or was cancelled before finishing; it is no longer pending."""

    def at(self, progress: float) -> None:
        """The run has used ``progress`` of its time budget (0 to 1); told before every :meth:`ask`.

        A search whose proposals follow a timetable (the size schedule, :mod:`nas.schedule`) reads
        it; the search itself keeps no clock, so it stays deterministic under test.
        """

    def close(self) -> None:
        """The run is over: stop whatever the proposer started beside it (processes)."""

    @abstractmethod
    def restore(self, trial_id: str, proposal: P, value: float | None, final: bool) -> None:
        """Re-enter a trial read back from the ledger (resume), without proposing anything."""
