"""The score from a synthetic ledger: re-queued trials, unfinished work and exact arithmetic."""

from __future__ import annotations

import math

import pytest

from aiperf.ledger.schema import (
    EpochRecord,
    RequeueRecord,
    ResumeRecord,
    RunStartRecord,
    RunStopRecord,
    TrialEndRecord,
    TrialStartRecord,
)
from aiperf.metrics.score import compute_score, format_ops, quality_factor, score_timeline


def epoch(t, trial, n, ops, val_acc, aiperf_ops=None):
    fields = {
        "t": t,
        "trial": trial,
        "epoch": n,
        "train_ops": ops * 0.75,
        "eval_ops": ops * 0.25,
        "ops": ops,
        "aiperf_ops": ops * 2 if aiperf_ops is None else aiperf_ops,
        "val_acc": val_acc,
        "precision": "float32",
    }
    if val_acc is None:  # the record's shape requires an accuracy: build this one unchecked
        return EpochRecord.model_construct(**fields)
    return EpochRecord(**fields)


def trial_start(t, trial, attempt=0):
    return TrialStartRecord(
        t=t, trial=trial, attempt=attempt, kind="seed", arch_id="a", flops={"train_per_image": 1.0}, params=1
    )


def ledger():
    """Three trials: one completes, one is re-queued after its first epoch, one is cut off by the stop."""
    return [
        RunStartRecord(t=0.0, run_id="r"),
        trial_start(1.0, "t00000"),
        trial_start(1.0, "t00001"),
        epoch(10.0, "t00000", 1, 100.0, 0.5),
        TrialEndRecord(t=11.0, trial="t00000", status="completed"),
        epoch(20.0, "t00001", 1, 200.0, 0.6),
        # t00001's node dies during epoch 2: that partial epoch leaves no record and is not counted
        RequeueRecord(t=25.0, trial="t00001", attempt=1, from_epoch=1),
        trial_start(26.0, "t00001", attempt=1),
        epoch(40.0, "t00001", 2, 300.0, 0.75),
        TrialEndRecord(t=41.0, trial="t00001", status="completed"),
        trial_start(42.0, "t00002"),  # still training at the stop
        RunStopRecord(t=60.0, status="completed"),
    ]


def test_counts_only_completed_epochs_and_divides_by_the_run_s_recorded_end():
    s = compute_score(ledger())
    assert (s.total_ops, s.train_ops, s.eval_ops, s.aiperf_ops) == (600.0, 450.0, 150.0, 1200.0)
    assert s.wall_s == 60.0  # the run_stop: the tail after the last epoch is run time too
    assert s.ops_per_s == 10.0
    assert s.best_val_acc == 0.75
    assert s.quality == pytest.approx(math.log(4), rel=1e-15)  # |ln(1 - 0.75)|
    assert s.regulated == pytest.approx(10.0 * math.log(4), rel=1e-15)
    assert s.aiperf_regulated == pytest.approx(20.0 * math.log(4), rel=1e-15)
    assert (s.epochs, s.trials_completed, s.trials_started) == (3, 2, 3)  # a re-queue does not start a new trial


def test_a_ledger_without_a_recorded_end_is_scored_to_its_last_epoch():
    s = compute_score(ledger()[:-1])  # in progress, or cut short: no run_stop
    assert (s.wall_s, s.ops_per_s) == (40.0, 15.0)


def test_a_run_that_ends_right_after_an_epoch_divides_by_its_end():
    records = [*ledger()[:-1], RunStopRecord(t=40.001, status="completed")]
    assert compute_score(records).wall_s == 40.001


def test_downtime_between_a_crash_and_its_resume_counts_as_run_time():
    """A master killed at 21 s and resumed 38 s later: the resumed clock carries the gap, and the score
    divides by the run's end at 60 s, not by the last epoch before the crash (a crash can only cost)."""
    records = [
        RunStartRecord(t=0.0, run_id="r"),
        trial_start(1.0, "t00000"),
        epoch(21.0, "t00000", 1, 600.0, 0.5),
        ResumeRecord(t=59.2, gap_s=38.0, from_seq=3),
        TrialEndRecord(t=59.3, trial="t00000", status="lost"),
        RunStopRecord(t=60.4, status="completed"),
    ]
    s = compute_score(records)
    assert s.wall_s == 60.4
    assert s.ops_per_s == pytest.approx(600.0 / 60.4)


def test_a_ledger_without_epochs_scores_zero():
    s = compute_score(
        [
            RunStartRecord(t=0.0, run_id="r"),
            trial_start(1.0, "t00000"),
            RunStopRecord(t=30.0, status="completed"),
        ]
    )
    assert (s.total_ops, s.wall_s, s.ops_per_s, s.regulated) == (0.0, 30.0, 0.0, 0.0)
    assert s.best_val_acc is None
    assert s.quality == 0.0
    assert (s.epochs, s.trials_started, s.trials_completed) == (0, 1, 0)


def test_null_accuracy_is_ignored_not_fatal():
    records = [epoch(10.0, "t0", 1, 10.0, None), epoch(20.0, "t0", 2, 10.0, 0.5)]
    assert compute_score(records).best_val_acc == 0.5


def test_quality_clamps_perfect_and_impossible_accuracies():
    assert quality_factor(1.0) == pytest.approx(-math.log(1e-9), rel=1e-6)  # finite, about 20.7
    assert math.isfinite(quality_factor(1.5))
    assert quality_factor(-0.2) == 0.0
    assert quality_factor(None) == 0.0
    assert quality_factor(0.5) == pytest.approx(math.log(2), rel=1e-15)


def test_to_dict_round_trips_every_field():
    s = compute_score(ledger())
    d = s.to_dict()
    assert d["total_ops"] == 600.0 and d["trials_started"] == 3
    assert set(d) == set(s.__dataclass_fields__)


# --- timeline ------------------------------------------------------------------------------------------------


def test_timeline_is_the_score_of_the_run_had_it_ended_at_each_point():
    points = score_timeline(ledger(), interval_s=10.0)
    assert [p["t"] for p in points] == [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert [p["total_ops"] for p in points] == [100.0, 300.0, 300.0, 600.0, 600.0, 600.0]
    assert [p["ops_per_s"] for p in points] == [10.0, 15.0, 10.0, 15.0, 12.0, 10.0]
    assert [p["best_val_acc"] for p in points] == [0.5, 0.6, 0.6, 0.75, 0.75, 0.75]
    assert points[-1]["regulated"] == compute_score(ledger()).regulated
    for p in points:
        cut = [r for r in ledger() if r.t <= p["t"] and not isinstance(r, RunStopRecord)]
        assert p["regulated"] == compute_score([*cut, RunStopRecord(t=p["t"], status="completed")]).regulated


def test_timeline_defaults_to_about_a_hundred_points_ending_at_the_last_record():
    points = score_timeline(ledger())
    assert len(points) == 100
    assert points[-1]["t"] == 60.0
    assert points[0]["total_ops"] == 0.0 and points[0]["best_val_acc"] is None  # t = 0.6 s: nothing done yet


def test_timeline_of_an_empty_ledger_is_empty():
    assert score_timeline([]) == []
    with pytest.raises(ValueError, match="interval"):
        score_timeline(ledger(), interval_s=0)


# --- units ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (12.3e9, "OPS", "12.3 GOPS"),
        (1.05e12, "OPS", "1.05 TOPS"),
        (3.2e15, "OPS", "3.2 POPS"),
        (999.96e9, "OPS", "1 TOPS"),  # rounding carries into the next prefix
        (532.0, "OPS", "532 OPS"),
        (0.0, "OPS", "0 OPS"),
        (1.5e6, "ops", "1.5 Mops"),
        (-2.5e3, "OPS", "-2.5 kOPS"),
        (7.0e21, "OPS", "7 ZOPS"),
    ],
)
def test_format_ops(value, unit, text):
    assert format_ops(value, unit) == text


def test_a_tally_fed_record_by_record_gives_the_score_of_the_records(sim_run):
    """The MLPerf-style log scores a run without holding its epochs; it must be the summary's number."""
    from aiperf.ledger.schema import RunStopRecord, run_records
    from aiperf.ledger.store import read_ledger
    from aiperf.metrics.score import ScoreTally

    records = run_records(list(read_ledger(sim_run)))
    tally = ScoreTally()
    for k, record in enumerate(records):
        tally.add(record)
        if k in (len(records) // 3, len(records) // 2):  # part of a run scores like that part
            assert tally.score() == compute_score(records[: k + 1])
    assert isinstance(records[-1], RunStopRecord)
    assert tally.score(records[-1]) == compute_score(records)
    assert tally.score(records[-1]).epochs > 10


def test_a_share_is_shown_with_a_decimal_from_one_percent_and_three_significant_digits_below():
    from aiperf.metrics.score import format_percent

    assert format_percent(0.125) == "12.5 %" and format_percent(0.2) == "20.0 %"
    assert format_percent(0.000587) == "0.0587 %"  # a CPU run's share of Rpeak: not 0.0 %
    assert format_percent(None) == "-"
