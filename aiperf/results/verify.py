"""``aiperf verify``: re-derive everything a run claims from its ledger and compare.

Four independent checks, each of which an edit to the results must get past:

1. the hash chain: every record's ``seq`` follows the previous one, its ``prev`` is the
   previous record's ``hash`` and its ``hash`` is the SHA-256 of its own content, so an
   edited, removed, inserted or reordered record shows where it happened;
2. the bookkeeping: the run header comes first, the master clock never runs backwards,
   every epoch belongs to a trial that started and no epoch of an attempt is counted twice;
   then the consistency (:func:`check_consistency`): what the ledger implies about itself --
   images per epoch against the split sizes, workers' step time against the master clock and
   their lifetimes, ``t`` against ``wall``, every trial started once and ended, nothing but a
   ``resume`` after a ``run_stop``;
3. the operation counts: every trial's FLOPs are recounted from the architecture stored in
   its ``trial_start`` record, and every epoch's ``train_ops``, ``eval_ops``, ``ops`` and
   ``aiperf_ops`` from those FLOPs, the epoch's image counts and its batch size (a language
   run's trials: per token, from their ``transformer``, ``seq_len`` and batch size, and each
   epoch's operations from its token counts; its quality from its bits per byte);
4. the claims: the summary (score, validity rules, trial counts, the ledger's record count
   and last hash, which anchors the end of the chain) is recomputed and must equal
   ``summary.json`` field by field.

The chain has no key and the hashing is public: a ledger rewritten with fresh hashes and a
matching ``summary.json`` passes checks 1 and 4, so the chain only catches accidents and
naive edits. The consistency checks are what such a forger must still get right; one who
keeps every derived fact consistent has invented a run that could have happened, and only
re-running it tells. Publish ``summary.json``'s ``ledger.last_hash`` with a result to pin the
ledger down.

Check 1 reads the ledger's JSON objects as they are, so it can name any damage. Before checks
2-4 every record's shape is checked (``aiperf.ledger.schema``): a record with a string where a
number belongs fails verification there, by name, instead of crashing a later check; once every
shape is right, checks 2-4 work on the typed records. Input that cannot be read as a ledger at
all (no such directory, a line that is not JSON, nesting too deep to parse) raises
:class:`~aiperf.errors.AiperfError`, which the CLI reports with exit code 2; a failed check is
exit code 1.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Generic, cast

from aiperf.errors import AiperfError, excerpt
from aiperf.families.image.flops import GraphCost, aiperf_compatible_per_image, count_flops, epoch_operations
from aiperf.ledger.files import read_regular
from aiperf.ledger.inert import inert
from aiperf.ledger.schema import (
    AuditRecord,
    EpochRecord,
    Record,
    RecordT,
    RecordType,
    RequeueRecord,
    ResumeRecord,
    RunStartRecord,
    RunStatus,
    RunStopRecord,
    TrialEndRecord,
    TrialStartRecord,
    WorkerRecord,
    checked_record,
)
from aiperf.ledger.store import LEDGER_NAME, LedgerStream, iter_ledger, line_hash_matches, record_hash, sorted_json
from aiperf.metrics.score import format_ops
from aiperf.results.size_pace import format_size_pace
from aiperf.results.summary import MAX_SUMMARY_BYTES, SUMMARY_NAME, RunDigest, build_summary, language_quality
from aiperf.results.summary_model import RunSummary
from aiperf.sampling.telemetry import read_telemetry
from nas.errors import NasError
from nas.graph import Graph
from nas.language.flops import TransformerFlops, transformer_flops
from nas.language.spec import TransformerSpec
from nas.serialize import graph_from_dict

REL_TOL = 1e-9  # JSON round-trips floats exactly; this only absorbs summation order
MAX_LISTED = 10


def describe(record: Record | Mapping[str, object]) -> str:
    """``seq 12 (epoch t00003 epoch 2)``: how a message points at a record.

    A record is named by the fields it was written with: the chain check describes raw JSON
    objects (their shapes unchecked), the later checks typed records, and both must name a
    record alike, down to the ``trial`` a record of an unknown type may carry.
    """
    fields = record.to_dict() if isinstance(record, Record) else record
    what = [_label(fields.get("type", "?"))]
    if "trial" in fields:
        what.append(_label(fields["trial"]))
    if fields.get("type") == RecordType.EPOCH and "epoch" in fields:
        what.append(f"epoch {_label(fields['epoch'])}")
    return f"seq {_label(fields.get('seq', '?'))} ({' '.join(what)})"


def _label(value: object) -> str:
    """A field as it appears in a message: itself when short and printable, else an excerpt."""
    text = value if isinstance(value, str) else None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**15:
        text = str(value)
    return text if text is not None and text.isprintable() and len(text) <= 40 else excerpt(value)


def _close(a: object, b: object) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)
    return a == b


# --- 1. the hash chain ------------------------------------------------------------------------


class _Problems:
    """One check's problems: the first few in full (all a report shows) and how many there were."""

    def __init__(self) -> None:
        self.listed: list[str] = []
        self.count = 0

    def add(self, problem: str) -> None:
        self.count += 1
        if len(self.listed) < MAX_LISTED:
            self.listed.append(problem)

    def extend(self, problems: list[str]) -> None:
        for problem in problems:
            self.add(problem)


class _Chain:
    """The chain check, one record at a time: it keeps the previous hash and a few pending messages.

    A record out of place is told apart as reordered when its expected ``seq`` turns up later in
    the file; that is known only at the end, so the first few such messages wait for it.
    """

    def __init__(self) -> None:
        self.problems = _Problems()
        self.index = 0
        self.prev_hash: object = ""
        # pending: position in problems.listed -> (the seq expected there, where, seq found)
        self.pending: dict[int, tuple[int, str, object]] = {}
        self.waiting: dict[int, list[int]] = {}  # an expected seq -> the pending messages that wait for it

    def add(self, rec: Mapping[str, object], line: bytes | None = None) -> None:
        index = self.index
        self.index += 1
        seq = rec.get("seq")
        # A seq later in the file that a pending message expected: that record was moved, not removed.
        if self.waiting and isinstance(seq, (int, float)):  # bool included: a seq compares as Python compares it
            for k in self.waiting.pop(seq, []):  # type: ignore[arg-type]
                expected, moved, _ = self.pending.pop(k)
                self.problems.listed[k] = (
                    f"{moved}: expected seq {expected} here; it comes later (records were reordered)"
                )
        where: str | None = None
        claimed = rec.get("hash")
        if not (line is not None and line_hash_matches(line, claimed)) and claimed != record_hash(rec):
            where = f"line {index + 1}, {describe(rec)}"
            self.problems.add(f"{where}: its content does not match its hash (the record was edited)")
        if seq != index:
            where = where or f"line {index + 1}, {describe(rec)}"
            if isinstance(seq, int) and seq > index:
                message = f"{where}: expected seq {index}; seq {index}..{seq - 1} missing (records were removed)"
            else:
                message = f"{where}: expected seq {index} (a record was duplicated or inserted)"
            if len(self.problems.listed) < MAX_LISTED:
                self.pending[len(self.problems.listed)] = (index, where, seq)
                self.waiting.setdefault(index, []).append(len(self.problems.listed))
            self.problems.add(message)
        if rec.get("prev") != self.prev_hash:
            where = where or f"line {index + 1}, {describe(rec)}"
            self.problems.add(
                f"{where}: 'prev' is not the hash of the record before it (records were removed, inserted or reordered)"
            )
        self.prev_hash = claimed


def check_chain(records: Sequence[Mapping[str, object]]) -> list[str]:
    """Sequence numbers, ``prev`` links and each record's own hash, in file order.

    It takes the ledger's JSON objects, shapes unchecked: a record too damaged to read as its
    model still has a place in the chain, and the hash covers exactly the bytes written.
    (Up to ``MAX_LISTED`` problems; :func:`verify_run` streams the same check.)
    """
    chain = _Chain()
    for rec in records:
        chain.add(rec)
    return chain.problems.listed


# --- 2. bookkeeping ---------------------------------------------------------------------------


class _Bookkeeping:
    """The run header first, the clock never backwards, every epoch of a started trial, none counted twice.

    Kept per trial: whether it started and, until its ``trial_end``, the epochs counted for it.
    """

    def __init__(self) -> None:
        self.problems = _Problems()
        self.first = True
        self.broken = False  # the ledger does not begin with run_start: nothing else is checked
        # started trial -> its epochs' (attempt, epoch), None once it ended
        self.counted: dict[str, set[tuple[int, int]] | None] = {}
        self.last_t: float = -math.inf

    def add(self, rec: Record) -> None:
        if self.first:
            self.first = False
            if not isinstance(rec, RunStartRecord):
                self.broken = True
                self.problems.add("the ledger does not begin with a run_start record")
        if self.broken:
            return
        # Every record has a number 't' (its model requires one): only its order is left to check.
        if rec.t < self.last_t:
            self.problems.add(f"{describe(rec)}: t={rec.t} is earlier than the record before it ({self.last_t})")
        else:
            self.last_t = rec.t
        if isinstance(rec, TrialStartRecord):
            if self.counted.get(rec.trial) is None:
                self.counted[rec.trial] = set()
        elif isinstance(rec, EpochRecord):
            if rec.trial not in self.counted:
                self.problems.add(f"{describe(rec)}: an epoch of a trial that never started")
                return
            keys = self.counted[rec.trial]
            if keys is None:
                return  # an epoch after its trial's end: the consistency check names it
            key = (rec.attempt, rec.epoch)
            if key in keys:
                self.problems.add(f"{describe(rec)}: this epoch of this attempt is counted twice")
            keys.add(key)
        elif isinstance(rec, TrialEndRecord) and rec.trial in self.counted:
            self.counted[rec.trial] = None


def check_bookkeeping(records: list[Record]) -> list[str]:
    if not records or not isinstance(records[0], RunStartRecord):
        return ["the ledger does not begin with a run_start record"]
    check = _Bookkeeping()
    for rec in records:
        check.add(rec)
    return check.problems.listed


# --- 2b. consistency: what a forger who re-chains the hashes must still get right ------------

TIME_REL_TOL = 0.02  # worker step timers and the master clock: different processes, same seconds
TIME_ABS_TOL_S = 2.0  # ... and the master notices a worker's event a little after it happened
WALL_REL_TOL, WALL_ABS_TOL_S = 0.01, 5.0  # monotonic vs wall clock: NTP slews (< 0.05 %), a small step
SUM_REL_TOL = 1e-6  # a worker's busy_s is the master's running sum of its epochs' train_s + eval_s

# Record types with no consistency check of their own, and why. Every other RecordType has an
# entry in _Consistency.checks; a test holds the two together, so a record type that is added
# or renamed cannot leave its check silently switched off.
UNCHECKED_TYPES: frozenset[RecordType] = frozenset(
    {
        RecordType.RUN_START,  # the first one opens the run (bookkeeping requires it there) and its session
        RecordType.WORKER_FAILED,  # a worker that could not start: no other record counts on it
        RecordType.BAD_IMAGES,  # the files a worker skipped: each epoch's skipped_images is checked instead
        RecordType.WEIGHTS,  # a file beside the ledger: `aiperf audit` checks its hash and re-evaluates it
    }
)


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _longer(measured: float, bound: float) -> bool:
    """Whether ``measured`` seconds exceed ``bound`` seconds beyond the clocks' tolerance."""
    return measured > bound * (1 + TIME_REL_TOL) + TIME_ABS_TOL_S


class _Check(Generic[RecordT]):
    """One record type's consistency check, given records of that type's model only."""

    def __init__(self, model: type[RecordT], check: Callable[[RecordT], None]) -> None:
        self.model = model
        self.check = check

    def __call__(self, record: Record) -> None:
        if isinstance(record, self.model):
            self.check(record)


class _Trial:
    """What the consistency check keeps of a trial while it runs (its latest trial_start, its epochs so far)."""

    __slots__ = ("attempt", "best", "done", "next_epoch", "planned", "requeued", "seq", "worker")

    def __init__(self, rec: TrialStartRecord) -> None:
        self.seq = rec.seq
        self.attempt = rec.attempt
        self.worker = rec.worker
        self.planned = rec.hparams.epochs
        self.requeued: int | None = None  # the attempt its last requeue announced
        self.done = 0  # epochs completed (what trial_end.epochs must say)
        self.best: float | None = None  # best val_acc of its epochs
        self.next_epoch: int | None = None  # the epoch number its next epoch record must have


class _Consistency:
    """One pass over the ledger, in order; every check is something the recorded facts imply.

    Records are given one at a time (:meth:`check`); what is kept grows with the trials that are
    running and the workers, and with one number per trial that has ended (its ``trial_end``'s
    seq), not with the records.
    """

    def __init__(self, start: RunStartRecord, rest: list[Record] | None = None) -> None:
        self.start = start
        self.rest = rest or []
        self.train_size = start.dataset.train_images
        self.eval_size = start.dataset.eval_images
        self.simulated = start.plan.backend == "simulated"
        self.problems = _Problems()
        self.wall_problem: str | None = None  # the clocks' disagreement, listed first (one is enough)
        self.current: dict[str, _Trial] = {}  # running trial -> its latest trial_start (and after an end, a restart)
        self.ended: dict[str, int] = {}  # trial -> the seq of its trial_end
        self.stopped: RunStopRecord | None = None  # the run_stop of the session, until a resume
        self.audited: AuditRecord | None = None  # the latest audit record (only audits may follow one)
        self.last_run_hash = start.hash  # the hash of the latest record that is not an audit
        self.t0, self.wall0 = float(start.t), float(start.wall)
        # Each record type's check; UNCHECKED_TYPES lists the types deliberately without one.
        self.checks: dict[RecordType, Callable[[Record], None]] = {
            RecordType.RESUME: _Check(ResumeRecord, self._resume),
            RecordType.AUDIT: _Check(AuditRecord, self._audit),
            RecordType.RUN_STOP: _Check(RunStopRecord, self._run_stop),
            RecordType.TRIAL_START: _Check(TrialStartRecord, self._trial_start),
            RecordType.REQUEUE: _Check(RequeueRecord, self._requeue),
            RecordType.TRIAL_END: _Check(TrialEndRecord, self._trial_end),
            RecordType.EPOCH: _Check(EpochRecord, self._epoch),
            RecordType.WORKER: _Check(WorkerRecord, self._worker),
        }
        self._new_session(start)

    def _new_session(self, rec: RunStartRecord | ResumeRecord) -> None:
        self.session_t0 = float(rec.t)
        self.busy: dict[str | None, float] = {}  # worker -> train_s + eval_s of its epochs this session
        self.worker_records: set[str] = set()

    def add(self, rec: Record, problem: str) -> None:
        self.problems.add(f"{describe(rec)}: {problem}")

    def run(self) -> list[str]:
        for rec in self.rest:
            self.check(rec)
        return self.listed()

    def listed(self) -> list[str]:
        """The first problems found (the clocks' disagreement first), up to ``MAX_LISTED``."""
        wall = [self.wall_problem] if self.wall_problem else []
        return (wall + self.problems.listed)[:MAX_LISTED]

    @property
    def count(self) -> int:
        return self.problems.count + (1 if self.wall_problem else 0)

    def check(self, rec: Record) -> None:
        """Check one record after the run_start (in file order)."""
        self._wall_clock(rec)
        if rec.type == RecordType.AUDIT:
            self.checks[RecordType.AUDIT](rec)
            return
        if self.audited is not None:
            self.add(rec, f"a run record after the audit record at seq {self.audited.seq} (only audits may follow)")
            self.audited = None  # report the first such record only
        if self.stopped is not None and not isinstance(rec, ResumeRecord):
            self.add(rec, f"a record after the run_stop at seq {self.stopped.seq} (only a resume may follow)")
            self.stopped = None  # report the first such record only
        self.last_run_hash = rec.hash
        # A record of a type this version does not know is a plain Record with a str type: no check.
        check = self.checks.get(rec.type) if isinstance(rec.type, RecordType) else None
        if check is not None:
            check(rec)

    def _wall_clock(self, rec: Record) -> None:
        """``t`` and ``wall`` are both the master's clocks: they advance together (across a resume too,
        whose gap is counted in ``t``). A simulated run's ``t`` skips the waiting, so it is exempt."""
        if self.simulated or self.wall_problem is not None:
            return  # one is enough: every later record repeats it
        elapsed_t, elapsed_wall = float(rec.t) - self.t0, float(rec.wall) - self.wall0
        if abs(elapsed_t - elapsed_wall) > WALL_REL_TOL * abs(elapsed_wall) + WALL_ABS_TOL_S:
            self.wall_problem = (
                f"{describe(rec)}: t says {elapsed_t:.1f} s since run_start but wall says {elapsed_wall:.1f} s "
                "(the master's two clocks disagree: t or wall was edited)"
            )

    def _audit(self, rec: AuditRecord) -> None:
        """An audit follows the run's completed end and names the record it audited (the run's last)."""
        self.audited = rec
        if self.stopped is None or self.stopped.status is not RunStatus.COMPLETED:
            self.add(rec, "an audit record before the run's completed end (run_stop, completed)")
        elif rec.audited_hash != self.last_run_hash:
            self.add(
                rec, f"audits the record {rec.audited_hash[:16]}, not the run's last record ({self.last_run_hash[:16]})"
            )

    def _resume(self, rec: ResumeRecord) -> None:
        self.stopped = None
        self._new_session(rec)

    def _run_stop(self, rec: RunStopRecord) -> None:
        self.stopped = rec
        if rec.status is RunStatus.FAILED:
            return  # a master that raised stops without closing its trials; a resume closes them as lost
        for trial, start in self.current.items():
            if trial not in self.ended:
                self.add(rec, f"trial {_label(trial)} (started at seq {start.seq}) never ended")

    def _trial_start(self, rec: TrialStartRecord) -> None:
        trial, attempt = rec.trial, rec.attempt
        if trial in self.ended:
            self.add(rec, f"the trial already ended at seq {self.ended[trial]}")
        previous = self.current.get(trial)
        requeued = previous.requeued if previous is not None else None
        if previous is not None and previous.attempt == attempt:
            self.add(rec, f"attempt {attempt} of this trial already started at seq {previous.seq}")
        elif attempt and requeued != attempt:
            self.add(rec, f"attempt {attempt} without a requeue record announcing it")
        elif not attempt and previous is not None:
            self.add(rec, f"the trial already started at seq {previous.seq}")
        first = rec.start_epoch
        done = previous.done if previous is not None else 0
        if attempt and first != done and not (first == 0 and rec.weights_lost):
            # A checkpoint gone with its node (weights_lost says so) restarts the attempt at epoch 0.
            self.add(rec, f"start_epoch {first} but the requeue kept {done} epochs")
        state = _Trial(rec)
        if previous is not None:
            state.requeued, state.best = previous.requeued, previous.best
        state.done = first
        state.next_epoch = first + 1
        self.current[trial] = state

    def _requeue(self, rec: RequeueRecord) -> None:
        trial = rec.trial
        start = self.current.get(trial)
        if start is None or trial in self.ended:
            self.add(rec, "a requeue of a trial that is not running")
            return
        if rec.attempt != start.attempt + 1:
            self.add(rec, f"attempt {rec.attempt} does not follow attempt {start.attempt}")
        kept = rec.from_epoch
        if kept is not None and kept not in (0, start.done):
            self.add(rec, f"from_epoch {kept} but the trial had completed {start.done} epochs")
        start.requeued = rec.attempt
        start.done = kept if kept is not None else 0

    def _trial_end(self, rec: TrialEndRecord) -> None:
        trial = rec.trial
        if trial in self.ended:
            self.add(rec, f"the trial already ended at seq {self.ended[trial]}")
            return
        self.ended[trial] = rec.seq
        start = self.current.pop(trial, None)  # an ended trial keeps only its end's seq
        if start is None:
            return  # a trial that never started has nothing to be consistent with (bookkeeping names it)
        epochs = rec.epochs
        if epochs is not None and epochs != start.done:
            self.add(rec, f"epochs is {epochs} but the ledger records {start.done} completed epochs")
        best = _float(rec.best_val_acc)
        if best is not None and not _close(best, start.best):
            self.add(rec, f"best_val_acc is {best!r} but the trial's epochs give {start.best!r}")

    def _epoch(self, rec: EpochRecord) -> None:
        trial = rec.trial
        start = self.current.get(trial)
        if trial in self.ended:
            self.add(rec, f"an epoch after the trial ended at seq {self.ended[trial]}")
        if start is None:
            if trial in self.ended:  # its worker's time still counts
                self._images(rec)
                self._clock(rec)
            return  # bookkeeping reports an epoch of a trial that never started
        if rec.attempt != start.attempt:
            self.add(rec, f"attempt {rec.attempt}, but the trial runs attempt {start.attempt}")
        if start.worker and rec.worker and rec.worker != start.worker:
            self.add(rec, f"trained on worker {_label(rec.worker)}, but the attempt started on {_label(start.worker)}")
        epoch = rec.epoch
        if epoch != start.next_epoch:
            self.add(rec, f"epoch {epoch} where epoch {start.next_epoch} comes next")
        planned = start.planned
        if planned is not None and epoch > planned:
            self.add(rec, f"epoch {epoch} of a trial planned for {planned} epochs")
        start.next_epoch = epoch + 1
        start.done = epoch
        acc = float(rec.val_acc)
        start.best = acc if start.best is None else max(start.best, acc)
        self._images(rec)
        self._clock(rec)

    def _images(self, rec: EpochRecord) -> None:
        """Images per epoch against the split sizes in run_start: the trainer feeds full batches only."""
        train, evaluation, batch = rec.train_images, rec.eval_images, rec.batch_size
        train_size, eval_size = self.train_size, self.eval_size
        if train is None or evaluation is None or batch is None or train_size is None or eval_size is None:
            return
        if train > train_size or evaluation > eval_size:
            self.add(
                rec,
                f"{train:,} training / {evaluation:,} validation images, more than the split holds "
                f"({train_size:,} / {eval_size:,} in run_start)",
            )
            return
        if rec.input == "simulated" or self.simulated:
            if not self.simulated:
                self.add(rec, "input 'simulated' in a run whose backend is not simulated")
            return
        if train % batch:
            self.add(rec, f"{train:,} training images is not a whole number of batches of {batch}")
        # Every full batch of the split is trained, every validation image evaluated; only images that
        # could not be decoded (skipped_images) and the last partial training batch are left out.
        missing = (train_size - train) + (eval_size - evaluation)
        allowed = rec.skipped_images + batch - 1
        if missing > allowed:
            self.add(
                rec,
                f"{train:,} training / {evaluation:,} validation images of a {train_size:,} / "
                f"{eval_size:,} split: {missing:,} images unaccounted for (at most {allowed:,}: the last "
                "partial batch and the skipped images)",
            )

    def _clock(self, rec: EpochRecord) -> None:
        """A worker cannot have spent more time in steps since its session began than the master clock shows."""
        worker = rec.worker
        step = (_float(rec.train_s) or 0.0) + (_float(rec.eval_s) or 0.0)
        self.busy[worker] = self.busy.get(worker, 0.0) + step
        elapsed = float(rec.t) - self.session_t0
        if _longer(self.busy[worker], elapsed):
            self.add(
                rec,
                f"worker {_label(worker)} has spent {self.busy[worker]:.1f} s in train/eval steps by now, "
                f"but only {elapsed:.1f} s passed on the master clock since its session began",
            )

    def _worker(self, rec: WorkerRecord) -> None:
        worker = rec.worker
        if worker in self.worker_records:
            self.add(rec, "a second worker record for this worker in one session")
        self.worker_records.add(worker)
        busy, alive = _float(rec.busy_s), _float(rec.alive_s)
        expected = self.busy.get(worker, 0.0)
        if busy is not None and not math.isclose(busy, expected, rel_tol=SUM_REL_TOL, abs_tol=1e-6):
            self.add(rec, f"busy_s is {busy!r} but its epochs' train_s + eval_s add up to {expected!r}")
        if busy is not None and alive is not None and _longer(busy, alive):
            self.add(rec, f"busy {busy:.1f} s is longer than its lifetime of {alive:.1f} s")
        elapsed = float(rec.t) - self.session_t0
        if alive is not None and _longer(alive, elapsed):
            self.add(rec, f"alive {alive:.1f} s, but only {elapsed:.1f} s passed on the master clock in its session")


def check_consistency(records: list[Record]) -> list[str]:
    """Facts the ledger implies about itself: images per epoch, time, trial and session structure."""
    if not records or not isinstance(records[0], RunStartRecord):
        return []  # bookkeeping reports it
    return _Consistency(records[0], records[1:]).run()


# --- 3. operation counts ----------------------------------------------------------------------


def _field_mismatch(rec: Record, name: str, recorded: object, recomputed: object) -> str:
    return f"{describe(rec)}: {name} is {recorded!r} but the stored architecture gives {recomputed!r}"


FLOPS_CACHE = 4096  # architectures whose counts are kept: a trial's children and re-tunes share its graph
QUALITY_REL_TOL = 1e-9  # a language epoch's val_acc is computed from its bits_per_byte in one expression
BITS_REL_TOL = 1e-6  # bits_per_byte from val_loss: the worker's ln 2 constant and the header's bytes per token


class _Flops:
    """Every trial's FLOPs recounted from its stored architecture, and every epoch's operations from them.

    The counts of the last ``FLOPS_CACHE`` architectures are kept by content (an image run's graphs,
    a language run's transformer specs); a running trial keeps its own (its latest trial_start's)
    until it ends. Which kind a trial is comes from the run's ``run_start.family``.
    """

    def __init__(self) -> None:
        self.problems = _Problems()
        self.costs: dict[str, _FixedCounts | _LanguageTrial] = {}  # running trial -> its latest trial_start's counts
        # per architecture document: its graph and counts
        self.cache: OrderedDict[bytes, tuple[Graph, GraphCost, _FixedCounts]] = OrderedDict()
        self.lm_cache: OrderedDict[bytes, _TransformerCounts] = OrderedDict()  # per transformer document
        self.trials = 0
        self.language = False
        self.bytes_per_token: float | None = None
        self.header_seen = False

    def add(self, rec: Record) -> None:
        if isinstance(rec, RunStartRecord):
            if not self.header_seen:  # the run's header: a later one is the bookkeeping's problem
                self.header_seen = True
                self.language = rec.family == "language"
                self.bytes_per_token = _float(rec.dataset.bytes_per_token)
        elif isinstance(rec, TrialStartRecord):
            if self.language:
                self._language_start(rec)
            else:
                self._image_start(rec)
        elif isinstance(rec, EpochRecord):
            counted = self.costs.get(rec.trial)
            if isinstance(counted, _LanguageTrial):
                self.problems.extend(_check_language_epoch(rec, counted, self.bytes_per_token))
            elif counted is not None:
                self.problems.extend(_check_epoch(rec, counted))
        elif isinstance(rec, TrialEndRecord):
            self.costs.pop(rec.trial, None)  # later epochs of it are an error the consistency check names

    def _image_start(self, rec: TrialStartRecord) -> None:
        try:
            key = _graph_key(rec.graph)
            found = self.cache.get(key)
            if found is None:
                graph = graph_from_dict(rec.graph)
                cost = count_flops(graph)
                found = self.cache[key] = (graph, cost, _FixedCounts(graph, cost))
                if len(self.cache) > FLOPS_CACHE:
                    self.cache.popitem(last=False)
            else:
                self.cache.move_to_end(key)
            graph, cost, counts = found
        except (NasError, AiperfError, TypeError, ValueError) as exc:
            self.problems.add(f"{describe(rec)}: the stored architecture is not readable ({exc})")
            return
        if rec.trial not in self.costs:
            self.trials += 1
        self.costs[rec.trial] = counts
        self.problems.extend(_check_trial_start(rec, graph, counts))

    def _language_start(self, rec: TrialStartRecord) -> None:
        if rec.transformer is None:
            self.problems.add(f"{describe(rec)}: a trial of a language run without its architecture (transformer)")
            return
        try:
            key = _graph_key(rec.transformer)
            counts = self.lm_cache.get(key)
            if counts is None:
                counts = self.lm_cache[key] = _TransformerCounts(TransformerSpec.from_dict(rec.transformer))
                if len(self.lm_cache) > FLOPS_CACHE:
                    self.lm_cache.popitem(last=False)
            else:
                self.lm_cache.move_to_end(key)
        except (NasError, TypeError, ValueError) as exc:
            self.problems.add(f"{describe(rec)}: the stored transformer is not readable ({exc})")
            return
        problems, trial = _check_language_start(rec, counts)
        self.problems.extend(problems)
        if rec.trial not in self.costs:
            self.trials += 1
        if trial is None:
            self.costs.pop(rec.trial, None)  # its epochs cannot be recounted: the start's problem says why
        else:
            self.costs[rec.trial] = trial


def _graph_key(graph: object) -> bytes:
    """A digest of an architecture document's content (its keys sorted), to cache its counts by."""
    return hashlib.sha256(sorted_json(graph)).digest()


def check_flops(records: list[Record]) -> tuple[list[str], int]:
    """Recount every trial's FLOPs and every epoch's operations; returns (problems, trials checked)."""
    flops = _Flops()
    for rec in records:
        flops.add(rec)
    return flops.problems.listed, flops.trials


def _check_trial_start(rec: TrialStartRecord, graph: Graph, counts: _FixedCounts) -> list[str]:
    # arch_id is a grouping label whose hash recipe may change between versions: not a claim checked here.
    problems = []
    if rec.params != graph.param_count:
        problems.append(_field_mismatch(rec, "params", rec.params, graph.param_count))
    flops = rec.flops
    expected: list[tuple[str, float | None, float]] = [
        ("forward", flops.forward, counts.forward),
        ("backward", flops.backward, counts.backward),
        ("update_per_step", flops.update_per_step, counts.update_per_step),
        ("eval_per_image", flops.eval_per_image, counts.eval_per_image),
    ]
    batch = cast(int, rec.hparams.batch_size)  # a missing one is refused by train_per_image, by name
    try:
        expected.append(("train_per_image", flops.train_per_image, counts.train_per_image(batch)))
    except AiperfError as exc:
        problems.append(f"{describe(rec)}: hparams.batch_size: {exc}")
    for name, recorded, value in expected:
        if not _close(recorded, value):
            problems.append(_field_mismatch(rec, f"flops.{name}", recorded, value))
    return problems


class _FixedCounts:
    """An architecture's per-image counts as plain numbers: what ``GraphCost`` sums over its layers at each
    access, and AIPerf's counts (``aiperf_compatible_per_image``), taken once (a long ledger has millions of
    epochs of a few thousand architectures)."""

    __slots__ = (
        "aiperf_eval",
        "aiperf_train",
        "backward",
        "cost",
        "eval_per_image",
        "forward",
        "per_batch",
        "update_per_step",
    )

    def __init__(self, graph: Graph, cost: GraphCost) -> None:
        self.cost = cost
        self.forward = cost.forward
        self.backward = cost.backward
        self.update_per_step = cost.update_per_step
        self.eval_per_image = cost.eval_per_image
        self.aiperf_eval, self.aiperf_train = aiperf_compatible_per_image(graph)
        self.per_batch: dict[object, float] = {}

    def train_per_image(self, batch_size: int) -> float:
        """``GraphCost.train_per_image``, once per batch size (it refuses a batch size that is not one)."""
        key = (type(batch_size), batch_size)
        found = self.per_batch.get(key)
        if found is None:
            found = self.per_batch[key] = self.cost.train_per_image(batch_size)
        return found


def _check_epoch(rec: EpochRecord, counts: _FixedCounts) -> list[str]:
    # A missing count or batch size is refused by the counting functions themselves, by name.
    train_images, eval_images = cast(int, rec.train_images), cast(int, rec.eval_images)
    batch = cast(int, rec.batch_size)
    try:
        train, evaluation = epoch_operations(cast(GraphCost, counts), train_images, eval_images, batch)
        # aiperf_compatible_operations(graph, ...), its per-image counts taken once (epoch_operations has
        # checked the image counts it checks).
        aiperf = float(train_images * counts.aiperf_train + eval_images * counts.aiperf_eval)
    except (AiperfError, TypeError) as exc:
        return [f"{describe(rec)}: its image counts or batch size are unusable ({exc})"]
    problems = []
    for name, recorded, value in (
        ("train_ops", rec.train_ops, train),
        ("eval_ops", rec.eval_ops, evaluation),
        ("ops", rec.ops, train + evaluation),
        ("aiperf_ops", rec.aiperf_ops, aiperf),
    ):
        if not _close(recorded, value):
            problems.append(_field_mismatch(rec, name, recorded, value))
    return problems


# --- 3b. a language run's counts: per token, from the trial's transformer, seq_len and batch size --------


class _TransformerCounts:
    """One transformer spec's counts, taken once per sequence length and step size (a long run has many
    trials of one spec: its re-tunes)."""

    __slots__ = ("by_len", "per_step", "spec")

    def __init__(self, spec: TransformerSpec) -> None:
        self.spec = spec
        self.by_len: dict[int, TransformerFlops] = {}
        self.per_step: dict[tuple[int, int], float] = {}

    def flops(self, seq_len: int) -> TransformerFlops:
        """``transformer_flops(spec, seq_len)``; a sequence length the spec cannot take raises NasError."""
        found = self.by_len.get(seq_len)
        if found is None:
            found = self.by_len[seq_len] = transformer_flops(self.spec, seq_len)
        return found

    def train_per_token(self, seq_len: int, batch_size: int) -> float:
        key = (seq_len, batch_size)
        found = self.per_step.get(key)
        if found is None:
            found = self.per_step[key] = self.flops(seq_len).train_per_token(batch_size * seq_len)
        return found


class _LanguageTrial:
    """What a language trial's epochs are recounted with: its spec's counts, its seq_len and batch size."""

    __slots__ = ("batch_size", "counts", "seq_len")

    def __init__(self, counts: _TransformerCounts, seq_len: int, batch_size: int) -> None:
        self.counts = counts
        self.seq_len = seq_len
        self.batch_size = batch_size


def _check_language_start(rec: TrialStartRecord, counts: _TransformerCounts) -> tuple[list[str], _LanguageTrial | None]:
    """A language trial's params and per-token FLOPs against its transformer at its seq_len and batch size;
    returns the problems and what its epochs are recounted with (None when they cannot be)."""
    problems = []
    spec = counts.spec
    if rec.params != spec.params():
        problems.append(_field_mismatch(rec, "params", rec.params, spec.params()))
    flops = rec.flops
    for name in ("train_per_image", "eval_per_image"):
        if getattr(flops, name) is not None:
            problems.append(f"{describe(rec)}: flops.{name} on a language trial (its counts are per token)")
    seq_len, batch = rec.hparams.seq_len, rec.hparams.batch_size
    if seq_len is None or batch is None:
        missing = "hparams.seq_len" if seq_len is None else "hparams.batch_size"
        problems.append(f"{describe(rec)}: {missing} is missing (a language trial's FLOPs per token depend on it)")
        return problems, None
    try:
        per_token = counts.flops(seq_len)
        train_per_token = counts.train_per_token(seq_len, batch)
    except NasError as exc:
        problems.append(f"{describe(rec)}: hparams.seq_len {seq_len} does not fit the stored transformer ({exc})")
        return problems, None
    expected: list[tuple[str, float | None, float]] = [
        ("forward", flops.forward, per_token.forward(1)),
        ("backward", flops.backward, per_token.backward(1)),
        ("update_per_step", flops.update_per_step, per_token.update_per_step),
        ("train_per_token", flops.train_per_token, train_per_token),
        ("eval_per_token", flops.eval_per_token, per_token.forward(1)),
    ]
    for name, recorded, value in expected:
        if not _close(recorded, value):
            problems.append(_field_mismatch(rec, f"flops.{name}", recorded, value))
    return problems, _LanguageTrial(counts, seq_len, batch)


def _check_language_epoch(rec: EpochRecord, trial: _LanguageTrial, bytes_per_token: float | None) -> list[str]:
    """A language epoch's operations from its token counts, its tokens from its sequences, its quality
    from its bits per byte (and those from its validation loss, where the header states bytes per token)."""
    problems = []
    if rec.aiperf_ops is not None:
        problems.append(f"{describe(rec)}: aiperf_ops on a language epoch (AIPerf's count is of images only)")
    train_tokens, eval_tokens = rec.train_tokens, rec.eval_tokens
    if train_tokens is None or eval_tokens is None:
        missing = "train_tokens" if train_tokens is None else "eval_tokens"
        problems.append(f"{describe(rec)}: {missing} is missing (a language epoch's operations are counted per token)")
    else:
        seq_len = trial.seq_len
        for name, tokens, windows in (
            ("train_tokens", train_tokens, rec.train_images),
            ("eval_tokens", eval_tokens, rec.eval_images),
        ):
            if windows is not None and tokens != windows * seq_len:
                problems.append(
                    f"{describe(rec)}: {name} is {tokens!r} but {windows:,} sequences of {seq_len} tokens hold "
                    f"{windows * seq_len:,}"
                )
        flops = trial.counts.flops(seq_len)
        train = float(trial.counts.train_per_token(seq_len, trial.batch_size) * train_tokens)
        evaluation = float(flops.forward(1) * eval_tokens)
        for name, recorded, value in (
            ("train_ops", rec.train_ops, train),
            ("eval_ops", rec.eval_ops, evaluation),
            ("ops", rec.ops, train + evaluation),
        ):
            if not _close(recorded, value):
                problems.append(_field_mismatch(rec, name, recorded, value))
    bits = _float(rec.bits_per_byte)
    if bits is None:
        problems.append(f"{describe(rec)}: bits_per_byte is missing (a language epoch's quality is computed from it)")
        return problems
    quality = language_quality(bits)
    if not math.isclose(float(rec.val_acc), quality, rel_tol=QUALITY_REL_TOL, abs_tol=1e-12):
        problems.append(
            f"{describe(rec)}: val_acc is {rec.val_acc!r} but bits_per_byte {bits!r} gives the quality "
            f"{quality!r} (1 - bits_per_byte / 8)"
        )
    loss = _float(rec.val_loss)
    if loss is not None and bytes_per_token:
        from_loss = loss / math.log(2.0) / bytes_per_token
        if not math.isclose(bits, from_loss, rel_tol=BITS_REL_TOL, abs_tol=1e-12):
            problems.append(
                f"{describe(rec)}: bits_per_byte is {bits!r} but val_loss {loss!r} nats per token at "
                f"{bytes_per_token!r} bytes per token gives {from_loss!r}"
            )
    return problems


# --- 4. the claims ----------------------------------------------------------------------------


def diff(recorded: object, recomputed: object, path: str = "") -> list[str]:
    """Every place where ``recorded`` (summary.json) differs from ``recomputed``, as dotted paths."""
    if isinstance(recorded, dict) and isinstance(recomputed, dict):
        out = []
        for key in sorted(set(recorded) | set(recomputed), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in recorded:
                out.append(f"summary.json has no {sub} (the ledger gives {_short(recomputed[key])})")
            elif key not in recomputed:
                out.append(f"summary.json has {sub} = {_short(recorded[key])}, which the ledger does not give")
            else:
                out.extend(diff(recorded[key], recomputed[key], sub))
        return out
    if isinstance(recorded, list) and isinstance(recomputed, list) and len(recorded) == len(recomputed):
        return [
            p for k, (a, b) in enumerate(zip(recorded, recomputed, strict=True)) for p in diff(a, b, f"{path}[{k}]")
        ]
    if _close(recorded, recomputed):
        return []
    return [f"summary.json {path} is {_short(recorded)} but the ledger gives {_short(recomputed)}"]


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def check_summary(run_dir: Path, records: list[Record] | RunDigest) -> tuple[list[str], RunSummary | None]:
    """Recompute the summary and compare it with ``summary.json``; returns (problems, recomputed)."""
    path = run_dir / SUMMARY_NAME
    try:
        data = read_regular(path, MAX_SUMMARY_BYTES)
    except FileNotFoundError:
        return [f"{path} is missing (run `aiperf summary {run_dir}` to write it, then publish it)"], None
    except OSError as exc:
        raise AiperfError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > MAX_SUMMARY_BYTES:
        return [f"{path} is larger than any summary ({MAX_SUMMARY_BYTES:,} bytes or more)"], None
    try:
        recorded = json.loads(data)
    except (ValueError, RecursionError):
        return [f"{path} is not valid JSON"], None
    try:
        if isinstance(records, RunDigest):
            recomputed = build_summary(run_dir, digest=records)
        else:
            recomputed = build_summary(run_dir, records)
    except AiperfError as exc:
        return [f"the summary cannot be recomputed from the ledger ({exc})"], None
    # The ledger's own figures (its records, its last hash) and the score first: a shortened or swapped
    # ledger shows there before the many figures computed from it are listed.
    first = ("summary.json ledger.", "summary.json score.")
    problems = sorted(diff(recorded, recomputed), key=lambda p: next((k for k, f in enumerate(first) if f in p), 2))
    return problems, recomputed


# --- all of it --------------------------------------------------------------------------------


def verify_run(run_dir: str | Path) -> tuple[bool, str]:
    """Run every check; ``(True, "verified: ...")`` or ``(False, "verify failed: <first problem> ...")``.

    The ledger is read once, one line at a time, and every check runs on each record as it
    comes: what verify keeps grows with the run's trials and workers, not with its records
    (docs/ledger.md, "Reading a long ledger"). Raises :class:`~aiperf.errors.AiperfError` when
    ``run_dir`` cannot be read as a run at all.
    """
    run_dir = Path(run_dir)
    stream = LedgerStream(run_dir)
    chain = _Chain()
    shapes = _Problems()
    bookkeeping = _Bookkeeping()
    consistency: _Consistency | None = None
    flops = _Flops()
    digest = RunDigest(run_dir / LEDGER_NAME, reread=lambda: iter_ledger(run_dir))
    epochs = 0
    last: Record | None = None
    for index, (line, raw) in enumerate(stream):
        chain.add(raw, line)
        if index == 0 and raw.get("type") != RecordType.RUN_START:
            shapes.add("the ledger does not begin with a run_start record")
        if shapes.count >= MAX_LISTED:
            continue  # as many shape problems as a report lists: the chain is all that is left to check
        parsed = checked_record(raw, index)
        if isinstance(parsed, str):
            shapes.add(parsed)
            continue
        if shapes.count:
            continue  # the deeper checks compute with typed records: they run only while every shape is right
        rec = last = parsed
        if isinstance(rec, EpochRecord):
            epochs += 1
        bookkeeping.add(rec)
        if consistency is None:
            consistency = _Consistency(cast(RunStartRecord, rec))  # the first record: its shape was a run_start
        else:
            consistency.check(rec)
        flops.add(rec)
        digest.add(rec)
    if stream.count == 0:
        raise AiperfError(f"{run_dir}: the ledger has no complete record")
    read_telemetry(run_dir)  # unreadable (a FIFO, a device) is unreadable input, not a failed check
    checks: list[_Problems] = [chain.problems, shapes]
    summary: RunSummary | None = None
    if not shapes.count:
        assert consistency is not None
        deeper = _Problems()
        deeper.listed, deeper.count = consistency.listed(), consistency.count
        summary_problems, summary = check_summary(run_dir, digest)
        summary_check = _Problems()
        summary_check.extend(summary_problems)
        checks += [bookkeeping.problems, deeper, flops.problems, summary_check]
    total = sum(c.count for c in checks)
    if total:
        problems = [p for c in checks for p in c.listed][:MAX_LISTED]
        lines = [f"verify failed: {inert(problems[0])}"]
        lines += [f"  also: {inert(p)}" for p in problems[1:MAX_LISTED]]
        if total > MAX_LISTED:
            lines.append(f"  ... and {total - MAX_LISTED} more problems")
        return False, "\n".join(lines)
    assert summary is not None and last is not None
    score, verdict = summary["score"], summary["verdict"]
    torn = stream.torn_note(run_dir / "ledger.jsonl")
    notes = [torn] if torn else []
    pace = summary.get("size_pace")
    if pace is not None and not pace["kept_pace"]:  # not a forgery: the search fell behind its size schedule
        notes.append(f"size schedule: {format_size_pace(pace)}")
    return True, (
        f"verified: run {inert(summary['run_id'])}: {stream.count} records, hash chain intact "
        f"(last {last.hash[:16]}); FLOPs of {flops.trials} trials and operations of {epochs} epochs "
        f"recomputed; score {score['ops_human']} (regulated {score['regulated_human']}, "
        f"{format_ops(score['total_ops'], 'OP')} counted) and verdict '{inert(verdict['headline'])}' "
        f"match {SUMMARY_NAME}" + "".join(f"\n  note: {inert(n)}" for n in notes)
    )
