"""The simulated pool's clock, and the scale simulation's start-up measurement built on it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from aiperf.cluster.messages import EventKind
from aiperf.cluster.sim_pool import HybridClock

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_a_cpu_clock_counts_the_master_s_work_and_the_jumps_but_not_its_waits():
    clock = HybridClock(cpu=True)
    start = clock()
    time.sleep(0.05)  # another process's time, on a shared box: not the master's
    assert clock() - start < 0.03
    clock.jump_to(clock() + 10.0)
    assert clock() - start >= 10.0


def test_time_unseen_by_the_master_does_not_pass_and_the_clock_never_goes_back():
    clock = HybridClock()
    entered = clock()
    with clock.unseen():
        inside = clock()
        time.sleep(0.2)
        assert entered <= clock() == inside  # frozen where it was entered, not ahead of what it reads after
        with clock.unseen():
            time.sleep(0.05)
    after = clock()
    assert entered <= after < entered + 0.1
    time.sleep(0.05)
    assert clock() >= after + 0.05  # and the master's own time passes again


def test_a_workers_side_of_a_submission_is_not_the_master_s_time():
    """The spec read, the weights found and the learning curve are worker and simulator work, not the master's."""
    from aiperf.cluster.sim_pool import SimulatedWorkerPool, learning_curve
    from aiperf.training.trial import TrialSpec

    def slow_curve(spec: TrialSpec) -> tuple[float, ...]:
        time.sleep(0.3)  # a simulator's expensive model of the trial
        return learning_curve(0.9, spec)

    clock = HybridClock()
    pool = SimulatedWorkerPool(2, clock, accuracy_fn=slow_curve, epoch_s=10.0)
    hparams = {"batch_size": 32, "epochs": 2}
    spec = TrialSpec(trial_id="t1", kind="seed", graph={}, hparams=hparams, seed=1).to_dict()
    before = clock()
    pool.submit("w00000", "t1", 0, spec)
    assert clock() - before < 0.1
    events = pool.wait(100.0) + pool.wait(100.0)  # the workers' announcements, then the trial's start
    assert any(e.trial == "t1" for e in events)


def test_the_start_up_measurement_ends_when_every_worker_has_its_first_trial(tmp_path):
    from scale_sim import simulate

    result = simulate(64, 600.0, 5, 3.0, 0, tmp_path, startup_only=True, cpu_clock=True)
    assert result.first_trial_all_busy_s is not None and result.epochs == 0
    assert 64 <= result.trials_started < 128  # the first trial of every worker (and those held for a worker)
    assert result.run_s < 600.0  # long before any trial ends


def _slowed(fn, seconds: float):
    def slow(*args, **kwargs):
        time.sleep(seconds)
        return fn(*args, **kwargs)

    return slow


def test_the_scale_simulation_s_workers_do_not_wait_for_what_a_real_run_does_before_they_exist(tmp_path, monkeypatch):
    """A real run makes its search and its header before its workers (engine/run.py): neither is their idle time."""
    import scale_sim

    monkeypatch.setattr(scale_sim, "make_search", _slowed(scale_sim.make_search, 2.0))
    monkeypatch.setattr(scale_sim, "run_start_record", _slowed(scale_sim.run_start_record, 2.0))
    result = scale_sim.simulate(64, 600.0, 5, 3.0, 0, tmp_path, startup_only=True)
    assert result.first_trial_all_busy_s is not None and result.first_trial_all_busy_s < 2.0


def test_a_simulated_study_s_workers_do_not_wait_for_its_search_or_header(tmp_path, monkeypatch):
    from aiperf.engine import assembly, search
    from aiperf.ledger.store import read_raw_ledger
    from tests.helpers import simulated_run

    monkeypatch.setattr(search, "make_search", _slowed(search.make_search, 2.0))
    monkeypatch.setattr(assembly, "run_start_record", _slowed(assembly.run_start_record, 2.0))
    records = read_raw_ledger(simulated_run(tmp_path / "run"))
    starts = [r["t"] for r in records if r["type"] == "trial_start"]
    assert starts and min(starts) < 2.0


def test_ray_s_remote_call_is_charged_to_the_master_on_every_submission():
    from aiperf.cluster.sim_pool import SimulatedWorkerPool, learning_curve
    from aiperf.training.trial import TrialSpec

    spec = TrialSpec(trial_id="t1", kind="seed", graph={}, hparams={"batch_size": 32, "epochs": 2}, seed=1).to_dict()
    for call_s, low, high in ((0.0, 0.0, 0.2), (0.5, 1.0, 1.2)):
        clock = HybridClock(cpu=True)
        pool = SimulatedWorkerPool(2, clock, epoch_s=10.0, call_s=call_s, accuracy_fn=lambda s: learning_curve(0.9, s))
        before = clock()
        pool.submit("w00000", "t1", 0, spec)
        pool.submit("w00001", "t2", 0, {**spec, "trial_id": "t2"})
        assert low <= clock() - before < high
    with pytest.raises(ValueError, match="call_s"):
        SimulatedWorkerPool(1, HybridClock(), call_s=-1.0)


def test_a_node_agents_trials_submitted_in_a_row_share_one_call_and_start_when_it_is_sent():
    from aiperf.cluster.sim_pool import SimulatedWorkerPool, learning_curve
    from aiperf.training.trial import TrialSpec

    spec = TrialSpec(trial_id="t1", kind="seed", graph={}, hparams={"batch_size": 32, "epochs": 2}, seed=1).to_dict()
    clock = HybridClock(cpu=True)
    pool = SimulatedWorkerPool(
        6, clock, nodes=3, epoch_s=10.0, call_s=0.5, per_node=True, accuracy_fn=lambda s: learning_curve(0.9, s)
    )
    assert [pool.worker_info(f"w0000{k}")["node"] for k in range(6)] == [f"sim-node-{k // 2}" for k in range(6)]
    pool.submit("w00000", "t0", 0, {**spec, "trial_id": "t0"})
    pool.submit("w00001", "t1", 0, {**spec, "trial_id": "t1"})
    assert clock() < 0.4, "a node's trials are held while the master goes on submitting to that node"
    pool.submit("w00002", "t2", 0, {**spec, "trial_id": "t2"})  # another node: the first node's call goes
    assert 0.5 <= clock() < 0.9, "one call for the first node's two trials"
    pool.submit("w00003", "t3", 0, {**spec, "trial_id": "t3"})
    pool.submit("w00004", "t4", 0, {**spec, "trial_id": "t4"})
    assert 1.0 <= clock() < 1.4
    events = pool.wait(timeout=0.0)  # the last node's call goes before the pool waits
    assert 1.5 <= clock() < 1.9
    events += pool.wait(timeout=0.0)
    starts = {e.trial: e for e in events if e.kind is EventKind.START}
    assert set(starts) == {"t0", "t1", "t2", "t3", "t4"}
    times = {k: v for k, v in pool._workers.items() if v.queue}
    assert times["w00000"].queue[0].start == times["w00001"].queue[0].start >= 0.5, "they start when the call went"
    assert times["w00004"].queue[0].start >= 1.5

    # One actor per worker: a call per trial, each trial starting as it is submitted.
    clock = HybridClock(cpu=True)
    pool = SimulatedWorkerPool(
        4, clock, nodes=2, epoch_s=10.0, call_s=0.5, accuracy_fn=lambda s: learning_curve(0.9, s)
    )
    pool.submit("w00000", "t0", 0, {**spec, "trial_id": "t0"})
    assert 0.5 <= clock() < 0.9 and pool._workers["w00000"].queue[0].start >= 0.5
    pool.submit("w00001", "t1", 0, {**spec, "trial_id": "t1"})
    assert 1.0 <= clock() < 1.4


def test_a_trial_held_for_its_nodes_call_is_not_sent_once_its_worker_died():
    from aiperf.cluster.sim_pool import SimulatedWorkerPool, learning_curve
    from aiperf.training.trial import TrialSpec

    spec = TrialSpec(trial_id="t1", kind="seed", graph={}, hparams={"batch_size": 32, "epochs": 2}, seed=1).to_dict()
    clock = HybridClock(cpu=True)
    pool = SimulatedWorkerPool(
        2, clock, nodes=1, epoch_s=10.0, per_node=True, accuracy_fn=lambda s: learning_curve(0.9, s)
    )
    pool.submit("w00000", "t0", 0, {**spec, "trial_id": "t0"})
    pool.submit("w00001", "t1", 0, {**spec, "trial_id": "t1"})
    lost = pool._kill("w00001")
    assert [e.trial for e in lost if e.kind is EventKind.FAILED] == ["t1"]
    events = []
    for _ in range(5):
        events += pool.wait(timeout=30.0)
    assert {e.trial for e in events if e.kind is EventKind.DONE} == {"t0"}, "the dead worker's trial never ran"


def test_each_wait_charges_one_keeper_call_per_node_whose_agent_named_weights():
    from aiperf.cluster.sim_pool import SimulatedWorkerPool, learning_curve
    from aiperf.training.trial import TrialSpec

    spec = TrialSpec(trial_id="t1", kind="seed", graph={}, hparams={"batch_size": 32, "epochs": 2}, seed=1).to_dict()
    charged = {}
    for on_nodes in (True, False):
        clock = HybridClock(cpu=True)
        pool = SimulatedWorkerPool(
            4, clock, nodes=2, epoch_s=10.0, call_s=0.5, per_node=True, weights_on_nodes=on_nodes,
            accuracy_fn=lambda s: learning_curve(0.9, s),
        )  # fmt: skip
        pool.wait(timeout=0.0)  # the workers announce themselves
        for k in range(4):
            pool.submit(f"w0000{k}", f"t{k}", 0, {**spec, "trial_id": f"t{k}"})
        pool.wait(timeout=0.0)  # the calls go; the trials start
        while pool._events[0][2] != "epoch":
            pool.wait(timeout=0.0)
        first_epoch = pool._events[0][0]
        events = pool.wait(timeout=60.0)
        assert {(pool.worker_info(e.worker)["node"], e.kind) for e in events} == {("sim-node-0", EventKind.EPOCH)}
        charged[on_nodes] = clock() - first_epoch
    assert 0.5 <= charged[True] < 0.9, "one keeper call for the node's two epochs"
    assert charged[False] < 0.4, "arrays in the messages: nothing to take"
