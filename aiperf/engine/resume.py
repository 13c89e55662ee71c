"""Continuing a run whose master died: which ledger may be continued, and the search rebuilt from it.

The search state is rebuilt by replaying the ledger into a fresh proposer, the kept parent
weights are reloaded from the run directory, and the clock continues from the ledger's last
``t`` plus the downtime gap (the gap is counted as wall time: a master crash costs the score,
it cannot inflate it). Trials that were running when the master died lost their in-memory
checkpoints with it; the new session closes them as ``lost``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from aiperf.config import Config, config_from_dict
from aiperf.engine.weights import WeightStore
from aiperf.errors import AiperfError, excerpt, first_line
from aiperf.record.ledger import LEDGER_NAME, read_raw_ledger
from aiperf.record.schema import (
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
    of_type,
    parse_records,
)
from nas.errors import NasError
from nas.morph import Morph
from nas.proposer import Proposer, TrialKind, TrialProposal
from nas.serialize import graph_from_dict


def run_start(records: list[Record]) -> RunStartRecord:
    """A checked ledger's first record (``parse_records`` refuses a ledger that begins otherwise)."""
    first = records[0]
    if not isinstance(first, RunStartRecord):
        raise AiperfError("the ledger does not begin with a run_start record")
    return first


def read_resumable(run_dir: Path) -> list[Record]:
    """The ledger of a run that can be continued, checked record by record (the caller holds the run lock).

    A torn tail is cut off; a malformed record, a run that already completed or a header
    whose config no longer validates is refused, before anything is appended.
    """
    raw = read_raw_ledger(run_dir, repair=True)
    if not raw or raw[0].get("type") != RecordType.RUN_START:
        raise AiperfError(f"{run_dir}: not a run directory (its ledger has no run_start record)")
    if not isinstance(raw[0].get("config"), dict):
        raise AiperfError(f"{run_dir}: its run_start record has no config to continue with")
    records = parse_records(raw, run_dir / LEDGER_NAME)
    stops = [r for r in records if isinstance(r, (RunStopRecord, ResumeRecord))]
    if stops and isinstance(stops[-1], RunStopRecord) and stops[-1].status is RunStatus.COMPLETED:
        raise AiperfError(f"{run_dir}: this run already completed ({excerpt(stops[-1].reason, 80)}); nothing to resume")
    recorded_config(records)
    return records


def recorded_config(records: list[Record]) -> Config:
    """The config a run was started with, as its run_start record holds it."""
    return config_from_dict(run_start(records).config.model_dump(exclude_unset=True))


@dataclass
class ResumePoint:
    """Where the next session of a run starts: its clock, its trial numbers, what it must close."""

    records: list[Record]
    gap_s: float  # downtime since the last record, counted as wall time
    first_trial: int  # the next trial number
    unfinished: list[str] = field(default_factory=list)  # trials the dead master was running
    weights_skipped: list[str] = field(default_factory=list)  # kept weights that could not be read back

    @property
    def clock_offset(self) -> float:
        return self.records[-1].t + self.gap_s

    @property
    def from_seq(self) -> int:
        return self.records[-1].seq

    @property
    def epochs_before(self) -> int:
        return len(of_type(self.records, EpochRecord))

    @property
    def bad_images(self) -> set[str]:
        return {f for r in of_type(self.records, BadImagesRecord) for f in r.files}

    @property
    def missing_images(self) -> set[str]:
        """Of :attr:`bad_images`, the files that were gone (deleted since the run began)."""
        return {f for r in of_type(self.records, BadImagesRecord) for f in r.missing}


def proposal_from_record(rec: TrialStartRecord) -> TrialProposal:
    """The proposal a trial_start record describes, as the search made it."""
    if rec.graph is None:
        raise AiperfError("its architecture (graph) is not recorded")
    return TrialProposal(
        graph=graph_from_dict(rec.graph),
        kind=TrialKind(rec.kind),
        hparams=rec.hparams.model_dump(exclude_unset=True),
        parent=rec.parent,
        inherit=rec.inherit,
        morphs=tuple(Morph.from_dict(m) for m in rec.morphs),
        info=rec.info,
    )


def replay(records: list[Record], proposer: Proposer, weights: WeightStore) -> ResumePoint:
    """Replay a ledger into a fresh proposer and reload the kept weights; where the next session starts.

    The records have passed their models' checks; what can still be wrong (an architecture
    that does not parse, a trial restored twice) is reported as one line naming the record.
    """
    starts: dict[str, TrialStartRecord] = {}
    best: dict[str, float] = {}
    final: dict[str, TrialStatus] = {}
    for r in records:
        if isinstance(r, TrialStartRecord):
            starts.setdefault(r.trial, r)
        elif isinstance(r, EpochRecord):
            best[r.trial] = max(best.get(r.trial, 0.0), r.val_acc)
        elif isinstance(r, TrialEndRecord):
            final[r.trial] = r.status
    for trial, rec in starts.items():
        done = final.get(trial) == TrialStatus.COMPLETED
        try:
            proposer.restore(trial, proposal_from_record(rec), best.get(trial), done)
            if trial in final and not done:  # failed, lost or stopped: no longer pending
                proposer.forget(trial)
        except (NasError, AiperfError, KeyError, TypeError, ValueError) as exc:
            raise AiperfError(
                f"cannot resume: the ledger's seq {rec.seq} (trial_start {excerpt(trial)}) "
                f"cannot be replayed: {first_line(exc, 200)}"
            ) from None
    skipped = weights.reload({t: best.get(t, 0.0) for t, s in final.items() if s == TrialStatus.COMPLETED})
    numbers = [int(t[1:]) for t in starts if t[1:].isdigit() and len(t) < 12]
    unfinished = [t for t in starts if t not in final]
    gap = max(0.0, time.time() - records[-1].wall)
    return ResumePoint(records, gap, max(numbers, default=-1) + 1, unfinished, skipped)
