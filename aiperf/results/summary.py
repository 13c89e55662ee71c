"""The run summary: computed from the ledger alone, written atomically, printed for people.

Because the summary is a pure function of the ledger, ``aiperf verify`` can recompute it
and compare, and a run that was killed still gets a correct summary afterwards. The one
additions from outside the ledger are the ``telemetry`` section (utilisation) and the
``energy`` section (energy, OPS per watt and its methodology level, :mod:`aiperf.sampling.energy`),
computed from ``telemetry.jsonl`` when the run recorded one; they never enter the score,
but telemetry can add notes to the verdict (a machine shared with other work, see
:func:`aiperf.sampling.telemetry.shared_machine_notes`).

The summary's shape, key by key, is :class:`aiperf.results.summary_model.RunSummary`
(:class:`~aiperf.results.summary_model.DigestSummary` before telemetry and energy are added).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from aiperf.errors import AiperfError, os_error
from aiperf.ledger.files import write_atomic
from aiperf.ledger.inert import inert, inert_tree
from aiperf.ledger.schema import (
    BadImagesRecord,
    EpochRecord,
    Record,
    RecordType,
    RequeueRecord,
    RunStartRecord,
    RunStopRecord,
    TrialEndRecord,
    TrialStartRecord,
    TrialStatus,
    WorkerFailedRecord,
    WorkerRecord,
)
from aiperf.ledger.store import LEDGER_NAME, iter_ledger
from aiperf.metrics.rules import evaluate_rules
from aiperf.metrics.score import Score, ScoreTally, format_ops
from aiperf.metrics.steadiness import SteadinessDict, spread_rates, steadiness_of
from aiperf.results.device_time import (
    DeviceTime,
    compile_critical_fraction,
    engine_efficiency,
    format_device_time,
)
from aiperf.results.efficiency import NodeEpochs, efficiency_of, format_efficiency
from aiperf.results.size_pace import SizePace, format_size_pace
from aiperf.results.summary_model import (
    BadImagesSummary,
    BestTrial,
    DigestSummary,
    InputSummary,
    LanguageSummary,
    PlannedNodes,
    RunSummary,
    StartFailures,
    WorkerLife,
    WorkersSummary,
)
from aiperf.sampling.energy import (
    EnergySummary,
    TelemetrySample,
    TrialSpan,
    energy_by_trial,
    format_energy,
    not_measured,
    summarize_energy,
)
from aiperf.sampling.telemetry import (
    TELEMETRY_NAME,
    TelemetryBinding,
    TelemetrySummary,
    read_bound_telemetry,
    shared_machine_notes,
    summarize_telemetry,
)

SUMMARY_NAME = "summary.json"
# The largest summary.json a reader accepts: its per-worker section is about 250 B a worker, so
# 16.4 MB at 65,536 workers and 33 MB at 131,072 (the most a run may have; aiperf.config.MAX_WORKERS).
MAX_SUMMARY_BYTES = 64 * 2**20
STARVED_FRACTION = 0.10  # a worker waiting longer than this share of its step time for input is starved
BITS_PER_BYTE_SCALE = 8.0  # a language epoch's quality: 1 - bits_per_byte / 8 (raw bytes: 8 bits each)


def language_quality(bits_per_byte: float) -> float:
    """The quality a language epoch records as ``val_acc``: ``1 - bits_per_byte / 8``, clamped to [0, 1].

    What the search maximises and the score regulates, as top-1 accuracy is for an image run;
    ``aiperf verify`` holds each language epoch's ``val_acc`` to it.
    """
    return min(1.0, max(0.0, 1.0 - bits_per_byte / BITS_PER_BYTE_SCALE))


def is_language(start: RunStartRecord) -> bool:
    """Whether a run trains language models (``run_start.family``; ledgers before it are image runs)."""
    return start.family == "language"


class _Workers:
    """The ``worker`` records as the summary uses them, kept one at a time."""

    def __init__(self, keep_last: bool) -> None:
        self.count = 0
        self.fractions: list[float] = []
        self.steady: list[float] = []
        self.gaps: list[float] = []
        self.per_worker: dict[str, WorkerLife] = {}
        self.threads: set[int] = set()
        self.devices: dict[str, int] = {}
        self.keep_last = keep_last  # efficiency needs each worker's last record (its ceiling) when kinds are known
        self.last: dict[str, WorkerRecord] = {}

    def add(self, w: WorkerRecord) -> None:
        self.count += 1
        if w.busy_fraction is not None:
            self.fractions.append(w.busy_fraction)
        if w.steady_busy_fraction is not None:
            self.steady.append(w.steady_busy_fraction)
        if w.idle_gaps.mean_s is not None:
            self.gaps.append(w.idle_gaps.mean_s)
        self.per_worker[w.worker] = {
            "node": w.node,
            "busy_fraction": w.busy_fraction,
            "busy_s": w.busy_s,
            "compile_s": w.compile_s,
            "alive_s": w.alive_s,
            "idle_gap_mean_s": w.idle_gaps.mean_s,
        }
        if w.decode_threads:
            self.threads.add(w.decode_threads)
        key = f"{w.device.get('kind', '?')}: {w.device.get('name', '?')}"  # device: as the worker reported it
        self.devices[key] = self.devices.get(key, 0) + 1
        if self.keep_last:
            self.last.pop(w.worker, None)  # a worker's last record states its life (and keeps its place last)
            self.last[w.worker] = w


def _storage(start: RunStartRecord) -> str:
    """How the images were held: ``storage`` where the header says, else from ``streaming`` (older headers)."""
    dataset = start.dataset
    return dataset.storage or ("stream" if dataset.streaming else "memory")


def _header(records: list[Record], source: object) -> RunStartRecord:
    """The ``run_start`` record a ledger begins with (``read_ledger`` refuses any other ledger)."""
    if not records:
        raise AiperfError(f"{source}: the ledger has no complete record")
    start = records[0]
    if not isinstance(start, RunStartRecord):
        raise AiperfError(f"{source}: the ledger does not begin with a run_start record")
    return start


# arch_id, params, kind, lineage, flops.train_per_image (a language trial's train_per_token)
_BestInfo = tuple[str, int, str, list[str], float | None]


def _best_info(rec: TrialStartRecord, language: bool) -> _BestInfo:
    flops = rec.flops
    per_example = flops.train_per_token if language else flops.train_per_image
    return (rec.arch_id, rec.params, rec.kind, rec.lineage, per_example)


class RunDigest:
    """Everything the summary says, gathered one record at a time: :func:`summarize` without the ledger in memory.

    A ten-million-record ledger is read once, in file order, and what is kept grows with the
    run's trials, workers and nodes, not with its records (docs/ledger.md, "Reading a long ledger"):
    per trial a flag word in one dictionary and its architecture id; per epoch three floats for
    the steadiness windows (which need the run's end before they can be filled); per worker
    and per node their sums. Every figure is the one :func:`summarize` computed from the whole
    list before (the sums are taken in file order, as it took them).

    ``reread`` gives the records again from the start; it is needed only when the best epoch
    belongs to a trial that had already ended (a ledger no writer of ours produces), to find
    that trial's start.
    """

    _STARTED, _COMPLETED = 1, 2

    def __init__(self, source: object = "the ledger", reread: Callable[[], Iterable[Record]] | None = None) -> None:
        self.source = source
        self.reread = reread
        self.start: RunStartRecord | None = None
        self.count = 0
        self.last_hash = ""
        self.last_run: Record | None = None  # the latest record that is not an audit
        # score
        self.tally = ScoreTally(count_trials=False)  # the score's sums: one definition (compute_score's)
        self.epoch_end = 0.0
        self.epochs = 0
        self.trial_flags: dict[str, int] = {}
        self.started = self.completed = 0
        self.by_status: dict[str, int] = {}
        self.step_known = self.step_reused = 0  # completed trials whose step reuse is known, and those reused
        self.arch_ids: set[str] = set()
        self.trained_nodes: set[str] = set()  # the nodes trials started on
        # the best epoch and its trial
        self.best_key: tuple[float, int] | None = None
        self.best_epoch: EpochRecord | None = None
        self.best_info: _BestInfo | None = None
        self.open_info: dict[str, _BestInfo] = {}  # trials started and not ended: their first start's facts
        # precisions, in the order they first appear, with their first epoch (the precision rule's input)
        self.precision_epochs: dict[str, EpochRecord] = {}
        self.stop: RunStopRecord | None = None
        self.lo, self.hi, self.amount = array("d"), array("d"), array("d")  # each epoch's busy interval and ops
        self.node_epochs = NodeEpochs()
        self.device_time = DeviceTime()
        self.size_pace: SizePace | None = None
        self.spans: list[TrialSpan] = []  # each trial attempt's node and Unix time span (energy per trial)
        self._open_spans: dict[str, TrialSpan] = {}
        self.workers: _Workers | None = None
        self.wait: dict[str, list[float]] = {}  # worker -> [data_wait_s, train_s] of its measured epochs
        self.measured = 0
        self.bad_files: list[str] = []
        self.bad_missing = 0
        self.failed_count = 0
        self.first_failed: WorkerFailedRecord | None = None
        # a language run (run_start.family): tokens trained and evaluated, the lowest bits per byte
        self.language = False
        self.train_tokens = 0
        self.eval_tokens = 0
        self.best_bits: tuple[float, str, int] | None = None  # bits_per_byte, trial, epoch

    def add(self, rec: Record) -> None:
        if self.start is None:
            if not isinstance(rec, RunStartRecord):
                raise AiperfError(f"{self.source}: the ledger does not begin with a run_start record")
            self.start = rec
            self.workers = _Workers(keep_last=bool(rec.system.kinds))
            self.language = is_language(rec)
            self.size_pace = SizePace(rec)
        self.count += 1
        self.last_hash = rec.hash
        if rec.type != RecordType.AUDIT:
            self.last_run = rec
            self.tally.add(rec)
        if isinstance(rec, EpochRecord):
            self._epoch(rec)
        elif isinstance(rec, TrialStartRecord):
            assert self.size_pace is not None
            self.size_pace.add_start(rec)
            self._close_span(rec.trial, rec.wall)  # a re-queued attempt's start ends the attempt before
            if rec.node:
                self._open_spans[rec.trial] = {"trial": rec.trial, "node": rec.node, "start": rec.wall, "end": rec.wall}
                self.trained_nodes.add(rec.node)
            flags = self.trial_flags.get(rec.trial)
            if flags is None or not flags & self._STARTED:
                self.started += 1
                self.trial_flags[rec.trial] = (flags or 0) | self._STARTED
                self.open_info[rec.trial] = _best_info(rec, self.language)
            self.arch_ids.add(rec.arch_id)
        elif isinstance(rec, TrialEndRecord):
            self._close_span(rec.trial, rec.wall)
            status = rec.status.value
            self.by_status[status] = self.by_status.get(status, 0) + 1
            flags = self.trial_flags.get(rec.trial, 0)
            if rec.status == TrialStatus.COMPLETED and not flags & self._COMPLETED:
                self.completed += 1
                self.trial_flags[rec.trial] = flags | self._COMPLETED
            self.open_info.pop(rec.trial, None)
            if rec.step_reused is not None:
                self.step_known += 1
                self.step_reused += bool(rec.step_reused)
        elif isinstance(rec, WorkerRecord):
            assert self.workers is not None
            self.workers.add(rec)
        elif isinstance(rec, RequeueRecord):
            self._close_span(rec.trial, rec.wall)
        elif isinstance(rec, RunStopRecord):
            self.stop = rec
        elif isinstance(rec, BadImagesRecord):
            self.bad_files.extend(f for f in rec.files if f not in self.bad_files)
            self.bad_missing += len(rec.missing)
        elif isinstance(rec, WorkerFailedRecord):
            self.failed_count += 1
            if self.first_failed is None:
                self.first_failed = rec

    def _epoch(self, rec: EpochRecord) -> None:
        ops = float(rec.ops or 0.0)
        end = float(rec.t)
        self.epoch_end = max(self.epoch_end, end)
        self.epochs += 1
        if rec.val_acc is not None:  # required by the shape; a record built without validation may lack it
            key = (rec.val_acc, -rec.seq)
            if self.best_key is None or key > self.best_key:
                self.best_key, self.best_epoch = key, rec
                self.best_info = self.open_info.get(rec.trial)
        if rec.precision not in self.precision_epochs:
            self.precision_epochs[rec.precision] = rec
        busy = float(rec.train_s or 0.0) + float(rec.eval_s or 0.0)
        self.lo.append(max(0.0, end - busy))
        self.hi.append(end)
        self.amount.append(ops)
        self.node_epochs.add(rec)
        self.device_time.add_epoch(rec)
        if self.size_pace is not None:
            self.size_pace.add_epoch(rec)
        if self.language:
            self.train_tokens += rec.train_tokens or 0
            self.eval_tokens += rec.eval_tokens or 0
            bits = rec.bits_per_byte
            if bits is not None and (self.best_bits is None or bits < self.best_bits[0]):
                self.best_bits = (bits, rec.trial, rec.epoch)
        if rec.data_wait_s is not None:
            self.measured += 1
            wait_train = self.wait.setdefault(rec.worker or "?", [0.0, 0.0])
            wait_train[0] += rec.data_wait_s or 0.0
            wait_train[1] += rec.train_s or 0.0  # optional in the record's shape

    def _close_span(self, trial: str, wall: float) -> None:
        span = self._open_spans.pop(trial, None)
        if span is not None:
            span["end"] = max(span["start"], wall)
            self.spans.append(span)

    def trial_spans(self) -> list[TrialSpan]:
        """Every attempt's node and Unix time span; one still open ends at the ledger's last record."""
        end = self.last_run.wall if self.last_run is not None else 0.0
        still: list[TrialSpan] = [
            {"trial": s["trial"], "node": s["node"], "start": s["start"], "end": max(s["start"], end)}
            for s in self._open_spans.values()
        ]
        return [*self.spans, *still]

    def score(self) -> Score:
        """:func:`aiperf.metrics.score.compute_score` of the records added."""
        end = self.last_run if isinstance(self.last_run, RunStopRecord) else None  # the recorded end
        return replace(self.tally.score(end), trials_completed=self.completed, trials_started=self.started)

    def _best_trial(self) -> BestTrial | None:
        best = self.best_epoch
        if best is None:
            return None
        if not self.trial_flags.get(best.trial, 0) & self._STARTED:
            raise AiperfError(f"the ledger's best epoch (seq {best.seq}) belongs to a trial that never started")
        info = self.best_info
        if info is None and self.reread is not None:  # its trial had ended before it: find its start again
            ts = next(r for r in self.reread() if isinstance(r, TrialStartRecord) and r.trial == best.trial)
            info = _best_info(ts, self.language)
        if info is None:
            raise AiperfError(f"the ledger's best epoch (seq {best.seq}) belongs to a trial that never started")
        arch_id, params, kind, lineage, train_per_example = info
        out: BestTrial = {
            "trial": best.trial,
            "epoch": best.epoch,
            "val_acc": best.val_acc,
            "arch_id": arch_id,
            "params": params,
            "kind": kind,
            "lineage": lineage,
        }
        if self.language:
            out["flops_train_per_token"] = train_per_example
            out["bits_per_byte"] = best.bits_per_byte
        else:
            out["flops_train_per_image"] = train_per_example
        return out

    def _language_summary(self, score: Score) -> LanguageSummary:
        """A language run's tokens, their rate over the score's duration, and its best bits per byte."""
        best = self.best_bits
        return {
            "tokens": self.train_tokens,
            "eval_tokens": self.eval_tokens,
            "tokens_per_s": self.train_tokens / score.wall_s if score.wall_s > 0 else 0.0,
            "best_bits_per_byte": best[0] if best is not None else None,
            "best_bits_per_byte_trial": best[1] if best is not None else None,
            "best_bits_per_byte_epoch": best[2] if best is not None else None,
        }

    def _planned_nodes(self, planned: int | None) -> PlannedNodes:
        """The nodes the job was given and those trials ran on, where the run states a plan.

        Absent otherwise, so a summary.json written before 2026-12-07 still matches its recomputation.
        """
        return {} if planned is None else {"planned_nodes": planned, "trained_nodes": len(self.trained_nodes)}

    def summary(self) -> DigestSummary:
        """Everything the run claims: what :func:`summarize` returns for the records added."""
        start, workers = self.start, self.workers
        if start is None or workers is None:
            raise AiperfError(f"{self.source}: the ledger has no complete record")
        score = self.score()
        # The rules see the header, the first epoch of each precision (the precision rule keeps the weakest,
        # the first of equals) and the run's last record (the recorded end): all they read of the records.
        last = [self.last_run] if self.last_run is not None else []
        verdict = evaluate_rules([start, *self.precision_epochs.values(), *last], score, len(self.trained_nodes))
        width, rates = spread_rates(zip(self.lo, self.hi, self.amount, strict=True), self.epoch_end)
        steady = steadiness_of(width, rates, self.epochs)
        stop = self.stop
        dataset, plan = start.dataset, start.plan
        summary: DigestSummary = {
            "run_id": start.run_id,
            "name": start.config.run.name,
            "status": stop.status.value if stop else "running or killed",
            "stop_reason": stop.reason if stop else "no run_stop record: the master was killed",
            "dataset": {
                "name": dataset.name,
                "train_images": dataset.train_images,
                "eval_images": dataset.eval_images,
                "input_shape": dataset.input_shape,
                "num_classes": dataset.num_classes,
                "fingerprint": dataset.fingerprint,
            },
            "backend": plan.backend,
            "precision": sorted(self.precision_epochs),
            "devices": {
                "nodes": len(plan.nodes),
                **self._planned_nodes(plan.planned_nodes),
                "cpus": sum(n.cpus for n in plan.nodes),
                "gpus": sum(n.gpus for n in plan.nodes),
                "accelerators": sorted({n.accelerator for n in plan.nodes if n.accelerator}),
                "concurrency": plan.concurrency,
                "placement": plan.placement,
                "workers_by_device": workers.devices,
            },
            "score": {
                **score.to_dict(),
                "ops_human": format_ops(score.ops_per_s),
                "regulated_human": format_ops(score.regulated),
                "aiperf_regulated_human": format_ops(score.aiperf_regulated),
            },
            "steadiness": steady.to_dict() if steady is not None else None,
            "efficiency": efficiency_of(
                start, self.node_epochs, list(workers.last.values()), score.ops_per_s, score.wall_s
            ),
            "verdict": {**verdict.to_dict(), "headline": verdict.headline()},
            "trials": {
                "started": self.started,
                "by_status": self.by_status,
                "distinct_architectures": len(self.arch_ids),
                "epochs_counted": self.epochs,
            },
            "best": self._best_trial(),
            "workers": self._workers_summary(workers),
            "input": self._input_summary(start, workers),
            "bad_images": self._bad_images_summary(start),
            "worker_start_failures": self._start_failures(),
            "ledger": {"records": self.count, "last_hash": self.last_hash},
        }
        self._add_device_time(summary, plan.concurrency or workers.count, score.wall_s, workers)
        pace = self.size_pace.summary() if self.size_pace is not None else None
        if pace is not None and self.device_time.measured:  # from 2026-12-07, as device_time (old summaries verify)
            summary["size_pace"] = pace
        if self.language:  # an image run's summary keeps exactly its keys (published summaries still verify)
            summary["family"] = "language"
            dataset_section = summary["dataset"]
            dataset_section["train_tokens"] = dataset.train_tokens
            dataset_section["eval_tokens"] = dataset.eval_tokens
            dataset_section["vocab_size"] = dataset.vocab_size
            dataset_section["tokenizer"] = dataset.tokenizer
            dataset_section["bytes_per_token"] = dataset.bytes_per_token
            summary["language"] = self._language_summary(score)
        return summary

    def _add_device_time(self, summary: DigestSummary, slots: int, wall_s: float, w: _Workers) -> None:
        """Where the devices' time went (:mod:`aiperf.results.device_time`), where the epochs tell it.

        Ledgers whose epochs carry no ``compile_s`` get no such keys, so the summaries published
        with them still verify.
        """
        worker_s = sum(float(life["alive_s"] or 0.0) for life in w.per_worker.values())
        section = self.device_time.summary(slots, wall_s, worker_s)
        if section is None:
            return
        summary["device_time"] = section
        summary["efficiency"]["engine"] = engine_efficiency(section)
        summary["workers"]["compile_critical_fraction"] = compile_critical_fraction(section)
        for name, life in summary["workers"]["per_worker"].items():
            extra = self.device_time.worker(name)
            if extra is not None:  # the keys of aiperf.results.device_time.WorkerTime, in its order
                life["steady_s"] = extra["steady_s"]
                life["compile_critical_s"] = extra["compile_critical_s"]

    def _workers_summary(self, w: _Workers) -> WorkersSummary:
        return {
            "count": w.count,
            "busy_fraction_mean": sum(w.fractions) / len(w.fractions) if w.fractions else None,
            "busy_fraction_min": min(w.fractions) if w.fractions else None,
            # Busy time less each completed trial's compile_s (its first step and evaluation beyond ordinary ones).
            "steady_busy_fraction_mean": sum(w.steady) / len(w.steady) if w.steady else None,
            "idle_gap_mean_s": sum(w.gaps) / len(w.gaps) if w.gaps else None,
            # Completed trials whose worker reused a model it had compiled (no tracing, no compiling).
            "trials_step_reused": self.step_reused,
            "trials_step_known": self.step_known,
            "per_worker": w.per_worker,
        }

    def _input_summary(self, start: RunStartRecord, w: _Workers) -> InputSummary:
        """How long the training loops waited for input, overall and per worker (from the epoch records)."""
        per_worker = self.wait
        wait = sum(x for x, _ in per_worker.values())
        train = sum(t for _, t in per_worker.values())
        fractions = {k: (wt[0] / wt[1] if wt[1] > 0 else None) for k, wt in per_worker.items()}
        return {
            "storage": _storage(start),
            "epochs_measured": self.measured,
            "data_wait_s": wait,
            "train_s": train,
            "wait_fraction": wait / train if train > 0 else None,
            "per_worker_wait_fraction": fractions,
            "starved_workers": sorted(k for k, f in fractions.items() if f is not None and f > STARVED_FRACTION),
            "starved_threshold": STARVED_FRACTION,
            "decode_threads": sorted(w.threads),
        }

    def _bad_images_summary(self, start: RunStartRecord) -> BadImagesSummary:
        """Images skipped because they could not be decoded: at load time (in memory) and on the workers."""
        dataset = start.dataset
        at_load_count = dataset.bad_images.count if dataset.bad_images is not None else 0
        at_load_files = dataset.bad_images.files if dataset.bad_images is not None else []
        missing = dataset.bad_images.missing_count if dataset.bad_images is not None else 0
        count = at_load_count + len(self.bad_files)
        total = (dataset.train_images or 0) + (dataset.eval_images or 0) + at_load_count
        return {
            "count": count,
            "fraction": count / total if total else None,
            "files": (list(at_load_files) + self.bad_files)[:20],
            "max_fraction": start.config.dataset.max_bad_fraction,
            "missing": missing + self.bad_missing,
        }

    def _start_failures(self) -> StartFailures:
        first = self.first_failed
        return {
            "count": self.failed_count,
            "first": (
                {"worker": first.worker, "hostname": first.hostname, "node": first.node, "cause": first.cause}
                if first is not None
                else None
            ),
        }


def summarize(records: Iterable[Record], source: object = "the ledger") -> DigestSummary:
    """Everything the run claims, derived from its ledger records (as ``read_ledger`` returns them)."""
    records = records if isinstance(records, list) else list(records)
    _header(records, source)
    digest = RunDigest(source, reread=lambda: records)
    for rec in records:
        digest.add(rec)
    return digest.summary()


def build_summary(
    run_dir: str | Path, records: list[Record] | None = None, digest: RunDigest | None = None
) -> RunSummary:
    """The summary of ``run_dir``: its ledger's summary plus its telemetry, if it has any.

    The ledger is read one record at a time (:class:`RunDigest`) unless ``records`` or a
    ``digest`` already fed with them is given.
    """
    run_dir = Path(run_dir)
    source = run_dir / LEDGER_NAME
    if digest is None:
        if records is not None:
            _header(records, source)
            digest = RunDigest(source, reread=lambda: records)
            for rec in records:
                digest.add(rec)
        else:
            digest = RunDigest(source, reread=lambda: iter_ledger(run_dir))
            for rec in iter_ledger(run_dir):
                digest.add(rec)
    ledger_summary = digest.summary()
    start = digest.start
    assert start is not None  # summary() refused a ledger without one
    stop = digest.stop
    binding = (
        TelemetryBinding(stop.telemetry_bytes, stop.telemetry_sha256)
        if stop is not None and stop.telemetry_bytes is not None and stop.telemetry_sha256 is not None
        else None
    )
    telemetry = read_bound_telemetry(run_dir, binding)
    samples = telemetry.samples
    utilisation = None
    if samples:
        interval = start.config.run.telemetry_interval_s
        utilisation = summarize_telemetry(samples, interval)
        notes = shared_machine_notes(utilisation)
        if notes:  # additive: the rules' verdict stands; the notes say what it was measured beside
            verdict = ledger_summary["verdict"]
            verdict["notes"] = notes
            verdict["headline"] = f"{verdict['headline']}; {'; '.join(notes)}"
    if telemetry.bound is False:
        energy = not_measured(
            f"{TELEMETRY_NAME} is not what the ledger's run_stop binds (edited or cut after the run): not used"
        )
    else:
        energy = energy_section(ledger_summary, samples, [start], source)
    if telemetry.bound is not None:  # from 2026-12-07: the list ranks energy only from bound telemetry
        energy["bound"] = telemetry.bound
    if samples and energy.get("readings_per_s") is not None:  # from 2026-12-07: nodes' power threads
        trials = energy_by_trial(samples, digest.trial_spans())
        if trials is not None:
            energy["trials"] = trials
    # The ledger's keys first, then telemetry (where there are samples) and energy, as they were always added.
    if utilisation is not None:
        return {**ledger_summary, "telemetry": utilisation, "energy": energy}
    return {**ledger_summary, "energy": energy}


def energy_section(
    summary: DigestSummary, samples: Sequence[TelemetrySample], records: list[Record], source: object
) -> EnergySummary:
    """The ``energy`` section: the run's OPS per watt with its sources and methodology level, or why there is none.

    Of ``records`` only the first, the ``run_start``, is read.
    """
    if not samples:
        return not_measured("no telemetry recorded")
    start = _header(records, source)
    nodes = start.plan.nodes
    hosts = len({n.hostname for n in nodes}) if all(n.hostname for n in nodes) else len(nodes)
    score = summary["score"]
    return summarize_energy(
        samples,
        ops_per_s=score["ops_per_s"],
        wall_s=score["wall_s"],
        run_hosts=hosts,
        interval_s=start.config.run.telemetry_interval_s,
        run_start_wall=start.wall,
    )


def save_summary(run_dir: str | Path, summary: RunSummary) -> Path:
    """Write ``summary.json`` atomically; a write that fails is an :class:`AiperfError` (exit 1) naming it."""
    path = Path(run_dir) / SUMMARY_NAME
    try:
        write_atomic(path, (json.dumps(summary, indent=2, sort_keys=True) + "\n").encode())
    except OSError as exc:
        raise os_error(exc, path, "write", exit_code=1) from None
    return path


def write_summary(run_dir: str | Path) -> RunSummary:
    """Recompute the summary from ``run_dir``'s ledger and write ``summary.json`` atomically."""
    summary = build_summary(run_dir)
    save_summary(run_dir, summary)
    return summary


def format_summary(summary: RunSummary, run_dir: str | Path) -> str:
    """The result block printed at the end of a run.

    Every string in it is made inert first: a run id, host name or reason read from a ledger
    cannot print a line of its own, move the cursor or reorder the line.
    """
    summary = inert_tree(summary)
    s, v = summary["score"], summary["verdict"]
    acc = s.get("best_val_acc")
    language = summary.get("language")
    devices = summary["devices"]
    where = ", ".join(f"{n} x {k}" for k, n in devices["workers_by_device"].items()) or "no workers recorded"
    planned_nodes = devices.get("planned_nodes")  # absent from summaries written before 2026-12-07
    planned = (
        f" (trials on {devices.get('trained_nodes')} of the {planned_nodes} planned)"
        if planned_nodes is not None
        else ""
    )
    lines = [
        f"aiperf result: run {summary['run_id']} ({summary['name']}), {summary['status']}",
        f"  score (OPS)          {s['ops_human']}  = {format_ops(s['total_ops'], 'OP')} counted"
        f" over {s['wall_s']:.1f} s",
        f"  regulated score      {s['regulated_human']}  = OPS x |ln(1 - {acc if acc is not None else 0:.4f})|",
        f"  AIPerf-compatible    {s['aiperf_regulated_human']}  (regulated, AIPerf's FLOP conventions)"
        if language is None
        else "  AIPerf-compatible    - (AIPerf's conventions count images: none in a language run)",
        f"  steadiness           {format_steadiness(summary.get('steadiness'))}",
        format_best(summary),
        f"  trials               {summary['trials']['started']} started "
        f"({format_statuses(summary['trials']['by_status'])}),"
        f" {summary['trials']['distinct_architectures']} distinct architectures, "
        f"{summary['trials']['epochs_counted']} epochs counted",
        f"  devices              {devices['concurrency']} concurrent trials on {devices['nodes']} node(s)"
        f"{planned}: {where};"
        f" backend {summary['backend']}, precision {', '.join(summary['precision']) or '-'}",
        f"  efficiency           {format_efficiency(summary.get('efficiency'))}",
        f"  verdict              {v['headline']}",
    ]
    if language is not None:  # beside the score: the same duration divides both
        lines.insert(2, f"  tokens               {format_tokens(language, s['wall_s'])}")
    if summary["status"] == "failed":
        lines.insert(1, f"  failed because       {summary.get('stop_reason')}")
    workers = summary["workers"]  # summarize always writes it, as the sections below
    if workers.get("busy_fraction_mean") is not None:
        lines.insert(-1, f"  workers              {format_workers(workers)}")
    device_time = format_device_time(summary.get("device_time"))
    if device_time is not None:
        engine = summary["efficiency"].get("engine")
        lines.insert(-1, f"  device time          {device_time}")
        if engine is not None:
            lines.insert(-1, f"  engine efficiency    {100 * engine:.1f} % (OPS over slots x steady device rate)")
    failures = summary.get("worker_start_failures") or {}
    if failures.get("count"):
        first = failures["first"]
        assert first is not None  # the writer keeps the first failure whenever it counts one
        lines.insert(
            -1,
            f"  workers not started  {failures['count']}, e.g. worker {first['worker']} on node "
            f"{first.get('hostname') or first.get('node')}: {first['cause']}",
        )
    pace = format_size_pace(summary.get("size_pace"))
    if pace is not None:
        lines.insert(-1, f"  size schedule        {pace}")
    for line in format_input(summary["input"], summary["bad_images"]):
        lines.insert(-1, line)
    telemetry = summary.get("telemetry")
    if telemetry:
        lines.append(f"  telemetry            {format_telemetry(telemetry)}")
    if summary.get("energy"):
        lines.append(f"  energy               {format_energy(summary['energy'])}")
    lines.append(f"  results              {inert(run_dir)}")
    return "\n".join(lines)


def format_statuses(by_status: dict[str, int]) -> str:
    """``2 completed, 1 stopped``: how the trials ended, for people (summary.json keeps the counts)."""
    return ", ".join(f"{n} {status}" for status, n in sorted(by_status.items(), key=lambda kv: -kv[1])) or "none ended"


def format_best(summary: RunSummary) -> str:
    """The best epoch's line: its top-1 accuracy, or a language run's bits per byte and the quality they give."""
    acc = summary["score"].get("best_val_acc")
    best: BestTrial | dict[str, object] = summary.get("best") or {}
    language = summary.get("language")
    if language is not None:
        bits = language.get("best_bits_per_byte")
        if acc is None or bits is None:
            return "  best bits per byte   - (no epoch completed)"
        where = f"validation, trial {language.get('best_bits_per_byte_trial')}"
        if language.get("best_bits_per_byte_trial") == best.get("trial"):
            where += f", {best.get('params', 0):,} params"
        return f"  best bits per byte   {bits:.4f} ({where}; quality 1 - bits per byte / 8 = {acc:.4f})"
    if acc is None:
        return "  best val accuracy    - (no epoch completed)"
    return f"  best val accuracy    {acc:.4f} (trial {best.get('trial')}, {best.get('params', 0):,} params)"


def format_rate(value: float, unit: str) -> str:
    """``12.3 k tokens/s``: three significant digits with an SI prefix, the unit a word apart."""
    return f"{format_ops(value, '').rstrip()} {unit}"


def format_tokens(language: LanguageSummary, wall_s: float) -> str:
    """One line: a language run's tokens trained and their rate over the score's duration."""
    return (
        f"{format_rate(language['tokens_per_s'], 'tokens/s')}  = {format_rate(language['tokens'], 'tokens')}"
        f" trained over {wall_s:.1f} s ({format_rate(language['eval_tokens'], 'tokens')} evaluated)"
    )


def format_steadiness(steady: SteadinessDict | None) -> str:
    """One line: the steady part's OPS, its spread across windows and the 95 % interval of its mean."""
    if not steady:
        return "- (too few epochs to tell)"
    return (
        f"{format_ops(steady['steady_ops_per_s'])} +/- {100 * steady['half_width']:.1f} % (95 %) after start-up;"
        f" windows of {steady['window_s']:.0f} s vary {100 * steady['window_cv']:.1f} %"
        f" ({format_ops(steady['window_min_ops_per_s'])} to {format_ops(steady['window_max_ops_per_s'])})"
    )


def format_workers(w: WorkersSummary) -> str:
    """One line: how much of the workers' lives went into training and evaluation steps (once measured)."""
    busy, steady = w["busy_fraction_mean"], w.get("steady_busy_fraction_mean")
    assert busy is not None  # the caller prints this line only when it was measured
    text = f"{w['count']} worker(s), {100 * busy:.0f}% of their time in train/eval steps"
    if steady is not None:
        text += f" ({100 * steady:.0f}% excluding compilation)"
    if w.get("idle_gap_mean_s") is not None:
        text += f", {w['idle_gap_mean_s']:.2f} s mean gap between trials"
    if w.get("trials_step_known"):
        text += f", {w['trials_step_reused']} of {w['trials_step_known']} trials on an already compiled step"
    return text


def format_input(inp: InputSummary, bad: BadImagesSummary) -> list[str]:
    """The input pipeline's lines: share of step time spent waiting, starved workers, skipped images."""
    lines = []
    wait_fraction = inp.get("wait_fraction")
    if wait_fraction is not None:
        how = "streamed" if inp.get("storage") == "stream" else "resident arrays"
        if inp.get("decode_threads"):
            how += f", {'/'.join(str(t) for t in inp['decode_threads'])} decode thread(s) per worker"
        lines.append(f"  input pipeline       {100 * wait_fraction:.0f} % of step time waiting ({how})")
    if inp.get("starved_workers"):
        starved = inp["starved_workers"]
        lines.append(
            f"  input warning        {len(starved)} worker(s) waited more than "
            f"{100 * inp['starved_threshold']:.0f} % of their step time for input ({', '.join(starved[:4])}"
            f"{', ...' if len(starved) > 4 else ''}): the input pipeline limits this run; give each worker more "
            "CPU cores (dataset.decode_threads, cluster.cpus_per_trial) or hold the data in memory"
        )
    if bad.get("count"):
        from aiperf.datasets.bad_images import name_a_few

        fraction = bad.get("fraction")
        share = f" ({100 * fraction:.2f} % of the images)" if fraction is not None else ""
        missing = bad.get("missing") or 0
        why = "cannot be decoded" if not missing else f"{missing} missing (deleted since the run began)"
        if missing and missing < bad["count"]:
            why += f", {bad['count'] - missing} cannot be decoded"
        lines.append(
            f"  bad images           {bad['count']} skipped, {why}{share}: {name_a_few(bad['files'], bad['count'])}"
        )
    return lines


def format_telemetry(t: TelemetrySummary) -> str:
    """One line: utilisation where it was measured (energy has its own line, :func:`format_energy`)."""
    parts = [f"{t['samples']} samples from {t['nodes']} node(s)"]
    if t.get("accelerator_util_mean_percent") is not None:
        parts.append(f"accelerators {t['accelerator_util_mean_percent']:.0f}% busy")
    if t.get("cpu_util_mean_percent") is not None:
        parts.append(f"CPU {t['cpu_util_mean_percent']:.0f}% busy")
    if t.get("nodes_lost"):
        parts.append(f"{len(t['nodes_lost'])} node(s) stopped answering")
    return ", ".join(parts)
