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
   ``aiperf_ops`` from those FLOPs, the epoch's image counts and its batch size;
4. the claims: the summary (score, validity rules, trial counts, the ledger's record count
   and last hash, which anchors the end of the chain) is recomputed and must equal
   ``summary.json`` field by field.

The chain has no key and the hashing is public: a ledger rewritten with fresh hashes and a
matching ``summary.json`` passes checks 1 and 4, so the chain only catches accidents and
naive edits. The consistency checks are what such a forger must still get right; one who
keeps every derived fact consistent has invented a run that could have happened, and only
re-running it tells. Publish ``summary.json``'s ``ledger.last_hash`` with a result to pin the
ledger down.

Before checks 2-4 every record's shape is checked (``aiperf.record.schema``): a record with
a string where a number belongs fails verification there, by name, instead of crashing a
later check. Input that cannot be read as a ledger at all (no such directory, a line that
is not JSON, nesting too deep to parse) raises :class:`~aiperf.errors.AiperfError`, which
the CLI reports with exit code 2; a failed check is exit code 1.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, cast

from aiperf.errors import AiperfError, excerpt
from aiperf.metrics.flops import GraphCost, aiperf_compatible_operations, count_flops, epoch_operations
from aiperf.metrics.score import format_ops
from aiperf.metrics.workloads import mapping
from aiperf.record.files import read_regular
from aiperf.record.ledger import read_ledger_contents, record_hash
from aiperf.record.schema import shape_problems
from aiperf.record.summary import SUMMARY_NAME, build_summary
from aiperf.record.telemetry import read_telemetry
from nas.errors import NasError
from nas.graph import Graph
from nas.serialize import graph_from_dict

REL_TOL = 1e-9  # JSON round-trips floats exactly; this only absorbs summation order
MAX_LISTED = 10
MAX_SUMMARY_BYTES = 16 * 1024 * 1024  # a real summary.json is a few kilobytes


def describe(record: dict[str, Any]) -> str:
    """``seq 12 (epoch t00003 epoch 2)``: how a message points at a record."""
    what = [_label(record.get("type", "?"))]
    if "trial" in record:
        what.append(_label(record["trial"]))
    if record.get("type") == "epoch" and "epoch" in record:
        what.append(f"epoch {_label(record['epoch'])}")
    return f"seq {_label(record.get('seq', '?'))} ({' '.join(what)})"


def _label(value: Any) -> str:
    """A field as it appears in a message: itself when short and printable, else an excerpt."""
    text = value if isinstance(value, str) else None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**15:
        text = str(value)
    return text if text is not None and text.isprintable() and len(text) <= 40 else excerpt(value)


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)
    return a == b


# --- 1. the hash chain ------------------------------------------------------------------------


def check_chain(records: list[dict[str, Any]]) -> list[str]:
    """Sequence numbers, ``prev`` links and each record's own hash, in file order."""
    problems = []
    seqs = [r.get("seq") for r in records]
    for line, rec in enumerate(records):
        where = f"line {line + 1}, {describe(rec)}"
        if rec.get("hash") != record_hash(rec):
            problems.append(f"{where}: its content does not match its hash (the record was edited)")
        if rec.get("seq") != line:
            if line in seqs[line + 1 :]:
                problems.append(f"{where}: expected seq {line} here; it comes later (records were reordered)")
            elif isinstance(rec.get("seq"), int) and rec["seq"] > line:
                problems.append(
                    f"{where}: expected seq {line}; seq {line}..{rec['seq'] - 1} missing (records were removed)"
                )
            else:
                problems.append(f"{where}: expected seq {line} (a record was duplicated or inserted)")
        expected_prev = records[line - 1].get("hash") if line else ""
        if rec.get("prev") != expected_prev:
            problems.append(
                f"{where}: 'prev' is not the hash of the record before it (records were removed, inserted or reordered)"
            )
    return problems


# --- 2. bookkeeping ---------------------------------------------------------------------------


def check_bookkeeping(records: list[dict[str, Any]]) -> list[str]:
    problems = []
    if not records or records[0].get("type") != "run_start":
        return ["the ledger does not begin with a run_start record"]
    started: set[Any] = set()
    counted: set[tuple[Any, Any, Any]] = set()
    last_t = -math.inf
    for rec in records:
        t = rec.get("t")
        if not isinstance(t, (int, float)):
            problems.append(f"{describe(rec)}: no master-clock time 't'")
        elif t < last_t:
            problems.append(f"{describe(rec)}: t={t} is earlier than the record before it ({last_t})")
        else:
            last_t = t
        if rec.get("type") == "trial_start":
            started.add(rec.get("trial"))
        elif rec.get("type") == "epoch":
            if rec.get("trial") not in started:
                problems.append(f"{describe(rec)}: an epoch of a trial that never started")
            key = (rec.get("trial"), rec.get("attempt", 0), rec.get("epoch"))
            if key in counted:
                problems.append(f"{describe(rec)}: this epoch of this attempt is counted twice")
            counted.add(key)
    return problems


# --- 2b. consistency: what a forger who re-chains the hashes must still get right ------------

TIME_REL_TOL = 0.02  # worker step timers and the master clock: different processes, same seconds
TIME_ABS_TOL_S = 2.0  # ... and the master notices a worker's event a little after it happened
WALL_REL_TOL, WALL_ABS_TOL_S = 0.01, 5.0  # monotonic vs wall clock: NTP slews (< 0.05 %), a small step
SUM_REL_TOL = 1e-6  # a worker's busy_s is the master's running sum of its epochs' train_s + eval_s


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _longer(measured: float, bound: float) -> bool:
    """Whether ``measured`` seconds exceed ``bound`` seconds beyond the clocks' tolerance."""
    return measured > bound * (1 + TIME_REL_TOL) + TIME_ABS_TOL_S


class _Consistency:
    """One pass over the ledger, in order; every check is something the recorded facts imply."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records
        start = records[0]
        dataset = mapping(start.get("dataset"))
        self.train_size = dataset.get("train_images")
        self.eval_size = dataset.get("eval_images")
        self.simulated = mapping(start.get("plan")).get("backend") == "simulated"
        self.problems: list[str] = []
        self.current: dict[Any, dict[str, Any]] = {}  # trial -> its latest trial_start
        self.ended: dict[Any, dict[str, Any]] = {}  # trial -> its trial_end
        self.requeued: dict[Any, Any] = {}  # trial -> the attempt its last requeue announced
        self.done: dict[Any, int] = {}  # trial -> epochs completed (what trial_end.epochs must say)
        self.best: dict[Any, float] = {}  # trial -> best val_acc of its epochs
        self.next_epoch: dict[Any, int] = {}  # trial -> the epoch number its next epoch record must have
        self.stopped: dict[str, Any] | None = None  # the run_stop of the session, until a resume
        self._new_session(start)

    def _new_session(self, rec: dict[str, Any]) -> None:
        self.session_t0 = float(rec.get("t") or 0.0)
        self.busy: dict[Any, float] = {}  # worker -> train_s + eval_s of its epochs this session
        self.worker_records: set[Any] = set()

    def add(self, rec: dict[str, Any], problem: str) -> None:
        self.problems.append(f"{describe(rec)}: {problem}")

    def run(self) -> list[str]:
        self._wall_clock()
        for rec in self.records[1:]:
            kind = rec.get("type")
            if self.stopped is not None and kind != "resume":
                self.add(
                    rec, f"a record after the run_stop at seq {self.stopped.get('seq')} (only a resume may follow)"
                )
                self.stopped = None  # report the first such record only
            handler = getattr(self, f"_{kind}", None)
            if handler is not None:
                handler(rec)
        return self.problems

    def _wall_clock(self) -> None:
        """``t`` and ``wall`` are both the master's clocks: they advance together (across a resume too,
        whose gap is counted in ``t``). A simulated run's ``t`` skips the waiting, so it is exempt."""
        if self.simulated:
            return
        t0, wall0 = _num(self.records[0].get("t")), _num(self.records[0].get("wall"))
        if t0 is None or wall0 is None:
            return
        for rec in self.records[1:]:
            t, wall = _num(rec.get("t")), _num(rec.get("wall"))
            if t is None or wall is None:
                continue
            elapsed_t, elapsed_wall = t - t0, wall - wall0
            if abs(elapsed_t - elapsed_wall) > WALL_REL_TOL * abs(elapsed_wall) + WALL_ABS_TOL_S:
                self.add(
                    rec,
                    f"t says {elapsed_t:.1f} s since run_start but wall says {elapsed_wall:.1f} s "
                    "(the master's two clocks disagree: t or wall was edited)",
                )
                return  # one is enough: every later record repeats it

    def _resume(self, rec: dict[str, Any]) -> None:
        self.stopped = None
        self._new_session(rec)

    def _run_stop(self, rec: dict[str, Any]) -> None:
        self.stopped = rec
        if rec.get("status") == "failed":
            return  # a master that raised stops without closing its trials; a resume closes them as lost
        for trial, start in self.current.items():
            if trial not in self.ended:
                self.add(rec, f"trial {_label(trial)} (started at seq {start.get('seq')}) never ended")

    def _trial_start(self, rec: dict[str, Any]) -> None:
        trial, attempt = rec.get("trial"), rec.get("attempt", 0)
        if trial in self.ended:
            self.add(rec, f"the trial already ended at seq {self.ended[trial].get('seq')}")
        previous = self.current.get(trial)
        if previous is not None and previous.get("attempt", 0) == attempt:
            self.add(rec, f"attempt {attempt} of this trial already started at seq {previous.get('seq')}")
        elif attempt and self.requeued.get(trial) != attempt:
            self.add(rec, f"attempt {attempt} without a requeue record announcing it")
        elif not attempt and previous is not None:
            self.add(rec, f"the trial already started at seq {previous.get('seq')}")
        self.current[trial] = rec
        first = int(rec.get("start_epoch") or 0)
        if attempt and first != self.done.get(trial, 0):
            self.add(rec, f"start_epoch {first} but the requeue kept {self.done.get(trial, 0)} epochs")
        self.done[trial] = first
        self.next_epoch[trial] = first + 1

    def _requeue(self, rec: dict[str, Any]) -> None:
        trial = rec.get("trial")
        start = self.current.get(trial)
        if start is None or trial in self.ended:
            self.add(rec, "a requeue of a trial that is not running")
            return
        if rec.get("attempt") != start.get("attempt", 0) + 1:
            self.add(rec, f"attempt {rec.get('attempt')} does not follow attempt {start.get('attempt', 0)}")
        kept = rec.get("from_epoch")
        if isinstance(kept, int) and kept not in (0, self.done.get(trial, 0)):
            self.add(rec, f"from_epoch {kept} but the trial had completed {self.done.get(trial, 0)} epochs")
        self.requeued[trial] = rec.get("attempt")
        self.done[trial] = kept if isinstance(kept, int) else 0

    def _trial_end(self, rec: dict[str, Any]) -> None:
        trial = rec.get("trial")
        if trial in self.ended:
            self.add(rec, f"the trial already ended at seq {self.ended[trial].get('seq')}")
            return
        self.ended[trial] = rec
        if trial not in self.current:
            return  # a trial that never started has nothing to be consistent with (bookkeeping names it)
        epochs = rec.get("epochs")
        if isinstance(epochs, int) and epochs != self.done.get(trial, 0):
            self.add(rec, f"epochs is {epochs} but the ledger records {self.done.get(trial, 0)} completed epochs")
        best = _num(rec.get("best_val_acc"))
        if best is not None and not _close(best, self.best.get(trial)):
            self.add(rec, f"best_val_acc is {best!r} but the trial's epochs give {self.best.get(trial)!r}")

    def _epoch(self, rec: dict[str, Any]) -> None:
        trial = rec.get("trial")
        start = self.current.get(trial)
        if start is None:
            return  # bookkeeping reports an epoch of a trial that never started
        if trial in self.ended:
            self.add(rec, f"an epoch after the trial ended at seq {self.ended[trial].get('seq')}")
        if rec.get("attempt", 0) != start.get("attempt", 0):
            self.add(rec, f"attempt {rec.get('attempt', 0)}, but the trial runs attempt {start.get('attempt', 0)}")
        if start.get("worker") and rec.get("worker") and rec.get("worker") != start.get("worker"):
            self.add(
                rec, f"trained on worker {_label(rec['worker'])}, but the attempt started on {_label(start['worker'])}"
            )
        epoch = rec.get("epoch")
        if epoch != self.next_epoch.get(trial):
            self.add(rec, f"epoch {epoch} where epoch {self.next_epoch.get(trial)} comes next")
        planned = (start.get("hparams") or {}).get("epochs")
        if isinstance(planned, int) and isinstance(epoch, int) and epoch > planned:
            self.add(rec, f"epoch {epoch} of a trial planned for {planned} epochs")
        if isinstance(epoch, int):
            self.next_epoch[trial] = epoch + 1
            self.done[trial] = epoch
        acc = _num(rec.get("val_acc"))
        if acc is not None:
            self.best[trial] = max(self.best.get(trial, acc), acc)
        self._images(rec)
        self._clock(rec)

    def _images(self, rec: dict[str, Any]) -> None:
        """Images per epoch against the split sizes in run_start: the trainer feeds full batches only."""
        values = (
            rec.get("train_images"),
            rec.get("eval_images"),
            rec.get("batch_size"),
            self.train_size,
            self.eval_size,
        )
        if not all(isinstance(v, int) for v in values):
            return
        train, evaluation, batch, train_size, eval_size = cast(tuple[int, int, int, int, int], values)
        if train > train_size or evaluation > eval_size:
            self.add(
                rec,
                f"{train:,} training / {evaluation:,} validation images, more than the split holds "
                f"({train_size:,} / {eval_size:,} in run_start)",
            )
            return
        if rec.get("input") == "simulated" or self.simulated:
            if not self.simulated:
                self.add(rec, "input 'simulated' in a run whose backend is not simulated")
            return
        if train % batch:
            self.add(rec, f"{train:,} training images is not a whole number of batches of {batch}")
        # Every full batch of the split is trained, every validation image evaluated; only images that
        # could not be decoded (skipped_images) and the last partial training batch are left out.
        missing = (train_size - train) + (eval_size - evaluation)
        allowed = int(rec.get("skipped_images") or 0) + batch - 1
        if missing > allowed:
            self.add(
                rec,
                f"{train:,} training / {evaluation:,} validation images of a {train_size:,} / "
                f"{eval_size:,} split: {missing:,} images unaccounted for (at most {allowed:,}: the last "
                "partial batch and the skipped images)",
            )

    def _clock(self, rec: dict[str, Any]) -> None:
        """A worker cannot have spent more time in steps since its session began than the master clock shows."""
        worker = rec.get("worker")
        step = (_num(rec.get("train_s")) or 0.0) + (_num(rec.get("eval_s")) or 0.0)
        self.busy[worker] = self.busy.get(worker, 0.0) + step
        elapsed = float(rec.get("t") or 0.0) - self.session_t0
        if _longer(self.busy[worker], elapsed):
            self.add(
                rec,
                f"worker {_label(worker)} has spent {self.busy[worker]:.1f} s in train/eval steps by now, "
                f"but only {elapsed:.1f} s passed on the master clock since its session began",
            )

    def _worker(self, rec: dict[str, Any]) -> None:
        worker = rec.get("worker")
        if worker in self.worker_records:
            self.add(rec, "a second worker record for this worker in one session")
        self.worker_records.add(worker)
        busy, alive = _num(rec.get("busy_s")), _num(rec.get("alive_s"))
        expected = self.busy.get(worker, 0.0)
        if busy is not None and not math.isclose(busy, expected, rel_tol=SUM_REL_TOL, abs_tol=1e-6):
            self.add(rec, f"busy_s is {busy!r} but its epochs' train_s + eval_s add up to {expected!r}")
        if busy is not None and alive is not None and _longer(busy, alive):
            self.add(rec, f"busy {busy:.1f} s is longer than its lifetime of {alive:.1f} s")
        elapsed = float(rec.get("t") or 0.0) - self.session_t0
        if alive is not None and _longer(alive, elapsed):
            self.add(rec, f"alive {alive:.1f} s, but only {elapsed:.1f} s passed on the master clock in its session")


def check_consistency(records: list[dict[str, Any]]) -> list[str]:
    """Facts the ledger implies about itself: images per epoch, time, trial and session structure."""
    if not records or records[0].get("type") != "run_start":
        return []  # bookkeeping reports it
    return _Consistency(records).run()


# --- 3. operation counts ----------------------------------------------------------------------


def _field_mismatch(rec: dict[str, Any], name: str, recorded: Any, recomputed: Any) -> str:
    return f"{describe(rec)}: {name} is {recorded!r} but the stored architecture gives {recomputed!r}"


def check_flops(records: list[dict[str, Any]]) -> tuple[list[str], int]:
    """Recount every trial's FLOPs and every epoch's operations; returns (problems, trials checked)."""
    problems: list[str] = []
    costs: dict[Any, tuple[Graph, GraphCost]] = {}  # per trial, from its latest trial_start
    cache: dict[str, tuple[Graph, GraphCost]] = {}  # per architecture document
    for rec in records:
        if rec.get("type") == "trial_start":
            try:
                doc = rec.get("graph")
                key = json.dumps(doc, sort_keys=True)
                if key not in cache:
                    graph = graph_from_dict(doc)
                    cache[key] = (graph, count_flops(graph))
                graph, cost = cache[key]
            except (NasError, AiperfError, TypeError, ValueError) as exc:
                problems.append(f"{describe(rec)}: the stored architecture is not readable ({exc})")
                continue
            costs[rec.get("trial")] = (graph, cost)
            problems.extend(_check_trial_start(rec, graph, cost))
        elif rec.get("type") == "epoch" and rec.get("trial") in costs:
            problems.extend(_check_epoch(rec, *costs[rec["trial"]]))
    return problems, len(costs)


def _check_trial_start(rec: dict[str, Any], graph: Graph, cost: GraphCost) -> list[str]:
    # arch_id is a grouping label whose hash recipe may change between versions: not a claim checked here.
    problems = []
    if rec.get("params") != graph.param_count:
        problems.append(_field_mismatch(rec, "params", rec.get("params"), graph.param_count))
    flops = mapping(rec.get("flops"))
    expected = {
        "forward": cost.forward,
        "backward": cost.backward,
        "update_per_step": cost.update_per_step,
        "eval_per_image": cost.eval_per_image,
    }
    batch: Any = mapping(rec.get("hparams")).get("batch_size")  # checked by train_per_image itself
    try:
        expected["train_per_image"] = cost.train_per_image(batch)
    except AiperfError as exc:
        problems.append(f"{describe(rec)}: hparams.batch_size: {exc}")
    for name, value in expected.items():
        if not _close(flops.get(name), value):
            problems.append(_field_mismatch(rec, f"flops.{name}", flops.get(name), value))
    return problems


def _check_epoch(rec: dict[str, Any], graph: Graph, cost: GraphCost) -> list[str]:
    images: Any = (rec.get("train_images"), rec.get("eval_images"))  # checked by the counting functions
    batch: Any = rec.get("batch_size")
    try:
        train, evaluation = epoch_operations(cost, images[0], images[1], batch)
        aiperf = aiperf_compatible_operations(graph, images[0], images[1])
    except (AiperfError, TypeError) as exc:
        return [f"{describe(rec)}: its image counts or batch size are unusable ({exc})"]
    problems = []
    for name, value in (
        ("train_ops", train),
        ("eval_ops", evaluation),
        ("ops", train + evaluation),
        ("aiperf_ops", aiperf),
    ):
        if not _close(rec.get(name), value):
            problems.append(_field_mismatch(rec, name, rec.get(name), value))
    return problems


# --- 4. the claims ----------------------------------------------------------------------------


def diff(recorded: Any, recomputed: Any, path: str = "") -> list[str]:
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


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def check_summary(run_dir: Path, records: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any] | None]:
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
        recomputed = build_summary(run_dir, records)
    except AiperfError as exc:
        return [f"the summary cannot be recomputed from the ledger ({exc})"], None
    return diff(recorded, recomputed), recomputed


# --- all of it --------------------------------------------------------------------------------


def verify_run(run_dir: str | Path) -> tuple[bool, str]:
    """Run every check; ``(True, "verified: ...")`` or ``(False, "verify failed: <first problem> ...")``.

    Raises :class:`~aiperf.errors.AiperfError` when ``run_dir`` cannot be read as a run at all.
    """
    run_dir = Path(run_dir)
    contents = read_ledger_contents(run_dir)
    records = contents.records
    if not records:
        raise AiperfError(f"{run_dir}: the ledger has no complete record")
    read_telemetry(run_dir)  # unreadable (a FIFO, a device) is unreadable input, not a failed check
    problems = check_chain(records)
    shapes = shape_problems(records)
    problems += shapes
    trials = 0
    summary: dict[str, Any] | None = None
    if not shapes:  # the deeper checks compute with the fields the shapes guarantee
        problems += check_bookkeeping(records)
        problems += check_consistency(records)
        flop_problems, trials = check_flops(records)
        problems += flop_problems
        summary_problems, summary = check_summary(run_dir, records)
        problems += summary_problems
    if problems:
        lines = [f"verify failed: {problems[0]}"]
        lines += [f"  also: {p}" for p in problems[1:MAX_LISTED]]
        if len(problems) > MAX_LISTED:
            lines.append(f"  ... and {len(problems) - MAX_LISTED} more problems")
        return False, "\n".join(lines)
    assert summary is not None
    epochs = sum(1 for r in records if r.get("type") == "epoch")
    score, verdict = summary["score"], summary["verdict"]
    torn = contents.torn_note(run_dir / "ledger.jsonl")
    return True, (
        f"verified: run {summary['run_id']}: {len(records)} records, hash chain intact "
        f"(last {records[-1]['hash'][:16]}); FLOPs of {trials} trials and operations of {epochs} epochs "
        f"recomputed; score {score['ops_human']} (regulated {score['regulated_human']}, "
        f"{format_ops(score['total_ops'], 'OP')} counted) and verdict '{verdict['headline']}' match {SUMMARY_NAME}"
        + (f"\n  note: {torn}" if torn else "")
    )
