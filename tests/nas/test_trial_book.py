"""The trial bookkeeping both families' searches share (nas/trial_book.py): lineages and TPE's gains."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from nas.errors import NasError
from nas.proposer import TrialKind
from nas.trial_book import TrialBook


@dataclass(frozen=True)
class _Proposal:
    kind: TrialKind
    hparams: Mapping[str, Any] = field(default_factory=lambda: {"epochs": 2, "learning_rate": 0.1})

    @property
    def epochs(self) -> int:
        return 2


class _Tuner:
    """TPE as the book sees it: what it was told."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.gains: dict[str, float] = {}
        self.failed: list[str] = []
        self.added: list[float] = []

    def tell(self, trial_id: str, value: float) -> None:
        self.running.discard(trial_id)
        self.gains[trial_id] = value

    def fail(self, trial_id: str) -> None:
        self.running.discard(trial_id)
        self.failed.append(trial_id)

    def is_running(self, trial_id: str) -> bool:
        return trial_id in self.running

    def add_completed(self, hparams: Mapping[str, Any], value: float) -> bool:
        self.added.append(value)
        return True


LINEAGE = ("t0", ("wider",))


def _book() -> tuple[TrialBook[_Proposal], _Tuner]:
    tuner = _Tuner()
    book: TrialBook[_Proposal] = TrialBook(tuner)
    book.register("t0", _Proposal(TrialKind.SEED), "k0", (None, ()))
    return book, tuner


def _tune(book: TrialBook[_Proposal], tuner: _Tuner, trial_id: str, lineage=LINEAGE, running: bool = True):
    if running:
        tuner.running.add(trial_id)
    return book.register(trial_id, _Proposal(TrialKind.TUNE), "k1", lineage)


def _end(book: TrialBook[_Proposal], trial_id: str, value: float) -> None:
    trial = book.active(trial_id)
    book.tell(trial, value, final=True)
    book.completed(trial)


def test_a_re_tune_ending_before_its_root_is_told_its_gain_when_the_root_ends():
    book, tuner = _book()
    book.register("t1", _Proposal(TrialKind.ARCH), "k1", LINEAGE)
    _tune(book, tuner, "t2")
    _end(book, "t2", 0.9)
    assert tuner.gains == {} and book.waiting_tpe == {"t1": ["t2"]}
    _end(book, "t1", 0.7)
    assert tuner.gains == {"t2": pytest.approx(0.2)}
    assert book.lineage_best["t1"] == 0.9 and book.tunes_per_root["t1"] == 1 and book.done_order == {"t1": 0}


def test_when_a_root_fails_its_waiting_re_tunes_fail_in_tpe_too():
    book, tuner = _book()
    book.register("t1", _Proposal(TrialKind.ARCH), "k1", LINEAGE)
    _tune(book, tuner, "t2")
    _end(book, "t2", 0.9)
    book.failed(book.active("t1"))
    assert tuner.failed == ["t1", "t2"] and tuner.gains == {}
    assert book.pending == ["t0"] and book.best() == ("t2", 0.9)


def test_a_lineage_proposed_again_after_its_root_failed_measures_its_re_tunes_against_the_new_root():
    book, tuner = _book()
    book.register("t1", _Proposal(TrialKind.ARCH), "k1", LINEAGE)
    book.failed(book.active("t1"))
    book.register("t3", _Proposal(TrialKind.ARCH), "k1", LINEAGE)  # the same architecture, proposed again
    _end(book, "t3", 0.6)
    assert _tune(book, tuner, "t4").root == "t3"
    _end(book, "t4", 0.65)
    assert tuner.gains == {"t4": pytest.approx(0.05)}


def test_a_restored_re_tune_is_added_to_tpe_with_its_gain_and_counts_as_an_ask():
    book, tuner = _book()
    _end(book, "t0", 0.5)
    proposal = _Proposal(TrialKind.TUNE)
    book.count_restored(proposal)
    _tune(book, tuner, "t1", lineage=(None, ()), running=False)  # read back from a ledger: TPE never asked
    _end(book, "t1", 0.75)
    assert tuner.added == [pytest.approx(0.25)] and book.asks == 1 and book.tunes == 1


def test_unknown_ended_and_repeated_trials_are_refused_by_name():
    book, _ = _book()
    with pytest.raises(NasError, match="unknown trial 'nope'"):
        book.active("nope")
    _end(book, "t0", 0.5)
    with pytest.raises(NasError, match="t0 has already ended"):
        book.active("t0")
    with pytest.raises(NasError, match="was already proposed"):
        book.check_new("t0")
    with pytest.raises(NasError, match="is restored twice"):
        book.check_new("t0", restoring=True)
