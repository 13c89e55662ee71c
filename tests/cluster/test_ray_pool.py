"""The Ray worker pool's event order, on a stand-in for Ray that delivers messages out of order.

A worker answers ``info`` before it runs any trial, but Ray reports a streaming generator's
items and a task's return value over separate paths: the master can see a trial's first
message before the worker's description. Every record the master writes for that trial
names the worker's node, so the pool must make the worker known first.

A node agent's workers get their trials in batched calls (one call for the trials handed its
slots in a row): each call's stream is delivered in order, two calls' streams in any order.
"""

from __future__ import annotations

from typing import Any

from aiperf.cluster import pool as pool_module
from aiperf.cluster.call_batch import CallBatcher
from aiperf.cluster.messages import (
    BadImagesReport,
    EpochReport,
    EventKind,
    StoredWeights,
    TrialDone,
    TrialEnded,
    TrialStarted,
)
from aiperf.cluster.node_weights import KEEPER_OWNER
from aiperf.cluster.plan import Slot
from aiperf.cluster.pool import FreeWorkers, RayWorkerPool, _Agent, _AgentSlot, _Task, _Worker


class _Generator:
    """A trial's stream of message references."""

    def __init__(self, refs: list[str]) -> None:
        self.refs = list(refs)

    def __next__(self) -> str:
        if not self.refs:
            raise StopIteration
        return self.refs.pop(0)


class _LaggingRay:
    """Ray whose first ``wait`` sees the trial's message but not yet the worker's ``info`` answer."""

    def __init__(self, values: dict[str, Any], info_ref: str) -> None:
        self.values, self.info_ref, self.waits = values, info_ref, 0

    def wait(self, refs: list[Any], num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        self.waits += 1
        ready = [r for r in refs if (isinstance(r, _Generator) and r.refs) or (r == self.info_ref and self.waits > 2)]
        return ready[:num_returns], []

    def get(self, ref: str) -> Any:
        if isinstance(self.values[ref], Exception):
            raise self.values[ref]
        return self.values[ref]


def _pool(values: dict[str, Any]) -> tuple[RayWorkerPool, _Worker]:
    pool = RayWorkerPool.__new__(RayWorkerPool)  # no Ray: only the event plumbing is under test
    pool._ray = _LaggingRay(values, "info")
    pool._queue_depth = 2
    pool._pending_events = []
    pool._hosts = {"node-a": "host-a"}
    pool._free = FreeWorkers()
    pool._batcher, pool._batches, pool._to_take, pool._takes = CallBatcher(), [], {}, {}
    slot = Slot(node_id="node-a", index=0, cpus=1.0, gpus=0.0)
    worker = _Worker("w0000", slot, actor=None, info_ref="info")
    worker.tasks.append(_Task("t00001", 0, "w0000", _Generator(["started"])))
    pool._workers = {"w0000": worker}
    return pool, worker


def test_a_trials_first_message_ahead_of_the_workers_description_still_finds_the_worker_ready():
    pool, worker = _pool({"info": {"worker": "w0000", "node": "node-a"}, "started": TrialStarted(worker="w0000")})
    events = pool.wait(timeout=0.1)
    assert [e.kind for e in events] == [EventKind.READY, EventKind.START]
    assert pool.worker_info("w0000")["node"] == "node-a"  # what the master's trial_start record reads
    assert worker.tasks[0].started


def test_a_worker_whose_description_failed_is_a_start_failure_not_a_trial_start():
    pool, worker = _pool({"info": RuntimeError("the backend did not import"), "started": TrialStarted(worker="w0000")})
    pool._ray.kill = lambda actor, no_restart=True: None
    events = pool.wait(timeout=0.1)
    assert [e.kind for e in events] == [EventKind.FAILED, EventKind.START_FAILED]
    lost_trial, failed_start = events
    assert lost_trial.trial == "t00001" and lost_trial.worker_lost and not lost_trial.started  # re-queued, not run
    assert "the backend did not import" in failed_start.error and not worker.alive


class _AgentActor:
    """A node agent's handle: each ``run_trials`` call is recorded and gets the next prepared stream."""

    def __init__(self, streams: list[_Generator]) -> None:
        self.calls: list[list[tuple]] = []
        self.streams = streams
        self.run_trials = self
        self.stop = self

    def remote(self, *args: Any) -> Any:
        if len(args) == 1 and isinstance(args[0], list):  # run_trials(batch)
            self.calls.append(args[0])
            return self.streams.pop(0)
        return None  # stop(key): nothing to wait for


def _agent_pool(values: dict[str, Any], agents: dict[str, _AgentActor], slots: int) -> RayWorkerPool:
    """A pool of ``slots`` ready workers on each of ``agents``' nodes, numbered node by node."""
    pool = RayWorkerPool.__new__(RayWorkerPool)
    pool._ray = _LaggingRay(values, "info")
    pool._queue_depth = 2
    pool._pending_events = []
    pool._hosts = {node: node for node in agents}
    pool._free = FreeWorkers()
    pool._batcher, pool._batches, pool._to_take, pool._takes = CallBatcher(), [], {}, {}
    pool._workers = {}
    for node, actor in agents.items():
        agent = _Agent(actor, node, frozenset(range(slots)))
        for key in range(slots):
            wid = f"w{len(pool._workers):04d}"
            w = _Worker(wid, Slot(node, 1.0, 0.0, key), actor, info_ref=None, info={"node": node})
            w.agent = _AgentSlot(agent, key)
            pool._workers[wid] = w
    return pool


def _spec(trial: str) -> dict[str, Any]:
    return {"trial_id": trial}


def _stream(values: dict[str, Any], name: str, items: list[tuple[int, Any]]) -> _Generator:
    refs = [f"{name}.{k}" for k in range(len(items))]
    values.update(zip(refs, items, strict=True))
    return _Generator(refs)


def _done() -> TrialDone:
    return TrialDone(weights={})


def test_trials_handed_one_agents_workers_in_a_row_go_in_one_call_sent_before_the_next_agents():
    values: dict[str, Any] = {}
    a = _AgentActor([_stream(values, "a", [(0, TrialStarted(worker="w0000")), (1, TrialStarted(worker="w0001"))])])
    b = _AgentActor([_stream(values, "b", [(0, TrialStarted(worker="w0002"))])])
    pool = _agent_pool(values, {"node-a": a, "node-b": b}, slots=2)
    pool.submit("w0000", "t1", 0, _spec("t1"))
    pool.submit("w0001", "t2", 0, _spec("t2"), parent_weights="p")
    assert a.calls == [], "held until the agent's batch is complete"
    pool.submit("w0002", "t3", 0, _spec("t3"))
    sent = [(0, "w0000", _spec("t1"), None, None), (1, "w0001", _spec("t2"), "p", None)]
    assert a.calls == [sent], "sent when the next went elsewhere"
    assert b.calls == []
    events = pool.wait(timeout=0.1)
    assert b.calls == [[(0, "w0002", _spec("t3"), None, None)]], "the last batch is sent before the pool waits"
    assert sorted((e.worker, e.trial, e.kind) for e in events) == [
        ("w0000", "t1", EventKind.START),
        ("w0001", "t2", EventKind.START),
        ("w0002", "t3", EventKind.START),
    ]


def test_a_trial_whose_stream_arrives_before_its_predecessors_end_waits_for_it():
    values: dict[str, Any] = {}
    first = _Generator([])  # the first call's stream: nothing delivered yet
    second = _stream(values, "second", [(0, TrialStarted(worker="w0000")), (0, _done()), (0, TrialEnded())])
    a = _AgentActor([first, second])
    pool = _agent_pool(values, {"node-a": a}, slots=1)
    pool.submit("w0000", "t1", 0, _spec("t1"))
    assert pool.wait(timeout=0.1) == []
    pool.submit("w0000", "t2", 0, _spec("t2"))  # queued behind t1 on the same slot, in a call of its own
    assert pool.wait(timeout=0.1) == [], "t2's messages wait: t1 still runs first on w0000"
    first.refs = _stream(
        values,
        "first",
        [
            (0, TrialStarted(worker="w0000")),
            (0, BadImagesReport(files=["x.jpg"], epoch_count=1)),
            (0, _done()),
            (0, TrialEnded()),
        ],
    ).refs
    events = pool.wait(timeout=0.1)
    assert [(e.trial, e.kind) for e in events] == [
        ("t1", EventKind.START),
        ("t1", EventKind.BAD_IMAGES),
        ("t1", EventKind.DONE),
        ("t2", EventKind.START),
        ("t2", EventKind.DONE),
    ]
    assert "w0000" in pool.free_workers() and not pool._workers["w0000"].tasks


def test_one_trial_failing_or_its_slot_dying_in_a_batch_leaves_its_neighbours_running():
    values: dict[str, Any] = {}
    stream = _stream(
        values,
        "a",
        [
            (0, TrialStarted(worker="w0000")),
            (1, TrialStarted(worker="w0001")),
            (2, TrialStarted(worker="w0002")),
            (1, TrialEnded(error="ValueError: the learning rate is not a number")),
            (2, TrialEnded(error="SlotLost: worker w0002's process died (exit code -9)", lost=True)),
        ],
    )
    a = _AgentActor([stream])
    pool = _agent_pool(values, {"node-a": a}, slots=3)
    for k in range(3):
        pool.submit(f"w000{k}", f"t{k}", 0, _spec(f"t{k}"))
    events = pool.wait(timeout=0.1)
    failed = {e.trial: e for e in events if e.kind is EventKind.FAILED}
    assert failed["t1"].error == "ValueError: the learning rate is not a number" and not failed["t1"].worker_lost
    assert failed["t2"].worker_lost and failed["t2"].started
    lost = [e for e in events if e.kind is EventKind.LOST]
    assert [e.worker for e in lost] == ["w0002"] and "process died (exit code -9)" in lost[0].error
    assert pool._workers["w0000"].tasks and pool._workers["w0000"].alive, "its neighbour still runs"
    assert "w0001" in pool.free_workers() and "w0002" not in pool.free_workers()


class _KeeperRay(_LaggingRay):
    """Ray whose keeper calls are ready once the test answers them."""

    def __init__(self, values: dict[str, Any]) -> None:
        super().__init__(values, "info")
        self.answered: set[str] = set()

    def wait(self, refs: list[Any], num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        ready = [r for r in refs if (isinstance(r, _Generator) and r.refs) or r in self.answered]
        return ready[:num_returns], []


class _Keeper:
    """A node's weight keeper: each ``take`` call is recorded and named ``take<n>``."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.take = self

    def remote(self, keys: list[int]) -> str:
        self.calls.append(keys)
        return f"take{len(self.calls) - 1}"


def _named(key: int) -> StoredWeights:
    return StoredWeights(ref=None, key=key, node="node-a", owner=KEEPER_OWNER, nbytes=8)


def _epoch(weights: StoredWeights) -> EpochReport:
    return EpochReport(
        epoch=1, train_images=8, eval_images=4, train_acc=0.5, train_loss=1.0, val_acc=0.5, val_loss=1.0,
        train_s=1.0, eval_s=0.1, batch_size=8, precision="float32", weights=weights,
    )  # fmt: skip


def _keeper_pool(items: list[tuple[int, Any]], slots: int) -> tuple[RayWorkerPool, _Keeper, dict[str, Any]]:
    values: dict[str, Any] = {}
    pool = _agent_pool(values, {"node-a": _AgentActor([_stream(values, "a", items)])}, slots=slots)
    pool._ray = _KeeperRay(values)
    keeper = _Keeper()
    pool._keepers = {"node-a": keeper}
    for k in range(slots):
        pool.submit(f"w000{k}", f"t{k}", 0, _spec(f"t{k}"))
    return pool, keeper, values


def test_a_set_named_by_key_is_taken_from_its_keeper_before_its_trial_goes_on():
    checkpoint, final = _named(7), _named(8)
    items = [(0, TrialStarted(worker="w0000")), (0, _epoch(checkpoint)), (0, TrialDone(weights=final))]
    items += [(0, TrialEnded()), (1, TrialStarted(worker="w0001"))]
    pool, keeper, values = _keeper_pool(items, slots=2)
    events = pool.wait(timeout=0.1)
    assert [(e.trial, e.kind) for e in events] == [("t0", EventKind.START), ("t1", EventKind.START)]
    assert keeper.calls == [[7, 8]], "one call for the node's keeper, whatever the wait's items named"
    assert pool.wait(timeout=0.1) == [], "the epoch and what follows it wait for the references"
    values["take0"] = ["ref7", "ref8"]
    pool._ray.answered.add("take0")
    events = pool.wait(timeout=0.1)
    assert [(e.trial, e.kind) for e in events] == [("t0", EventKind.EPOCH), ("t0", EventKind.DONE)]
    assert events[0].report.weights is checkpoint and (checkpoint.ref, final.ref) == ("ref7", "ref8")
    assert not checkpoint.pending and not final.pending
    assert "w0000" in pool.free_workers() and not pool._workers["w0000"].tasks
    assert keeper.calls == [[7, 8]] and not pool._takes


def test_sets_a_dead_keeper_cannot_give_are_lost_and_one_named_for_a_gone_trial_is_still_taken():
    final, orphan = _named(1), _named(2)
    items = [(0, TrialStarted(worker="w0000")), (1, TrialDone(weights=orphan)), (0, TrialDone(weights=final))]
    pool, keeper, values = _keeper_pool([*items, (0, TrialEnded()), (1, TrialEnded())], slots=2)
    pool._flush()  # the call went out; then its worker was lost and its trial failed with it
    pool._workers["w0001"].tasks.clear()
    pool._workers["w0001"].alive = False
    events = pool.wait(timeout=0.1)
    assert keeper.calls == [[2, 1]], "the gone trial's set too, so its keeper lets go of it"
    values["take0"] = RuntimeError("ActorDiedError: the keeper's node died")
    pool._ray.answered.add("take0")
    events += pool.wait(timeout=0.1)
    assert [(e.trial, e.kind) for e in events] == [("t0", EventKind.START), ("t0", EventKind.DONE)]
    assert final.ref is None and not final.pending, "lost: a child of it starts fresh (node_weights.resolve_start)"


def test_a_keeper_that_never_answers_is_given_up_after_unresponsive_s():
    final = _named(3)
    pool, keeper, _ = _keeper_pool([(0, TrialDone(weights=final)), (0, TrialEnded())], slots=1)
    assert pool.wait(timeout=0.1) == [] and keeper.calls == [[3]]
    assert pool.wait(timeout=0.1) == []
    next(iter(pool._takes.values())).since -= pool_module.UNRESPONSIVE_S
    events = pool.wait(timeout=0.1)
    assert [(e.trial, e.kind) for e in events] == [("t0", EventKind.DONE)] and final.ref is None
    assert not pool._takes
