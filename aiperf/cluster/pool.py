"""The worker pool: how the master runs trials, independent of what runs them.

The master only sees :class:`WorkerPool`: which workers can take another trial, submit a
trial to one, and wait for events (a trial started, an epoch completed, images were skipped,
a trial finished or failed, a worker joined, could not start, or was lost).
:class:`RayWorkerPool` implements it with Ray actors and streaming generators (a node agent's
trials submitted in a row share one call: :mod:`aiperf.cluster.call_batch`); tests and the
scale simulator implement it in-process.

A worker that cannot start (its backend does not import, its device does not set up, its
node does not see the dataset) is reported once as ``start_failed`` with its node and the
cause; its slot is tried again at most ``MAX_START_ATTEMPTS`` times in all, so a broken node
does not restart workers every few seconds for the whole run.

Nothing here waits on Ray's control plane (docs/cluster.md, "When Ray stops answering"): the
cluster is re-read by a :class:`~aiperf.cluster.ray_session.ControlPlaneWatch` on a thread of
its own, and a silent control plane is reported as a ``control_plane`` event. A ready worker
holding a trial that has said nothing for ``PING_AFTER_S`` is asked whether it is alive (on a
thread of the worker's own, beside the trial's); one that answers nothing for
``UNRESPONSIVE_S`` is lost as ``unresponsive``, and at the run's end :meth:`WorkerPool.unresponsive`
names those that do not answer within ``FINAL_ANSWER_S``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

from sortedcontainers import SortedList

from aiperf.cluster.call_batch import CallBatcher
from aiperf.cluster.messages import EventKind, StoredWeights, TrialEnded, TrialMessage, WorkerInfo, WorkerStats
from aiperf.cluster.node_agent import NodeAgent, SlotLost
from aiperf.cluster.node_weights import WeightKeeper
from aiperf.cluster.plan import Plan, Slot, make_plan
from aiperf.cluster.ray_session import ControlPlaneWatch
from aiperf.cluster.worker import LIVENESS_GROUP, PREPARE_GROUP, RayTrialWorker, WorkerSettings
from aiperf.training.compile_ahead import ahead_supported

if TYPE_CHECKING:
    from collections.abc import Callable

    from ray import ObjectRef, ObjectRefGenerator
    from ray.actor import ActorHandle

    from aiperf.cluster.node_weights import Arrays, SentWeights, WeightSource
    from aiperf.cluster.remote import AgentActor, KeeperActor, Waitable, WorkerActor
    from aiperf.cluster.resources import NodeInfo
    from aiperf.config import Config
    from aiperf.datasets.base import Dataset
    from aiperf.families.language.data import LanguageData
    from aiperf.training.trial import TrialSpecDict

logger = logging.getLogger(__name__)

MAX_START_ATTEMPTS = 3
PING_AFTER_S = 10.0  # a ready worker holding a trial that said nothing this long is asked whether it is alive
UNRESPONSIVE_S = 60.0  # ... one that answered nothing this long is lost as unresponsive (its trial re-queued)
FINAL_ANSWER_S = 5.0  # at the run's end, each worker holding a trial must answer within this
FINAL_STATS_S = 5.0  # ... and the idle workers' final statistics are waited for this long
AGENT_SPARE_THREADS = 4  # a node agent's threads beyond those its slots need (queued trials, start, a question)
KEEPER_THREADS = 4  # a node's weight keeper copies this many sets at once (its node's workers hand them in)


class EventData(WorkerInfo, total=False):
    """What a :class:`PoolEvent` says beyond its kind: the worker's description, or (``control_plane``) the GCS's."""

    answering: bool  # control_plane: whether Ray's control plane answers again
    silent_s: float  # control_plane: how long it has not answered


@dataclass
class PoolEvent:
    """Something that happened on a worker.

    ``report`` is the trial's message for ``start``, ``epoch``, ``bad_images`` and ``done``;
    ``data`` is what is known about the worker for ``ready`` (its own description),
    ``lost`` and ``start_failed`` (its node and host). A kind that is not an
    :class:`EventKind` raises here, where the event is made, not in the master.
    """

    kind: EventKind
    worker: str
    trial: str | None = None
    attempt: int = 0
    data: EventData = field(default_factory=lambda: EventData())
    error: str = ""
    started: bool = False  # for failed/lost: whether the trial had begun on the worker
    worker_lost: bool = False  # failed because the worker (process or node) is gone, not the trial's fault
    unresponsive: bool = False  # ... because the worker stopped answering (its process may still exist)
    report: TrialMessage | None = None

    def __post_init__(self) -> None:
        self.kind = EventKind(self.kind)  # ValueError for a misspelt kind


@dataclass(frozen=True)
class Retirement:
    """What the workers said last, at the run's end.

    ``stats``: each reachable worker's own final numbers. ``lost``: why each worker found dead
    at the end is gone (a process killed while it waited for its next trial has no trial stream
    to say so), so its record says it died rather than that the run ended.
    """

    stats: dict[str, WorkerStats] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)


class WorkerPool(ABC):
    """Something that runs trials on workers and reports what happens."""

    @abstractmethod
    def sync(self) -> list[PoolEvent]:
        """Reconcile workers with the cluster (new nodes get workers); returns lost-worker events."""

    @abstractmethod
    def free_workers(self) -> list[str]:
        """Workers that can take another trial now (their queue is below the depth), least loaded first."""

    @abstractmethod
    def submit(
        self,
        worker: str,
        trial: str,
        attempt: int,
        spec: TrialSpecDict,
        parent_weights: SentWeights = None,
        resume_weights: SentWeights = None,
    ) -> None:
        """Queue a trial on ``worker``; it starts as soon as the worker finishes what it has."""

    @abstractmethod
    def wait(self, timeout: float) -> list[PoolEvent]:
        """Block up to ``timeout`` seconds for events; return all that are ready."""

    @abstractmethod
    def worker_info(self, worker: str) -> WorkerInfo:
        """What the worker said about itself (node, device, precision); empty until ready."""

    @abstractmethod
    def retire_all(self, wait_s: float = FINAL_STATS_S) -> Retirement:
        """Stop all work; each reachable worker's final stats (waited for ``wait_s``), and the workers found dead."""

    def put(self, value: WeightSource) -> SentWeights:
        """Hand a large value (weights) to the pool once so several submissions can share it."""
        return value

    def live_workers(self) -> int | None:
        """Workers alive or still starting; None when the pool cannot tell."""
        return None

    def may_start_workers(self) -> bool:
        """Whether the pool may still start another worker (a slot it has not given up on)."""
        return True

    def unresponsive(self, wait_s: float) -> dict[str, str]:
        """At the run's end: the workers holding a trial that do not answer within ``wait_s``, each with why.

        Empty when every one answers, or when the pool cannot ask (an in-process pool).
        """
        return {}

    @property
    @abstractmethod
    def plan(self) -> Plan:
        """The current sizing."""


class FreeWorkers:
    """The workers that can take another trial, kept in order as their queues change.

    The master lists free workers on every loop iteration; sorting all workers each time
    costs ``O(workers log workers)`` per iteration at thousands of workers. Instead a pool
    calls :meth:`update` whenever a worker's queue (or readiness) changes, with the worker's
    *group* -- a sortable tuple such as ``(queue length,)``, or None when it is not free --
    and each group keeps its workers sorted by id, in a ``SortedList``: a plain sorted list
    moves every worker behind the one it removes, and the start-up fill removes the first of
    all idle workers once per worker, quadratic in the workers (65,536: 0.38 s in isolation
    against 0.07 s; benchmarks/RESULTS.md, "The start-up fill without the collector, refused
    children packed").
    """

    def __init__(self) -> None:
        self._group_of: dict[str, tuple] = {}
        self._groups: dict[tuple, SortedList] = {}

    def update(self, worker: str, group: tuple | None) -> None:
        old = self._group_of.get(worker)
        if old == group:
            return
        if old is not None:
            members = self._groups[old]
            members.remove(worker)
            if not members:
                del self._groups[old]
            del self._group_of[worker]
        if group is not None:
            joined = self._groups.get(group)
            if joined is None:
                joined = self._groups[group] = SortedList()
            joined.add(worker)
            self._group_of[worker] = group

    def ordered(self) -> list[str]:
        """Free workers, group by group in ascending order, by id within a group (a fresh list)."""
        out: list[str] = []
        for group in sorted(self._groups):
            out.extend(self._groups[group])
        return out


@dataclass(eq=False)
class _Task:
    """A trial submitted to a worker: its own stream (``gen``), or (None) a place in a node agent's call."""

    trial: str
    attempt: int
    worker: str
    gen: ObjectRefGenerator | None = None  # the trial's stream, for a worker that is an actor of its own
    started: bool = False
    # What arrived and is not yet taken: the trial does not run first on its worker yet, or its items
    # wait behind a weight set whose reference the pool is taking from its node's keeper.
    inbox: list[TrialMessage | TrialEnded] = field(default_factory=list)


@dataclass(eq=False)
class _Batch:
    """One remote call to a node agent carrying trials for its slots; its stream carries ``(index, message)``."""

    gen: ObjectRefGenerator
    agent: _Agent
    tasks: list[_Task]


_Named = tuple[StoredWeights, "_Worker"]  # a set named by its keeper's key, and the worker whose trial named it


@dataclass(eq=False)
class _Take:
    """One ``WeightKeeper.take`` call: the references of sets a node agent's stream named by key."""

    ref: ObjectRef[list[ObjectRef[Arrays] | None]] | None  # None: its keeper was gone before it was asked
    sets: list[StoredWeights]
    workers: list[_Worker]  # whose trials' items wait behind these sets
    since: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class _Agent:
    """A node agent (``cluster.actors: per_node``): one actor holding the resources of the slots it was made for."""

    actor: AgentActor
    node_id: str
    keys: frozenset[int]  # the slot indexes it has room for
    alive: bool = True


@dataclass
class _AgentSlot:
    """How the pool reaches a worker that is a slot of a node agent."""

    agent: _Agent
    key: int

    def alive(self) -> ObjectRef[bool]:
        return self.agent.actor.alive.remote(self.key)

    def stats(self) -> ObjectRef[WorkerStats]:
        return self.agent.actor.stats.remote(self.key)

    def stop(self) -> None:
        if self.agent.alive:
            self.agent.actor.stop.remote(self.key)  # not waited for: the agent stops the process on a thread of its own


@dataclass
class _Held:
    """A submission to a node agent's worker, held until its batch is sent."""

    worker: _Worker
    task: _Task
    spec: TrialSpecDict
    parent: SentWeights
    resume: SentWeights


@dataclass
class _Worker:
    worker_id: str
    slot: Slot
    actor: WorkerActor | AgentActor  # the worker's actor, or its node agent's
    info_ref: ObjectRef[WorkerInfo]
    info: WorkerInfo = field(default_factory=lambda: WorkerInfo())
    tasks: list[_Task] = field(default_factory=list)
    alive: bool = True
    heard: float = field(default_factory=time.monotonic)  # when it last said anything (a message, an answer)
    ping: ObjectRef[bool] | None = None  # the liveness question it has not answered yet
    agent: _AgentSlot | None = None  # set when the worker is a slot of a node agent


class RayWorkerPool(WorkerPool):
    """Workers are Ray actors placed by the plan; trials stream their epochs back as generators."""

    _watch: ControlPlaneWatch | None = None
    _silent_since: float | None = None  # the control plane's silence already reported (time.monotonic)

    def __init__(
        self,
        plan: Plan,
        dataset: Dataset | LanguageData,
        nodes: list[NodeInfo],
        settings: WorkerSettings,
        *,
        replan: Callable[[list[NodeInfo]], Plan],
        queue_depth: int,
        max_workers: int | None = None,
        resync_s: float = 10.0,
        per_node: bool = False,
    ) -> None:
        """Start a worker for every slot of ``plan``; ``replan`` sizes the cluster again when nodes come and go.

        ``per_node``: one node agent per node runs that node's workers (:mod:`aiperf.cluster.node_agent`)
        instead of one actor per worker.
        """
        import ray

        self._ray = ray
        self._settings = settings
        self._replan = replan
        self._queue_depth = queue_depth
        self._max_workers = max_workers
        self._dataset_ref = ray.put(dataset)
        # Ray's type stubs lack concurrency_groups, which ray.remote takes (docs: "Concurrency Groups").
        self._actor_cls = ray.remote(  # type: ignore[call-overload]
            max_restarts=0, concurrency_groups={LIVENESS_GROUP: 1, PREPARE_GROUP: 1}
        )(RayTrialWorker)
        # A trial queued behind a running one is sent to be compiled ahead too (aiperf.training.compile_ahead).
        self._ahead = settings.compile_ahead and ahead_supported(settings.backend, 1)
        self._per_node = per_node
        self._agents: list[_Agent] = []
        self._agent_cls = ray.remote(max_restarts=0)(NodeAgent)
        self._keeper_cls = ray.remote(max_restarts=0)(WeightKeeper)
        self._keepers: dict[str, KeeperActor] = {}  # node id -> its WeightKeeper (weights stay on their node)
        self._workers: dict[str, _Worker] = {}
        self._ids = itertools.count()
        self._resync_s = resync_s
        self._last_sync = 0.0
        self._plan = plan
        self._hosts = {n.node_id: n.hostname for n in nodes}
        self._start_attempts: dict[tuple[str, int], int] = {}
        self._pending_events: list[PoolEvent] = []
        self._free = FreeWorkers()
        self._batcher: CallBatcher[_Agent, _Held] = CallBatcher()
        self._batches: list[_Batch] = []  # node agents' calls whose streams have not ended
        self._to_take: dict[str, list[_Named]] = {}  # by node: the sets this wait's items named by key
        self._takes: dict[
            ObjectRef[list[ObjectRef[Arrays] | None]], _Take
        ] = {}  # keeper calls in flight, by their result's reference
        self._watch = ControlPlaneWatch(resync_s=resync_s).start()
        self._start_workers(self._plan.slots)

    @classmethod
    def for_config(
        cls, cfg: Config, plan: Plan, dataset: Dataset | LanguageData, nodes: list[NodeInfo], compile_cache: str = ""
    ) -> RayWorkerPool:
        """The pool a run config asks for: its worker settings, queue depth and cap, re-planned under it."""
        return cls(
            plan,
            dataset,
            nodes,
            replace(WorkerSettings.from_config(cfg, plan), compile_cache=compile_cache),
            replan=functools.partial(make_plan, cfg=cfg),
            queue_depth=cfg.cluster.queue_depth,
            max_workers=cfg.cluster.max_concurrent_trials,
            per_node=cfg.cluster.actors == "per_node",
        )

    @property
    def plan(self) -> Plan:
        return self._plan

    def _start_workers(self, slots: list[Slot]) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self._per_node:
            self._start_on_agents(slots)
            return
        for slot in slots:
            worker_id = f"w{next(self._ids):04d}"
            key = (slot.node_id, slot.index)
            self._start_attempts[key] = self._start_attempts.get(key, 0) + 1
            actor = self._actor_cls.options(
                num_cpus=slot.cpus,
                num_gpus=slot.gpus,
                name=None,
                scheduling_strategy=NodeAffinitySchedulingStrategy(slot.node_id, soft=False),
            ).remote(worker_id, self._dataset_ref, self._settings.for_slot(slot), self._keeper(slot.node_id))
            info_ref = actor.info.remote()
            self._workers[worker_id] = _Worker(worker_id, slot, actor, info_ref)
            self._refresh_free(self._workers[worker_id])

    def _start_on_agents(self, slots: list[Slot]) -> None:
        """Start ``slots``' workers as slots of node agents: a live agent made for the slot, else a new one per node.

        A new agent holds the summed resources of the node's new slots; a lost slot starts again on
        its agent (its resources are still the agent's), and a dead agent's slots get a new agent.
        """
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        fresh: dict[str, list[Slot]] = {}
        placed: list[tuple[Slot, _Agent]] = []
        for slot in slots:
            agent = next(
                (a for a in self._agents if a.alive and a.node_id == slot.node_id and slot.index in a.keys), None
            )
            if agent is None:
                fresh.setdefault(slot.node_id, []).append(slot)
            else:
                placed.append((slot, agent))
        for node_id, group in fresh.items():
            # Ray's stubs type a handle's remote methods as Never: the pool calls them through AgentActor.
            actor = cast(
                "AgentActor",
                self._agent_cls.options(
                    num_cpus=sum(s.cpus for s in group),
                    num_gpus=sum(s.gpus for s in group),
                    # A thread per queued trial (each waits for its slot), one for the slot's start, one for a question.
                    max_concurrency=(self._queue_depth + 2) * len(group) + AGENT_SPARE_THREADS,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                ).remote({s.index: s.gpus for s in group}, self._keeper(node_id)),
            )
            agent = _Agent(actor, node_id, frozenset(s.index for s in group))
            self._agents.append(agent)
            placed.extend((s, agent) for s in group)
        for slot, agent in placed:
            worker_id = f"w{next(self._ids):04d}"
            key = (slot.node_id, slot.index)
            self._start_attempts[key] = self._start_attempts.get(key, 0) + 1
            info_ref = agent.actor.start.remote(slot.index, worker_id, self._dataset_ref, self._settings.for_slot(slot))
            w = _Worker(worker_id, slot, agent.actor, info_ref, agent=_AgentSlot(agent, slot.index))
            self._workers[worker_id] = w
            self._refresh_free(w)

    def _keeper(self, node_id: str) -> KeeperActor:
        """The node's weight keeper, started with the node's first worker (no CPU, a few threads to copy sets)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        keeper = self._keepers.get(node_id)
        if keeper is None:
            keeper = cast(  # called through KeeperActor, as a node agent is through AgentActor
                "KeeperActor",
                self._keeper_cls.options(
                    num_cpus=0,
                    max_concurrency=KEEPER_THREADS,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                ).remote(),
            )
            self._keepers[node_id] = keeper
        return keeper

    def sync(self) -> list[PoolEvent]:
        """Start workers for capacity that appeared (new nodes, replaced processes)."""
        now = time.monotonic()
        if now - self._last_sync < self._resync_s:
            return []
        nodes = self._listed_nodes()
        if nodes is None:
            return []
        self._last_sync = now
        plan = self._replan(nodes)
        alive_nodes = {n.node_id for n in nodes}
        self._hosts.update({n.node_id: n.hostname for n in nodes})
        events = []
        for w in self._workers.values():
            if w.alive and w.slot.node_id not in alive_nodes:
                events.extend(self._lose(w, "its node left the cluster"))
        for agent in self._agents:
            if agent.node_id not in alive_nodes:
                agent.alive = False  # gone with its node (its workers were lost just above)
        for node_id in [n for n in self._keepers if n not in alive_nodes]:
            del self._keepers[node_id]  # gone with its node (and the weight sets it held)
        have: dict[tuple[str, int], bool] = {
            (w.slot.node_id, w.slot.index): True for w in self._workers.values() if w.alive
        }
        missing = _fitting(
            [s for s in plan.slots if (s.node_id, s.index) not in have and self._may_retry(s)],
            [w.slot for w in self._workers.values() if w.alive],
            nodes,
        )
        cap = self._max_workers
        if cap is not None:
            room = cap - sum(1 for w in self._workers.values() if w.alive)
            missing = missing[: max(0, room)]
        self._plan = plan
        if missing:
            self._start_workers(missing)
        return events

    def _listed_nodes(self) -> list[NodeInfo] | None:
        """The watch's newest listing of the cluster (None: none since the last one, e.g. the GCS is silent)."""
        from aiperf.cluster.resources import cluster_nodes, node_from_ray

        if self._watch is not None and self._watch.unavailable is None:
            raw = self._watch.take_nodes()
            if raw is None:
                return None
            nodes = [node_from_ray(r) for r in raw if r.get("Alive")]
            return sorted(nodes, key=lambda n: (not n.is_head, n.node_id))
        try:  # a Ray that cannot be watched (a client connection): ask it here, as before
            return cluster_nodes(probe=False)  # counts only: a probe would block this loop on a dying node
        except Exception as exc:  # the head is busy or restarting: try again at the next re-sync
            logger.debug("re-sync skipped: listing the cluster's nodes failed: %s", exc)
            return None

    def free_workers(self) -> list[str]:
        return self._free.ordered()

    def _may_retry(self, slot: Slot) -> bool:
        return self._start_attempts.get((slot.node_id, slot.index), 0) < MAX_START_ATTEMPTS

    def live_workers(self) -> int:
        return sum(1 for w in self._workers.values() if w.alive)

    def may_start_workers(self) -> bool:
        have = {(w.slot.node_id, w.slot.index) for w in self._workers.values() if w.alive}
        return any((s.node_id, s.index) not in have and self._may_retry(s) for s in self._plan.slots)

    def _refresh_free(self, w: _Worker) -> None:
        """Re-file ``w`` after its queue, readiness or liveness changed: ready workers first, then the least loaded."""
        free = w.alive and len(w.tasks) < self._queue_depth
        self._free.update(w.worker_id, (not w.info, len(w.tasks)) if free else None)

    def put(self, value: WeightSource) -> SentWeights:
        """Arrays held here go to the object store once; a set already on a node is handed on as its reference."""
        if value is None or isinstance(value, StoredWeights):
            return value
        return self._ray.put(value)

    def submit(
        self,
        worker: str,
        trial: str,
        attempt: int,
        spec: TrialSpecDict,
        parent_weights: SentWeights = None,
        resume_weights: SentWeights = None,
    ) -> None:
        w = self._workers[worker]
        task = _Task(trial, attempt, worker)
        if not w.tasks:  # its silence counts from now: an idle worker has nothing to say
            w.heard = time.monotonic()
        w.tasks.append(task)
        self._refresh_free(w)
        if w.agent is None:
            actor = cast("WorkerActor", w.actor)  # not a node agent's slot: the worker is an actor of its own
            task.gen = actor.run_trial.remote(spec, parent_weights, resume_weights)
            if self._ahead and len(w.tasks) > 1:  # behind a running trial: its steps compile while that one trains
                actor.prepare.options(concurrency_group=PREPARE_GROUP).remote(spec)
            return
        for agent, held in self._batcher.add(w.agent.agent, _Held(w, task, spec, parent_weights, resume_weights)):
            self._send(agent, held)

    def _send(self, agent: _Agent, held: list[_Held]) -> None:
        """Send a node agent the trials held for its slots, as one call; those of workers lost meanwhile are dropped."""
        held = [h for h in held if h.worker.alive and _holds(h.worker, h.task)]
        if not held:
            return
        requests = [(h.worker.slot.index, h.worker.worker_id, h.spec, h.parent, h.resume) for h in held]
        gen = agent.actor.run_trials.remote(requests)
        self._batches.append(_Batch(gen, agent, [h.task for h in held]))

    def _flush(self) -> None:
        """Send what the batcher holds: the pool is about to wait, or to stop."""
        for agent, held in self._batcher.flush():
            self._send(agent, held)

    def worker_info(self, worker: str) -> WorkerInfo:
        return self._workers[worker].info

    def _lose(
        self, w: _Worker, why: str, kind: EventKind = EventKind.LOST, unresponsive: bool = False
    ) -> list[PoolEvent]:
        """The worker is gone (or ``unresponsive``): its queued trials fail as worker losses (the master re-queues)."""
        w.alive = False
        w.ping = None
        events = [
            PoolEvent(
                EventKind.FAILED,
                w.worker_id,
                t.trial,
                t.attempt,
                error=why,
                started=t.started,
                worker_lost=True,
                unresponsive=unresponsive,
            )
            for t in w.tasks
        ]
        w.tasks.clear()
        self._refresh_free(w)
        where = EventData(node=w.slot.node_id, hostname=self._hosts.get(w.slot.node_id, ""))
        events.append(PoolEvent(kind, w.worker_id, error=why, worker_lost=True, unresponsive=unresponsive, data=where))
        if w.agent is not None:
            w.agent.stop()
            return events
        try:
            self._ray.kill(_handle(w.actor), no_restart=True)
        except Exception as exc:  # already gone with its process or node
            logger.debug("killing lost worker %s: %s", w.worker_id, exc)
        return events

    def _lose_agent(self, agent: _Agent, why: str) -> list[PoolEvent]:
        """A node agent died: every worker it ran is lost with it."""
        agent.alive = False
        events: list[PoolEvent] = []
        for w in self._workers.values():
            if w.alive and w.agent is not None and w.agent.agent is agent:
                events.extend(self._lose(w, why, kind=EventKind.LOST if w.info else EventKind.START_FAILED))
        return events

    def wait(self, timeout: float) -> list[PoolEvent]:
        ray = self._ray
        self._flush()
        events, self._pending_events = self._pending_events, []
        events.extend(self._control_plane())
        events.extend(self._check_liveness())
        waitables: list[Waitable] = []
        owner: dict[Waitable, tuple[_Worker, _Task | None]] = {}
        pings: dict[Waitable, _Worker] = {}
        batches: dict[Waitable, _Batch] = {}
        for w in self._workers.values():
            if not w.alive:
                continue
            if not w.info:
                waitables.append(w.info_ref)
                owner[w.info_ref] = (w, None)
            if w.tasks and w.tasks[0].gen is not None:  # only the running (first) task can produce output
                gen = w.tasks[0].gen
                waitables.append(gen)
                owner[gen] = (w, w.tasks[0])
            if w.ping is not None:
                waitables.append(w.ping)
                pings[w.ping] = w
        self._batches = [b for b in self._batches if b.agent.alive]  # a dead agent's calls ended with its workers
        for batch in self._batches:
            waitables.append(batch.gen)
            batches[batch.gen] = batch
        events.extend(self._give_up_takes())
        waitables.extend(self._takes)
        if not waitables:
            time.sleep(min(timeout, 0.05)) if not events else None
            return events
        ready, _ = ray.wait(waitables, num_returns=1, timeout=0 if events else timeout)
        if ready:  # collect everything else that is ready too, without blocking
            more, _ = ray.wait(waitables, num_returns=len(waitables), timeout=0)
            ready = list(dict.fromkeys([*ready, *more]))
        for item in ready:
            if item in pings:
                self._take_answer(pings[item], item)
                continue
            if item in batches:
                events.extend(self._drain_batch(batches[item]))
                continue
            if item in self._takes:
                events.extend(self._end_take(self._takes.pop(item)))
                continue
            w, task = owner[item]
            w.heard = time.monotonic()
            if w.alive and not w.info:
                # The worker answered ``info`` before it began any trial, but Ray may deliver its trial's
                # first message first: the master must know the worker (its node) before that message.
                events.extend(self._take_info(w))
            if task is not None and w.alive:
                events.extend(self._drain(w, task))
        events.extend(self._ask_keepers())
        return events

    def _ask_keepers(self) -> list[PoolEvent]:
        """Take the references of the sets this wait's items named by key: one call per node's keeper."""
        events: list[PoolEvent] = []
        for node_id, named in self._to_take.items():
            sets, workers = [s for s, _ in named], list({id(w): w for _, w in named}.values())
            keeper = self._keepers.get(node_id)
            if keeper is None:  # gone with its node
                events.extend(self._end_take(_Take(None, sets, workers), "its node left the cluster"))
                continue
            ref = keeper.take.remote([s.key for s in sets])
            self._takes[ref] = _Take(ref, sets, workers)
        self._to_take.clear()
        return events

    def _end_take(self, take: _Take, failed: str = "") -> list[PoolEvent]:
        """Fill in the taken references (a set its keeper did not give is lost); then move its trials on.

        A lost set stays a :class:`StoredWeights` with no reference: a child of it, or an attempt
        resuming from it, falls back as for any set whose node is gone (the ledger says so).
        """
        refs: list[ObjectRef[Arrays] | None] = [None] * len(take.sets)
        if not failed and take.ref is not None:
            try:
                refs = self._ray.get(take.ref)
            except Exception as exc:  # the keeper died (its node, or its process)
                failed = _ray_cause(exc)
        lost = 0
        for stored, ref in zip(take.sets, refs, strict=True):
            stored.ref, stored.key = ref, None
            lost += ref is None
        if lost:
            why = f": {failed}" if failed else ""
            logger.warning(f"{lost} weight set(s) could not be taken from node {take.sets[0].node[:16]}'s keeper{why}")
        events: list[PoolEvent] = []
        for w in take.workers:
            events.extend(self._advance(w))
        return events

    def _give_up_takes(self) -> list[PoolEvent]:
        """End the keeper calls unanswered for ``UNRESPONSIVE_S``: their sets are lost, their trials go on."""
        now = time.monotonic()
        events: list[PoolEvent] = []
        for ref, take in list(self._takes.items()):
            if now - take.since >= UNRESPONSIVE_S:
                del self._takes[ref]
                events.extend(self._end_take(take, f"its keeper answered nothing for {now - take.since:.0f} s"))
        return events

    def _control_plane(self) -> list[PoolEvent]:
        """A ``control_plane`` event when the GCS stops answering, and another when it answers again."""
        if self._watch is None:
            return []
        now = time.monotonic()
        if self._silent_since is None:
            since = self._watch.silent_since(now)
            if since is None:
                return []
            self._silent_since = since
            return [PoolEvent(EventKind.CONTROL_PLANE, "", data={"answering": False, "silent_s": now - since})]
        if self._watch.silent_since(float("inf")) is not None:  # still silent (or a question is out)
            return []
        silent_s, self._silent_since = now - self._silent_since, None
        return [PoolEvent(EventKind.CONTROL_PLANE, "", data={"answering": True, "silent_s": silent_s})]

    def _check_liveness(self) -> list[PoolEvent]:
        """Ask quiet workers whether they are alive; lose those that stayed silent ``UNRESPONSIVE_S``."""
        now = time.monotonic()
        events: list[PoolEvent] = []
        for w in list(self._workers.values()):
            if not (w.alive and w.info and w.tasks):  # a worker still starting is a start-up matter
                continue
            silent = now - w.heard
            if silent >= UNRESPONSIVE_S:
                why = f"unresponsive: worker {w.worker_id} answered nothing for {silent:.0f} s"
                events.extend(self._lose(w, why, unresponsive=True))
            elif silent >= PING_AFTER_S and w.ping is None:
                w.ping = self._ask_alive(w)
        return events

    def _ask_alive(self, w: _Worker) -> ObjectRef[bool]:
        if w.agent is not None:
            return w.agent.alive()
        return w.actor.alive.options(concurrency_group=LIVENESS_GROUP).remote()

    def _take_answer(self, w: _Worker, ref: ObjectRef[bool]) -> bool:
        """The worker's answer to "alive?"; False when it died instead (its trial's stream says so)."""
        if w.ping is ref:
            w.ping = None
        try:
            self._ray.get(ref)
        except Exception as exc:
            logger.debug("worker %s did not answer: %s", w.worker_id, exc)
            return False
        w.heard = time.monotonic()
        return True

    def unresponsive(self, wait_s: float) -> dict[str, str]:
        self._flush()
        asked: dict[ObjectRef[bool], _Worker] = {}
        for w in self._workers.values():
            if w.alive and w.info and w.tasks:
                if w.ping is None:
                    w.ping = self._ask_alive(w)
                asked[w.ping] = w
        if not asked:
            return {}
        began = time.monotonic()
        ready, _ = self._ray.wait(list(asked), num_returns=len(asked), timeout=wait_s)
        answered = {asked[ref].worker_id for ref in ready if self._take_answer(asked[ref], ref)}
        return {
            w.worker_id: f"no answer within {wait_s:g} s at the run's end, nothing heard for {began - w.heard:.0f} s"
            for w in asked.values()
            if w.worker_id not in answered
        }

    def _take_info(self, w: _Worker) -> list[PoolEvent]:
        """The worker's answer to ``info`` (it ran before any trial): ready, or a start failure."""
        try:
            w.info = self._ray.get(w.info_ref)
        except Exception as exc:
            return self._lose(w, _ray_cause(exc), kind=EventKind.START_FAILED)
        self._refresh_free(w)
        return [PoolEvent(EventKind.READY, w.worker_id, data=EventData(**w.info))]

    def _drain(self, w: _Worker, task: _Task) -> list[PoolEvent]:
        """Take every ready item from the stream of a trial on a worker that is an actor of its own."""
        ray = self._ray
        events: list[PoolEvent] = []
        gen = task.gen
        assert gen is not None  # only a task with a stream of its own is drained (wait)
        while _holds(w, task):
            ready, _ = ray.wait([gen], timeout=0)
            if not ready:
                break
            item: TrialMessage | TrialEnded
            try:
                item = ray.get(next(gen))
            except StopIteration:
                item = TrialEnded()
            except Exception as exc:
                if _is_death(exc):
                    if not w.info:  # it died in __init__: a start failure, whichever of its refs failed first
                        events.extend(self._lose(w, _ray_cause(exc), kind=EventKind.START_FAILED))
                    else:
                        events.extend(self._lose(w, f"worker died: {_ray_cause(exc)}"))
                    break
                item = TrialEnded(error=_ray_cause(exc))
            events.extend(self._take(w, task, item))
        return events

    def _drain_batch(self, batch: _Batch) -> list[PoolEvent]:
        """Take every ready item from a node agent's batched stream, each to its trial's worker.

        Each item goes to its trial's inbox; :meth:`_advance` turns it into events once the trial
        runs first on its worker and no set it named is still being taken.
        """
        ray = self._ray
        events: list[PoolEvent] = []
        while True:
            ready, _ = ray.wait([batch.gen], timeout=0)
            if not ready:
                break
            try:
                index, item = ray.get(next(batch.gen))
            except StopIteration:
                self._batches.remove(batch)
                for task in batch.tasks:  # every trial's share ends in the stream (one with items held has its end)
                    w = self._workers[task.worker]
                    if _holds(w, task) and not task.inbox:
                        events.extend(self._take(w, task, TrialEnded(error="its node agent's stream ended early")))
                break
            except Exception as exc:
                self._batches.remove(batch)
                if _is_death(exc):
                    events.extend(self._lose_agent(batch.agent, f"its node agent died: {_ray_cause(exc)}"))
                else:  # the agent's call failed itself, not one of its trials
                    for task in batch.tasks:
                        w = self._workers[task.worker]
                        if _holds(w, task):
                            events.extend(self._take(w, task, TrialEnded(error=_ray_cause(exc))))
                break
            task = batch.tasks[index]
            w = self._workers[task.worker]
            if _named(item):  # taken even for a trial already gone, so its keeper lets go of it
                self._to_take.setdefault(batch.agent.node_id, []).append((item.weights, w))
            if not (w.alive and _holds(w, task)):
                continue  # a trial already failed with its lost worker
            w.heard = time.monotonic()
            if not w.info:  # as in wait(): the worker is known before its trial's first message
                events.extend(self._take_info(w))
                if not w.alive:
                    continue
            events.extend(self._take(w, task, item))
        return events

    def _take(self, w: _Worker, task: _Task, item: TrialMessage | TrialEnded) -> list[PoolEvent]:
        """One item of ``task``'s stream, and the events of whatever ``w`` can now take (:meth:`_advance`)."""
        task.inbox.append(item)
        return self._advance(w)

    def _advance(self, w: _Worker) -> list[PoolEvent]:
        """The events of the items ``w``'s first trial holds, in order, to one waiting on its keeper; trial by trial.

        Ray delivers each stream in order but not two streams in the order they were written, so a
        trial's start may arrive (in a later call's stream) before its predecessor's ``done``: it
        waits in its inbox until the trial runs first. An item naming a set by key waits, with
        everything after it, until the set's reference is taken (:meth:`_ask_keepers`).
        """
        events: list[PoolEvent] = []
        while w.alive and w.tasks:
            task = w.tasks[0]
            ended = False
            while task.inbox and not ended:
                if _named(task.inbox[0]):
                    return events
                ended = self._message(w, task, task.inbox.pop(0), events)
            if not ended or not w.alive:  # nothing more yet, or lost with its worker (every trial failed with it)
                break
            w.tasks.remove(task)  # what came after its end, if anything: nothing it still needs
            self._refresh_free(w)
        return events

    def _message(self, w: _Worker, task: _Task, item: TrialMessage | TrialEnded, events: list[PoolEvent]) -> bool:
        """Add the events of one item of ``task``'s stream to ``events``; whether the trial has ended."""
        if isinstance(item, TrialEnded):
            if item.lost:  # its slot's process died: the worker is lost
                if not w.info:
                    events.extend(self._lose(w, _cause_line(item.error or ""), kind=EventKind.START_FAILED))
                else:
                    events.extend(self._lose(w, f"worker died: {_cause_line(item.error or '')}"))
                return True
            if item.error is not None:
                events.append(
                    PoolEvent(
                        EventKind.FAILED,
                        w.worker_id,
                        task.trial,
                        task.attempt,
                        error=_cause_line(item.error),
                        started=task.started,
                    )
                )
            return True
        if item.kind is EventKind.START:
            task.started = True
        events.append(PoolEvent(item.kind, w.worker_id, task.trial, task.attempt, report=item, started=task.started))
        return item.kind is EventKind.DONE

    def retire_all(self, wait_s: float = FINAL_STATS_S) -> Retirement:
        ray = self._ray
        self._flush()
        if self._watch is not None:
            self._watch.stop(wait_s=0)  # no new question; the one in flight has its own deadline
        stats: dict[str, WorkerStats] = {}
        lost: dict[str, str] = {}
        alive = [w for w in self._workers.values() if w.alive]
        refs = {w.worker_id: w.agent.stats() if w.agent else w.actor.stats.remote() for w in alive if not w.tasks}
        if refs:
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=wait_s)
            for wid, ref in refs.items():
                if ref in ready:
                    try:
                        stats[wid] = ray.get(ref)
                    except Exception as exc:  # the master's own accounting remains
                        if _is_death(exc):  # it died idle, between trials: nothing else would say so
                            lost[wid] = f"worker died: {_ray_cause(exc)}"
                        logger.debug("final stats of worker %s unavailable: %s", wid, exc)
        for w in alive:
            w.alive = False
            self._refresh_free(w)
        for actor in [w.actor for w in alive if w.agent is None] + [a.actor for a in self._agents if a.alive]:
            try:
                ray.kill(
                    _handle(actor), no_restart=True
                )  # a node agent's slot processes end with it (their pipe closes)
            except Exception as exc:
                logger.debug("killing a worker or node agent at the end: %s", exc)
        for agent in self._agents:
            agent.alive = False
        for keeper in self._keepers.values():  # the kept sets' files were collected before (WeightStore.finish)
            try:
                ray.kill(_handle(keeper), no_restart=True)
            except Exception as exc:
                logger.debug("killing a weight keeper at the end: %s", exc)
        self._keepers.clear()
        if self._watch is not None:
            self._watch.stop()  # out of any call into Ray before Ray is shut down
        return Retirement(stats, lost)


def _fitting(wanted: list[Slot], held: list[Slot], nodes: list[NodeInfo]) -> list[Slot]:
    """The wanted slots that fit next to the workers already holding resources on each node.

    A re-plan can reshape a node's slots (e.g. oversubscribe the survivors when a node
    dies); a worker for a slot that does not fit would wait forever for resources its
    siblings hold, and trials queued on it would never start.
    """
    room = {n.node_id: [n.cpus, n.gpus] for n in nodes}
    for s in held:
        if s.node_id in room:
            room[s.node_id][0] -= s.cpus
            room[s.node_id][1] -= s.gpus
    out = []
    for s in wanted:
        free = room.get(s.node_id)
        if free is not None and s.cpus <= free[0] + 1e-9 and s.gpus <= free[1] + 1e-9:
            free[0] -= s.cpus
            free[1] -= s.gpus
            out.append(s)
    return out


def _handle(actor: WorkerActor | AgentActor | KeeperActor) -> ActorHandle[object]:
    """The Ray actor handle behind one of the pool's views of it, as ``ray.kill`` takes it."""
    return cast("ActorHandle[object]", actor)


def _is_death(exc: BaseException) -> bool:
    """Whether a call failed because its worker is gone: its actor died, or its node agent's slot process did."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

    return isinstance(exc, (ActorDiedError, RayActorError, ActorUnavailableError, SlotLost))


def _named(item: TrialMessage | TrialEnded) -> bool:
    """Whether ``item`` carries a weight set named by its keeper's key, whose reference is still to be taken."""
    weights = getattr(item, "weights", None)
    return isinstance(weights, StoredWeights) and weights.pending


def _holds(w: _Worker, task: _Task) -> bool:
    """Whether ``task`` is still one of ``w``'s (not ended, not failed with the worker)."""
    return any(t is task for t in w.tasks)


def _ray_cause(exc: BaseException) -> str:
    """The line of a Ray-wrapped error that names the original error (:func:`_cause_line`), or the error's type."""
    return _cause_line(str(exc)) or type(exc).__name__


def _cause_line(text: str) -> str:
    """The line of an error's text that names the original error, cut to 300 characters.

    Ray wraps a remote exception in its traceback, so -- unlike :func:`aiperf.errors.first_line`
    -- this returns the LAST meaningful line (not a ``File ...`` frame or a ``^``/``~`` marker,
    and with a ``:`` as in ``ValueError: ...``); the first line when none looks like that.
    """
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if not ln.startswith(("File ", "^", "~")) and ":" in ln:
            return ln[:300]
    return lines[0][:300] if lines else ""
