"""A run's results as pandas DataFrames, for analysis in a notebook and for the report.

``load(run_dir)`` reads the ledger (and ``telemetry.jsonl`` when present) and returns one
frame per kind of fact: trials (one row per trial, its latest attempt), epochs (one row per
counted epoch), workers and telemetry (one row per node, device and sample). A language run's
rows fill the token columns (``train_tokens``, ``bits_per_byte``, ``flops_train_per_token``,
``seq_len``, ...) and leave the image ones empty, and an image run's the other way round. Times are the
master clock ``t`` of the ledger throughout; telemetry samples, which carry Unix time, are
mapped onto it through the ledger records around them.

The ledger is read one record at a time and the frames are bounded (docs/ledger.md, "Reading a
long ledger"): a run with more than ``max_rows`` epochs keeps every k-th of them in ``epochs``
(``epochs_stride`` says k, a power of two; 1 when every epoch is there), and likewise its trials
(``trials_stride``), plus the ``TOP_TRIALS`` most accurate trials whatever their place. What is
computed from every record stays exact: each trial's ``ops`` and ``best_val_acc``, the score
timeline (``timeline``), the summary. ``records`` holds only what the report's audit section
reads: the ``run_start``, the run's last record and the audit records.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypedDict, TypeVar

import pandas as pd

from aiperf.errors import AiperfError
from aiperf.ledger.schema import (
    AuditRecord,
    EpochRecord,
    Record,
    RunStartRecord,
    TrialEndRecord,
    TrialStartRecord,
    WorkerRecord,
)
from aiperf.ledger.store import LEDGER_NAME, iter_ledger
from aiperf.metrics.score import TimelinePoint, TimelineTally
from aiperf.results.summary import RunDigest
from aiperf.sampling.energy import TelemetrySample
from aiperf.sampling.telemetry import read_telemetry

EPOCH_COLUMNS = [
    "seq",
    "t",
    "trial",
    "attempt",
    "epoch",
    "worker",
    "node",
    "train_images",
    "eval_images",
    "train_tokens",
    "eval_tokens",
    "batch_size",
    "train_ops",
    "eval_ops",
    "ops",
    "aiperf_ops",
    "train_acc",
    "train_loss",
    "val_acc",
    "val_loss",
    "bits_per_byte",
    "train_s",
    "eval_s",
    "data_wait_s",
    "input",
    "skipped_images",
    "precision",
]
TRIAL_COLUMNS = [
    "trial",
    "kind",
    "parent",
    "inherit",
    "arch_id",
    "params",
    "flops_train_per_image",
    "flops_eval_per_image",
    "flops_train_per_token",
    "flops_eval_per_token",
    "learning_rate",
    "batch_size",
    "weight_decay",
    "dropout",
    "kernel_size",
    "seq_len",
    "warmup_fraction",
    "epochs_planned",
    "lineage",
    "worker",
    "node",
    "attempts",
    "start_t",
    "end_t",
    "status",
    "epochs",
    "best_val_acc",
    "best_bits_per_byte",
    "ops",
    "depth",
]
TELEMETRY_COLUMNS = [
    "wall",
    "t",
    "node",
    "hostname",
    "device",
    "name",
    "util_percent",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "run_util_percent",  # the host rows: the run's own processes' share of the host's CPUs since the previous sample
]


MAX_ROWS = 1_000_000  # epochs and trials a frame keeps at most (about 200 MB of epochs)
TOP_TRIALS = 100  # the most accurate trials, kept in the trials frame whatever the sampling


@dataclass
class RunResults:
    """Everything a run recorded, as frames; ``header`` is the ledger's ``run_start`` record."""

    header: RunStartRecord
    trials: pd.DataFrame
    epochs: pd.DataFrame
    workers: pd.DataFrame
    telemetry: pd.DataFrame
    records: list[Record] = field(repr=False, default_factory=list)
    epochs_stride: int = 1  # epochs keeps every epochs_stride-th counted epoch
    trials_stride: int = 1  # trials keeps every trials_stride-th trial (and the TOP_TRIALS most accurate)
    epochs_total: int = 0
    trials_total: int = 0
    timeline: list[TimelinePoint] = field(repr=False, default_factory=list)


_Item = TypeVar("_Item")


class _Sample(Generic[_Item]):
    """Every k-th item of a stream, at most ``limit`` of them: k doubles (and every other kept item goes)
    each time the kept items would pass the limit, so the sample stays evenly spread."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.stride = 1
        self.seen = 0
        self.kept: list[_Item] = []

    def add(self, item: _Item) -> None:
        if self.seen % self.stride == 0:
            self.kept.append(item)
            if len(self.kept) > self.limit:
                self.kept = self.kept[::2]
                self.stride *= 2
        self.seen += 1


_EpochRow = tuple[object, ...]  # an epoch record's EPOCH_COLUMNS, in order


def _epoch_row(r: EpochRecord) -> _EpochRow:
    return tuple(getattr(r, name) for name in EPOCH_COLUMNS)


def _epochs_frame(rows: list[_EpochRow]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=EPOCH_COLUMNS)


def _epochs(records: list[Record]) -> pd.DataFrame:
    # Each record's declared fields (None where it has none); the frame keeps EPOCH_COLUMNS of them.
    return _epochs_frame([_epoch_row(r) for r in records if isinstance(r, EpochRecord)])


class _TrialRow(TypedDict, total=False):
    """A trial's row as it is built: TRIAL_COLUMNS (those of its end once it ended) and two keys of its own."""

    trial: str
    kind: str
    parent: str | None
    inherit: str | None
    arch_id: str
    params: int
    flops_train_per_image: float | None
    flops_eval_per_image: float | None
    flops_train_per_token: float | None
    flops_eval_per_token: float | None
    learning_rate: float | None
    batch_size: int | None
    weight_decay: float | None
    dropout: float | None
    kernel_size: int | None
    seq_len: int | None
    warmup_fraction: float | None
    epochs_planned: int | None
    lineage: str
    start_t: float
    status: str
    attempts: int
    ops: float
    best_bits_per_byte: float | None  # a language trial's lowest validation bits per byte
    worker: str | None
    node: str | None
    end_t: float
    epochs: int | None
    best_val_acc: float | None
    _best: float | None  # the best val_acc of its epochs so far (left out of the frame)
    _order: int  # its place in start order (left out of the frame)


class _Trials:
    """The trials frame's rows, built as the records stream by: a trial's row is final at its end."""

    def __init__(self, limit: int) -> None:
        self.rows: dict[str, _TrialRow] = {}  # trials not yet ended, in start order
        self.sample: _Sample[_TrialRow] = _Sample(limit)
        self.top: list[tuple[float, int, _TrialRow]] = []  # a min-heap of the most accurate ended trials
        self.order = 0
        self.ended: set[str] = set()

    def start(self, r: TrialStartRecord) -> None:
        row = self.rows.get(r.trial)
        if row is None:
            if r.trial in self.ended:
                return  # restarted after its end (no writer of ours does it): the row stands
            hp, flops = r.hparams, r.flops
            row = self.rows[r.trial] = {
                "trial": r.trial,
                "kind": r.kind,
                "parent": r.parent,
                "inherit": r.inherit,
                "arch_id": r.arch_id,
                "params": r.params,
                "flops_train_per_image": flops.train_per_image,
                "flops_eval_per_image": flops.eval_per_image,
                "flops_train_per_token": flops.train_per_token,
                "flops_eval_per_token": flops.eval_per_token,
                "learning_rate": hp.learning_rate,
                "batch_size": hp.batch_size,
                "weight_decay": hp.weight_decay,
                "dropout": hp.dropout,
                "kernel_size": hp.kernel_size,
                "seq_len": hp.seq_len,
                "warmup_fraction": hp.warmup_fraction,
                "epochs_planned": hp.epochs,
                "lineage": " ; ".join(r.lineage),
                "start_t": r.t,
                "status": "running",
                "attempts": 0,
                "ops": 0.0,
                "best_bits_per_byte": None,  # a language trial's lowest validation bits per byte
                "_best": None,
                "_order": self.order,
            }
            self.order += 1
        row.update({"worker": r.worker, "node": r.node, "attempts": row["attempts"] + 1})

    def epoch(self, r: EpochRecord) -> None:
        row = self.rows.get(r.trial)
        if row is not None:
            row["ops"] += float(r.ops) if r.ops is not None else 0.0
            acc = float(r.val_acc)
            row["_best"] = acc if row["_best"] is None else max(row["_best"], acc)
            if r.bits_per_byte is not None:
                bits = float(r.bits_per_byte)
                lowest = row["best_bits_per_byte"]
                row["best_bits_per_byte"] = bits if lowest is None else min(lowest, bits)

    def end(self, r: TrialEndRecord) -> None:
        row = self.rows.pop(r.trial, None)
        if row is None:
            return
        row.update({"end_t": r.t, "status": r.status.value, "epochs": r.epochs, "best_val_acc": r.best_val_acc})
        self.ended.add(r.trial)
        self._final(row)

    def _final(self, row: _TrialRow) -> None:
        if row.get("best_val_acc") is None:  # still running when the ledger ends: its best from its epochs
            row["best_val_acc"] = row["_best"]
        self.sample.add(row)
        best = row["best_val_acc"]
        if best is not None:
            item = (float(best), -row["_order"], row)
            if len(self.top) < TOP_TRIALS:
                heapq.heappush(self.top, item)
            elif item[:2] > self.top[0][:2]:
                heapq.heapreplace(self.top, item)

    def frame(self) -> pd.DataFrame:
        for row in list(self.rows.values()):
            self._final(row)
        self.rows = {}
        kept = {id(row): row for row in self.sample.kept}
        for _, _, row in self.top:
            kept.setdefault(id(row), row)
        rows = sorted(kept.values(), key=lambda row: row["_order"])
        for row in rows:
            row.pop("_best", None)
        frame = pd.DataFrame(rows, columns=[*TRIAL_COLUMNS, "_order"]).drop(columns="_order")
        parents = dict(zip(frame["trial"], frame["parent"], strict=True))
        frame["depth"] = [_depth(t, parents) for t in frame["trial"]]
        return frame


def _trials(records: list[Record], epochs: pd.DataFrame | None = None) -> pd.DataFrame:
    trials = _Trials(len(records) + 1)
    for r in records:
        if isinstance(r, TrialStartRecord):
            trials.start(r)
        elif isinstance(r, EpochRecord):
            trials.epoch(r)
        elif isinstance(r, TrialEndRecord):
            trials.end(r)
    return trials.frame()


def _depth(trial: str, parents: dict[str, str | None]) -> int:
    """Generations from the seed (0 for a trial without a parent); stops on a broken or cyclic chain
    (or, in a sampled frame, at a parent the frame does not hold)."""
    depth, seen = 0, {trial}
    parent = parents.get(trial)
    while isinstance(parent, str) and parent in parents and parent not in seen:
        seen.add(parent)
        depth += 1
        parent = parents.get(parent)
    return depth


_WORKER_COLUMNS = [
    "worker",
    "node",
    "hostname",
    "device",
    "busy_s",
    "alive_s",
    "busy_fraction",
    "idle_gap_mean_s",
    "retired",
]


def _worker_row(r: WorkerRecord) -> dict[str, object]:
    return {
        "worker": r.worker,
        "node": r.node,
        "hostname": r.hostname,
        "device": f"{r.device.get('kind', '?')}: {r.device.get('name', '?')}",  # as the worker reported
        "busy_s": r.busy_s,
        "alive_s": r.alive_s,
        "busy_fraction": r.busy_fraction,
        "idle_gap_mean_s": r.idle_gaps.mean_s,
        "retired": r.retired,
    }


def _workers(records: list[Record]) -> pd.DataFrame:
    return pd.DataFrame([_worker_row(r) for r in records if isinstance(r, WorkerRecord)], columns=_WORKER_COLUMNS)


def master_time(records: Sequence[Record], walls: list[float]) -> list[float]:
    """Map Unix times onto the ledger's master clock, using the latest record written before each."""
    return _master_time(sorted((r.wall, r.wall - r.t) for r in records), walls)


def _master_time(anchors: list[tuple[float, float]], walls: list[float]) -> list[float]:
    """``master_time`` from sorted ``(wall, wall - t)`` pairs."""
    if not anchors:
        return [float("nan")] * len(walls)
    keys = [a[0] for a in anchors]
    out = []
    for w in walls:
        k = max(bisect.bisect_right(keys, w) - 1, 0)
        out.append(w - anchors[k][1])
    return out


class _Anchors:
    """The records ``master_time`` maps telemetry through, one per second of wall time (the first of that
    second): a sample is placed on the master clock by a record at most a second older than the latest one
    before it, whose clocks' offset differs from it by the clocks' drift within that second."""

    def __init__(self) -> None:
        self.by_second: dict[int, tuple[float, float]] = {}

    def add(self, r: Record) -> None:
        wall = float(r.wall)
        second = int(wall)
        found = self.by_second.get(second)
        if found is None or wall < found[0]:
            self.by_second[second] = (wall, wall - float(r.t))

    def sorted(self) -> list[tuple[float, float]]:
        return sorted(self.by_second.values())


def _run_share(s: TelemetrySample, previous: TelemetrySample | None) -> float | None:
    """The run's processes' CPU use between two samples of a node, in % of its host's CPUs (None: not measured)."""
    if previous is None:
        return None
    cpu0, cpu1, cpus = previous.get("run_cpu_s"), s.get("run_cpu_s"), s.get("cpus")
    t0, t1 = previous.get("node_wall"), s.get("node_wall")
    if cpu0 is None or cpu1 is None or t0 is None or t1 is None or not cpus or t1 <= t0 or cpu1 < cpu0:
        return None
    return min(100.0, 100.0 * (float(cpu1) - float(cpu0)) / (float(cpus) * (float(t1) - float(t0))))


def _telemetry(run_dir: Path, anchors: list[tuple[float, float]]) -> pd.DataFrame:
    rows = []
    last: dict[str, TelemetrySample] = {}
    for s in read_telemetry(run_dir):
        if "error" in s:
            continue
        base = {"wall": s["wall"], "node": s["node"], "hostname": s.get("hostname")}
        rows.append(
            {
                **base,
                "device": "cpu",
                "name": "host",
                "util_percent": s.get("cpu_percent"),
                "mem_used_bytes": s.get("host_mem_used_bytes"),
                "mem_total_bytes": s.get("host_mem_total_bytes"),
                "power_w": None,
                "run_util_percent": _run_share(s, last.get(s["node"])),
            }
        )
        last[s["node"]] = s
        for a in s.get("accelerators") or []:
            rows.append(
                {
                    **base,
                    "device": f"gpu{a.get('index', 0)}",
                    "name": a.get("name"),
                    "util_percent": a.get("util_percent"),
                    "mem_used_bytes": a.get("mem_used_bytes"),
                    "mem_total_bytes": a.get("mem_total_bytes"),
                    "power_w": a.get("power_w"),
                    "run_util_percent": None,
                }
            )
    frame = pd.DataFrame(rows, columns=TELEMETRY_COLUMNS)
    frame["t"] = _master_time(anchors, list(frame["wall"])) if len(frame) else []
    return frame


def load(run_dir: str | Path, max_rows: int = MAX_ROWS, digest: RunDigest | None = None) -> RunResults:
    """The run in ``run_dir`` as frames, read one record at a time (frames of at most ``max_rows`` rows,
    see the module docstring).

    Raises :class:`~aiperf.errors.AiperfError` when it has no ledger or a record is malformed
    (``aiperf.ledger.schema``), so a notebook gets one line naming the record, not a pandas error.
    """
    run_dir = Path(run_dir)
    header: RunStartRecord | None = None
    epochs: _Sample[_EpochRow] = _Sample(max_rows)
    trials = _Trials(max_rows)
    workers: list[dict[str, object]] = []
    timeline = TimelineTally()
    anchors = _Anchors()
    last_run: Record | None = None
    audits: list[Record] = []
    for r in iter_ledger(run_dir):
        if header is None:
            if not isinstance(r, RunStartRecord):  # iter_ledger refuses such a ledger already
                raise AiperfError(f"{run_dir / LEDGER_NAME}: the ledger does not begin with a run_start record")
            header = r
        timeline.add(r)
        anchors.add(r)
        if digest is not None:  # the summary, from the same pass (aiperf report)
            digest.add(r)
        if isinstance(r, AuditRecord):
            audits.append(r)
        else:
            last_run = r
        if isinstance(r, EpochRecord):
            epochs.add(_epoch_row(r))
            trials.epoch(r)
        elif isinstance(r, TrialStartRecord):
            trials.start(r)
        elif isinstance(r, TrialEndRecord):
            trials.end(r)
        elif isinstance(r, WorkerRecord):
            workers.append(_worker_row(r))
    assert header is not None and last_run is not None  # iter_ledger refuses a ledger without records
    kept = [header] + ([last_run] if last_run is not header else []) + audits
    trials_frame = trials.frame()
    return RunResults(
        header,
        trials_frame,
        _epochs_frame(epochs.kept),
        pd.DataFrame(workers, columns=_WORKER_COLUMNS),
        _telemetry(run_dir, anchors.sorted()),
        kept,
        epochs_stride=epochs.stride,
        trials_stride=trials.sample.stride,
        epochs_total=epochs.seen,
        trials_total=trials.sample.seen,
        timeline=timeline.points(),
    )
