"""One benchmark run from config to summary: data, cluster, plan, search, run directory, result.

``aiperf run`` and ``aiperf run --resume`` come here; the run itself (header, ledger, master,
end) is put together by :mod:`aiperf.engine.assembly`, the search by :mod:`aiperf.engine.search`,
and a resumed run's state is rebuilt by :mod:`aiperf.engine.resume`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from aiperf.config import Config
from aiperf.datasets import Dataset
from aiperf.engine.output import Output, output
from aiperf.engine.resume import Records, ResumePoint, read_resumable, recorded_config, replay, run_start
from aiperf.engine.search import make_lm_search, make_search
from aiperf.engine.weights import WeightStore
from aiperf.errors import AiperfError, os_error
from aiperf.families import family_for
from aiperf.ledger.files import remove_temporaries
from aiperf.ledger.inert import inert
from aiperf.ledger.schema import DatasetHeader, RunStartRecord
from aiperf.ledger.store import LEDGER_NAME
from aiperf.logs import through
from nas.language.spec import TransformerSpec

if TYPE_CHECKING:
    from aiperf.cluster.plan import Plan
    from aiperf.cluster.resources import NodeInfo
    from aiperf.cluster.workload_choice import WorkloadChoice
    from aiperf.engine.master import Master
    from aiperf.engine.weights import AnyWeights
    from aiperf.families.language.data import LanguageData
    from aiperf.ledger.runlock import RunLock
    from aiperf.results.summary_model import RunSummary
    from aiperf.sampling.telemetry import TelemetryRecorder
    from nas.graph import Graph
    from nas.proposer import Proposer

logger = logging.getLogger(__name__)

WEIGHTS_DIR = "weights"
COMPILE_CACHE_DIR = "compile-cache"  # the backends' persistent compiled executables, one folder per node


def new_run_id(name: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:40]
    return f"{stamp}-{safe}-{secrets.token_hex(2)}"


class _Signals:
    """SIGTERM asks the master to stop cleanly; a second one exits at once."""

    def __init__(self) -> None:
        self.master: Master | None = None
        self.telemetry: TelemetryRecorder | None = None
        self.count = 0

    def __enter__(self) -> _Signals:
        import signal

        self._old = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.master is not None and self.count == 1:
            self.master.request_stop("terminated (SIGTERM)")
            if self.telemetry is not None:
                self.telemetry.run_stopping()
        else:
            raise SystemExit(143)

    def __exit__(self, *exc: object) -> None:
        import signal

        signal.signal(signal.SIGTERM, self._old)


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


def run_benchmark(
    cfg: Config | None,
    *,
    address: str | None = None,
    out: TextIO | Output | None = None,
    resume_dir: str | Path | None = None,
    err: TextIO | Output | None = None,
    choice: WorkloadChoice | None = None,
) -> tuple[Path, RunSummary]:
    """Run (or resume) the benchmark; returns the run directory and its summary.

    ``choice``: how ``cfg`` was chosen for this host where no ``--config`` was named (the plan says).

    The run directory is locked for the master's lifetime (:mod:`aiperf.ledger.runlock`);
    nothing it prints can stop or stall it (:class:`~aiperf.engine.output.Output`).
    """
    from aiperf.ledger.runlock import RunLock, takeover_note
    from aiperf.training.backend import check_backend_installed

    out = output(out if out is not None else sys.stdout, background=True)
    errors = output(err if err is not None else sys.stderr, background=True)
    locks: list[RunLock] = []
    try:
        if resume_dir is None:
            if cfg is None:
                raise AiperfError("run_benchmark needs a config or a run directory to resume")
            check_backend_installed(cfg.model.backend)  # before anything is created on disk
            declared_peak(cfg)  # a bad site file is refused before anything is created too
            prepare_results_dir(cfg.run.results_dir)
            with through(errors):
                return _run(cfg, address, out, None, [], locks, choice)
        run_dir = Path(resume_dir)
        if not (run_dir / LEDGER_NAME).is_file():
            raise AiperfError(f"--resume {run_dir}: not a run directory (no {LEDGER_NAME})")
        locks.append(RunLock(run_dir).acquire("aiperf run --resume"))  # before the ledger is read for appending
        note = takeover_note(locks[0].previous)
        if note:
            print(f"aiperf: {inert(note)}", file=out)
        previous = read_resumable(run_dir)
        for folder in (run_dir, run_dir / WEIGHTS_DIR):
            remove_temporaries(folder)
        with through(errors):
            return _run(recorded_config(previous), address, out, run_dir, previous, locks)
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
    run_dir: Path | None,
    previous: Records,
    locks: list[RunLock],
    choice: WorkloadChoice | None = None,
) -> tuple[Path, RunSummary]:
    """The run itself; a new run's directory is created and locked here (its lock appended to ``locks``)."""
    from aiperf.cluster.ray_session import start_ray
    from aiperf.results.summary import build_summary, format_summary, save_summary
    from aiperf.training.backend import check_backend_installed

    check_backend_installed(cfg.model.backend)
    dataset, seed_graph = _data_and_seed(cfg, out)
    if previous and dataset.fingerprint() != run_start(previous).dataset.fingerprint:
        raise AiperfError(f"{run_dir}: the dataset on this machine differs from the one the run started with")
    proposer: Proposer[Any] | None = None
    if isinstance(seed_graph, TransformerSpec):  # needs no plan: a bad lm section fails before Ray starts
        proposer = make_lm_search(cfg, seed_graph)
    session = start_ray(address or cfg.cluster.address)
    try:
        nodes, plan = _size(cfg, dataset, out, choice)
        if proposer is None:
            assert isinstance(dataset, Dataset) and not isinstance(seed_graph, TransformerSpec)
            proposer = make_search(cfg, seed_graph, plan.batch_size, dataset, workers=plan.concurrency)
        if previous:
            assert run_dir is not None
            run_id = run_start(previous).run_id
        else:
            run_id, run_dir = create_run_dir(Path(cfg.run.results_dir), cfg.run.name)
            locks.append(_lock(run_dir))
        _session(cfg, run_dir, run_id, dataset, seed_graph, nodes, plan, proposer, previous, out)
    finally:
        forced = session.shutdown()  # bounded: a silent control plane cannot hold the run's end
        if forced:
            logger.warning(forced)
    if out.failure is not None:
        why = _reason(out.failure)
        logger.warning(f"progress output stopped ({why}); the run went on and its results are complete")
    elif out.dropped:
        logger.warning(f"{out.dropped} progress line(s) dropped: standard output was not being read")
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


def _data_and_seed(cfg: Config, out: Output) -> tuple[Dataset | LanguageData, Graph | TransformerSpec]:
    """The run's data and its search's seed architecture, of the config's family; one line says what was loaded."""
    family = family_for(cfg.family)
    data = family.load_data(cfg)
    seed = family.seed(cfg, data)
    print(family.loaded_line(data, seed), file=out)
    return data, seed


def _weights_loader(cfg: Config) -> Callable[[Path], AnyWeights]:
    """How ``--resume`` reads the kept weight files back: image sets, or language-model sets checked by name."""
    from aiperf.engine.weights import load_lm_weights, load_weights

    return load_lm_weights if cfg.family == "language" else load_weights


def declared_peak(cfg: Config) -> dict[str, dict[str, float]]:
    """The site file's declared peaks (``cluster.site``), device -> precision -> FLOP/s; {} without a site file."""
    if not cfg.cluster.site:
        return {}
    from aiperf.system.site import read_site

    return read_site(cfg.cluster.site).declared_peaks()


def _lock(run_dir: Path) -> RunLock:
    from aiperf.ledger.runlock import RunLock

    return RunLock(run_dir).acquire("aiperf run")


def _size(
    cfg: Config, dataset: Dataset | LanguageData, out: Output, choice: WorkloadChoice | None
) -> tuple[list[NodeInfo], Plan]:
    """The cluster's nodes and the plan for them; every node that trains must see a streamed dataset."""
    from aiperf.cluster.plan import format_plan, make_plan
    from aiperf.cluster.resources import cluster_nodes

    nodes = cluster_nodes(probe=True, backend=cfg.model.backend)
    if not nodes:
        raise AiperfError("the Ray cluster has no alive nodes")
    plan = make_plan(nodes, cfg, choice)
    if not plan.slots:
        raise AiperfError("the cluster has no room for a single trial (no CPUs or GPUs Ray can schedule)")
    print(format_plan(plan), file=out)
    if isinstance(dataset, Dataset) and dataset.streaming:  # token shards: each worker opens them at its start
        from aiperf.cluster.dataset_check import check_nodes_see_dataset

        training = {s.node_id for s in plan.slots}
        check_nodes_see_dataset(
            [n for n in nodes if n.node_id in training], cfg.dataset.name, dataset.source, dataset.meta["census"]
        )
    return nodes, plan


def _session(
    cfg: Config,
    run_dir: Path,
    run_id: str,
    dataset: Dataset | LanguageData,
    seed_graph: Graph | TransformerSpec,
    nodes: list[NodeInfo],
    plan: Plan,
    proposer: Proposer[Any],
    previous: Records,
    out: Output,
) -> None:
    """One session of the run on the Ray cluster: workers, master, telemetry and signals, to its run_stop."""
    from aiperf.cluster.pool import RayWorkerPool
    from aiperf.engine.assembly import open_session, run_start_record, system_description
    from aiperf.engine.progress import Progress
    from aiperf.sampling.energy import MeterSpec
    from aiperf.sampling.telemetry import TelemetryRecorder

    weights = WeightStore(cfg.cluster.keep_weights, run_dir / WEIGHTS_DIR, loader=_weights_loader(cfg))
    system = system_description(nodes, plan, declared_peak(cfg))
    header: RunStartRecord | ResumePoint
    if previous:
        header = replay(previous, proposer, weights, cfg.family)
    else:
        described = DatasetHeader(**dataset.describe(), fingerprint=dataset.fingerprint())
        backend = cfg.model.backend
        header = run_start_record(
            cfg, run_id=run_id, plan=plan, dataset=described, system=system, backend=backend, seed_graph=seed_graph
        )
    progress = Progress(
        cfg.run.progress_interval_s, cfg.run.time_budget_s, out, family=cfg.family, workers=plan.concurrency or 0
    )
    print(
        f"aiperf: run {inert(run_id)}: searching for {cfg.run.time_budget_s:g} s;"
        f" ledger {inert(run_dir / LEDGER_NAME)}",
        file=out,
    )
    pool = RayWorkerPool.for_config(cfg, plan, dataset, nodes, compile_cache=str(run_dir / COMPILE_CACHE_DIR))
    run = open_session(
        cfg,
        run_dir,
        header=header,
        plan=plan,
        system=system,
        proposer=proposer,
        pool=pool,
        weights=weights,
        dataset_images=dataset.train_size + dataset.val_size if isinstance(dataset, Dataset) else 0,
        progress=progress,
    )
    meter = cfg.run.power_meter
    spec: MeterSpec | None = None
    if meter.command:
        spec = {"command": meter.command, "scope": meter.scope, "reading": meter.reading,
                "covers": list(meter.covers), "timeout_s": meter.timeout_s}  # fmt: skip
    telemetry = TelemetryRecorder(run_dir, cfg.run.telemetry_interval_s, spec, cfg.run.power_interval_s)
    try:
        run.run(_watched(run.master, telemetry, nodes), stop_fields=telemetry.run_stop_fields)
    finally:
        progress.close()


@contextlib.contextmanager
def _watched(master: Master, telemetry: TelemetryRecorder, nodes: list[NodeInfo]) -> Iterator[None]:
    """While the master runs: SIGTERM asks it to stop, and the nodes are sampled."""
    with _Signals() as signals:
        signals.master, signals.telemetry = master, telemetry
        telemetry.start(nodes)
        try:
            yield
        finally:
            telemetry.stop()


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__


def _after_run(run_dir: Path, out: Output) -> None:
    """Write the HTML report next to the summary; a report that cannot be drawn never fails the run."""
    from aiperf.results.report import write_report

    try:
        path = write_report(run_dir)
        print(f"aiperf: report {inert(path)}", file=out, flush=True)
    except AiperfError as exc:
        print(f"aiperf: report not written: {inert(exc)}", file=out, flush=True)
