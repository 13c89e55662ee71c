"""A run that cannot train stops with a reason (simulated pool: milliseconds per run)."""

from __future__ import annotations

import pytest

from aiperf.cluster.messages import BadImagesReport
from aiperf.cluster.pool import PoolEvent
from aiperf.cluster.sim_pool import HybridClock, SimulatedWorkerPool
from aiperf.config import load_config
from aiperf.engine.master import Master, MasterSettings, cause_key
from aiperf.engine.search import make_search
from aiperf.engine.weights import WeightStore
from aiperf.ledger.schema import Record
from aiperf.ledger.store import LedgerWriter, read_ledger, read_raw_ledger
from aiperf.results.summary import format_summary, summarize
from nas import zoo


def run(tmp_path, workers=3, budget=300.0, failure_fn=None, fail_start=None, kills=(), stop_after=5, images=0):
    cfg = load_config("smoke")
    proposer = make_search(cfg, zoo.small_resnet((8, 8, 1), 10, width=8), 64)
    clock = HybridClock()
    pool = SimulatedWorkerPool(workers, clock, nodes=2, epoch_s=5.0, failure_fn=failure_fn, fail_start=fail_start)
    for worker, at in kills:
        pool.kill_worker_at(worker, at)
    ledger = LedgerWriter(tmp_path)
    dataset = {"name": "sim", "train_images": 900, "eval_images": 100, "split": {"disjoint": True}}
    ledger.append(Record(
        type="run_start", t=0.0, run_id="sim", config=cfg.to_dict(), plan=pool.plan.to_dict(), dataset=dataset,
        rules=cfg.rules.model_dump(),
    ))  # fmt: skip
    settings = MasterSettings(time_budget_s=budget, stop_after_failures=stop_after, dataset_images=images)
    master = Master(settings, proposer, pool, ledger, WeightStore(8), clock=clock)
    outcome = master.run()
    ledger.append(Record(type="run_stop", t=clock(), status=outcome.status, reason=outcome.reason))
    ledger.close()
    return outcome, read_ledger(tmp_path), clock()


def test_every_worker_failing_to_start_fails_the_run_at_once(tmp_path):
    outcome, records, t = run(tmp_path, fail_start=lambda w: "ModuleNotFoundError: No module named 'jax'")
    assert outcome.status == "failed" and t < 5.0
    assert outcome.reason.startswith("no worker could start: worker w0000")
    assert "on node sim-node-" in outcome.reason and "No module named 'jax'" in outcome.reason
    assert "(2 more failed the same way)" in outcome.reason
    failed = [r for r in records if r.type == "worker_failed"]
    assert [r.worker for r in failed] == ["w00000", "w00001", "w00002"]
    assert all(r.cause == "ModuleNotFoundError: No module named 'jax'" and r.hostname for r in failed)
    assert not [r for r in records if r.type == "trial_start"]
    summary = summarize(records)
    assert summary["status"] == "failed" and summary["worker_start_failures"]["count"] == 3
    text = format_summary(summary, tmp_path)
    assert "failed because       no worker could start" in text and "workers not started  3" in text


def test_workers_that_start_carry_the_run_when_others_cannot(tmp_path):
    outcome, records, _ = run(
        tmp_path, fail_start=lambda w: "RuntimeError: CUDA unavailable" if w == "w00001" else None
    )
    assert outcome.status == "completed"
    assert [r.worker for r in records if r.type == "worker_failed"] == ["w00001"]
    trained = {r.worker for r in records if r.type == "epoch"}
    assert trained == {"w00000", "w00002"}


def test_a_deterministic_trial_error_stops_the_run_instead_of_proposing_forever(tmp_path):
    def always(spec):
        return f"TypeError: object of type 'NoneType' has no len() (trial seed {spec.seed})"

    outcome, records, t = run(tmp_path, failure_fn=always)
    assert outcome.status == "failed" and t < 30.0
    assert outcome.reason.startswith("the first 5 trials all failed with the same error; the last on worker w0000")
    assert "TypeError: object of type 'NoneType' has no len()" in outcome.reason
    ends = [r for r in records if r.type == "trial_end"]
    assert 5 <= sum(r.status == "failed" for r in ends) <= 5 + 3
    assert not [r for r in records if r.type == "requeue"], "a deterministic error is never re-queued"


def test_failures_after_progress_stop_the_run_once_they_repeat(tmp_path):
    def later(spec):
        return "OSError: /data/x: Stale file handle" if int(spec.trial_id[1:]) >= 8 else None

    outcome, records, _ = run(tmp_path, budget=1000.0, failure_fn=later)
    assert outcome.status == "failed"
    assert outcome.reason.startswith(
        "5 trials in a row failed, with no epoch completing in between, with the same error"
    )
    assert [r for r in records if r.type == "epoch"], "the run trained before the failures began"


def test_occasional_failures_and_lost_workers_do_not_stop_a_run(tmp_path):
    outcome, records, _ = run(
        tmp_path, workers=4, budget=300.0, kills=[("w00001", 12.0)],
        failure_fn=lambda spec: "ValueError: loss became NaN" if spec.kind == "tune" else None,
    )  # fmt: skip
    assert outcome.status == "completed"
    assert [r for r in records if r.type == "requeue"], "the lost worker's trial is still re-queued"
    assert [r for r in records if r.type == "trial_end" and r.status == "failed"]


def test_a_cause_is_the_error_without_its_numbers_and_paths():
    a = cause_key("OOM when allocating tensor with shape[64,8,8,8] at /tmp/a/b.py:12")
    b = cause_key("OOM when allocating tensor with shape[32,16,16,8] at /var/x.py:7")
    assert a == b and cause_key("ValueError: x") != cause_key("TypeError: x")


def test_skipped_images_over_the_limit_fail_the_run_naming_them(tmp_path):
    cfg = load_config("smoke")
    clock = HybridClock()
    pool = SimulatedWorkerPool(2, clock)
    ledger = LedgerWriter(tmp_path)
    settings = MasterSettings(time_budget_s=100, dataset_images=1000, max_bad_fraction=0.002)
    master = Master(settings, make_search(cfg, zoo.small_resnet((8, 8, 1), 10), 64), pool, ledger, WeightStore(4))

    def report(worker, files, **extra):
        report = BadImagesReport(files=files, epoch_count=len(files), **extra)
        master._handle([PoolEvent("bad_images", worker, "t00000", report=report)])

    report("w00000", ["train/a/1.JPEG", "val/b/2.JPEG"])
    report("w00001", ["val/b/2.JPEG"])  # the same file from another worker: no new record
    assert master.failure is None
    report("w00001", ["train/c/3.JPEG"])  # 3 of 1,000 > 0.2 %
    assert master.failure is not None
    assert master.failure.startswith("3 of 1,000 images cannot be decoded (0.30 %), more than dataset.max_bad_fraction")
    assert "train/a/1.JPEG" in master.failure and "reported by worker w00001" in master.failure
    ledger.close()
    bad = [r for r in read_raw_ledger(tmp_path) if r["type"] == "bad_images"]  # a ledger of bad_images records alone
    assert [r["files"] for r in bad] == [["train/a/1.JPEG", "val/b/2.JPEG"], ["train/c/3.JPEG"]]
    assert [r["count"] for r in bad] == [2, 3] and bad[-1]["over_limit"]


@pytest.mark.parametrize("over", [True, False])
def test_a_worker_that_saw_too_many_bad_images_in_one_epoch_fails_the_run(tmp_path, over):
    cfg = load_config("smoke")
    clock = HybridClock()
    pool = SimulatedWorkerPool(1, clock)
    settings = MasterSettings(time_budget_s=100, dataset_images=100_000)
    master = Master(
        settings, make_search(cfg, zoo.small_resnet((8, 8, 1), 10), 64), pool, LedgerWriter(tmp_path), WeightStore(4)
    )
    report = BadImagesReport(files=["x.JPEG"], epoch_count=400 if over else 1, over_limit=over)
    master._handle([PoolEvent("bad_images", "w00000", "t00000", report=report)])
    assert (master.failure is not None) == over
    if over:
        assert master.failure.startswith("400 of 100,000 images cannot be decoded")
