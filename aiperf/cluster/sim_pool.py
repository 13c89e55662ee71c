"""An in-process worker pool with simulated time, for testing and scaling the master.

Trials do not train: each takes ``epoch_s`` simulated seconds per epoch and reports an
accuracy from ``accuracy_fn`` (the trial's learning curve, computed once when it is queued).
Time is a :class:`HybridClock`: real time spent in the
master's own code flows into it (a submission's serialisation, as Ray does it, included; the
worker's side of a submission and the simulator's own work do not), while waiting for workers
jumps straight to the next event. So a simulation of thousands of workers running 10-minute trials finishes in
seconds, and any time the master spends thinking shows up as workers waiting for it —
exactly what ``benchmarks/scale_sim.py`` measures.
"""

from __future__ import annotations

import heapq
import itertools
import pickle
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import cast

from aiperf.cluster.call_batch import CallBatcher
from aiperf.cluster.messages import EpochReport, EventKind, StoredWeights, TrialDone, TrialStarted, WorkerInfo
from aiperf.cluster.node_weights import (
    KEEPER_OWNER,
    Arrays,
    SentWeights,
    WeightsLost,
    WeightSource,
    resolve_start,
)
from aiperf.cluster.plan import Plan, Slot
from aiperf.cluster.pool import EventData, FreeWorkers, PoolEvent, Retirement, WorkerPool
from aiperf.training.trial import TrialSpec, TrialSpecDict

AccuracyFn = Callable[[TrialSpec], Sequence[float]]  # accuracy after each of the spec's epochs 1..epochs


def ray_pickler() -> Callable[..., bytes]:
    """What Ray serialises a remote call's arguments with: its cloudpickle (the standard pickler without Ray)."""
    try:
        from ray import cloudpickle
    except ImportError:  # ray is a dependency; this keeps the simulator usable without it
        return pickle.dumps
    return cloudpickle.dumps


class HybridClock:
    """Simulated seconds: real elapsed time plus the jumps the pool makes while the master waits.

    ``cpu=True`` counts this process's CPU time instead of real time: on a box shared with other
    work the master's own cost is then measured without what the other processes take from it
    (but without the time it waits for the disk, either).
    """

    def __init__(self, cpu: bool = False) -> None:
        self._now = time.process_time if cpu else time.perf_counter
        self._real0 = self._now()
        self._jumped = 0.0
        self._frozen: float | None = None

    def __call__(self) -> float:
        if self._frozen is not None:
            return self._frozen
        return self._now() - self._real0 + self._jumped

    @contextmanager
    def unseen(self) -> Iterator[None]:
        """Time spent inside does not pass: work a real master would not do (a worker's, the simulator's).

        The clock reads the same inside as when it was entered, and goes on from there after.
        """
        if self._frozen is not None:
            yield
            return
        self._frozen = self()
        entered = self._now()
        try:
            yield
        finally:
            self._jumped -= self._now() - entered
            self._frozen = None

    def jump_to(self, t: float) -> None:
        now = self()
        if t > now:
            self._jumped += t - now

    def spend(self, seconds: float) -> None:
        """The master is busy ``seconds`` more than it measured: a cost modelled by its size, not done."""
        if self._frozen is None and seconds > 0:
            self._jumped += seconds


@dataclass
class _SimTask:
    """A submitted trial, reduced to what its simulation needs.

    The accuracies of every epoch are computed at submission, so the spec (with its whole
    graph) is not held while the trial waits and runs: at 65,536 workers, two queued trials
    each, the specs were gigabytes of the benchmark's memory, not the master's.
    """

    trial: str
    attempt: int
    epochs: int
    start_epoch: int
    batch_size: int
    accuracies: tuple[float, ...]  # after epoch 1, 2, ..., epochs
    spec: TrialSpec | None = None  # kept only for a failure_fn
    started: TrialStarted | None = None  # what it starts from, when weights live on nodes
    start: float = 0.0
    epochs_done: int = 0
    epoch_s: float = 0.0
    steps: int | None = None  # each epoch's steps: those the master sent a later attempt, else the worker's


_Payload = tuple[str, _SimTask, int]  # a simulated event's worker, trial, and epoch (1-based; 0: its start or end)


@dataclass
class _SimWorker:
    worker_id: str
    node: str
    queue: list[_SimTask] = field(default_factory=list)
    free_at: float = 0.0
    alive: bool = True
    busy_s: float = 0.0
    last_step_end: float | None = None


def learning_curve(final: float, spec: TrialSpec) -> tuple[float, ...]:
    """Accuracy after each epoch, approaching ``final`` as ``1 - 0.5^epoch`` (counted from the trial's first epoch)."""
    return tuple(final * (1.0 - 0.5 ** (epoch + spec.start_epoch)) for epoch in range(1, spec.epochs + 1))


def default_accuracy(spec: TrialSpec) -> tuple[float, ...]:
    """A plausible learning curve that rewards depth a little: deterministic per architecture.

    The whole curve at once: the graph is walked once per trial, not once per epoch (at
    65,536 simulated workers the per-epoch walk was 7 % of the master's start-up fill, and
    it is the simulator's work, not the master's).
    """
    depth = sum(1 for n in spec.graph["nodes"] if n["op"] in ("conv", "dense"))
    return learning_curve(min(0.99, 0.90 + 0.004 * depth), spec)


class SimulatedWorkerPool(WorkerPool):
    """``workers`` simulated workers spread over ``nodes`` nodes."""

    def __init__(
        self,
        workers: int,
        clock: HybridClock,
        *,
        nodes: int = 1,
        epoch_s: float = 1.0,
        startup_s: float = 0.0,
        queue_depth: int = 2,
        accuracy_fn: AccuracyFn = default_accuracy,
        images: tuple[int, int] = (1000, 200),
        batch_size: int = 64,
        failure_fn: Callable[[TrialSpec], str | None] | None = None,
        device_ops_per_s: float | None = None,
        fail_start: Callable[[str], str | None] | None = None,
        weights_on_nodes: bool = False,
        call_s: float = 0.0,
        per_node: bool = False,
    ) -> None:
        """``weights_on_nodes``: trials report their weights as references on their node, as Ray workers do
        (:mod:`aiperf.cluster.node_weights`), and a node killed by :meth:`kill_node_at` takes its sets with it.

        ``call_s``: what Ray's remote call costs the submitting thread beyond serialising its arguments
        (which :meth:`submit` does for real), charged to the master's clock on every call.

        ``per_node``: as ``cluster.actors: per_node`` -- a node agent's trials submitted in a row go in
        one call (:mod:`aiperf.cluster.call_batch`), sent when the next goes to another node or the
        master waits; its trials start when it is sent. Workers are numbered node by node, as a plan's are.
        With ``weights_on_nodes`` too, every wait also charges one call per node whose trials reported
        weights (the pool takes their references from the node's keeper)."""
        if not 0.0 <= call_s <= 1.0:
            raise ValueError(f"call_s must be in [0, 1] seconds, got {call_s!r}")
        self.clock = clock
        self.call_s = call_s
        with clock.unseen():  # importing Ray is the simulator's cost, not the master's
            self._pickle = ray_pickler()
        self.weights_on_nodes = weights_on_nodes
        self._lost_nodes: set[str] = set()
        self._node_kills: dict[str, float] = {}
        self.epoch_s = epoch_s
        self.device_ops_per_s = device_ops_per_s
        self.startup_s = startup_s
        self.queue_depth = queue_depth
        self.accuracy_fn = accuracy_fn
        self.images = images
        self.batch_size = batch_size
        self.failure_fn = failure_fn
        self.fail_start = fail_start  # worker id -> why it cannot start (None: it starts)
        self.per_node = per_node
        self._batcher: CallBatcher[str, tuple[_SimWorker, _SimTask]] = CallBatcher()
        self._workers = {
            f"w{k:05d}": _SimWorker(f"w{k:05d}", f"sim-node-{k * nodes // workers}") for k in range(workers)
        }
        self._free = FreeWorkers()
        for w in self._workers.values():
            self._refresh_free(w)
        self._events: list[tuple[float, int, str, _Payload]] = []  # (time, order, kind, payload)
        self._order = itertools.count()
        self._kills: list[tuple[float, str]] = []
        self._announced = False
        slots = [Slot(w.node, 1.0, 0.0, k) for k, w in enumerate(self._workers.values())]
        self._plan = Plan(
            "simulated",
            slots,
            batch_size,
            "simulated",
            "float32",
            1,
            [
                {
                    "node_id": f"sim-node-{k}",
                    "hostname": f"sim-node-{k}",
                    "address": "",
                    "cpus": 1,
                    "gpus": 0,
                    "memory_bytes": 0,
                    "cpu_model": "",
                    "accelerator": "",
                    "gpu_memory_bytes": 0,
                }
                for k in range(nodes)
            ],
        )

    @property
    def plan(self) -> Plan:
        return self._plan

    def kill_worker_at(self, worker: str, t: float) -> None:
        """Make ``worker`` die at simulated time ``t`` (its trials fail as worker losses)."""
        self._kills.append((t, worker))
        self._kills.sort()

    def kill_node_at(self, node: str, t: float) -> None:
        """Make every worker of ``node`` die at simulated time ``t``, and the weights the node held with them."""
        self._node_kills[node] = t
        for w in self._workers.values():
            if w.node == node:
                self.kill_worker_at(w.worker_id, t)

    # -- WorkerPool ------------------------------------------------------------------------------
    def sync(self) -> list[PoolEvent]:
        events = []
        now = self.clock()
        while self._kills and self._kills[0][0] <= now:
            _, wid = self._kills.pop(0)
            node = self._workers[wid].node
            if self._node_kills.get(node, now + 1) <= now:
                self._lost_nodes.add(node)
            events.extend(self._kill(wid))
        return events

    def _weights(self, w: _SimWorker) -> dict | StoredWeights:
        """What a trial on ``w`` reports as its weights: nothing to hold, or a reference on its node."""
        return StoredWeights(ref=None, node=w.node, owner=KEEPER_OWNER, nbytes=0) if self.weights_on_nodes else {}

    def _fetch(self, sent: SentWeights, timeout: float = 0.0) -> Arrays | None:
        source = _in_process(sent)
        if isinstance(source, StoredWeights):
            if source.node in self._lost_nodes:
                raise WeightsLost(f"{source.describe()}: the node is gone")
            return {}
        return source

    def _kill(self, wid: str, why: str = "simulated worker death", kind: EventKind = EventKind.LOST) -> list[PoolEvent]:
        w = self._workers[wid]
        if not w.alive:
            return []
        w.alive = False
        now = self.clock()
        events = [
            PoolEvent(EventKind.FAILED, wid, t.trial, t.attempt, error=why, started=t.start <= now, worker_lost=True)
            for t in w.queue
        ]
        w.queue.clear()
        self._refresh_free(w)
        events.append(PoolEvent(kind, wid, error=why, worker_lost=True, data=EventData(node=w.node, hostname=w.node)))
        return events

    def live_workers(self) -> int:
        return sum(1 for w in self._workers.values() if w.alive)

    def may_start_workers(self) -> bool:
        return False  # simulated workers are never replaced

    def free_workers(self) -> list[str]:
        return self._free.ordered()

    def _refresh_free(self, w: _SimWorker) -> None:
        """Re-file ``w`` after its queue changed: the least loaded first, then by id."""
        free = w.alive and len(w.queue) < self.queue_depth
        self._free.update(w.worker_id, (len(w.queue),) if free else None)

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
        # Submitting costs a real master the serialisation of the call's arguments (Ray pickles
        # them with its cloudpickle, in the caller's thread): done here, on the master's clock.
        # Reading the spec, finding the weights, the trial's learning curve and the events its
        # worker will send are the worker's work and the simulator's: they do not pass on it.
        self._pickle((spec, parent_weights, resume_weights), protocol=5)
        with self.clock.unseen():
            task = self._task(worker, trial, attempt, spec, parent_weights, resume_weights)
        w.queue.append(task)
        self._refresh_free(w)
        if not self.per_node:
            self._send([(w, task)])
            return
        for _, held in self._batcher.add(w.node, (w, task)):
            self._send(held)

    def _send(self, held: list[tuple[_SimWorker, _SimTask]]) -> None:
        """One remote call carrying ``held``, charged to the master's clock; a trial starts once its worker is free."""
        self.clock.spend(self.call_s)
        now = self.clock()
        with self.clock.unseen():
            for w, task in held:
                if not (w.alive and any(t is task for t in w.queue)):
                    continue  # lost with its worker while it was held
                task.start = max(now, w.free_at)
                epochs = task.epochs - task.start_epoch
                w.free_at = task.start + self.startup_s + epochs * task.epoch_s
                self._push(task.start, "start", (w.worker_id, task, 0))
                for k in range(1, epochs + 1):
                    self._push(task.start + self.startup_s + k * task.epoch_s, "epoch", (w.worker_id, task, k))
                self._push(w.free_at, "done", (w.worker_id, task, 0))
                self._sent(w, task)

    def _sent(self, w: _SimWorker, task: _SimTask) -> None:
        """A trial's call went: when it runs is known (for a subclass that records it)."""

    def _flush(self) -> None:
        for _, held in self._batcher.flush():
            self._send(held)

    def _task(
        self,
        worker: str,
        trial: str,
        attempt: int,
        spec: TrialSpecDict,
        parent_weights: SentWeights,
        resume_weights: SentWeights,
    ) -> _SimTask:
        """The worker's side of a submission: the spec read, its weights found, its epochs simulated ahead."""
        trial_spec = TrialSpec.from_dict(spec)
        started = None
        if self.weights_on_nodes:
            start = resolve_start(trial_spec, parent_weights, resume_weights, self._fetch)
            trial_spec = start.spec
            started = TrialStarted(
                worker=worker,
                start_epoch=trial_spec.start_epoch,
                inherited=start.inherited,
                weights_lost=start.fallback,
            )
        return _SimTask(
            trial,
            attempt,
            trial_spec.epochs,
            trial_spec.start_epoch,
            int(trial_spec.hparams["batch_size"]),
            tuple(float(a) for a in self.accuracy_fn(trial_spec)),
            trial_spec if self.failure_fn is not None else None,
            started,
            epoch_s=self._epoch_seconds(trial_spec),
            steps=trial_spec.steps_per_epoch or -(-self.images[0] // max(1, int(trial_spec.hparams["batch_size"]))),
        )

    def _epoch_seconds(self, spec: TrialSpec) -> float:
        """Fixed ``epoch_s``, or the epoch's counted operations at ``device_ops_per_s``."""
        if not self.device_ops_per_s:
            return self.epoch_s
        from aiperf.families.image.flops import count_flops, epoch_operations

        cost = count_flops(spec.architecture())
        train, evaluate = epoch_operations(cost, self.images[0], self.images[1], int(spec.hparams["batch_size"]))
        return (train + evaluate) / self.device_ops_per_s

    def _push(self, t: float, kind: str, payload: _Payload) -> None:
        heapq.heappush(self._events, (t, next(self._order), kind, payload))

    def wait(self, timeout: float) -> list[PoolEvent]:
        self._flush()
        events: list[PoolEvent] = []
        if not self._announced:
            self._announced = True
            for w in self._workers.values():
                cause = self.fail_start(w.worker_id) if self.fail_start is not None else None
                if cause:
                    events.extend(self._kill(w.worker_id, cause, kind=EventKind.START_FAILED))
                else:
                    events.append(
                        PoolEvent(EventKind.READY, w.worker_id, data=EventData(**self.worker_info(w.worker_id)))
                    )
            return events
        now = self.clock()
        if self._events and self._events[0][0] > now:
            target = min(self._events[0][0], now + timeout)
            if self._kills:
                target = min(target, self._kills[0][0])
            self.clock.jump_to(target)
        elif not self._events:
            self.clock.jump_to(now + timeout if not self._kills else min(now + timeout, self._kills[0][0]))
        now = self.clock()
        while self._events and self._events[0][0] <= now:
            event_t, _, kind, (wid, task, extra) = heapq.heappop(self._events)
            w = self._workers[wid]
            if not w.alive or task not in w.queue:
                continue
            if kind == "start":
                started = task.started or TrialStarted(worker=wid)
                events.append(PoolEvent(EventKind.START, wid, task.trial, task.attempt, report=started, started=True))
            elif kind == "epoch" and task.spec is not None and self.failure_fn and self.failure_fn(task.spec):
                w.queue.remove(task)  # the trial raised during training: the worker itself survives
                self._refresh_free(w)
                events.append(
                    PoolEvent(
                        EventKind.FAILED,
                        wid,
                        task.trial,
                        task.attempt,
                        error=self.failure_fn(task.spec) or "",
                        started=True,
                    )
                )
            elif kind == "epoch":
                epoch = task.start_epoch + extra
                acc = task.accuracies[epoch - 1]
                w.busy_s += task.epoch_s
                idle = None
                if extra == 1 and w.last_step_end is not None:
                    idle = max(0.0, (event_t - task.epoch_s) - w.last_step_end)
                w.last_step_end = event_t
                events.append(
                    PoolEvent(
                        EventKind.EPOCH,
                        wid,
                        task.trial,
                        task.attempt,
                        started=True,
                        report=EpochReport(
                            epoch=epoch,
                            train_images=self.images[0],
                            eval_images=self.images[1],
                            train_acc=acc,
                            train_loss=1.0 - acc,
                            val_acc=acc,
                            val_loss=1.0 - acc,
                            train_s=task.epoch_s * 0.9,
                            eval_s=task.epoch_s * 0.1,
                            data_wait_s=0.0,
                            compile_s=0.0,  # a simulated worker compiles in its start-up (startup_s), not its steps
                            input="simulated",
                            batch_size=task.batch_size,
                            precision="float32",
                            oom_retries=0,
                            weights=self._weights(w),
                            idle_before_s=idle,
                            steps=task.steps,
                        ),
                    )
                )
            else:
                w.queue.remove(task)
                self._refresh_free(w)
                best = max(task.accuracies)
                events.append(
                    PoolEvent(
                        EventKind.DONE,
                        wid,
                        task.trial,
                        task.attempt,
                        started=True,
                        report=TrialDone(
                            weights=self._weights(w),
                            startup_s=self.startup_s,
                            first_step_s=None,
                            best_val_acc=best,
                            batch_size=task.batch_size,
                            requested_batch_size=task.batch_size,
                            precision="float32",
                        ),
                    )
                )
        if self.per_node and self.weights_on_nodes:
            # A node agent's stream names each set by its keeper's key; the real pool takes the
            # references with one keeper call per node per wait (RayWorkerPool._ask_keepers).
            named = {self._workers[e.worker].node for e in events if e.kind in (EventKind.EPOCH, EventKind.DONE)}
            self.clock.spend(self.call_s * len(named))
        return events

    def worker_info(self, worker: str) -> WorkerInfo:
        w = self._workers[worker]
        return {
            "worker": worker,
            "node": w.node,
            "hostname": w.node,
            "device": {"kind": "sim", "name": "simulated"},
            "precision": "float32",
            "init_s": 0.0,
        }

    def retire_all(self, wait_s: float = 0.0) -> Retirement:
        self._flush()
        for w in self._workers.values():
            w.alive = False
            w.queue.clear()
            self._refresh_free(w)
        self._events.clear()
        return Retirement()  # a simulated death is an event when it happens: none is found at the end


def _in_process(weights: SentWeights) -> WeightSource:
    """What a simulated trial was sent: the pool's ``put`` is the identity here, so never a Ray reference."""
    return cast("WeightSource", weights)
