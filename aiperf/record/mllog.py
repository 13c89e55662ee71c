"""The run as an MLPerf-style event log (``mllog.txt``), for tools that already parse MLPerf logs.

Each line is ``:::MLLOG {json}`` with the fields in MLPerf's order — ``namespace``,
``time_ms`` (Unix milliseconds), ``event_type`` (``INTERVAL_START`` | ``INTERVAL_END`` |
``POINT_IN_TIME``), ``key``, ``value``, ``metadata`` — and MLPerf's key names
(mlcommons/logging ``mllog/constants.py``). The log is derived from the ledger alone, record
by record (every line's metadata names the ledger ``seq`` it came from), so it can always be
regenerated and ``aiperf verify`` could compare it; it is written while the run goes,
one flushed line at a time, by a subscriber on the :class:`~aiperf.record.ledger.LedgerWriter`.

Trials run concurrently, so epochs interleave: every ``epoch_start``/``epoch_stop``/
``eval_accuracy`` carries ``trial`` and MLPerf's ``epoch_num`` in its metadata. An epoch
opens when its trial starts (or its previous epoch ends) and closes when its ``epoch``
record arrives (``counted: true``), or, if the trial is stopped, lost or re-queued first,
with ``counted: false`` — that partial epoch is not in the score.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, BinaryIO

from aiperf.metrics.score import compute_score
from aiperf.record.ledger import LedgerWriter, read_ledger

MLLOG_NAME = "mllog.txt"
PREFIX = ":::MLLOG "
INTERVAL_START, INTERVAL_END, POINT_IN_TIME = "INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"
BENCHMARK = "aiperf"
# The architecture is searched, not fixed: that is MLPerf's open division. The benchmark is run
# on the submitter's own machines ("onprem"); there is no organisation field in the config.
DIVISION, STATUS, ORG = "open", "onprem", "unspecified"
Event = tuple[str, str, Any, dict[str, Any]]  # (event_type, key, value, metadata)


def encode(time_ms: int, event_type: str, key: str, value: Any, metadata: dict[str, Any]) -> str:
    """One log line in MLPerf's field order."""
    body = {
        "namespace": "",
        "time_ms": time_ms,
        "event_type": event_type,
        "key": key,
        "value": value,
        "metadata": metadata,
    }
    return PREFIX + json.dumps(body)


def parse(line: str) -> dict[str, Any] | None:
    """The JSON of an ``:::MLLOG`` line, or None for any other line."""
    if not line.startswith(PREFIX):
        return None
    try:
        event = json.loads(line[len(PREFIX) :])
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _platform(plan: dict[str, Any]) -> str:
    nodes = plan.get("nodes") or []
    if not nodes:
        return "unknown"
    gpus = max(int(n.get("gpus") or 0) for n in nodes)
    names = sorted({n.get("accelerator") or n.get("cpu_model") or "CPU" for n in nodes})
    per_node = (
        f"{gpus}x {'/'.join(names)}" if gpus else f"{max(n.get('cpus', 0) for n in nodes):g} CPUs ({'/'.join(names)})"
    )
    return f"{len(nodes)} node(s) x {per_node}"


class MLLogRenderer:
    """Turns ledger records, in order, into log lines; keeps only what later lines need."""

    def __init__(self) -> None:
        self.trials: dict[str, dict[str, Any]] = {}  # trial -> {epochs, open epoch_num or None, attempt}
        self.epochs: list[dict[str, Any]] = []  # slim copies, for the final score
        self.min_accuracy: float | None = None

    def lines(self, rec: dict[str, Any]) -> list[str]:
        handler = getattr(self, f"_{rec.get('type')}", None)
        if handler is None:
            return []
        ms = int(rec["wall"] * 1000)
        return [encode(ms, kind, key, value, {**meta, "seq": rec["seq"]}) for kind, key, value, meta in handler(rec)]

    def _run_start(self, rec: dict[str, Any]) -> list[Event]:
        plan, dataset = rec.get("plan") or {}, rec.get("dataset") or {}
        self.min_accuracy = (rec.get("rules") or {}).get("min_accuracy")
        nodes = plan.get("nodes") or []
        return [
            (POINT_IN_TIME, "submission_benchmark", BENCHMARK, {}),
            (POINT_IN_TIME, "submission_org", (rec.get("config") or {}).get("run", {}).get("organization") or ORG, {}),
            (POINT_IN_TIME, "submission_division", DIVISION, {}),
            (POINT_IN_TIME, "submission_status", STATUS, {}),
            (POINT_IN_TIME, "submission_platform", _platform(plan), {}),
            (POINT_IN_TIME, "number_of_nodes", len(nodes), {}),
            (POINT_IN_TIME, "accelerators_per_node", max((int(n.get("gpus") or 0) for n in nodes), default=0), {}),
            (POINT_IN_TIME, "seed", (rec.get("config") or {}).get("run", {}).get("seed"), {}),
            (POINT_IN_TIME, "train_samples", dataset.get("train_images"), {"dataset": dataset.get("name")}),
            (POINT_IN_TIME, "eval_samples", dataset.get("eval_images"), {"dataset": dataset.get("name")}),
            (INTERVAL_START, "run_start", None, {"run_id": rec.get("run_id")}),
        ]

    def _trial_start(self, rec: dict[str, Any]) -> list[Event]:
        trial = rec["trial"]
        epoch = int(rec.get("start_epoch") or 0) + 1
        state = {
            "epochs": int((rec.get("hparams") or {}).get("epochs") or epoch),
            "open": epoch,
            "attempt": rec.get("attempt", 0),
        }
        self.trials[trial] = state
        return [
            (
                INTERVAL_START,
                "epoch_start",
                None,
                self._meta(trial, epoch, kind=rec.get("kind"), worker=rec.get("worker")),
            )
        ]

    def _meta(self, trial: str, epoch: int, **extra: Any) -> dict[str, Any]:
        return {"trial": trial, "epoch_num": epoch, "attempt": self.trials[trial]["attempt"], **extra}

    def _epoch(self, rec: dict[str, Any]) -> list[Event]:
        trial, epoch = rec["trial"], rec["epoch"]
        self.epochs.append(
            {k: rec.get(k) for k in ("type", "t", "ops", "train_ops", "eval_ops", "aiperf_ops", "val_acc")}
        )
        state = self.trials.setdefault(trial, {"epochs": epoch, "open": epoch, "attempt": rec.get("attempt", 0)})
        out = [
            (POINT_IN_TIME, "eval_accuracy", rec.get("val_acc"), self._meta(trial, epoch)),
            (
                INTERVAL_END,
                "epoch_stop",
                None,
                self._meta(trial, epoch, counted=True, ops=rec.get("ops"), aiperf_ops=rec.get("aiperf_ops")),
            ),
        ]
        state["open"] = None
        if epoch < state["epochs"]:
            state["open"] = epoch + 1
            out.append((INTERVAL_START, "epoch_start", None, self._meta(trial, epoch + 1)))
        return out

    def _close(self, trial: str, why: str) -> list[Event]:
        state = self.trials.get(trial)
        if state is None or state["open"] is None:
            return []
        epoch, state["open"] = state["open"], None
        return [(INTERVAL_END, "epoch_stop", None, self._meta(trial, epoch, counted=False, reason=why))]

    def _requeue(self, rec: dict[str, Any]) -> list[Event]:
        return self._close(rec["trial"], f"re-queued: {rec.get('reason', '')}")

    def _trial_end(self, rec: dict[str, Any]) -> list[Event]:
        return self._close(rec["trial"], f"trial {rec.get('status')}")

    def _resume(self, rec: dict[str, Any]) -> list[Event]:
        return [(POINT_IN_TIME, "aiperf_resume", rec.get("gap_s"), {"from_seq": rec.get("from_seq")})]

    def _run_stop(self, rec: dict[str, Any]) -> list[Event]:
        out = [event for trial in list(self.trials) for event in self._close(trial, f"run {rec.get('status')}")]
        score = compute_score(self.epochs)
        reached = (
            score.best_val_acc is not None and self.min_accuracy is not None and score.best_val_acc >= self.min_accuracy
        )
        out.append(
            (
                POINT_IN_TIME,
                "aiperf_score",
                score.regulated,
                {
                    "ops_per_s": score.ops_per_s,
                    "total_ops": score.total_ops,
                    "wall_s": score.wall_s,
                    "best_val_acc": score.best_val_acc,
                    "aiperf_regulated": score.aiperf_regulated,
                },
            )
        )
        # MLPerf's "success" means the target quality was reached; the run's own status goes alongside.
        status = "success" if rec.get("status") == "completed" and reached else "aborted"
        out.append(
            (
                INTERVAL_END,
                "run_stop",
                None,
                {"status": status, "run_status": rec.get("status"), "reason": rec.get("reason")},
            )
        )
        return out


def render(records: list[dict[str, Any]]) -> list[str]:
    """The whole log of a ledger (what ``mllog.txt`` holds once the run has ended)."""
    renderer = MLLogRenderer()
    return [line for rec in records for line in renderer.lines(rec)]


class MLLogWriter:
    """Appends the lines of each new ledger record to ``mllog.txt``, flushing every line."""

    def __init__(self, path: Path, renderer: MLLogRenderer) -> None:
        self.path = path
        self._renderer = renderer
        self._fh: BinaryIO | None = None

    def write(self, lines: list[str]) -> None:
        if self._fh is None or self._fh.closed:
            self._fh = open(self.path, "ab")  # noqa: SIM115 - held open until the session's run_stop
        for line in lines:
            self._fh.write(line.encode() + b"\n")
            self._fh.flush()

    def __call__(self, record: dict[str, Any]) -> None:
        self.write(self._renderer.lines(record))
        if record.get("type") == "run_stop":
            self.close()

    def close(self) -> None:
        if self._fh is not None and not self._fh.closed:
            self._fh.close()


def _complete_lines(path: Path) -> tuple[list[str], int]:
    """The log's complete lines and their length in bytes (a line torn by a crash is not one)."""
    if not path.exists():
        return [], 0
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    return data[:end].decode(errors="replace").splitlines(), end


def attach(run_dir: str | Path, ledger: LedgerWriter, cfg: Any = None) -> MLLogWriter:
    """Bring ``mllog.txt`` up to date with the ledger so far, then follow it record by record.

    The run header is written before observers attach, and a resumed run already has a log:
    both are handled by replaying the ledger — lines already in the file are kept, the rest
    appended. A log that is not a prefix of what the ledger gives (edited by hand) is rewritten
    from the ledger, which is the authority. ``cfg`` is accepted for symmetry with the other
    observers; everything logged comes from the ledger itself.
    """
    path = Path(run_dir) / MLLOG_NAME
    renderer = MLLogRenderer()
    expected = [line for rec in read_ledger(run_dir) for line in renderer.lines(rec)]
    have, size = _complete_lines(path)
    if have != expected[: len(have)]:
        have, size = [], 0
    if path.exists():
        with open(path, "r+b") as fh:
            fh.truncate(size)  # drop a torn tail, or everything when the log disagrees with the ledger
    writer = MLLogWriter(path, renderer)
    writer.write(expected[len(have) :])
    ledger.subscribe(writer)
    return writer
