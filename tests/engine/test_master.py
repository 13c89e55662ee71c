"""The master loop against an in-process simulated pool: bookkeeping, faults, budget, determinism."""

from __future__ import annotations

import io
import json
import logging
import pickle
from collections import Counter

import numpy as np
import pytest
from helpers import sim_run_start

from aiperf.cluster.messages import StoredWeights
from aiperf.cluster.sim_pool import HybridClock, SimulatedWorkerPool
from aiperf.config import load_config
from aiperf.engine.master import Master, MasterSettings
from aiperf.engine.search import make_search
from aiperf.engine.weights import WeightStore
from aiperf.ledger.schema import Record
from aiperf.ledger.store import LedgerWriter, read_ledger
from aiperf.metrics.score import compute_score
from aiperf.results.summary import summarize
from aiperf.results.verify import check_consistency
from nas import zoo


def _run(
    tmp_path,
    workers=4,
    budget=200.0,
    epoch_s=5.0,
    kills=(),
    max_trials=None,
    failure_fn=None,
    seed=0,
    stop_at=None,
    queue_depth=2,
    keep_weights=16,
    masters=None,
    node_kills=(),
    weights_on_nodes=False,
):
    cfg = load_config("smoke", [f"run.seed={seed}"])
    proposer = make_search(cfg, zoo.small_resnet((8, 8, 1), 10, width=8), 64)
    clock = HybridClock()
    pool = SimulatedWorkerPool(
        workers,
        clock,
        nodes=2,
        epoch_s=epoch_s,
        failure_fn=failure_fn,
        queue_depth=queue_depth,
        weights_on_nodes=weights_on_nodes,
    )
    for worker, at in kills:
        pool.kill_worker_at(worker, at)
    for node, at in node_kills:
        pool.kill_node_at(node, at)
    ledger = LedgerWriter(tmp_path)
    ledger.append(sim_run_start(cfg, pool))
    settings = MasterSettings(time_budget_s=budget, max_trials=max_trials, seed=seed)
    master = Master(settings, proposer, pool, ledger, WeightStore(keep_weights), clock=clock)
    if masters is not None:
        masters.append(master)
    if stop_at is not None:
        original = pool.wait

        def wait(timeout):
            if clock() >= stop_at:
                master.request_stop("test stop")
            return original(timeout)

        pool.wait = wait
    outcome = master.run()
    ledger.append(Record(type="run_stop", t=clock(), status=outcome.status, reason=outcome.reason))
    ledger.close()
    return outcome, read_ledger(tmp_path)


def _check_consistent(records):
    started = {r.trial for r in records if r.type == "trial_start"}
    ended = Counter(r.trial for r in records if r.type == "trial_end")
    epochs = [(r.trial, r.epoch) for r in records if r.type == "epoch"]
    assert all(t in started for t, _ in epochs), "an epoch of a trial that never started"
    assert len(epochs) == len(set(epochs)), "an epoch was counted twice"
    assert all(n == 1 for n in ended.values()), "a trial ended twice"
    assert set(ended) == started, "every started trial has exactly one end"
    times = [r.t for r in records]
    assert times == sorted(times), "master clock went backwards"


def test_run_keeps_every_worker_busy_and_ledger_consistent(tmp_path):
    outcome, records = _run(tmp_path, workers=4, budget=200.0)
    assert outcome.status == "completed"
    _check_consistent(records)
    starts = [r for r in records if r.type == "trial_start"]
    assert len({r.arch_id for r in starts}) >= 10
    # With a queue depth of 2 the next trial is already waiting: no worker ever sits idle between trials.
    workers = [r for r in records if r.type == "worker"]
    assert len(workers) == 4
    for w in workers:
        assert w.idle_gaps.max_s is not None and w.idle_gaps.max_s < 0.5
        assert w.busy_fraction > 0.9
    score = compute_score(records)
    last_epoch = max(r.t for r in records if r.type == "epoch")
    assert records[-1].type == "run_stop" and score.wall_s == pytest.approx(records[-1].t)  # the recorded end
    assert last_epoch <= score.wall_s <= 200.0 + 1.0
    assert score.total_ops == pytest.approx(sum(r.ops for r in records if r.type == "epoch"))


def test_children_inherit_from_completed_parents_only(tmp_path):
    _, records = _run(tmp_path, workers=2, budget=150.0)
    completed_at = {r.trial: r.t for r in records if r.type == "trial_end" and r.status == "completed"}
    inheriting = [r for r in records if r.type == "trial_start" and r.inherit]
    assert inheriting, "no trial inherited weights"
    for r in inheriting:
        assert r.inherit in completed_at and completed_at[r.inherit] <= r.t
        assert r.morphs or r.kind == "tune"


def test_worker_death_requeues_from_the_last_completed_epoch(tmp_path, monkeypatch):
    sent: dict[tuple[str, int], int | None] = {}  # (trial, attempt) -> the steps per epoch its spec carried
    submit = SimulatedWorkerPool.submit

    def recording(self, worker, trial, attempt, spec, *weights):
        sent[(trial, attempt)] = spec.get("steps_per_epoch")
        return submit(self, worker, trial, attempt, spec, *weights)

    monkeypatch.setattr(SimulatedWorkerPool, "submit", recording)
    # Epochs of 5 s and 2-epoch trials: at t=17 the worker is inside some trial's second epoch.
    _outcome, records = _run(tmp_path, workers=3, budget=120.0, kills=[("w00001", 17.0)])
    _check_consistent(records)
    requeues = [r for r in records if r.type == "requeue"]
    assert len(requeues) == 1
    rq = requeues[0]
    trial = rq.trial
    assert rq.attempt == 1
    first_epochs = [r for r in records if r.type == "epoch" and r.trial == trial and r.attempt == 0]
    assert rq.from_epoch == len(first_epochs)
    resumed = [r for r in records if r.type == "trial_start" and r.trial == trial]
    assert [r.attempt for r in resumed] == [0, 1]
    assert resumed[1].start_epoch == rq.from_epoch
    # the next attempt continues with the steps its epochs had (a worker may have sized them: lm auto)
    assert sent[(trial, 0)] is None and first_epochs, "the check below needs a completed epoch"
    assert sent[(trial, 1)] == first_epochs[-1].steps is not None
    assert resumed[1].worker != "w00001"
    end = next(r for r in records if r.type == "trial_end" and r.trial == trial)
    assert end.status in ("completed", "stopped")
    lost = [r for r in records if r.type == "worker" and r.worker == "w00001"]
    assert lost and "death" in lost[0].retired
    # The dead worker gets no more work.
    assert not [r for r in records if r.type == "trial_start" and r.worker == "w00001" and r.t > 17.0]


def test_weights_left_on_a_node_that_dies_make_its_trials_start_over_and_its_children_start_fresh(tmp_path):
    KILL_T = 27.0  # the node holds a checkpoint of a running trial and a completed parent then
    masters = []
    _, records = _run(
        tmp_path, workers=4, budget=160.0, node_kills=[("sim-node-1", KILL_T)], weights_on_nodes=True, masters=masters
    )
    assert check_consistency(records) == []  # `aiperf verify`'s rules, a restart from epoch 0 included
    assert all(isinstance(w, StoredWeights) for w in masters[0].weights._weights.values()), "references only"
    starts = [r for r in records if r.type == "trial_start"]
    dead = {r.trial for r in starts if r.node == "sim-node-1" and r.t < KILL_T}
    requeues = [r for r in records if r.type == "requeue" and r.trial in dead]
    assert requeues and any(r.from_epoch > 0 for r in requeues)
    for rq in requeues:  # the checkpoint was on the dead node: the next attempt says so and starts at epoch 0
        again = next(r for r in starts if r.trial == rq.trial and r.attempt == rq.attempt)
        assert again.start_epoch == 0 and again.node == "sim-node-0"
        if rq.from_epoch:
            assert "the checkpoint of epoch" in again.weights_lost
        epochs = [r.epoch for r in records if r.type == "epoch" and r.trial == rq.trial and r.attempt == rq.attempt]
        assert epochs == list(range(1, len(epochs) + 1))
    # Children of parents that completed on the dead node train from scratch, and the parent is dropped.
    orphans = [r for r in starts if r.weights_lost and "lost the parent's weights" in r.weights_lost]
    assert orphans and all(r.inherit is None for r in orphans)
    lost_parents = {r.parent for r in orphans if r.kind == "arch"}
    after = min(r.t for r in orphans)
    assert not [r for r in starts if r.t > after and r.inherit in lost_parents]
    assert [r for r in starts if r.t > after and r.inherit], "inheritance goes on"


def test_a_trial_requeued_just_before_the_end_is_still_closed(tmp_path):
    # The worker dies 3 s before the budget: its trial is re-queued but never starts again.
    _, records = _run(tmp_path, workers=2, budget=100.0, kills=[("w00001", 97.0)])
    _check_consistent(records)
    requeued = {r.trial for r in records if r.type == "requeue"}
    assert requeued
    ends = {r.trial: r for r in records if r.type == "trial_end"}
    for trial in requeued:
        assert ends[trial].status == "stopped"


def test_trial_cap_ends_the_run_when_all_trials_finish(tmp_path):
    outcome, records = _run(tmp_path, workers=3, budget=10_000.0, max_trials=7)
    assert outcome.status == "completed" and "7 trials" in outcome.reason
    ends = [r for r in records if r.type == "trial_end"]
    assert len(ends) == 7 and all(r.status == "completed" for r in ends)


def test_failing_trials_are_recorded_and_the_run_goes_on(tmp_path):
    def fail_tune(spec):
        return "ValueError: loss became NaN" if spec.kind == "tune" else None

    _, records = _run(tmp_path, workers=2, budget=150.0, failure_fn=fail_tune)
    _check_consistent(records)
    failed = [r for r in records if r.type == "trial_end" and r.status == "failed"]
    assert failed and all("NaN" in r.reason for r in failed)
    assert [r for r in records if r.type == "trial_end" and r.status == "completed"]


def test_stop_request_interrupts_cleanly(tmp_path):
    outcome, records = _run(tmp_path, workers=2, budget=1000.0, stop_at=30.0)
    assert outcome.status == "interrupted"
    _check_consistent(records)
    summary = summarize(records)
    assert summary["status"] == "interrupted"
    assert summary["score"]["wall_s"] <= 40.0


def test_same_seed_on_one_worker_proposes_the_same_trials(tmp_path):
    def sequence(path):
        _, records = _run(path, workers=1, budget=120.0, queue_depth=1)
        return [
            (
                r.arch_id,
                r.kind,
                r.parent,
                tuple(r.lineage),
                tuple(sorted(r.hparams.model_dump(exclude_unset=True).items())),
            )
            for r in records
            if r.type == "trial_start"
        ]

    a = sequence(tmp_path / "a")
    b = sequence(tmp_path / "b")
    assert len(a) >= 5
    assert a == b


def test_free_workers_kept_in_order_match_a_sort_of_all_workers():
    from aiperf.cluster.pool import FreeWorkers

    rng = np.random.default_rng(0)
    free = FreeWorkers()
    state: dict[str, tuple | None] = {}
    for _ in range(2000):
        worker = f"w{int(rng.integers(50)):04d}"
        group = None if rng.random() < 0.3 else (bool(rng.integers(2)), int(rng.integers(3)))
        free.update(worker, group)
        state[worker] = group
        expected = sorted((g, w) for w, g in state.items() if g is not None)
        assert free.ordered() == [w for _, w in expected]


def test_the_simulated_pool_lists_free_workers_as_a_full_sort_would(tmp_path, monkeypatch):
    checked = []
    original = SimulatedWorkerPool.free_workers

    def checked_free_workers(pool):
        alive = [w for w in pool._workers.values() if w.alive and len(w.queue) < pool.queue_depth]
        expected = [w.worker_id for w in sorted(alive, key=lambda w: (len(w.queue), w.worker_id))]
        listed = original(pool)
        assert listed == expected
        checked.append(len(listed))
        return listed

    monkeypatch.setattr(SimulatedWorkerPool, "free_workers", checked_free_workers)
    _run(tmp_path, workers=5, budget=120.0, kills=[("w00002", 30.0)])
    assert len(checked) > 20 and max(checked) == 5


@pytest.mark.slow
def test_every_record_is_durable_before_the_master_submits_more_work(tmp_path, monkeypatch):
    import aiperf.ledger.store as ledger_module

    ledger_path = tmp_path / "ledger.jsonl"
    synced = {"size": 0, "count": 0}
    real_fsync = ledger_module.os.fsync

    def recording_fsync(fd):
        real_fsync(fd)
        synced["size"] = ledger_path.stat().st_size
        synced["count"] += 1

    monkeypatch.setattr(ledger_module.os, "fsync", recording_fsync)
    submits = []
    original = SimulatedWorkerPool.submit

    def checked_submit(pool, *args, **kwargs):
        assert synced["size"] == ledger_path.stat().st_size, "submitted work on records not yet durable"
        submits.append(args[1])
        return original(pool, *args, **kwargs)

    monkeypatch.setattr(SimulatedWorkerPool, "submit", checked_submit)
    _, records = _run(tmp_path, workers=6, budget=150.0, epoch_s=2.0)
    assert len(submits) > 20
    assert synced["size"] == ledger_path.stat().st_size  # run_stop and all before it are durable
    assert synced["count"] < len(records)  # and records did share fsyncs


def test_a_run_that_counted_no_epoch_fails_and_says_why(tmp_path):
    """A budget shorter than the first epoch scores nothing: the run ends failed, not completed with 0 OPS."""
    outcome, records = _run(tmp_path / "short", budget=3.0, epoch_s=5.0)
    assert not [r for r in records if r.type == "epoch"]
    assert outcome.status == "failed"
    assert "no epoch completed within the 3 s budget" in outcome.reason and "run.time_budget_s" in outcome.reason
    assert records[-1].type == "run_stop" and records[-1].status == "failed"
    outcome, _ = _run(tmp_path / "long", budget=30.0, epoch_s=5.0)
    assert outcome.status == "completed"


def test_the_master_forgets_ended_trials_except_those_whose_weights_children_may_inherit(tmp_path):
    masters = []
    _, records = _run(tmp_path, workers=4, budget=400.0, epoch_s=2.0, keep_weights=3, masters=masters)
    master = masters[0]
    _check_consistent(records)
    ended = {r.trial for r in records if r.type == "trial_end"}
    assert len(ended) > 40
    # What is left: the kept weights' trials (children may inherit them) and what was queued or
    # running when the budget ran out (4 workers, 2 trials each, one held per worker at most).
    assert {t for t in ended if t in master.weights} <= set(master.trials)
    assert len(master.weights) == 3 and len(master.trials) <= 3 + 4 * 2 + 4
    inheriting = [r for r in records if r.type == "trial_start" and r.inherit]
    assert len(inheriting) > 10 and all(r.inherit in ended for r in inheriting)  # forgetting cost no inheritance


def test_the_master_proposes_and_submits_only_on_durable_records(tmp_path):
    """Group commit: event records are fsync'ed in groups, but always before the next submission."""
    masters, checked = [], []
    original = SimulatedWorkerPool.submit

    def submit(self, *args, **kwargs):
        master = masters[0]
        checked.append(not master.ledger._unsynced)
        return original(self, *args, **kwargs)

    SimulatedWorkerPool.submit = submit
    try:
        _, records = _run(tmp_path, workers=4, budget=200.0, masters=masters)
    finally:
        SimulatedWorkerPool.submit = original
    _check_consistent(records)
    assert len(checked) > 20 and all(checked)


def test_the_master_raises_the_collectors_threshold_for_its_run_and_puts_it_back(tmp_path, monkeypatch):
    import gc

    from aiperf.engine.master import GC_FIRST_GENERATION

    before = gc.get_threshold()
    seen = []
    original = SimulatedWorkerPool.wait

    def wait(self, timeout):
        seen.append(gc.get_threshold())
        return original(self, timeout)

    monkeypatch.setattr(SimulatedWorkerPool, "wait", wait)
    _run(tmp_path, workers=2, budget=30.0)
    assert seen and all(t[0] >= GC_FIRST_GENERATION and t[1:] == before[1:] for t in seen)
    assert gc.get_threshold() == before
    monkeypatch.setattr(SimulatedWorkerPool, "wait", original)
    with pytest.raises(RuntimeError):  # put back however the run ends

        def broken(self, timeout):
            raise RuntimeError("a pool that fails")

        monkeypatch.setattr(SimulatedWorkerPool, "wait", broken)
        _run(tmp_path / "again", workers=2, budget=30.0)
    assert gc.get_threshold() == before


class _CountingPickler(pickle.Pickler):
    """Counts the objects the pickler hands to Python-level code (what Ray's cloudpickle does per object)."""

    calls = 0

    def reducer_override(self, obj):
        self.calls += 1
        return NotImplemented


def test_every_submission_carries_plain_json_a_pickler_copies_without_python_code(tmp_path, monkeypatch):
    """Ray pickles each submission in the master's thread: a dict subclass per node cost 64 us a spec, not 12."""
    sent = []
    submit = SimulatedWorkerPool.submit

    def recording(self, worker, trial, attempt, spec, *rest):
        sent.append(spec)
        return submit(self, worker, trial, attempt, spec, *rest)

    monkeypatch.setattr(SimulatedWorkerPool, "submit", recording)
    outcome, records = _run(tmp_path, workers=4, budget=300.0)
    assert outcome.status == "completed" and len(sent) >= 8
    assert any(spec["parent_graph"] for spec in sent)  # children carry their parent's graph too
    starts = {r.trial: r for r in records if r.type == "trial_start"}
    for spec in sent:
        pickler = _CountingPickler(io.BytesIO(), protocol=5)
        pickler.dump(spec)
        assert pickler.calls == 0, spec["trial_id"]
        assert json.loads(json.dumps(spec)) == spec
        if spec["trial_id"] in starts:  # what the worker builds is what the ledger says it trained
            assert spec["graph"] == starts[spec["trial_id"]].graph


def test_the_collector_pauses_only_while_workers_that_never_had_a_trial_wait(tmp_path, monkeypatch):
    import gc

    seen: list[tuple[bool, bool]] = []  # (a never-started worker is waiting in this fill, the collector is on)
    original = Master._next_for

    def next_for(master, worker, waiting=0):
        seen.append((worker not in master.compiled_on, gc.isenabled()))
        return original(master, worker, waiting)

    monkeypatch.setattr(Master, "_next_for", next_for)
    assert gc.isenabled()
    _run(tmp_path, workers=5, budget=120.0, kills=[("w00002", 30.0)])
    assert gc.isenabled()  # put back after every fill, and after the run
    first = seen[:5]
    assert all(new and not on for new, on in first)  # the start-up fill: all five wait, no collections
    later = [on for new, on in seen[5:] if not new]
    assert len(later) > 10 and all(later)  # fills of workers that have trained run with the collector on


def test_workers_below_other_programs_priority_are_recorded_and_said_once(tmp_path, monkeypatch, caplog):
    # Ray's default for its workers is niceness 15: on a shared machine the trials get what others leave.
    original = SimulatedWorkerPool.worker_info
    monkeypatch.setattr(SimulatedWorkerPool, "worker_info", lambda self, w: {**original(self, w), "niceness": 15})
    with caplog.at_level(logging.WARNING, logger="aiperf.engine.master"):
        _, records = _run(tmp_path, workers=3, budget=30.0)
    workers = [r for r in records if r.type == "worker"]
    assert len(workers) == 3 and {w.niceness for w in workers} == {15}
    said = [r.getMessage() for r in caplog.records if "niceness 15" in r.getMessage()]
    assert len(said) == 1 and "RAY_worker_niceness=0" in said[0], said
