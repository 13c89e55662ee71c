"""Where the devices' time went (aiperf.results.device_time): the summary's section, its keys, verify's recount."""

from __future__ import annotations

import json
import shutil

import pytest

from aiperf.ledger.schema import EpochRecord
from aiperf.results.device_time import DeviceTime, compile_critical_fraction, engine_efficiency
from aiperf.results.summary import build_summary
from aiperf.results.verify import verify_run


def _epoch(worker: str, train: float, evaluation: float, ops: float, **extra: float) -> EpochRecord:
    return EpochRecord(
        trial="t", epoch=1, val_acc=0.5, precision="float32", worker=worker, train_s=train, eval_s=evaluation, ops=ops,
        **extra,
    )  # fmt: skip


def test_each_second_of_the_slots_is_put_in_one_place():
    time = DeviceTime()
    # worker a: a first trial that compiled 2 s in its steps and waited 0.5 s for input...
    time.add_epoch(_epoch("a", 9.0, 1.0, 100.0, compile_s=2.0, data_wait_s=0.5))
    # ... then a trial compiled ahead that waited 0.25 s for the rest of its compile, after a 1 s gap in all
    time.add_epoch(_epoch("a", 8.0, 1.0, 90.0, compile_s=0.0, idle_before_s=1.0, compile_wait_s=0.25))
    time.add_epoch(_epoch("b", 18.0, 2.0, 200.0, compile_s=1.0))
    section = time.summary(slots=2, wall_s=30.0, worker_s=50.0)
    assert section is not None
    assert section["steady_s"] == pytest.approx(10 - 2 - 0.5 + 9 + 20 - 1)
    assert section["compile_critical_s"] == pytest.approx(2 + 0.25 + 1)
    assert section["between_trials_s"] == pytest.approx(0.75)
    assert section["idle_s"] == pytest.approx(50 - 39 - 1)
    assert section["starting_s"] == pytest.approx(60 - 50)
    parts = (
        "steady_s",
        "compile_in_steps_s",
        "compile_wait_s",
        "data_wait_s",
        "between_trials_s",
        "idle_s",
        "starting_s",
    )
    assert sum(section[p] for p in parts) == pytest.approx(section["slot_s"])
    assert section["steady_rate_ops_per_s"] == pytest.approx(390 / section["steady_s"])
    # OPS / (slots x steady rate) is the steady share of the slots' time
    ops_per_s = 390 / 30
    assert engine_efficiency(section) == pytest.approx(ops_per_s / (2 * section["steady_rate_ops_per_s"]))
    assert compile_critical_fraction(section) == pytest.approx(3.25 / 50)
    assert time.worker("a") == {"steady_s": pytest.approx(16.5), "compile_critical_s": pytest.approx(2.25)}


def test_a_ledger_whose_epochs_carry_no_compile_share_gets_no_section():
    time = DeviceTime()
    time.add_epoch(_epoch("a", 9.0, 1.0, 100.0))  # written before epochs carried compile_s, or simulated
    assert time.summary(slots=1, wall_s=10.0, worker_s=10.0) is None
    assert time.worker("a") is None
    assert engine_efficiency(None) is None and compile_critical_fraction(None) is None


def test_a_real_run_s_summary_splits_its_slots_time_and_its_engine_efficiency_is_the_steady_share(smoke_run):
    run, _ = smoke_run
    summary = json.loads((run / "summary.json").read_text())
    section = summary["device_time"]
    assert section["slots"] == summary["devices"]["concurrency"]
    assert section["wall_s"] == pytest.approx(summary["score"]["wall_s"])
    engine = summary["efficiency"]["engine"]
    assert 0 < engine <= 1 and engine == pytest.approx(section["steady_s"] / section["slot_s"])
    assert section["steady_rate_ops_per_s"] * section["steady_s"] == pytest.approx(summary["score"]["total_ops"])
    critical = summary["workers"]["compile_critical_fraction"]
    assert critical == pytest.approx(section["compile_critical_s"] / section["worker_s"])
    per_worker = summary["workers"]["per_worker"].values()
    assert sum(w["steady_s"] for w in per_worker) == pytest.approx(section["steady_s"])
    fractions = section["fractions"]
    assert sum(fractions.values()) == pytest.approx(1.0, abs=0.02)


def test_verify_recomputes_the_engine_efficiency_and_flags_an_inflated_one(smoke_run, tmp_path):
    run = shutil.copytree(smoke_run[0], tmp_path / "run")
    ok, _ = verify_run(run)
    assert ok
    summary = json.loads((run / "summary.json").read_text())
    assert summary["device_time"] == build_summary(run)["device_time"]
    summary["efficiency"]["engine"] = 0.99
    (run / "summary.json").write_text(json.dumps(summary))
    ok, report = verify_run(run)
    assert not ok and "efficiency.engine" in report


def test_the_report_shows_where_the_devices_time_went(smoke_run, tmp_path):
    from aiperf.results.report import write_report

    page = write_report(smoke_run[0], tmp_path / "report.html").read_text()
    assert "Where the devices&#x27; time went" in page or "Where the devices' time went" in page
    summary = json.loads((smoke_run[0] / "summary.json").read_text())
    assert f"Engine efficiency {100 * summary['efficiency']['engine']:.1f} %" in page
