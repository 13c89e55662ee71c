"""One way to assemble a run: its header, its ledger and observers, its master, and its end.

A real run (``aiperf run``), a resumed one (``--resume``) and a simulated one (``aiperf scaling
--simulate``, ``benchmarks/scale_sim.py``, the master's tests) differ in their pool, their clock
and what surrounds the master loop (signals, telemetry, progress). Everything else -- what
``run_start`` and ``run_stop`` hold, which observers follow the ledger, how the master is set up
from the config and from a resumed ledger -- is decided here, once, so no kind of run can
forget a field the others record.
"""

from __future__ import annotations

import contextlib
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiperf.config import Config
from aiperf.engine.master import Master, MasterSettings, RunOutcome
from aiperf.engine.resume import ResumePoint
from aiperf.engine.weights import WeightStore
from aiperf.errors import AiperfError
from aiperf.ledger.schema import (
    ConfigHeader,
    DatasetHeader,
    PlanHeader,
    Record,
    ResumeRecord,
    RulesHeader,
    RunStartRecord,
    RunStatus,
    RunStopRecord,
    SystemHeader,
    TrialEndRecord,
    TrialStatus,
)
from aiperf.ledger.store import LedgerWriter
from aiperf.system.software import software_versions

if TYPE_CHECKING:
    from collections.abc import Callable

    from aiperf.cluster.plan import Plan
    from aiperf.cluster.pool import WorkerPool
    from aiperf.cluster.resources import NodeInfo
    from aiperf.engine.progress import Progress
    from nas.graph import Graph
    from nas.language.spec import TransformerSpec
    from nas.proposer import Proposer


def system_description(
    nodes: list[NodeInfo], plan: Plan | None = None, declared_peak: dict[str, dict[str, float]] | None = None
) -> dict[str, Any]:
    """The machine a session ran on, as ``run_start`` and ``resume`` record it.

    Besides Ray's view of each node: the measured description of each kind of node, the
    devices of each kind the plan trains on, their peaks (docs/system.md), and the head's
    software and source commit. ``declared_peak`` is the site file's (``cluster.site``).
    """
    from aiperf.system.kinds import attach_usage, group_nodes
    from aiperf.system.peak import device_peaks
    from aiperf.system.software import source_commit

    kinds = group_nodes([(n.node_id, n.description) for n in nodes if n.description])
    if plan is not None:
        attach_usage(kinds, [(s.node_id, s.cpus, s.gpus) for s in plan.slots])
    for kind in kinds:
        kind.peaks = device_peaks(kind.description, declared_peak)
    system: dict[str, object] = {  # its headers are validated by SystemHeader where it is recorded
        "head": platform.node(),
        "platform": platform.platform(),
        "nodes": [n.to_dict() for n in nodes],
        "kinds": [k.to_dict() for k in kinds],
        "commit": source_commit(),
    }
    if declared_peak:
        system["declared_peak"] = declared_peak
    return system


def run_start_record(
    cfg: Config,
    *,
    run_id: str,
    plan: Plan,
    dataset: DatasetHeader,
    system: dict[str, Any],
    backend: str,
    seed_graph: Graph | TransformerSpec | None = None,
    t: float | None = None,
) -> RunStartRecord:
    """The header of a run: its config, rules, plan, dataset, machine and software, as every reader needs them.

    ``backend`` is what ``versions`` names (``simulated`` for a simulation); ``t`` stamps the
    record with a clock of the caller's (a simulation's), else the ledger's.
    """
    optional: dict[str, Any] = {}  # what a writer leaves out is absent from the record, not null
    if t is not None:
        optional["t"] = t
    if seed_graph is not None:
        optional["seed_architecture"] = seed_graph.to_dict()
    if cfg.family != "image":  # an image run's header stays as it was
        optional["family"] = cfg.family
    plan_header = PlanHeader(**plan.to_dict())
    if cfg.cluster.planned_nodes is not None:  # absent otherwise: a header without a plan stays as it was
        plan_header.planned_nodes = cfg.cluster.planned_nodes
    return RunStartRecord(
        run_id=run_id,
        config=ConfigHeader(**cfg.to_dict()),
        versions=software_versions(backend),
        system=SystemHeader(**system),
        plan=plan_header,
        dataset=dataset,
        rules=RulesHeader(**cfg.rules.model_dump()),
        **optional,
    )


@dataclass
class RunSession:
    """One session of a run -- a new run, or one more session of a resumed run -- ready to go."""

    run_dir: Path
    ledger: LedgerWriter
    master: Master

    def run(
        self,
        around: contextlib.AbstractContextManager[object] | None = None,
        stop_fields: Callable[[], dict[str, Any]] | None = None,
    ) -> RunOutcome:
        """Run the master to its end inside ``around`` (signals, telemetry) and record the end.

        However the loop ends -- its budget, a stop, an error -- the ledger gets its ``run_stop``
        (an error is recorded as ``failed`` and raised again) and is closed, every record durable.
        ``stop_fields``, asked once ``around`` has exited, gives that record more fields (what it binds
        of ``telemetry.jsonl``).
        """
        try:
            with around if around is not None else contextlib.nullcontext():
                try:
                    outcome = self.master.run()
                except BaseException as exc:
                    if self.ledger.broken is None:
                        with contextlib.suppress(AiperfError):
                            reason = f"{type(exc).__name__}: {exc}"[:500]
                            self.ledger.append(RunStopRecord(status=RunStatus.FAILED, reason=reason))
                    raise
            self.ledger.append(
                RunStopRecord(
                    t=self.master.clock(),
                    status=outcome.status,
                    reason=outcome.reason,
                    **outcome.run_stop_fields(),
                    **(stop_fields() if stop_fields is not None else {}),
                )
            )
        finally:
            with contextlib.suppress(AiperfError):  # a ledger that cannot sync has already said so
                self.ledger.close()
        return outcome


def open_session(
    cfg: Config,
    run_dir: Path,
    *,
    header: RunStartRecord | ResumePoint,
    plan: Plan,
    system: dict[str, Any],
    proposer: Proposer[Any],
    pool: WorkerPool,
    weights: WeightStore,
    dataset_images: int = 0,
    progress: Progress | None = None,
    clock: Callable[[], float] | None = None,
) -> RunSession:
    """Open the ledger, record how this session begins, attach the observers and set up the master.

    ``header`` is the new run's ``run_start``, or the point a resumed run continues from
    (:func:`aiperf.engine.resume.replay`): then this session records ``resume``, closes the
    trials the dead master was running as ``lost``, and the master carries on its counts.
    """
    from aiperf.families import family_for
    from aiperf.results.mllog import attach as attach_mllog

    resumed = header if isinstance(header, ResumePoint) else None
    ledger = LedgerWriter(run_dir, clock_offset=resumed.clock_offset if resumed else 0.0)
    written: list[Record] | None = None  # the ledger's records, when this session wrote them all
    if resumed is None:
        assert isinstance(header, RunStartRecord)
        written = [ledger.append(header)]
    else:
        ledger.append(
            ResumeRecord(
                gap_s=resumed.gap_s,
                from_seq=resumed.from_seq,
                weights_skipped=resumed.weights_skipped,
                plan=plan.to_dict(),
                system=SystemHeader(**system),
            )
        )
        for trial in resumed.unfinished:  # their in-memory checkpoints died with the old master
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
    attach_mllog(run_dir, ledger, written)
    master = Master(
        MasterSettings.from_config(cfg, dataset_images=dataset_images),
        proposer,
        pool,
        ledger,
        weights,
        progress,
        first_trial=resumed.first_trial if resumed else 0,
        epochs_before=resumed.epochs_before if resumed else 0,
        clock=clock,
        family=family_for(cfg.family),
    )
    if resumed is not None:
        master.bad_images.update(resumed.bad_images)
        master.missing_images.update(resumed.missing_images)
    return RunSession(run_dir, ledger, master)
