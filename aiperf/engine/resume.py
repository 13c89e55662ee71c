"""Continuing a run whose master died: which ledger may be continued, and the search rebuilt from it.

The search state is rebuilt by replaying the ledger into a fresh proposer, the kept parent
weights are reloaded from the run directory, and the clock continues from the ledger's last
``t`` plus the downtime gap (the gap is counted as wall time: a master crash costs the score,
it cannot inflate it). Trials that were running when the master died lost their in-memory
checkpoints with it; the new session closes them as ``lost``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiperf.config import Config, config_from_dict
from aiperf.engine.weights import WeightStore
from aiperf.errors import AiperfError, excerpt, first_line
from aiperf.ledger.schema import (
    BadImagesRecord,
    EpochRecord,
    Record,
    RecordType,
    ResumeRecord,
    RunStartRecord,
    RunStatus,
    RunStopRecord,
    TrialEndRecord,
    TrialStartRecord,
    TrialStatus,
    parse_record,
)
from aiperf.ledger.store import LEDGER_NAME, LedgerStream, cut_torn_tail, iter_ledger
from nas.errors import NasError
from nas.proposer import Proposer

if TYPE_CHECKING:
    from nas.language.search import LMTrialProposal
    from nas.proposer import TrialProposal


class _Facts:
    """What a resume needs of a ledger's records, gathered in one pass: per trial its best accuracy and how
    it ended, the trials still open, the session's end; a few numbers and the bad image files besides."""

    def __init__(self) -> None:
        self.start: RunStartRecord | None = None
        self.count = 0
        self.last: Record | None = None
        self.last_stop: Record | None = None  # the latest run_stop or resume
        self.best: dict[str, float] = {}
        self.final: dict[str, TrialStatus] = {}
        self.open: dict[str, None] = {}  # started, not ended, in start order
        self.top_number = -1
        self.epochs = 0
        self.bad_images: set[str] = set()
        self.missing_images: set[str] = set()

    def add(self, r: Record) -> None:
        if self.start is None and isinstance(r, RunStartRecord):
            self.start = r
        self.count += 1
        self.last = r
        if isinstance(r, TrialStartRecord):
            number = r.trial[1:]
            if number.isdigit() and len(r.trial) < 12:
                self.top_number = max(self.top_number, int(number))
            if r.trial not in self.final:
                self.open[r.trial] = None
        elif isinstance(r, EpochRecord):
            self.epochs += 1
            self.best[r.trial] = max(self.best.get(r.trial, 0.0), r.val_acc)
        elif isinstance(r, TrialEndRecord):
            self.final[r.trial] = r.status
            self.open.pop(r.trial, None)
        elif isinstance(r, (RunStopRecord, ResumeRecord)):
            self.last_stop = r
        elif isinstance(r, BadImagesRecord):
            self.bad_images.update(r.files)
            self.missing_images.update(r.missing)


class ResumableLedger:
    """A ledger checked for ``--resume`` in one pass, without holding its records.

    Iterating reads the records again, one at a time (the replay's second pass); ``start`` is its
    ``run_start`` and ``facts`` what the first pass gathered.
    """

    def __init__(self, run_dir: Path, facts: _Facts) -> None:
        assert facts.start is not None and facts.last is not None
        self.run_dir = run_dir
        self.start: RunStartRecord = facts.start
        self.facts = facts

    def __iter__(self) -> Iterator[Record]:
        return iter_ledger(self.run_dir)

    def __len__(self) -> int:
        return self.facts.count


Records = list[Record] | ResumableLedger


def run_start(records: Records) -> RunStartRecord:
    """A checked ledger's first record (``parse_records`` refuses a ledger that begins otherwise)."""
    first = records.start if isinstance(records, ResumableLedger) else records[0]
    if not isinstance(first, RunStartRecord):
        raise AiperfError("the ledger does not begin with a run_start record")
    return first


def read_resumable(run_dir: Path) -> ResumableLedger:
    """The ledger of a run that can be continued, checked record by record (the caller holds the run lock).

    A torn tail is cut off; a malformed record, a run that already completed or a header
    whose config no longer validates is refused, before anything is appended. The ledger is
    read one record at a time: what is kept grows with its trials, not its records.
    """
    stream = LedgerStream(run_dir)
    facts = _Facts()
    source = run_dir / LEDGER_NAME
    for index, (_, raw) in enumerate(stream):
        if index == 0:
            if raw.get("type") != RecordType.RUN_START:
                raise AiperfError(f"{run_dir}: not a run directory (its ledger has no run_start record)")
            if not isinstance(raw.get("config"), dict):
                raise AiperfError(f"{run_dir}: its run_start record has no config to continue with")
        facts.add(parse_record(raw, index, source))
    if stream.count == 0:
        raise AiperfError(f"{run_dir}: not a run directory (its ledger has no run_start record)")
    if stream.torn_bytes:
        cut_torn_tail(stream)
    stop = facts.last_stop
    if isinstance(stop, RunStopRecord) and stop.status is RunStatus.COMPLETED:
        raise AiperfError(f"{run_dir}: this run already completed ({excerpt(stop.reason, 80)}); nothing to resume")
    ledger = ResumableLedger(run_dir, facts)
    recorded_config(ledger)
    return ledger


def recorded_config(records: Records) -> Config:
    """The config a run was started with, as its run_start record holds it."""
    return config_from_dict(run_start(records).config.model_dump(exclude_unset=True))


@dataclass
class ResumePoint:
    """Where the next session of a run starts: its clock, its trial numbers, what it must close."""

    last: Record  # the ledger's last record
    gap_s: float  # downtime since the last record, counted as wall time
    first_trial: int  # the next trial number
    unfinished: list[str] = field(default_factory=list)  # trials the dead master was running
    weights_skipped: list[str] = field(default_factory=list)  # kept weights that could not be read back
    epochs_before: int = 0  # epochs counted by the earlier sessions
    bad_images: set[str] = field(default_factory=set)
    missing_images: set[str] = field(default_factory=set)  # of bad_images, the files that were gone

    @property
    def clock_offset(self) -> float:
        return self.last.t + self.gap_s

    @property
    def from_seq(self) -> int:
        return self.last.seq


def proposal_from_record(rec: TrialStartRecord, family: str = "image") -> TrialProposal | LMTrialProposal:
    """The proposal a trial_start record describes, as the search made it (of the run's family)."""
    from aiperf.families import family_for

    return family_for(family).proposal_from_record(rec)


def replay(records: Records, proposer: Proposer[Any], weights: WeightStore, family: str = "image") -> ResumePoint:
    """Replay a ledger into a fresh proposer and reload the kept weights; where the next session starts.

    The records have passed their models' checks; what can still be wrong (an architecture
    that does not parse, a trial restored twice) is reported as one line naming the record.
    The ledger is read twice, one record at a time: first what each trial reached and how it
    ended (already gathered by :func:`read_resumable`), then each trial's first start, restored
    as it comes.
    """
    if isinstance(records, ResumableLedger):
        facts = records.facts
    else:
        facts = _Facts()
        for r in records:
            facts.add(r)
    best, final = facts.best, facts.final
    restored: set[str] = set()
    for rec in records:
        if not isinstance(rec, TrialStartRecord) or rec.trial in restored:
            continue
        trial = rec.trial
        restored.add(trial)
        done = final.get(trial) == TrialStatus.COMPLETED
        try:
            proposer.restore(trial, proposal_from_record(rec, family), best.get(trial), done)
            if trial in final and not done:  # failed, lost or stopped: no longer pending
                proposer.forget(trial)
        except (NasError, AiperfError, KeyError, TypeError, ValueError) as exc:
            raise AiperfError(
                f"cannot resume: the ledger's seq {rec.seq} (trial_start {excerpt(trial)}) "
                f"cannot be replayed: {first_line(exc, 200)}"
            ) from None
    del restored
    skipped = weights.reload({t: best.get(t, 0.0) for t, s in final.items() if s == TrialStatus.COMPLETED})
    last = facts.last
    assert last is not None  # a checked ledger has records
    gap = max(0.0, time.time() - last.wall)
    return ResumePoint(
        last,
        gap,
        facts.top_number + 1,
        list(facts.open),
        skipped,
        epochs_before=facts.epochs,
        bad_images=facts.bad_images,
        missing_images=facts.missing_images,
    )
