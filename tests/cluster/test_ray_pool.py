"""The Ray worker pool's event order, on a stand-in for Ray that delivers messages out of order.

A worker answers ``info`` before it runs any trial, but Ray reports a streaming generator's
items and a task's return value over separate paths: the master can see a trial's first
message before the worker's description. Every record the master writes for that trial
names the worker's node, so the pool must make the worker known first.
"""

from __future__ import annotations

from typing import Any

from aiperf.cluster.messages import EventKind, TrialStarted
from aiperf.cluster.plan import Slot
from aiperf.cluster.pool import FreeWorkers, RayWorkerPool, _Task, _Worker


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
