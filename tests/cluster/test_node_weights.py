"""Weights stay on the node that trained them (aiperf.cluster.node_weights), on a real local Ray.

A worker hands each weight set to its node's keeper; the set must outlive the worker process
that made it, be fetched by another process from the reference alone, and -- once its node's
keeper is gone -- make the next trial fall back (a lost checkpoint restarts at epoch 0 from the
parent, a lost parent trains from a fresh initialisation) instead of failing.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from aiperf.cluster import node_weights
from aiperf.cluster.messages import StoredWeights
from aiperf.cluster.node_weights import NodeStore, WeightKeeper, resolve_start, store_on_node
from aiperf.engine.weights import WeightStore, file_sha256, load_weights
from aiperf.training.trial import TrialSpec

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def _kill(keeper) -> None:
    """Kill a keeper and wait until it is gone.

    ``ray.kill`` only asks: a call sent just after it can still be answered by the living actor
    (CI saw one), so ask again until a call fails, for at most 30 s.
    """
    ray.kill(keeper, no_restart=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(keeper.alive.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.1)
    pytest.fail("a killed keeper still answered after 30 s")


def _spec(**fields) -> TrialSpec:
    base = dict(trial_id="t00009", kind="arch", graph={}, hparams={"epochs": 4}, seed=1)
    return TrialSpec(**{**base, **fields})


def _worker_class() -> type:
    """A stand-in for a worker process: stores what it trained through its node's keeper, and starts trials.

    Defined in a function so Ray ships the class by value (this test module is not importable there).
    """

    class Worker:
        def store(self, keeper, value: float, worker: str) -> StoredWeights:
            # A set like a real one: above Ray's 100 KiB inline limit, so it lives in the object store.
            weights = {1: [np.full((256, 128), value, np.float32), np.full(128, value, np.float32)]}
            weights[5] = [np.full(2, value, np.float32)]
            return store_on_node(weights, keeper, node="node-a", worker=worker)

        def hold(self, keeper, value: float, worker: str) -> StoredWeights | dict:
            weights = {1: [np.full((256, 128), value, np.float32), np.full(128, value, np.float32)]}
            return NodeStore(keeper, "node-a").hold(weights, worker)

        def start(self, spec: TrialSpec, parent, resume) -> tuple:
            """What the trial starts from: (start_epoch, inherited, its first weight, lineage kept, fallback)."""
            got = resolve_start(spec, parent, resume)
            arrays = got.resume if got.resume is not None else got.parent
            first = float(arrays[1][0][0, 0]) if arrays is not None else None
            kept = got.spec.parent_graph is not None and bool(got.spec.morphs)
            return got.spec.start_epoch, got.inherited, first, kept, got.fallback

    return Worker


def _actor(cls: type):
    return ray.remote(cls).options(num_cpus=0).remote()


def test_a_set_outlives_the_worker_that_trained_it_and_is_fetched_elsewhere_from_its_reference(local_ray):
    keeper, trainer, other = _actor(WeightKeeper), _actor(_worker_class()), _actor(_worker_class())
    stored = ray.get(trainer.store.remote(keeper, 2.5, "w0001"))
    assert stored.owner == "weight keeper" and stored.nbytes == (256 * 128 + 128 + 2) * 4
    ray.kill(trainer, no_restart=True)  # the process that trained it dies; its node (the keeper) lives

    assert ray.get(other.start.remote(_spec(start_epoch=2), None, stored)) == (2, False, 2.5, False, "")
    _kill(keeper)


def test_a_set_held_under_a_key_is_taken_once_as_a_reference_that_outlives_the_process_that_trained_it(local_ray):
    # A node agent's stream names a set by its keeper's key; the master takes the reference (node_agent.py).
    keeper, trainer, other = _actor(WeightKeeper), _actor(_worker_class()), _actor(_worker_class())
    held = ray.get(trainer.hold.remote(keeper, 3.5, "w0002"))
    assert held.pending and held.owner == "weight keeper" and held.nbytes == (256 * 128 + 128) * 4
    ray.kill(trainer, no_restart=True)

    [ref] = ray.get(keeper.take.remote([held.key]))
    assert ray.get(keeper.take.remote([held.key, 12345])) == [None, None], "taken once; an unknown key is nothing"
    assert ray.get(keeper.holding.remote()) == 0, "the keeper let go of it: the taker's reference keeps it"
    held.ref, held.key = ref, None
    assert not held.pending
    assert ray.get(other.start.remote(_spec(start_epoch=2), None, held)) == (2, False, 3.5, False, "")
    _kill(keeper)


def test_a_checkpoint_gone_with_its_node_restarts_the_attempt_from_the_parent_then_from_scratch():
    # A node's death takes its object store with it; on one machine the store is shared, so the loss is
    # stood in for here (a real node is killed in tests/cluster/test_multinode.py).
    gone: set[str] = set()
    arrays = {"node-a": {1: [np.full((2, 2), 1.0, np.float32)]}, "node-b": {1: [np.full((2, 2), 7.0, np.float32)]}}

    def fetch(source, timeout=0.0):
        if isinstance(source, StoredWeights):
            if source.node in gone:
                raise node_weights.WeightsLost(f"{source.describe()}: OwnerDiedError")
            return arrays[source.node]
        return source

    checkpoint = StoredWeights(ref=None, node="node-a", owner="weight keeper", nbytes=16)
    parent = StoredWeights(ref=None, node="node-b", owner="weight keeper", nbytes=16)
    spec = _spec(start_epoch=3, parent_graph={"nodes": []}, morphs=[{"op": "wider"}])

    start = resolve_start(spec, parent, checkpoint, fetch)  # all there: the checkpoint, the parent not even fetched
    assert start.spec.start_epoch == 3 and start.resume[1][0][0, 0] == 1.0 and start.parent is None

    gone.add("node-a")
    start = resolve_start(spec, parent, checkpoint, fetch)
    assert start.resume is None and start.inherited and start.parent[1][0][0, 0] == 7.0
    assert start.spec.start_epoch == 0 and start.spec.morphs == [{"op": "wider"}]
    assert "the checkpoint of epoch 3" in start.fallback and "inherits its parent" in start.fallback

    gone.add("node-b")
    start = resolve_start(spec, parent, checkpoint, fetch)
    assert start.parent is None and start.resume is None and not start.inherited
    assert start.spec.start_epoch == 0 and start.spec.parent_graph is None and start.spec.morphs == []
    assert "the parent's weights" in start.fallback and "fresh initialisation" in start.fallback
    assert spec.start_epoch == 3 and spec.morphs, "the spec sent is not changed"


def test_a_keeper_that_does_not_answer_leaves_the_set_with_the_worker(local_ray):
    keeper, trainer = _actor(WeightKeeper), _actor(_worker_class())
    _kill(keeper)
    stored = ray.get(trainer.store.remote(keeper, 4.0, "w0003"))
    assert stored.owner == "worker w0003"
    held = ray.get(trainer.hold.remote(keeper, 4.0, "w0003"))
    assert isinstance(held, dict) and held[1][0][0, 0] == 4.0, "a node agent's set then travels as its arrays"
    assert ray.get(trainer.start.remote(_spec(start_epoch=1), None, stored)) == (1, False, 4.0, False, "")


def test_a_set_its_keeper_did_not_give_is_lost_and_its_child_starts_fresh():
    lost = StoredWeights(ref=None, node="node-a", owner="weight keeper", nbytes=8)  # the pool's take came back empty
    with pytest.raises(node_weights.WeightsLost, match="its keeper no longer held it"):
        node_weights.fetch_weights(lost)
    start = resolve_start(_spec(parent_graph={"nodes": []}, morphs=[{"op": "wider"}]), parent=lost, resume=None)
    assert start.parent is None and start.spec.parent_graph is None and "fresh initialisation" in start.fallback


def test_a_set_the_master_put_in_the_object_store_is_fetched_when_it_arrives_nested_in_a_batch(local_ray):
    # A node agent's call carries its trials' weights inside a list, where Ray resolves no reference:
    # the master's arrays (read back on --resume) reach the agent as an ObjectRef, not as arrays.
    weights = {1: [np.full((2, 2), 3.0, np.float32)]}
    start = resolve_start(
        _spec(parent_graph={"nodes": []}, morphs=[{"op": "deeper"}]), parent=ray.put(weights), resume=None
    )
    assert isinstance(start.parent, dict) and start.inherited and start.fallback == ""
    np.testing.assert_array_equal(start.parent[1][0], weights[1][0])


def test_arrays_sent_as_they_are_need_no_fetch():
    weights = {1: [np.ones((2, 2), np.float32)]}
    start = resolve_start(_spec(parent_graph={"nodes": []}, morphs=[{"op": "deeper"}]), parent=weights, resume=None)
    assert start.parent is weights and start.fallback == "" and start.inherited


def test_the_store_collects_a_kept_sets_file_from_its_node_and_drops_what_it_no_longer_keeps(local_ray, tmp_path):
    keeper, trainer = _actor(WeightKeeper), _actor(_worker_class())
    store = WeightStore(2, tmp_path / "weights")
    sets = {t: ray.get(trainer.store.remote(keeper, v, "w0001")) for t, v in [("t1", 1.0), ("t2", 2.0), ("t3", 3.0)]}
    assert store.put("t1", sets["t1"], 0.5) and store.put("t2", sets["t2"], 0.6)
    assert store.shared("t1", put=None) is sets["t1"], "children get the node's reference, nothing is put"
    assert store.get("t1") is None, "the arrays are not held by the master"
    saved = dict(store.finish(wait_s=60))
    assert sorted(saved) == ["t1", "t2"] and store.drain_saved() == []
    arrays = load_weights(tmp_path / "weights" / "t2.npz")
    assert arrays[1][0][0, 0] == 2.0 and saved["t2"].sha256 == file_sha256(tmp_path / "weights" / "t2.npz")[0]

    store = WeightStore(2, tmp_path / "again")
    store.put("t1", sets["t1"], 0.5)
    store.put("t2", sets["t2"], 0.6)
    store.put("t3", sets["t3"], 0.7)  # t1 is dropped, collected or not: no file of it stays
    saved = dict(store.finish(wait_s=60))
    assert sorted(saved) == ["t2", "t3"] and store.drain_evicted() == ["t1"]
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == ["t2.npz", "t3.npz"]

    # A set gone with its node: children get the collected file from now on, or nothing when there is none.
    store.lost("t2")
    assert store.get("t2")[1][0][0, 0] == 2.0 and store.shared("t2", put=lambda w: ("put", w))[0] == "put"
    store._saved.pop("t3")  # as if its file had not been written
    store.lost("t3")
    assert "t3" not in store and store.drain_evicted() == ["t3"] and not (tmp_path / "again" / "t3.npz").exists()
    _kill(keeper)
