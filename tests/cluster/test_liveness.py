"""Nothing the master does waits on a silent Ray: the control-plane watch, worker liveness, a bounded shutdown.

Fast: stand-ins for Ray and for the GCS; ``tests/cluster/test_control_plane.py`` freezes a real
run's GCS and a real worker (slow).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from aiperf.cluster import ray_session
from aiperf.cluster.call_batch import CallBatcher
from aiperf.cluster.messages import EventKind
from aiperf.cluster.node_agent import SlotLost
from aiperf.cluster.plan import Slot
from aiperf.cluster.pool import PING_AFTER_S, UNRESPONSIVE_S, FreeWorkers, RayWorkerPool, _Task, _Worker
from aiperf.cluster.ray_session import ControlPlaneWatch, RaySession

# --- the control-plane watch ------------------------------------------------------------------


class _Gcs:
    """A GCS that answers, raises (its deadline passed) or hangs (ignores the deadline) as told."""

    def __init__(self) -> None:
        self.mode = "answer"
        self.release = threading.Event()
        self.listings = 0

    def ping(self, timeout_s: float) -> None:
        if self.mode == "raise":
            raise TimeoutError("RPC error: Deadline Exceeded")
        if self.mode == "hang":
            self.release.wait(5)
        if self.mode == "missing":
            raise AttributeError("'Worker' object has no attribute 'gcs_client'")

    def nodes(self, timeout_s: float) -> list[dict[str, Any]]:
        self.ping(timeout_s)
        self.listings += 1
        return [{"NodeID": "n1", "Alive": True, "Resources": {"CPU": 2.0}}]


def test_the_watch_reports_since_when_the_control_plane_has_not_answered():
    gcs = _Gcs()
    watch = ControlPlaneWatch(resync_s=100.0, probe_s=0.1, timeout_s=5.0, ping=gcs.ping, list_nodes=gcs.nodes)
    watch.ask_once()  # the first question lists the nodes
    assert watch.take_nodes() == [{"NodeID": "n1", "Alive": True, "Resources": {"CPU": 2.0}}]
    assert watch.take_nodes() is None  # each listing is taken once
    assert watch.silent_since() is None
    gcs.mode = "raise"
    before = time.monotonic()
    watch.ask_once()
    watch.ask_once()  # still failing: the silence began with the first failed question
    since = watch.silent_since(now=before + 10)
    assert since is not None and before <= since <= before + 1
    assert watch.silent_since(now=since + 4.9) is None  # not yet timeout_s: a slow answer is not silence
    gcs.mode = "answer"
    watch.ask_once()
    assert watch.silent_since(now=float("inf")) is None
    assert gcs.listings == 1  # re-listed only every resync_s; pings in between


def test_a_question_that_hangs_past_its_deadline_counts_as_silence_while_it_hangs():
    gcs = _Gcs()
    gcs.mode = "hang"
    watch = ControlPlaneWatch(resync_s=100.0, probe_s=0.05, timeout_s=0.2, ping=gcs.ping, list_nodes=gcs.nodes)
    watch.start()
    try:
        deadline = time.monotonic() + 3
        while watch.silent_since() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert watch.silent_since() is not None
    finally:
        gcs.release.set()
        gcs.mode = "answer"
        watch.stop()


def test_a_ray_without_a_gcs_client_is_not_watched():
    gcs = _Gcs()
    gcs.mode = "missing"
    watch = ControlPlaneWatch(ping=gcs.ping, list_nodes=gcs.nodes)
    watch.ask_once()
    assert watch.unavailable and "gcs_client" in watch.unavailable
    assert watch.silent_since(now=float("inf")) is None  # not silence: the pool asks Ray directly instead


def test_a_silent_control_plane_becomes_one_event_then_another_when_it_answers_again():
    gcs = _Gcs()
    watch = ControlPlaneWatch(resync_s=100.0, probe_s=0.1, timeout_s=0.0, ping=gcs.ping, list_nodes=gcs.nodes)
    pool = _pool()
    pool._watch = watch
    assert pool.wait(0) == []
    gcs.mode = "raise"
    watch.ask_once()
    events = pool.wait(0)
    assert [(e.kind, e.data["answering"]) for e in events] == [(EventKind.CONTROL_PLANE, False)]
    assert pool.wait(0) == []  # reported once
    gcs.mode = "answer"
    watch.ask_once()
    events = pool.wait(0)
    assert [(e.kind, e.data["answering"]) for e in events] == [(EventKind.CONTROL_PLANE, True)]
    assert events[0].data["silent_s"] >= 0


# --- worker liveness --------------------------------------------------------------------------


class _Generator:
    """A trial's stream with nothing ready (the worker is mid-epoch, or frozen)."""

    def __next__(self) -> str:
        raise StopIteration


class _Method:
    def __init__(self, actor: _Actor, name: str) -> None:
        self.actor, self.name = actor, name

    def options(self, **options: Any) -> _Method:
        self.actor.options.append(options)
        return self

    def remote(self) -> str:
        self.actor.asked += 1
        return f"{self.actor.name}.{self.name}-{self.actor.asked}"


class _Actor:
    def __init__(self, name: str) -> None:
        self.name = name
        self.asked = 0
        self.options: list[dict[str, Any]] = []
        self.alive = _Method(self, "alive")
        self.stats = _Method(self, "stats")


class _Ray:
    """Answers the refs in ``answering`` (the workers' "alive?" questions), nothing else."""

    def __init__(self) -> None:
        self.answering: set[str] = set()
        self.failing: dict[str, Exception] = {}  # refs that are ready with an error
        self.killed: list[Any] = []

    def wait(self, refs: list[Any], num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        ready = [r for r in refs if r in self.answering or r in self.failing]
        return ready[:num_returns], [r for r in refs if r not in ready]

    def get(self, ref: str) -> Any:
        if ref in self.failing:
            raise self.failing[ref]
        return {"worker": ref.split(".")[0]}

    def kill(self, actor: Any, no_restart: bool = True) -> None:
        self.killed.append(actor)


def _pool(workers: int = 1) -> RayWorkerPool:
    pool = RayWorkerPool.__new__(RayWorkerPool)  # no Ray: only the pool's own bookkeeping is under test
    pool._ray = _Ray()
    pool._queue_depth = 2
    pool._pending_events = []
    pool._hosts = {"node-a": "host-a"}
    pool._free = FreeWorkers()
    pool._batcher, pool._batches, pool._to_take, pool._takes = CallBatcher(), [], {}, {}
    pool._watch = None
    pool._agents = []
    pool._keepers = {}
    pool._workers = {}
    for k in range(workers):
        wid = f"w{k:04d}"
        w = _Worker(wid, Slot(node_id="node-a", index=k, cpus=1.0, gpus=0.0), actor=_Actor(wid), info_ref=f"info-{k}")
        w.info = {"worker": wid, "node": "node-a"}
        w.tasks.append(_Task(f"t{k:05d}", 0, wid, _Generator(), started=True))
        pool._workers[wid] = w
    return pool


def test_a_quiet_worker_is_asked_on_its_liveness_thread_and_an_answer_keeps_it():
    pool = _pool()
    w = pool._workers["w0000"]
    assert pool.wait(0) == [] and w.ping is None  # heard from just now: nothing to ask
    w.heard = time.monotonic() - PING_AFTER_S - 1
    assert pool.wait(0) == []
    assert w.ping == "w0000.alive-1" and w.actor.options == [{"concurrency_group": "liveness"}]
    assert pool.wait(0) == [] and w.actor.asked == 1  # one question at a time
    pool._ray.answering.add("w0000.alive-1")
    assert pool.wait(0) == []
    assert w.ping is None and time.monotonic() - w.heard < 1
    assert w.alive


def test_a_worker_silent_for_unresponsive_s_is_lost_as_unresponsive():
    pool = _pool()
    w = pool._workers["w0000"]
    w.heard = time.monotonic() - UNRESPONSIVE_S - 1
    events = pool.wait(0)
    kinds = [(e.kind, e.trial, e.worker_lost, e.unresponsive, e.started) for e in events]
    assert kinds == [(EventKind.FAILED, "t00000", True, True, True), (EventKind.LOST, None, True, True, False)]
    assert "unresponsive" in events[0].error and "w0000" in events[0].error
    assert not w.alive and pool._ray.killed == [w.actor]


def test_a_worker_still_starting_is_not_unresponsive():
    pool = _pool()
    w = pool._workers["w0000"]
    w.info = {}  # has not described itself yet: a start-up matter (start_failed), not silence
    w.heard = time.monotonic() - UNRESPONSIVE_S - 1
    assert [e for e in pool.wait(0) if e.kind is not EventKind.READY] == []
    assert w.alive and w.ping is None


def test_at_the_end_the_workers_that_do_not_answer_are_named():
    pool = _pool(workers=2)
    pool._ray.answering.add("w0000.alive-1")  # w0000 answers its question; w0001 does not
    began = time.monotonic()
    silent = pool.unresponsive(0.05)
    assert list(silent) == ["w0001"] and "no answer within 0.05 s" in silent["w0001"]
    assert time.monotonic() - began < 1


class _Lost(SlotLost, RuntimeError):
    """What a node agent's call raises on the master when the slot's process is gone (Ray's task error, its cause)."""


def test_a_worker_found_dead_at_the_end_is_retired_as_lost_and_the_others_report_their_stats():
    pool = _pool(workers=3)
    for w in pool._workers.values():
        w.tasks.clear()  # each waits for its next trial: only the final stats question can find a dead one
    pool._ray.answering.add("w0000.stats-1")
    pool._ray.failing["w0001.stats-1"] = _Lost("SlotLost: worker w0001's process died (exit code -9)")
    pool._ray.failing["w0002.stats-1"] = ValueError("a stats bug is not a death")
    final = pool.retire_all()
    assert final.stats == {"w0000": {"worker": "w0000"}}
    assert final.lost == {"w0001": "worker died: SlotLost: worker w0001's process died (exit code -9)"}
    assert not any(w.alive for w in pool._workers.values())
    assert len(pool._ray.killed) == 3


# --- shutting Ray down ------------------------------------------------------------------------


def _hanging_ray(monkeypatch: pytest.MonkeyPatch, released: threading.Event) -> None:
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "shutdown", lambda: released.wait(10))


def test_a_local_ray_that_does_not_shut_down_is_killed_and_the_run_moves_on(monkeypatch):
    released = threading.Event()
    _hanging_ray(monkeypatch, released)

    def kill() -> int:
        released.set()  # as killing the frozen GCS releases ray.shutdown
        return 7

    monkeypatch.setattr(ray_session, "kill_local_ray", kill)
    began = time.monotonic()
    note = RaySession("127.0.0.1:6379", local=True).shutdown(wait_s=0.2)
    assert time.monotonic() - began < 2
    assert note == "Ray did not shut down within 0.2 s: its 7 local process(es) were killed"


def test_a_cluster_that_does_not_let_go_is_left_after_the_wait(monkeypatch):
    released = threading.Event()
    _hanging_ray(monkeypatch, released)
    monkeypatch.setattr(ray_session, "kill_local_ray", lambda: pytest.fail("a joined cluster is not ours to kill"))
    began = time.monotonic()
    try:
        note = RaySession("head:6379", local=False).shutdown(wait_s=0.1)
    finally:
        released.set()
    assert time.monotonic() - began < 1
    assert note is not None and "head:6379" in note and "did not finish within 0.1 s" in note
