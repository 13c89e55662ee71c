"""A run's results as pandas DataFrames, for analysis in a notebook and for the report.

``load(run_dir)`` reads the ledger (and ``telemetry.jsonl`` when present) and returns one
frame per kind of fact: trials (one row per trial, its latest attempt), epochs (one row per
counted epoch), workers and telemetry (one row per node, device and sample). Times are the
master clock ``t`` of the ledger throughout; telemetry samples, which carry Unix time, are
mapped onto it through the ledger records around them.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from aiperf.errors import AiperfError
from aiperf.record.ledger import LEDGER_NAME, read_ledger
from aiperf.record.schema import EpochRecord, Record, RunStartRecord, TrialEndRecord, TrialStartRecord, WorkerRecord
from aiperf.record.telemetry import read_telemetry

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
    "batch_size",
    "train_ops",
    "eval_ops",
    "ops",
    "aiperf_ops",
    "train_acc",
    "train_loss",
    "val_acc",
    "val_loss",
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
    "learning_rate",
    "batch_size",
    "weight_decay",
    "dropout",
    "kernel_size",
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
]


@dataclass
class RunResults:
    """Everything a run recorded, as frames; ``header`` is the ledger's ``run_start`` record."""

    header: RunStartRecord
    trials: pd.DataFrame
    epochs: pd.DataFrame
    workers: pd.DataFrame
    telemetry: pd.DataFrame
    records: list[Record] = field(repr=False, default_factory=list)


def _epochs(records: list[Record]) -> pd.DataFrame:
    # Each record's declared fields (None where it has none); the frame keeps EPOCH_COLUMNS of them.
    rows = [r.model_dump() for r in records if isinstance(r, EpochRecord)]
    return pd.DataFrame(rows, columns=EPOCH_COLUMNS)


def _trials(records: list[Record], epochs: pd.DataFrame) -> pd.DataFrame:
    rows: dict[str, dict[str, Any]] = {}
    for r in records:
        if isinstance(r, TrialStartRecord):
            row = rows.get(r.trial)
            if row is None:
                hp, flops = r.hparams, r.flops
                row = rows[r.trial] = {
                    "trial": r.trial,
                    "kind": r.kind,
                    "parent": r.parent,
                    "inherit": r.inherit,
                    "arch_id": r.arch_id,
                    "params": r.params,
                    "flops_train_per_image": flops.train_per_image,
                    "flops_eval_per_image": flops.eval_per_image,
                    "learning_rate": hp.learning_rate,
                    "batch_size": hp.batch_size,
                    "weight_decay": hp.weight_decay,
                    "dropout": hp.dropout,
                    "kernel_size": hp.kernel_size,
                    "epochs_planned": hp.epochs,
                    "lineage": " ; ".join(r.lineage),
                    "start_t": r.t,
                    "status": "running",
                    "attempts": 0,
                }
            row.update(worker=r.worker, node=r.node, attempts=row["attempts"] + 1)
        elif isinstance(r, TrialEndRecord) and r.trial in rows:
            rows[r.trial].update(end_t=r.t, status=r.status.value, epochs=r.epochs, best_val_acc=r.best_val_acc)
    frame = pd.DataFrame(list(rows.values()), columns=TRIAL_COLUMNS)
    if len(frame) and len(epochs):
        per_trial = epochs.groupby("trial").agg(ops=("ops", "sum"), best=("val_acc", "max"))
        frame["ops"] = frame["trial"].map(per_trial["ops"]).fillna(0.0)
        # A trial still running when the ledger ends has no trial_end: take its best from its epochs.
        frame["best_val_acc"] = frame["best_val_acc"].fillna(frame["trial"].map(per_trial["best"]))
    else:
        frame["ops"] = 0.0
    parents = dict(zip(frame["trial"], frame["parent"], strict=True))
    frame["depth"] = [_depth(t, parents) for t in frame["trial"]]
    return frame


def _depth(trial: str, parents: dict[str, str | None]) -> int:
    """Generations from the seed (0 for a trial without a parent); stops on a broken or cyclic chain."""
    depth, seen = 0, {trial}
    parent = parents.get(trial)
    while isinstance(parent, str) and parent in parents and parent not in seen:
        seen.add(parent)
        depth += 1
        parent = parents.get(parent)
    return depth


def _workers(records: list[Record]) -> pd.DataFrame:
    columns = [
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
    rows = []
    for r in records:
        if isinstance(r, WorkerRecord):
            rows.append(
                {
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
            )
    return pd.DataFrame(rows, columns=columns)


def master_time(records: Sequence[Record], walls: list[float]) -> list[float]:
    """Map Unix times onto the ledger's master clock, using the latest record written before each."""
    anchors = sorted((r.wall, r.wall - r.t) for r in records)
    if not anchors:
        return [float("nan")] * len(walls)
    keys = [a[0] for a in anchors]
    out = []
    for w in walls:
        k = max(bisect.bisect_right(keys, w) - 1, 0)
        out.append(w - anchors[k][1])
    return out


def _telemetry(run_dir: Path, records: list[Record]) -> pd.DataFrame:
    rows = []
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
            }
        )
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
                }
            )
    frame = pd.DataFrame(rows, columns=TELEMETRY_COLUMNS)
    frame["t"] = master_time(records, list(frame["wall"])) if len(frame) else []
    return frame


def load(run_dir: str | Path) -> RunResults:
    """The run in ``run_dir`` as frames.

    Raises :class:`~aiperf.errors.AiperfError` when it has no ledger or a record is malformed
    (``aiperf.record.schema``), so a notebook gets one line naming the record, not a pandas error.
    """
    run_dir = Path(run_dir)
    records = read_ledger(run_dir)
    header = records[0]
    if not isinstance(header, RunStartRecord):  # read_ledger refuses such a ledger already
        raise AiperfError(f"{run_dir / LEDGER_NAME}: the ledger does not begin with a run_start record")
    epochs = _epochs(records)
    return RunResults(
        header, _trials(records, epochs), epochs, _workers(records), _telemetry(run_dir, records), records
    )
