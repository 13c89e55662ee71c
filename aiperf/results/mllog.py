"""The run as an MLCommons-compliant event log (``mllog.txt``), in MLCommons' own logger's format.

Each line is what :class:`mlperf_logging.mllog.mllog.MLLogger`, the reference logger of the
MLPerf benchmarks, writes for the event: ``:::MLLOG {json}`` with ``namespace``, ``time_ms``
(Unix milliseconds: the ``wall`` of the ledger record the line comes from), ``event_type``,
``key``, ``value`` and ``metadata`` (which the logger extends with the ``file`` and ``lineno``
that logged the line). The lines are encoded here, not by calling the logger: it looks its
caller up with ``inspect`` on every line, which took 14 % of the master's time at 2,048
simulated workers and 35 % while 16,384 of them closed their trials (docs/cluster.md);
``tests/results/test_mllog.py`` holds every kind of line to the logger's own output. The log
passes MLCommons' compliance checker (HPC ruleset 3.0.0, its common and open-division rules)
once aiperf is registered there as an open benchmark: :func:`write_checker_config` writes that
registration, derived from the checker's own configuration files.

The log is derived from the ledger alone, record by record (every line's metadata names the
ledger ``seq`` it came from), so it can always be regenerated (:func:`render`); it is written
while the run goes, one flushed line at a time, by a subscriber on the
:class:`~aiperf.ledger.store.LedgerWriter`, so a run killed at any moment keeps its log.

Trials run concurrently, so epochs interleave: every ``epoch_start``/``epoch_stop``/
``eval_start``/``eval_stop``/``eval_accuracy`` carries ``trial`` and MLPerf's ``epoch_num`` in
its metadata. An epoch opens when its trial starts (or its previous epoch ends) and closes when
its ``epoch`` record arrives (``counted: true``), or, if the trial is stopped, lost or re-queued
first, with ``counted: false`` — that partial epoch is not in the score. A session that ended
and was then resumed is logged as ``aiperf_session_stop``: only the run's last end is
``run_stop`` (MLPerf allows exactly one).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np
from mlperf_logging.mllog import constants as mlc

from aiperf.ledger.json_types import JSONObject
from aiperf.ledger.schema import (
    EpochRecord,
    PlanHeader,
    Record,
    RecordType,
    RequeueRecord,
    ResumeRecord,
    RunStartRecord,
    RunStatus,
    RunStopRecord,
    TrialEndRecord,
    TrialStartRecord,
)
from aiperf.ledger.store import LedgerWriter, read_ledger
from aiperf.metrics.score import ScoreTally
from aiperf.metrics.workloads import NOT_COMPARABLE, identify

MLLOG_NAME = "mllog.txt"
PREFIX = ":::MLLOG "
INTERVAL_START, INTERVAL_END, POINT_IN_TIME = mlc.INTERVAL_START, mlc.INTERVAL_END, mlc.POINT_IN_TIME
BENCHMARK = "aiperf"
# The architecture is searched, not fixed: that is MLPerf's open division. The benchmark is run
# on the submitter's own machines ("onprem"); the organisation is ``run.organization``.
DIVISION, STATUS, ORG = "open", "onprem", "unspecified"
CHECKER_USAGE, CHECKER_RULESET = "hpc", "3.0.0"
Event = tuple[str, str, object, dict[str, object]]  # (event_type, key, value, metadata): what JSON encodes
# The caller MLLogger wrote into every line when aiperf called it (this file, the line of that
# call): kept, so the log of an earlier run rebuilt from its ledger (``attach`` on --resume) is the
# mllog.txt that run wrote.
CALLER = {"file": "aiperf/results/mllog.py", "lineno": 122}


def _plain(value: object) -> object:
    """NumPy scalars and arrays as MLLogger's encoder writes them."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode_line(event_type: str, key: str, value: object, metadata: Mapping[str, object], time_ms: int) -> str:
    """One log line, byte for byte what MLLogger writes for it from aiperf's call (namespace "")."""
    event = {
        "namespace": "",
        "time_ms": time_ms,
        "event_type": event_type,
        "key": key,
        "value": value,
        "metadata": {**CALLER, **metadata},
    }
    return PREFIX + json.dumps(event, default=_plain)


def parse(line: str) -> JSONObject | None:
    """The JSON of an ``:::MLLOG`` line, or None for any other line."""
    if not line.startswith(PREFIX):
        return None
    try:
        event = json.loads(line[len(PREFIX) :])
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


class MLLogRenderer:
    """Turns ledger records, in order, into log lines; keeps only what later lines need."""

    def __init__(self) -> None:
        self.trials: dict[str, _TrialState] = {}
        self.score = ScoreTally(
            count_trials=False
        )  # the epochs, for the final score (not the records: a long run has millions)
        self.min_accuracy: float | None = None
        self.comparable: dict[str, object] = {}
        self.language = False  # a language run (run_start.family): its samples are tokens
        self.tokens = 0  # a language run's training tokens of the counted epochs
        self._handlers = self._table()

    def lines(self, rec: Record, resumed: bool = False) -> list[str]:
        """The log lines of one ledger record; ``resumed``: a ``run_stop`` that a ``resume`` follows."""
        if resumed and isinstance(rec, RunStopRecord):
            events = self._session_stop(rec)
        else:  # the types without a handler (workers, weights, types a newer writer added) make no lines
            events = self._handlers[rec.type](rec) if rec.type in self._handlers else []
        ms = int(rec.wall * 1000)
        lines = []
        for kind, key, value, meta in events:
            before = meta.pop("before_s", None)  # only an epoch's evaluation has one: its eval_s
            at = ms - round(1000 * before) if isinstance(before, (int, float)) else ms
            try:
                lines.append(encode_line(kind, key, value, {**meta, "seq": rec.seq}, at))
            except (TypeError, ValueError):  # as MLLogger does: a value JSON cannot hold makes no line
                continue
        return lines

    def _table(self) -> dict[str, _Handler]:
        """The handler of each record type that makes lines."""
        return {
            RecordType.RUN_START: _only(RunStartRecord, self._run_start),
            RecordType.TRIAL_START: _only(TrialStartRecord, self._trial_start),
            RecordType.EPOCH: _only(EpochRecord, self._epoch),
            RecordType.REQUEUE: _only(RequeueRecord, self._requeue),
            RecordType.TRIAL_END: _only(TrialEndRecord, self._trial_end),
            RecordType.RESUME: _only(ResumeRecord, self._resume),
            RecordType.RUN_STOP: _only(RunStopRecord, self._run_stop),
        }

    def _run_start(self, rec: RunStartRecord) -> list[Event]:
        dataset, nodes = rec.dataset, rec.plan.nodes
        self.min_accuracy = rec.rules.min_accuracy
        self.language = rec.family == "language"
        # A language run's samples are tokens (what its operations are counted per); an image run's, images.
        samples = (
            (dataset.train_tokens, dataset.eval_tokens)
            if self.language
            else (dataset.train_images, dataset.eval_images)
        )
        about = {"dataset": dataset.name, **({"unit": "tokens"} if self.language else {})}
        workload = identify(rec)
        self.comparable = {
            "workload": workload.workload,
            "comparable": workload.comparable,
            "label": "" if workload.comparable else NOT_COMPARABLE,
            "custom": list(workload.reasons),
        }
        init = {"note": "initialisation (dataset load, Ray start, sizing) ends when the ledger begins"}
        return [
            (POINT_IN_TIME, "submission_benchmark", BENCHMARK, {}),
            (POINT_IN_TIME, "submission_org", rec.config.run.organization or ORG, {}),
            (POINT_IN_TIME, "submission_division", DIVISION, {}),
            (POINT_IN_TIME, "submission_status", STATUS, {}),
            (POINT_IN_TIME, "submission_platform", _platform(rec.plan), {}),
            (POINT_IN_TIME, "number_of_nodes", len(nodes), {}),
            (POINT_IN_TIME, "accelerators_per_node", max((int(n.gpus) for n in nodes), default=0), {}),
            (POINT_IN_TIME, "seed", rec.config.run.seed, {}),
            (POINT_IN_TIME, "train_samples", samples[0], dict(about)),
            (POINT_IN_TIME, "eval_samples", samples[1], dict(about)),
            (POINT_IN_TIME, "aiperf_workload", workload.workload, dict(self.comparable)),
            # aiperf does not drop the operating system's file cache before a run: recorded as such.
            (POINT_IN_TIME, "cache_clear", False, {}),
            (INTERVAL_START, "init_start", None, dict(init)),
            (INTERVAL_END, "init_stop", None, dict(init)),
            (INTERVAL_START, "run_start", None, {"run_id": rec.run_id}),
        ]

    def _trial_start(self, rec: TrialStartRecord) -> list[Event]:
        epoch = rec.start_epoch + 1
        self.trials[rec.trial] = _TrialState(epochs=rec.hparams.epochs or epoch, open=epoch, attempt=rec.attempt)
        return [(INTERVAL_START, "epoch_start", None, self._meta(rec.trial, epoch, kind=rec.kind, worker=rec.worker))]

    def _meta(self, trial: str, epoch: int, **extra: object) -> dict[str, object]:
        return {"trial": trial, "epoch_num": epoch, "attempt": self.trials[trial].attempt, **extra}

    def _epoch(self, rec: EpochRecord) -> list[Event]:
        trial, epoch = rec.trial, rec.epoch
        self.score.add(rec)
        self.tokens += rec.train_tokens or 0
        state = self.trials.setdefault(trial, _TrialState(epochs=epoch, open=epoch, attempt=rec.attempt))
        eval_s = rec.eval_s if rec.eval_s is not None else 0.0
        out: list[Event] = [
            # The evaluation ended when the worker reported the epoch; it began eval_s before that.
            (INTERVAL_START, "eval_start", None, {**self._meta(trial, epoch), "before_s": eval_s}),
            (INTERVAL_END, "eval_stop", None, self._meta(trial, epoch, eval_s=eval_s)),
            (POINT_IN_TIME, "eval_accuracy", rec.val_acc, self._meta(trial, epoch)),
            (
                INTERVAL_END,
                "epoch_stop",
                None,
                self._meta(trial, epoch, counted=True, ops=rec.ops, aiperf_ops=rec.aiperf_ops),
            ),
        ]
        state.open = None
        if epoch < state.epochs:
            state.open = epoch + 1
            out.append((INTERVAL_START, "epoch_start", None, self._meta(trial, epoch + 1)))
        return out

    def _tokens(self, wall_s: float) -> dict[str, int | float]:
        """A language run's tokens trained and their rate over the score's duration (an image run: none)."""
        if not self.language:
            return {}
        return {"tokens": self.tokens, "tokens_per_s": self.tokens / wall_s if wall_s > 0 else 0.0}

    def _close(self, trial: str, why: str) -> list[Event]:
        state = self.trials.get(trial)
        if state is None or state.open is None:
            return []
        epoch, state.open = state.open, None
        return [(INTERVAL_END, "epoch_stop", None, self._meta(trial, epoch, counted=False, reason=why))]

    def _requeue(self, rec: RequeueRecord) -> list[Event]:
        return self._close(rec.trial, f"re-queued: {rec.reason or ''}")

    def _trial_end(self, rec: TrialEndRecord) -> list[Event]:
        return self._close(rec.trial, f"trial {rec.status}")

    def _resume(self, rec: ResumeRecord) -> list[Event]:
        return [(POINT_IN_TIME, "aiperf_resume", rec.gap_s, {"from_seq": rec.from_seq})]

    def _close_all(self, rec: RunStopRecord) -> list[Event]:
        return [event for trial in list(self.trials) for event in self._close(trial, f"run {rec.status}")]

    def _session_stop(self, rec: RunStopRecord) -> list[Event]:
        """A session's end that a resume follows: the run went on, and MLPerf logs one run_stop, at its real end."""
        return [*self._close_all(rec), (POINT_IN_TIME, "aiperf_session_stop", rec.status, {"reason": rec.reason})]

    def _run_stop(self, rec: RunStopRecord) -> list[Event]:
        out = self._close_all(rec)
        score = self.score.score(rec)  # divided by the run's recorded end, as the summary's
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
                    **self._tokens(score.wall_s),
                    **self.comparable,
                },
            )
        )
        # MLPerf's "success" means the target quality was reached; the run's own status goes alongside.
        status = "success" if rec.status is RunStatus.COMPLETED and reached else "aborted"
        out.append((INTERVAL_END, "run_stop", None, {"status": status, "run_status": rec.status, "reason": rec.reason}))
        return out


def render(records: list[Record]) -> list[str]:
    """The whole log of a ledger (what ``mllog.txt`` holds once the run has ended)."""
    renderer = MLLogRenderer()
    return [line for k, rec in enumerate(records) for line in renderer.lines(rec, _resumed(records, k))]


def _resumed(records: list[Record], k: int) -> bool:
    """Whether ``records[k]`` is a session's ``run_stop`` that a ``resume`` follows."""
    return isinstance(records[k], RunStopRecord) and k + 1 < len(records) and isinstance(records[k + 1], ResumeRecord)


R = TypeVar("R", bound=Record)
_Handler = Callable[[Record], list[Event]]


def _platform(plan: PlanHeader) -> str:
    nodes = plan.nodes
    if not nodes:
        return "unknown"
    gpus = max(int(n.gpus) for n in nodes)
    names = sorted({n.accelerator or n.cpu_model or "CPU" for n in nodes})
    per_node = f"{gpus}x {'/'.join(names)}" if gpus else f"{max(n.cpus for n in nodes):g} CPUs ({'/'.join(names)})"
    return f"{len(nodes)} node(s) x {per_node}"


def _only(kind: type[R], handler: Callable[[R], list[Event]]) -> _Handler:
    """``handler`` for the records of ``kind`` (a record built as another model under its name gets no lines)."""
    return lambda rec: handler(rec) if isinstance(rec, kind) else []


@dataclass
class _TrialState:
    epochs: int  # the epochs the trial trains
    open: int | None  # the epoch_num of its open epoch interval, if one is open
    attempt: int


def encode(time_ms: int, event_type: str, key: str, value: object, metadata: Mapping[str, object]) -> str:
    """One log line in MLPerf's field order (without the logger's call site: for tools and tests)."""
    body = {"namespace": "", "time_ms": time_ms, "event_type": event_type, "key": key, "value": value,
            "metadata": metadata}  # fmt: skip
    return PREFIX + json.dumps(body)


def write_checker_config(directory: str | Path) -> Path:
    """Register aiperf as an open HPC benchmark for MLCommons' compliance checker; returns the config to pass.

    The checker accepts only its own benchmarks (``submission_benchmark`` must be deepcam,
    cosmoflow, oc20 or openfold) and then loads ``open_<benchmark>.yaml``. This writes, into
    ``directory``, the checker's own ``common.yaml`` and ``open_common.yaml`` with aiperf added
    to that list and pointing at each other here, plus ``open_aiperf.yaml`` (aiperf's
    benchmark rules: at least one ``eval_accuracy`` per run, a fraction, with its epoch). Run
    ``python -m mlperf_logging.compliance_checker --usage hpc --ruleset 3.0.0 --config
    <returned path> mllog.txt``; the installed package is not modified.
    """
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    source = resources.files("mlperf_logging.compliance_checker") / f"{CHECKER_USAGE}_{CHECKER_RULESET}"
    here = f"{directory}/"
    edits = {
        "common.yaml": [(f"'{CHECKER_USAGE}_{CHECKER_RULESET}/{{}}_common.yaml'", f"'{here}{{}}_common.yaml'")],
        "open_common.yaml": [
            (
                "['deepcam', 'cosmoflow', 'oc20', 'openfold']",
                f"['deepcam', 'cosmoflow', 'oc20', 'openfold', '{BENCHMARK}']",
            ),
            (f"'{CHECKER_USAGE}_{CHECKER_RULESET}/open_{{}}.yaml'", f"'{here}open_{{}}.yaml'"),
        ],
    }
    for name, replacements in edits.items():
        text = (source / name).read_text()
        for old, new in replacements:
            if old not in text:
                raise RuntimeError(f"mlperf_logging's {name} has changed: {old!r} not found")
            text = text.replace(old, new)
        (directory / name).write_text(text)
    (directory / f"open_{BENCHMARK}.yaml").write_text(
        "- KEY:\n"
        "    NAME:  eval_accuracy\n"
        "    REQ:   AT_LEAST_ONE\n"
        "    CHECK:\n"
        "        - \"'epoch_num' in v['metadata']\"\n"
        "        - \"0 <= v['value'] <= 1\"\n"
    )
    return directory / "common.yaml"


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

    def __call__(self, record: Record) -> None:
        self.write(self._renderer.lines(record))
        if isinstance(record, RunStopRecord):
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


def attach(run_dir: str | Path, ledger: LedgerWriter, written: Sequence[Record] | None = None) -> MLLogWriter:
    """Bring ``mllog.txt`` up to date with the ledger so far, then follow it record by record.

    The run header is written before observers attach, and a resumed run already has a log:
    both are handled by replaying the ledger — lines already in the file are kept, the rest
    appended. Where the log departs from what the ledger gives (edited by hand, or the end of a
    session that has since been resumed) it is rewritten from there, from the ledger, which is
    the authority. Everything logged comes from the ledger itself.

    ``written``: every record the ledger holds, as :meth:`LedgerWriter.append` returned them (a
    new run: its header), so they need not be read back -- at 65,536 workers parsing the header
    again took a second of the master's start, while every worker waited. Ignored unless the
    ledger holds exactly that many records.
    """
    path = Path(run_dir) / MLLOG_NAME
    renderer = MLLogRenderer()
    records = list(written) if written is not None and len(written) == ledger.next_seq else read_ledger(run_dir)
    expected = [line for k, rec in enumerate(records) for line in renderer.lines(rec, _resumed(records, k))]
    have, _ = _complete_lines(path)
    keep = 0
    while keep < len(have) and keep < len(expected) and have[keep] == expected[keep]:
        keep += 1  # a resumed session's earlier run_stop becomes aiperf_session_stop: rewrite from there
    have = have[:keep]
    size = sum(len(line.encode()) + 1 for line in have)
    if path.exists():
        with open(path, "r+b") as fh:
            fh.truncate(size)  # drop a torn tail, or everything when the log disagrees with the ledger
    writer = MLLogWriter(path, renderer)
    writer.write(expected[len(have) :])
    ledger.subscribe(writer)
    return writer
