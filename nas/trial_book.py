"""What every search keeps of its trials: the part of ask/tell/forget/restore that no family changes.

Both families' searches (:mod:`nas.search` for image networks, :mod:`nas.language.search` for
transformers) propose the seed, new architectures and re-tunes. A re-tune belongs to the lineage of
the seed or architecture trial it repeats (its root), and TPE learns from a re-tune's gain over that
root, which may end after the re-tune does. How an architecture is keyed, what a valid score is and
what the architecture search learns from a result are the family's; the trials, their lineages and
the gains owed to TPE are kept here, once.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from nas.errors import NasError
from nas.graph import short_repr
from nas.proposer import TrialKind


class Proposal(Protocol):
    """What the book reads of a family's proposal (``TrialProposal``, ``LMTrialProposal``)."""

    @property
    def kind(self) -> TrialKind: ...
    @property
    def hparams(self) -> Mapping[str, Any]: ...
    @property
    def epochs(self) -> int: ...


class GainTuner(Protocol):
    """TPE as the book uses it: a re-tune's gain over its root, or its failure (``nas.hpo``, ``nas.tuner_ahead``)."""

    def tell(self, trial_id: str, value: float) -> None: ...
    def fail(self, trial_id: str) -> None: ...
    def is_running(self, trial_id: str) -> bool: ...
    def add_completed(self, hparams: Mapping[str, Any], value: float) -> bool: ...


P = TypeVar("P", bound=Proposal)

TrialState = Literal["pending", "final", "failed"]


@dataclass
class SearchTrial(Generic[P]):
    """One proposed trial as its search sees it."""

    id: str
    proposal: P
    key: str  # its architecture's key
    root: str | None  # the seed/arch trial this one repeats (itself for seed/arch trials)
    state: TrialState = "pending"
    value: float | None = None
    partials: int = 0  # epochs told so far

    @property
    def progress(self) -> float:
        return min(1.0, self.partials / max(1, self.proposal.epochs))

    @property
    def result(self) -> float:
        """The trial's value, which a final trial always has."""
        if self.value is None:
            raise NasError(f"trial {self.id} has no result yet")
        return self.value


class TrialBook(Generic[P]):
    """The trials of one search, their lineages, and the re-tune gains owed to TPE."""

    def __init__(self, tuner: GainTuner) -> None:
        self.tuner = tuner
        self.trials: dict[str, SearchTrial[P]] = {}
        self.roots: dict[Hashable, str] = {}  # lineage (parent, morphs) -> its seed/arch trial
        self.done_order: dict[str, int] = {}  # completed root -> how many roots completed before it
        self.lineage_best: dict[str, float] = {}  # root -> best result in its lineage
        self.tunes_per_root: dict[str, int] = {}
        self.waiting_tpe: dict[str, list[str]] = {}  # root -> its re-tunes that finished before it
        self.seed_trial: str | None = None
        self.asks = 0  # asks after the seed
        self.tunes = 0

    # --- the lifecycle ----------------------------------------------------------------------
    def check_new(self, trial_id: str, restoring: bool = False) -> None:
        if trial_id in self.trials:
            raise NasError(f"trial id {trial_id} " + ("is restored twice" if restoring else "was already proposed"))

    def count_restored(self, proposal: P) -> None:
        """A trial read back from a ledger counts as the ask that proposed it (the seed's does not)."""
        if proposal.kind != TrialKind.SEED or self.seed_trial is not None:
            self.asks += 1

    def register(self, trial_id: str, proposal: P, key: str, lineage: Hashable) -> SearchTrial[P]:
        """Enter a proposed (or restored) trial; a re-tune joins the lineage ``lineage`` names."""
        if proposal.kind == TrialKind.TUNE:
            root = self.roots.get(lineage)
            self.tunes += 1
            if root is not None:
                self.tunes_per_root[root] = self.tunes_per_root.get(root, 0) + 1
        else:
            root = trial_id
            old = self.roots.get(lineage)
            if old is None or self.trials[old].state == "failed":  # a lineage proposed again after its root failed
                self.roots[lineage] = trial_id
            if proposal.kind == TrialKind.SEED and self.seed_trial is None:
                self.seed_trial = trial_id
        trial = self.trials[trial_id] = SearchTrial(trial_id, proposal, key, root)
        return trial

    def active(self, trial_id: str) -> SearchTrial[P]:
        trial = self.trials.get(trial_id)
        if trial is None:
            raise NasError(f"unknown trial {short_repr(trial_id)}")
        if trial.state != "pending":
            raise NasError(f"trial {trial_id} has already ended ({trial.state})")
        return trial

    def tell(self, trial: SearchTrial[P], value: float, final: bool) -> None:
        """Record a checked result: an epoch's (``final=False``) or the trial's end."""
        trial.value = float(value)
        if final:
            trial.state = "final"
        else:
            trial.partials += 1

    def completed(self, trial: SearchTrial[P]) -> None:
        """A final result: its lineage's best, and TPE's gains that waited for it or that it is."""
        value = trial.result
        if trial.proposal.kind != TrialKind.TUNE:
            self.done_order.setdefault(trial.id, len(self.done_order))
            self.tunes_per_root.setdefault(trial.id, 0)
            for waiting in self.waiting_tpe.pop(trial.id, []):
                self._report_tune(self.trials[waiting])
        else:
            self._report_tune(trial)
        if trial.root is not None:
            self.lineage_best[trial.root] = max(self.lineage_best.get(trial.root, -math.inf), value)

    def failed(self, trial: SearchTrial[P]) -> None:
        """The trial ended without a result: TPE drops it, and the re-tunes waiting on it as their root."""
        trial.state = "failed"
        self.tuner.fail(trial.id)
        for waiting in self.waiting_tpe.pop(trial.id, []):  # their baseline will never come
            self.tuner.fail(waiting)

    def _report_tune(self, trial: SearchTrial[P]) -> None:
        """Tell TPE a finished re-tune's gain over its lineage root (or hold it until the root ends)."""
        root = self.trials.get(trial.root) if trial.root is not None else None
        if root is not None and root.state == "pending":
            self.waiting_tpe.setdefault(root.id, []).append(trial.id)
            return
        if root is None or root.state != "final":
            self.tuner.fail(trial.id)  # no baseline to measure the gain against
            return
        gain = trial.result - root.result
        if self.tuner.is_running(trial.id):
            self.tuner.tell(trial.id, gain)
        else:  # restored from the ledger
            self.tuner.add_completed(trial.proposal.hparams, gain)

    # --- introspection ------------------------------------------------------------------------
    @property
    def pending(self) -> list[str]:
        return [t.id for t in self.trials.values() if t.state == "pending"]

    def best(self) -> tuple[str, float] | None:
        """The completed trial with the best result, or None."""
        done = [t for t in self.trials.values() if t.state == "final"]
        if not done:
            return None
        top = max(done, key=lambda t: t.result)
        return top.id, top.result
