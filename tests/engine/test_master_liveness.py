"""The master records what stopped answering -- Ray's control plane, a worker -- and still ends at its budget.

On the simulated pool, with the pool's reports injected; the real thing is frozen with SIGSTOP in
``tests/cluster/test_control_plane.py`` (slow).
"""

from __future__ import annotations

from helpers import sim_run_start

from aiperf.cluster.messages import EventKind
from aiperf.cluster.pool import PoolEvent, Retirement
from aiperf.cluster.sim_pool import HybridClock, SimulatedWorkerPool
from aiperf.config import load_config
from aiperf.engine.master import Master, MasterSettings
from aiperf.engine.search import make_search
from aiperf.engine.weights import WeightStore
from aiperf.ledger.schema import RunStopRecord, TrialStatus
from aiperf.ledger.store import LedgerWriter, read_ledger
from nas import zoo


def _master(tmp_path, budget=120.0, retries=2):
    cfg = load_config("smoke")
    proposer = make_search(cfg, zoo.small_resnet((8, 8, 1), 10, width=8), 64)
    clock = HybridClock()
    pool = SimulatedWorkerPool(2, clock, nodes=1, epoch_s=5.0)
    ledger = LedgerWriter(tmp_path)
    ledger.append(sim_run_start(cfg, pool))
    settings = MasterSettings(time_budget_s=budget, max_trial_retries=retries)
    return Master(settings, proposer, pool, ledger, WeightStore(16), clock=clock), pool, ledger, clock


def _finish(master, ledger, tmp_path):
    outcome = master.run()
    ledger.append(
        RunStopRecord(t=master.clock(), status=outcome.status, reason=outcome.reason, **outcome.run_stop_fields())
    )
    ledger.close()
    return outcome, read_ledger(tmp_path)


def _inject(pool, clock, at: dict[float, PoolEvent]):
    """Deliver each event with the first ``wait`` at or after its time."""
    original = pool.wait

    def wait(timeout):
        due = [t for t in at if clock() >= t]
        return [at.pop(t) for t in sorted(due)] + original(timeout)

    pool.wait = wait


def _silence(answering: bool, silent_s: float) -> PoolEvent:
    return PoolEvent(EventKind.CONTROL_PLANE, "", data={"answering": answering, "silent_s": silent_s})


def test_a_control_plane_silence_is_recorded_in_run_stop_and_the_run_ends_at_its_budget(tmp_path):
    master, pool, ledger, clock = _master(tmp_path)
    _inject(pool, clock, {30.0: _silence(False, 5.0), 60.0: _silence(True, 35.0)})
    outcome, records = _finish(master, ledger, tmp_path)
    stop = records[-1]
    assert outcome.status == "completed" and 120.0 <= stop.t < 121.0
    assert 25.0 <= stop.control_plane_silent_t <= 26.0  # when it stopped answering, not when that was noticed
    assert 34.0 <= stop.control_plane_silent_s <= 36.0
    # trials went on while it was silent
    assert any(r.type == "epoch" and 30.0 < r.t < 60.0 for r in records)


def test_a_control_plane_silent_to_the_end_counts_its_silence_to_the_end(tmp_path):
    master, pool, ledger, clock = _master(tmp_path)
    _inject(pool, clock, {50.0: _silence(False, 5.0)})
    _, records = _finish(master, ledger, tmp_path)
    stop = records[-1]
    assert 45.0 <= stop.control_plane_silent_t <= 46.0
    assert 74.0 <= stop.control_plane_silent_s <= 76.0


def test_a_run_whose_control_plane_always_answered_records_no_silence(tmp_path):
    master, _, ledger, _ = _master(tmp_path, budget=30.0)
    _, records = _finish(master, ledger, tmp_path)
    assert "control_plane_silent_t" not in records[-1].to_dict()


def test_a_trial_whose_worker_does_not_answer_at_the_end_ends_unresponsive(tmp_path):
    master, pool, ledger, _ = _master(tmp_path, budget=60.0)
    asked = []

    def unresponsive(wait_s):
        asked.append(wait_s)
        return {"w00000": "no answer within 5 s at the run's end, nothing heard for 40 s"}

    pool.unresponsive = unresponsive
    _, records = _finish(master, ledger, tmp_path)
    assert asked == [5.0]
    ends = [r for r in records if r.type == "trial_end" and r.t >= 60.0]
    by_worker = {r.worker: r for r in ends}
    assert by_worker["w00000"].status is TrialStatus.UNRESPONSIVE
    assert "stopped answering" in by_worker["w00000"].reason and "unfinished epoch is not" in by_worker["w00000"].reason
    epochs = [r for r in records if r.type == "epoch" and r.trial == by_worker["w00000"].trial]
    assert by_worker["w00000"].epochs == len(epochs)  # what it completed before still counts
    assert by_worker["w00001"].status is TrialStatus.STOPPED
    retired = {r.worker: r.retired for r in records if r.type == "worker"}
    assert retired["w00000"].startswith("unresponsive at the run's end") and retired["w00001"] == "run ended"


def test_a_run_stopped_by_a_signal_asks_its_workers_nothing_and_records_them_stopped_with_it(tmp_path):
    """scancel and a job's time limit signal the workers with the master (issue 46), and the job's Ray processes:
    the master's end asks nothing it would wait for (the workers' answers, their final statistics), so its
    run_stop is written before its own node's Ray stops (a real Slurm job lost it on a loaded box); a worker
    is not a fault, and its trial ends stopped, not unresponsive."""
    master, pool, ledger, clock = _master(tmp_path, budget=600.0)
    asked: list[float] = []

    def unresponsive(wait_s):
        asked.append(wait_s)
        return {"w00000": "no answer within 5 s at the run's end"}

    pool.unresponsive = unresponsive
    retire_all, waits = pool.retire_all, []

    def retire(wait_s=5.0):
        waits.append(wait_s)
        return retire_all(wait_s)

    pool.retire_all = retire
    original = pool.wait

    def wait(timeout):
        if clock() >= 40.0:
            master.request_stop("terminated (SIGTERM)")
        return original(timeout)

    pool.wait = wait
    outcome, records = _finish(master, ledger, tmp_path)
    assert outcome.status == "interrupted"
    ends = {r.worker: r for r in records if r.type == "trial_end" and r.t >= 40.0}
    assert ends["w00000"].status is TrialStatus.STOPPED, ends["w00000"]
    assert "the run was stopped (terminated (SIGTERM)) and its worker with it" in ends["w00000"].reason
    retired = {r.worker: r.retired for r in records if r.type == "worker"}
    assert set(retired.values()) == {"stopped with the run (terminated (SIGTERM))"}
    assert not [r for r in records if r.type == "trial_end" and r.status is TrialStatus.UNRESPONSIVE]
    assert asked == [] and waits == [0.0], "the signalled end waited on its workers"


def test_a_worker_found_dead_at_the_end_is_recorded_as_died_not_as_ended(tmp_path):
    master, pool, ledger, _ = _master(tmp_path, budget=60.0)
    original = pool.retire_all

    def retire_all(wait_s=5.0):
        original(wait_s)
        return Retirement(lost={"w00001": "worker died: worker w00001's process died (exit code -9)"})

    pool.retire_all = retire_all
    _, records = _finish(master, ledger, tmp_path)
    retired = {r.worker: r.retired for r in records if r.type == "worker"}
    assert retired == {"w00000": "run ended", "w00001": "worker died: worker w00001's process died (exit code -9)"}


def _unresponsive_losses(pool):
    """The simulated pool's worker deaths, reported as a worker that stopped answering."""
    original = pool.sync

    def sync():
        events = original()
        for ev in events:
            if ev.worker_lost:
                ev.unresponsive = True
                ev.error = f"unresponsive: worker {ev.worker} answered nothing for 60 s"
        return events

    pool.sync = sync


def test_a_trial_of_an_unresponsive_worker_is_requeued_and_ends_unresponsive_when_it_cannot_be(tmp_path):
    master, pool, ledger, _ = _master(tmp_path, budget=60.0, retries=0)
    pool.kill_worker_at("w00000", 22.0)
    _unresponsive_losses(pool)
    _, records = _finish(master, ledger, tmp_path)
    lost = [
        r for r in records if r.type == "trial_end" and r.worker == "w00000" and r.t < 60.0 and r.status != "completed"
    ]
    assert [r.status for r in lost] == [TrialStatus.UNRESPONSIVE]
    assert "answered nothing" in lost[0].reason
    worker = next(r for r in records if r.type == "worker" and r.worker == "w00000")
    assert worker.retired.startswith("unresponsive")


def test_with_retries_left_an_unresponsive_workers_trial_is_requeued_saying_why(tmp_path):
    master, pool, ledger, _ = _master(tmp_path, budget=60.0, retries=2)
    pool.kill_worker_at("w00000", 22.0)
    _unresponsive_losses(pool)
    _, records = _finish(master, ledger, tmp_path)
    requeues = [r for r in records if r.type == "requeue"]
    assert requeues and all("unresponsive" in r.reason for r in requeues)
    assert not any(r.type == "trial_end" and r.status == "unresponsive" for r in records)
