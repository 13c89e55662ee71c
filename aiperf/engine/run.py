"""One benchmark run from config to summary: data, cluster, plan, search, ledger, result.

Also continues a run whose master died (``resume_run``): the search state is rebuilt by
replaying the ledger into the proposer, the kept parent weights are reloaded from the run
directory, and the clock continues from the ledger's last ``t`` plus the downtime gap
(the gap is counted as wall time: a master crash costs the score, it cannot inflate it).
"""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from aiperf.config import Config, config_from_dict
from aiperf.datasets import Dataset, load_dataset
from aiperf.engine.output import Output, output
from aiperf.engine.weights import WeightStore
from aiperf.errors import AiperfError, excerpt, os_error
from aiperf.record.files import remove_temporaries
from aiperf.record.ledger import LEDGER_NAME, LedgerWriter, read_raw_ledger
from aiperf.record.schema import (
    BadImagesRecord,
    ConfigHeader,
    DatasetHeader,
    EpochRecord,
    PlanHeader,
    Record,
    RecordType,
    ResumeRecord,
    RulesHeader,
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
from nas.graph import Graph
from nas.morph import Morph
from nas.proposer import Proposer, TrialKind, TrialProposal
from nas.serialize import graph_from_dict

if TYPE_CHECKING:
    from aiperf.cluster.resources import NodeInfo
    from aiperf.engine.master import Master
    from aiperf.record.runlock import RunLock
    from nas.search import SearchSettings

WEIGHTS_DIR = "weights"
COMPILE_CACHE_DIR = "compile-cache"  # the backends' persistent compiled executables, one folder per node


def new_run_id(name: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:40]
    return f"{stamp}-{safe}-{secrets.token_hex(2)}"


def seed_architecture(cfg: Config, dataset: Dataset) -> Graph:
    """The search's starting architecture, sized to the dataset's images and classes.

    It always carries a dropout layer before its classifier (inserted if the architecture
    has none), so the searched dropout rate reaches every trial.
    """
    return _seed_graph(cfg, dataset).with_dropout(cfg.train.dropout, ensure=True)


def _seed_graph(cfg: Config, dataset: Dataset) -> Graph:
    from nas import serialize, zoo

    name = cfg.model.seed_architecture
    try:
        if name.endswith(".json") or os.sep in name:
            graph = serialize.load(name)
            if tuple(graph.input_shape) != tuple(dataset.input_shape) or graph.num_classes != dataset.num_classes:
                raise AiperfError(
                    f"model.seed_architecture: {name} takes {graph.input_shape} images and {graph.num_classes} classes,"
                    f" but the dataset has {tuple(dataset.input_shape)} and {dataset.num_classes}"
                )
            return graph
        if name == "small_resnet":
            return zoo.small_resnet(
                dataset.input_shape, dataset.num_classes, width=cfg.model.width, dropout=cfg.train.dropout
            )
        return zoo.by_name(name, dataset.input_shape, dataset.num_classes)
    except NasError as exc:
        raise AiperfError(f"model.seed_architecture: {exc}") from None


def software_versions(backend: str) -> dict[str, str]:
    """Versions from package metadata (cheap: the master never imports the framework)."""
    out = {"python": platform.python_version(), "backend": backend}
    for pkg in ("aiperf", "keras", "tensorflow", "jax", "jaxlib", "torch", "ray", "numpy", "optuna"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return out


def _search_settings(cfg: Config, plan_batch: int) -> SearchSettings:
    from nas.hpo import HyperparameterSpace
    from nas.search import SearchSettings

    h = cfg.hpo
    batch_sizes = sorted({b for b in h.batch_sizes if b <= cfg.train.max_batch_size}) or [plan_batch]
    space = HyperparameterSpace(
        learning_rate=h.learning_rate,
        weight_decay=h.weight_decay,
        dropout=h.dropout,
        batch_sizes=tuple(batch_sizes),
        kernel_sizes=tuple(h.kernel_sizes),
        epochs=h.epochs,
    )
    defaults = {
        "learning_rate": cfg.train.learning_rate,
        "batch_size": plan_batch,
        "weight_decay": cfg.train.weight_decay,
        "dropout": cfg.train.dropout,
        "kernel_size": cfg.train.kernel_size,
        "epochs": cfg.train.epochs_per_trial,
    }
    s = cfg.search
    return SearchSettings(
        strategy=s.strategy,
        seed=cfg.run.seed,
        ucb_beta=s.ucb_beta,
        retune_fraction=s.retune_fraction,
        max_morphs_per_child=s.max_morphs_per_child,
        gp_window=s.gp_window,
        candidates=s.candidates,
        default_hparams=defaults,
        hparam_space=space,
    )


def make_search(cfg: Config, seed_graph: Graph, plan_batch: int) -> Proposer:
    """The proposer for this config: BO or random architecture search interleaved with TPE."""
    from aiperf.metrics.flops import count_flops
    from nas.limits import Limits
    from nas.search import make_proposer

    limits = Limits(
        cfg.search.max_layers,
        cfg.search.max_params,
        cfg.search.max_flops_per_image,
        flops_fn=lambda g: count_flops(g).train_per_image(plan_batch),
    )
    reason = limits.reason(seed_graph)
    if reason:
        raise AiperfError(f"the seed architecture is already over a search limit: {reason}")
    return make_proposer(_search_settings(cfg, plan_batch), seed_graph, limits)


def _proposal_from_record(rec: TrialStartRecord) -> TrialProposal:
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


class _Signals:
    """SIGTERM asks the master to stop cleanly; a second one exits at once."""

    def __init__(self) -> None:
        self.master: Master | None = None
        self.count = 0

    def __enter__(self) -> _Signals:
        import signal

        self._old = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.master is not None and self.count == 1:
            self.master.request_stop("terminated (SIGTERM)")
        else:
            raise SystemExit(143)

    def __exit__(self, *exc: object) -> None:
        import signal

        signal.signal(signal.SIGTERM, self._old)


def _system(nodes: list[NodeInfo]) -> dict[str, Any]:
    return {"head": platform.node(), "platform": platform.platform(), "nodes": [n.to_dict() for n in nodes]}


def prepare_results_dir(results_dir: str | Path) -> Path:
    """Create ``run.results_dir`` if needed and check it can take a run, before anything slow starts."""
    path = Path(results_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(exc, path, "create run.results_dir", then="set another with --set run.results_dir=DIR") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise AiperfError(f"run.results_dir {path}: not writable; set another with --set run.results_dir=DIR")
    return path


def create_run_dir(results_dir: Path, name: str, attempts: int = 50) -> tuple[str, Path]:
    """A new, empty run directory: never one that exists (a run-id collision draws another id)."""
    for _ in range(attempts):
        run_id = new_run_id(name)
        run_dir = results_dir / run_id
        try:
            run_dir.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise os_error(exc, run_dir, "create the run directory") from None
        return run_id, run_dir
    raise AiperfError(f"{results_dir}: no free run id after {attempts} tries")


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
    config_from_dict(raw[0]["config"])
    return records


def _warner(stream: Output) -> Callable[[str], None]:
    def warn(message: str) -> None:
        print(f"aiperf: warning: {message}", file=stream)

    return warn


def run_benchmark(
    cfg: Config | None,
    *,
    address: str | None = None,
    out: TextIO | Output | None = None,
    resume_dir: str | Path | None = None,
    err: TextIO | Output | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Run (or resume) the benchmark; returns the run directory and its summary.

    The run directory is locked for the master's lifetime (:mod:`aiperf.record.runlock`);
    nothing it prints can stop or stall it (:class:`~aiperf.engine.output.Output`).
    """
    from aiperf.record.runlock import RunLock, takeover_note
    from aiperf.training.backend import check_backend_installed

    out = output(out if out is not None else sys.stdout, background=True)
    errors = output(err if err is not None else sys.stderr, background=True)
    warn = _warner(errors)
    locks: list[RunLock] = []
    try:
        if resume_dir is None:
            if cfg is None:
                raise AiperfError("run_benchmark needs a config or a run directory to resume")
            check_backend_installed(cfg.model.backend)  # before anything is created on disk
            prepare_results_dir(cfg.run.results_dir)
            return _run(cfg, address, out, warn, None, [], locks)
        run_dir = Path(resume_dir)
        if not (run_dir / LEDGER_NAME).is_file():
            raise AiperfError(f"--resume {run_dir}: not a run directory (no {LEDGER_NAME})")
        locks.append(RunLock(run_dir).acquire("aiperf run --resume"))  # before the ledger is read for appending
        note = takeover_note(locks[0].previous)
        if note:
            print(f"aiperf: {note}", file=out)
        previous = read_resumable(run_dir)
        for folder in (run_dir, run_dir / WEIGHTS_DIR):
            remove_temporaries(folder)
        config = run_start(previous).config.model_dump(exclude_unset=True)
        return _run(config_from_dict(config), address, out, warn, run_dir, previous, locks)
    finally:
        for lock in locks:
            lock.release()
        # Give the last lines a moment to reach a slow reader; a reader that stopped reading
        # does not hold the process (the run is complete by now).
        out.drain()
        errors.drain(2.0)


def _run(
    cfg: Config,
    address: str | None,
    out: Output,
    warn: Callable[[str], None],
    run_dir: Path | None,
    previous: list[Record],
    locks: list[RunLock],
) -> tuple[Path, dict[str, Any]]:
    """The run itself; a new run's directory is created and locked here (its lock appended to ``locks``)."""
    from aiperf.cluster.plan import format_plan
    from aiperf.cluster.pool import RayWorkerPool
    from aiperf.cluster.ray_session import start_ray
    from aiperf.cluster.resources import cluster_nodes
    from aiperf.engine.master import Master, MasterSettings
    from aiperf.engine.progress import Progress
    from aiperf.record.runlock import RunLock
    from aiperf.record.summary import build_summary, format_summary, save_summary
    from aiperf.record.telemetry import TelemetryRecorder
    from aiperf.training.backend import check_backend_installed

    check_backend_installed(cfg.model.backend)
    dataset = load_dataset(cfg.dataset)
    if previous and dataset.fingerprint() != run_start(previous).dataset.fingerprint:
        raise AiperfError(f"{run_dir}: the dataset on this machine differs from the one the run started with")
    seed_graph = seed_architecture(cfg, dataset)
    print(
        f"aiperf: dataset {dataset.name}: {dataset.train_size} train / {dataset.val_size} validation images "
        f"{tuple(dataset.input_shape)}, {dataset.num_classes} classes ({dataset.source})",
        file=out,
    )
    session = start_ray(address or cfg.cluster.address)
    try:
        nodes = cluster_nodes(probe=True)
        if not nodes:
            raise AiperfError("the Ray cluster has no alive nodes")
        from aiperf.cluster.plan import make_plan

        plan = make_plan(nodes, cfg)
        if not plan.slots:
            raise AiperfError("the cluster has no room for a single trial (no CPUs or GPUs Ray can schedule)")
        print(format_plan(plan), file=out)
        if dataset.streaming:
            from aiperf.cluster.dataset_check import check_nodes_see_dataset

            training = {s.node_id for s in plan.slots}
            check_nodes_see_dataset(
                [n for n in nodes if n.node_id in training], cfg.dataset.name, dataset.source, dataset.meta["census"]
            )
        proposer = make_search(cfg, seed_graph, plan.batch_size)
        if previous:
            run_id = run_start(previous).run_id
            assert run_dir is not None
        else:
            run_id, run_dir = create_run_dir(Path(cfg.run.results_dir), cfg.run.name)
            locks.append(RunLock(run_dir).acquire("aiperf run"))
        weights = WeightStore(cfg.cluster.keep_weights, run_dir / WEIGHTS_DIR)
        weights.on_warning = warn
        offset = 0.0
        first_trial = 0
        unfinished: list[str] = []
        if previous:
            gap = max(0.0, time.time() - previous[-1].wall)
            offset = previous[-1].t + gap
            first_trial, unfinished = _restore(previous, proposer, weights)
        ledger = LedgerWriter(run_dir, clock_offset=offset)
        ledger.on_warning = warn
        if previous:
            ledger.append(
                ResumeRecord(
                    gap_s=offset - previous[-1].t,
                    from_seq=previous[-1].seq,
                    plan=plan.to_dict(),
                    system=_system(nodes),
                )
            )
            for trial in unfinished:  # their in-memory checkpoints died with the old master
                ledger.append(
                    TrialEndRecord(
                        trial=trial,
                        status=TrialStatus.LOST,
                        reason="the master stopped while it ran",
                        epochs=None,
                        best_val_acc=None,
                    )
                )
                proposer.forget(trial)
        else:
            ledger.append(
                RunStartRecord(
                    run_id=run_id,
                    config=ConfigHeader(**cfg.to_dict()),
                    versions=software_versions(cfg.model.backend),
                    system=_system(nodes),
                    plan=PlanHeader(**plan.to_dict()),
                    dataset=DatasetHeader(**dataset.describe(), fingerprint=dataset.fingerprint()),
                    rules=RulesHeader(**cfg.rules.model_dump()),
                    seed_architecture=seed_graph.to_dict(),
                )
            )
        _attach_observers(run_dir, ledger)
        print(
            f"aiperf: run {run_id}: searching for {cfg.run.time_budget_s:g} s; ledger {run_dir / LEDGER_NAME}",
            file=out,
        )
        pool = RayWorkerPool(cfg, dataset, nodes, compile_cache=str(run_dir / COMPILE_CACHE_DIR))
        progress = Progress(cfg.run.progress_interval_s, cfg.run.time_budget_s, out)
        settings = MasterSettings.from_config(cfg, dataset_images=dataset.train_size + dataset.val_size)
        master = Master(
            settings,
            proposer,
            pool,
            ledger,
            weights,
            progress,
            first_trial=first_trial,
            epochs_before=len(of_type(previous, EpochRecord)),
        )
        master.bad_images.update(f for r in of_type(previous, BadImagesRecord) for f in r.files)
        telemetry = TelemetryRecorder(run_dir, cfg.run.telemetry_interval_s)
        telemetry.on_warning = warn
        with _Signals() as signals:
            signals.master = master
            telemetry.start(nodes)
            try:
                outcome = master.run()
            except BaseException as exc:
                if ledger.broken is None:
                    with contextlib.suppress(AiperfError):
                        ledger.append(
                            RunStopRecord(status=RunStatus.FAILED, reason=f"{type(exc).__name__}: {exc}"[:500])
                        )
                raise
            finally:
                telemetry.stop()
        progress.close()
        ledger.append(RunStopRecord(status=outcome.status, reason=outcome.reason))
        ledger.close()
    finally:
        session.shutdown()
    if out.failure is not None:
        warn(f"progress output stopped ({_reason(out.failure)}); the run went on and its results are complete")
    elif out.dropped:
        warn(f"{out.dropped} progress line(s) dropped: standard output was not being read")
    summary = build_summary(run_dir)
    unsaved: AiperfError | None = None
    try:
        save_summary(run_dir, summary)
    except AiperfError as exc:
        unsaved = exc
    _after_run(run_dir, out)
    print(format_summary(summary, run_dir), file=out)
    if unsaved is not None:
        raise AiperfError(
            f"{unsaved}; the run {summary['status']} and its ledger is complete: "
            f"`aiperf summary {run_dir}` writes the summary once that is fixed",
            exit_code=1,
        )
    return run_dir, summary


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__


def _restore(records: list[Record], proposer: Proposer, weights: WeightStore) -> tuple[int, list[str]]:
    """Replay a ledger into a fresh proposer; returns the next trial number and the unfinished trials.

    The records have passed their models' checks; what can still be
    wrong (an architecture that does not parse, a trial restored twice) is reported as one
    line naming the record.
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
            proposer.restore(trial, _proposal_from_record(rec), best.get(trial), done)
            if trial in final and not done:  # failed, lost or stopped: no longer pending
                proposer.forget(trial)
        except (NasError, AiperfError, KeyError, TypeError, ValueError) as exc:
            detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise AiperfError(
                f"cannot resume: the ledger's seq {rec.seq} (trial_start {excerpt(trial)}) cannot be replayed: {detail}"
            ) from None
    weights.reload({t: best.get(t, 0.0) for t, s in final.items() if s == TrialStatus.COMPLETED})
    numbers = [int(t[1:]) for t in starts if t[1:].isdigit() and len(t) < 12]
    unfinished = [t for t in starts if t not in final]
    return max(numbers, default=-1) + 1, unfinished


def run_start(records: list[Record]) -> RunStartRecord:
    """A checked ledger's first record (``parse_records`` refuses a ledger that begins otherwise)."""
    first = records[0]
    if not isinstance(first, RunStartRecord):
        raise AiperfError("the ledger does not begin with a run_start record")
    return first


def _attach_observers(run_dir: Path, ledger: LedgerWriter) -> None:
    """Hook the per-record writers (the MLPerf-style log) onto the ledger."""
    from aiperf.record.mllog import attach as attach_mllog

    attach_mllog(run_dir, ledger)


def _after_run(run_dir: Path, out: Output) -> None:
    """Write the HTML report next to the summary; a report that cannot be drawn never fails the run."""
    from aiperf.record.report import write_report

    try:
        path = write_report(run_dir)
        print(f"aiperf: report {path}", file=out, flush=True)
    except AiperfError as exc:
        print(f"aiperf: report not written: {exc}", file=out, flush=True)
