"""The run's own spread: OPS across windows of the steady part, from the ledger alone."""

from __future__ import annotations

import pytest

from aiperf.ledger.schema import EpochRecord
from aiperf.metrics.repeats import format_spread, spread
from aiperf.metrics.steadiness import WINDOWS, steadiness, window_rates


def _epoch(t: float, ops: float, busy: float, trial: str = "t00001") -> EpochRecord:
    return EpochRecord(trial=trial, epoch=1, val_acc=0.5, precision="float32", t=t, ops=ops, train_s=busy, eval_s=0.0)


def _steady_run(rate: float, epoch_s: float, end: float, workers: int = 2) -> list[EpochRecord]:
    """Workers each finishing an epoch of ``rate * epoch_s`` operations every ``epoch_s`` seconds."""
    records = []
    for w in range(workers):
        t = epoch_s + 0.37 * w
        while t <= end:
            records.append(_epoch(t, rate * epoch_s, epoch_s, trial=f"t{w:05d}"))
            t += epoch_s
    return records


def test_a_constant_rate_has_no_spread_whatever_the_epoch_boundaries():
    records = _steady_run(rate=1e9, epoch_s=7.3, end=300.0)
    steady = steadiness(records)
    assert steady is not None
    assert steady.windows == WINDOWS - 1
    assert steady.steady_ops_per_s == pytest.approx(2e9, rel=0.01)
    assert steady.window_cv < 0.01 and steady.half_width < 0.01


def test_an_epoch_counts_in_the_windows_its_steps_ran_in():
    # one epoch of 100 ops over [5, 15] on a scored interval of 20 s cut in two windows
    width, rates = window_rates([_epoch(15.0, 100.0, 10.0), _epoch(20.0, 0.0, 1.0)], windows=2)
    assert width == 10.0
    assert rates == pytest.approx([5.0, 5.0])


def test_a_rate_that_changes_shows_in_the_spread():
    slow = _steady_run(rate=1e9, epoch_s=5.0, end=150.0)
    fast = [_epoch(r.t + 150.0, 3 * r.ops, r.train_s, r.trial) for r in slow]
    steady = steadiness(slow + fast)
    assert steady is not None
    assert steady.window_cv > 0.3
    assert steady.window_min_ops_per_s == pytest.approx(2e9, rel=0.1)
    assert steady.window_max_ops_per_s == pytest.approx(6e9, rel=0.1)


def test_too_short_a_run_has_no_figure():
    assert steadiness(_steady_run(rate=1e9, epoch_s=10.0, end=30.0)) is None
    assert steadiness([]) is None


def test_spread_of_repeated_runs():
    s = spread([100.0, 110.0, 90.0, 105.0, 300.0])
    assert s.runs == 5 and s.median == 105.0 and s.min == 90.0 and s.max == 300.0
    assert s.olympic_mean == pytest.approx(105.0)  # 300 and 90 dropped
    assert s.cv == pytest.approx(0.6326, rel=1e-3)
    one = spread([42.0])
    assert one.cv is None and one.olympic_mean is None and one.median == 42.0
    line = format_spread("OPS", spread([1.0, 3.0]), lambda v: f"{v:g}")
    assert "median 2" in line and "CV 70.7 %" in line and "min 1" in line and "max 3" in line
    with pytest.raises(ValueError):
        spread([])
