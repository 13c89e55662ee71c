"""TPE asked ahead (nas.tuner_ahead): the same values here or in its own process; a lost process loses nothing."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from nas.errors import NasError
from nas.hpo import HyperparameterSpace, HyperparameterTuner
from nas.tuner_ahead import AheadTuner, TunerProcess

SPACE = HyperparameterSpace()


def _script(tuner, asks: int = 120, seed: int = 0, before=None) -> list[dict]:
    """Asks with results arriving 16 asks later, some failures and resumed results; the values asked, in order."""
    rng = np.random.default_rng(seed)
    asked, running = [], []
    for k in range(asks):
        if before is not None:
            before(k)
        trial_id = f"t{k:04d}"
        asked.append(tuner.ask(trial_id))
        running.append(trial_id)
        if k % 29 == 5:
            assert tuner.add_completed(asked[k // 2], float(rng.random()))
        if len(running) > 16:
            done = running.pop(0)
            if rng.random() < 0.1:
                tuner.fail(done)
                assert not tuner.is_running(done)
            else:
                tuner.tell(done, float(rng.random()))
        assert tuner.is_running(trial_id)
    return asked


@pytest.mark.parametrize("ahead", [0, 4])
def test_the_process_asks_what_this_process_would_in_the_same_order(ahead):
    here = _script(AheadTuner(HyperparameterTuner(SPACE, seed=3), ahead))
    process = TunerProcess(SPACE, 3, ahead)
    try:
        there = _script(process)
        assert process.in_process
        assert process.best() is not None
    finally:
        process.close()
    assert there == here
    assert len({tuple(v.items()) for v in here}) > 100  # TPE's values, not one value repeated


def test_asking_ahead_changes_the_values_but_not_their_space():
    now = _script(AheadTuner(HyperparameterTuner(SPACE, seed=3), 0))
    ahead = _script(AheadTuner(HyperparameterTuner(SPACE, seed=3), 8))
    assert ahead != now
    assert all(SPACE.kernel_sizes.count(v["kernel_size"]) and v["batch_size"] in SPACE.batch_sizes for v in ahead)


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_lost_tuner_process_hands_over_to_the_master_and_the_asks_go_on(how, caplog):
    process = TunerProcess(SPACE, 3, 4, patience_s=2.0)

    def lose_at_60(k):
        if k == 60:
            os.kill(process._process.pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            if how == "kill":
                process._process.join(10)

    try:
        asked = _script(process, before=lose_at_60)
        assert not process.in_process and not process._process.is_alive()
        # Trials asked by the lost process are still running here: their results are taken, a repeat refused.
        assert process.is_running("t0119")
        process.tell("t0119", 0.5)
        with pytest.raises(NasError, match="not running"):
            process.tell("t0119", 0.5)
        assert process.best() is not None
    finally:
        process.close()
        if process._process.is_alive():
            os.kill(process._process.pid, signal.SIGKILL)
    assert len(asked) == 120
    assert "tuning in the master" in caplog.text


@pytest.mark.parametrize(
    "make", [lambda: AheadTuner(HyperparameterTuner(SPACE, seed=1), 2), lambda: TunerProcess(SPACE, 1, 2)]
)
def test_a_trial_asked_twice_or_told_unasked_is_refused_as_by_the_tuner(make):
    tuner = make()
    try:
        tuner.ask("a")
        with pytest.raises(NasError, match="already has"):
            tuner.ask("a")
        with pytest.raises(NasError, match="already has"):
            tuner.ask("~ahead:0")  # the names of the values made ahead are not a trial's
        with pytest.raises(NasError, match="not running"):
            tuner.tell("b", 0.1)
        tuner.fail("b")  # failing what is not running changes nothing
        assert not tuner.add_completed({**tuner.ask("c"), "kernel_size": 4}, 0.2)  # outside the space
    finally:
        tuner.close()


def test_tune_ahead_out_of_range_is_refused():
    with pytest.raises(NasError, match="asked ahead"):
        AheadTuner(HyperparameterTuner(SPACE, seed=1), 65)
    with pytest.raises(NasError, match="asked ahead"):
        TunerProcess(SPACE, 1, -1)
