"""Compiling a queued trial's steps ahead (aiperf.training.compile_ahead): JAX in a subprocess, TensorFlow here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, backend_subprocess

from aiperf.config import DatasetConfig
from aiperf.datasets.synthetic import load_synthetic
from aiperf.families.image.trainer import TrainerSettings, TrialRunner
from aiperf.training.compile_ahead import ahead_supported, prepares_by_running

CHECK = Path(__file__).with_name("compile_ahead_check.py")


@pytest.fixture(scope="module")
def facts() -> dict:
    python, env = backend_subprocess("jax")
    proc = subprocess.run([python, str(CHECK)], capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    if proc.returncode == 77:
        pytest.skip("jax is not installed")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_prepared_trial_trains_exactly_as_on_a_fresh_worker(facts):
    fresh, ahead = facts["fresh"], facts["ahead"]
    assert facts["prepared"] is True
    assert [e["val_acc"] for e in ahead["epochs"]] == [e["val_acc"] for e in fresh["epochs"]]
    for a, f in zip(ahead["epochs"], fresh["epochs"], strict=True):
        assert a["train_loss"] == pytest.approx(f["train_loss"], rel=1e-6)
    assert ahead["checksum"] == pytest.approx(fresh["checksum"], rel=1e-6)


def test_a_prepared_trial_runs_the_executables_compiled_ahead_and_compiles_nothing_itself(facts):
    fresh, ahead = facts["fresh"], facts["ahead"]
    assert ahead["train_misses"] == 0 and ahead["predict_misses"] == 0
    assert ahead["train_hits"] > 0 and ahead["predict_hits"] > 0
    assert ahead["step_reused"] is True
    # The fresh worker compiled just in time, inside its first step: that is what the ahead one saved.
    assert fresh["train_misses"] > 0 and fresh["step_reused"] is False
    assert ahead["epochs"][0]["compile_s"] < fresh["epochs"][0]["compile_s"]


def test_preparing_what_is_already_compiled_does_nothing(facts):
    assert facts["prepared_again"] is False


def test_a_trial_that_arrives_while_its_model_compiles_waits_for_it_and_nothing_compiles_twice(facts):
    waiting = facts["waiting"]
    assert waiting["epochs"][0]["compile_wait_s"] > 0
    assert waiting["train_misses"] == 0 and waiting["predict_misses"] == 0
    assert waiting["step_reused"] is True


def test_a_kept_model_is_prepared_again_for_another_batch_size(facts):
    assert facts["other_batch_prepared"] is True
    other = facts["other_batch"]
    # the same model (the misses of earlier trials on it stay counted): none for the new batch size
    assert other["train_misses"] == facts["ahead"]["train_misses"]


def test_a_batch_size_nobody_prepared_still_trains_compiled_just_in_time(facts):
    unprepared = facts["unprepared_batch"]
    assert unprepared["train_misses"] > facts["other_batch"]["train_misses"]
    assert len(unprepared["epochs"]) == 2


def test_a_language_trial_prepared_ahead_trains_as_on_a_fresh_worker_without_compiling_in_its_steps(facts):
    fresh, ahead = facts["language"]["fresh"], facts["language"]["ahead"]
    assert fresh["prepared"] is False and ahead["prepared"] is True  # only where the runner compiles ahead
    assert ahead["losses"] == pytest.approx(fresh["losses"], rel=1e-6)
    assert ahead["misses"] == 0 and ahead["hits"] > 0  # the train step and both evaluation shapes (6 = 4 + 2)
    assert ahead["step_reused"] is True and fresh["step_reused"] is False
    assert ahead["compile_s"][0] < fresh["compile_s"][0]


def test_compiling_ahead_applies_to_jax_and_tensorflow_on_one_device():
    assert ahead_supported("jax", 1) and ahead_supported("tensorflow", 1)
    assert not ahead_supported("jax", 2) and not ahead_supported("tensorflow", 2)  # a distribution shards the state
    assert not ahead_supported("torch", 1)  # Keras's torch trainer runs eagerly: nothing to compile
    # TensorFlow prepares by running the steps once, which moves the model: the language runner (which trains a
    # prepared model from its built state) and a kept model a trial may be training are left alone there.
    assert prepares_by_running("tensorflow") and not prepares_by_running("jax")


# -- TensorFlow, in this process (the test run's backend) ---------------------------------------------------------
def _tf_trial(runner: TrialRunner, width: int = 8, batch: int = 32, trial: str = "a") -> dict:
    from compile_ahead_check import _spec

    epochs, done = [], {}
    for item in runner.run(_spec(runner.dataset, width, batch, trial)):
        if item["type"] == "epoch":
            epochs.append(item)
        elif item["type"] == "done":
            done = item
    checksum = float(sum(float(abs(w).sum()) for arrays in done["weights"].values() for w in arrays))
    return {"epochs": epochs, "done": done, "checksum": checksum}


@pytest.fixture(scope="module")
def tf_runs() -> dict:
    """The same trial on a fresh TensorFlow worker and on one that prepared it ahead, then what each prepares."""
    import keras

    if keras.backend.backend() != "tensorflow":
        pytest.skip("the test run's Keras backend is not TensorFlow")
    from compile_ahead_check import _spec

    synthetic = {"shape": [12, 12, 3], "classes": 4, "train_size": 256, "val_size": 64}
    dataset = load_synthetic(DatasetConfig(name="synthetic", synthetic=synthetic))
    settings = TrainerSettings(eval_batch_size=64, compile_ahead=True)
    out: dict = {"fresh": _tf_trial(TrialRunner(dataset, settings, "tensorflow"))}
    runner = TrialRunner(dataset, settings, "tensorflow")
    out["prepared"] = runner.prepare(_spec(dataset, 8, 32, "a"))
    out["prepared_again"] = runner.prepare(_spec(dataset, 8, 32, "a"))
    out["ahead"] = _tf_trial(runner)
    out["after_its_trial"] = runner.prepare(_spec(dataset, 8, 32, "b"))  # the kept model ran these shapes
    out["kept_other_batch"] = runner.prepare(_spec(dataset, 8, 16, "c"))  # a kept model: a trial may be training it
    out["other_architecture"] = runner.prepare(_spec(dataset, 6, 32, "d"))
    out["other"] = _tf_trial(runner, width=6, trial="d")
    return out


def test_a_tensorflow_trial_prepared_ahead_trains_exactly_as_on_a_fresh_worker(tf_runs):
    fresh, ahead = tf_runs["fresh"], tf_runs["ahead"]
    assert tf_runs["prepared"] is True
    assert [e["val_acc"] for e in ahead["epochs"]] == [e["val_acc"] for e in fresh["epochs"]]
    assert [e["train_loss"] for e in ahead["epochs"]] == pytest.approx([e["train_loss"] for e in fresh["epochs"]])
    assert ahead["checksum"] == pytest.approx(fresh["checksum"], rel=1e-6)


def test_a_tensorflow_trial_prepared_ahead_starts_on_traced_steps(tf_runs):
    fresh, ahead = tf_runs["fresh"], tf_runs["ahead"]
    assert ahead["done"]["step_reused"] is True and fresh["done"]["step_reused"] is False
    # The fresh worker traced its train and predict steps inside its first epoch: what the prepared one saved.
    assert ahead["epochs"][0]["compile_s"] < fresh["epochs"][0]["compile_s"]
    assert ahead["done"]["first_step_s"] < fresh["done"]["first_step_s"]
    assert tf_runs["other"]["done"]["step_reused"] is True  # a second architecture, prepared while the first was kept


def test_tensorflow_prepares_only_what_a_trial_would_trace_and_never_a_kept_model(tf_runs):
    assert tf_runs["prepared_again"] is False  # ready for these shapes
    assert tf_runs["after_its_trial"] is False  # its trial ran them
    assert tf_runs["kept_other_batch"] is False  # running a step on it could move a trial's weights
    assert tf_runs["other_architecture"] is True


def test_a_torch_worker_prepares_nothing():
    dataset = load_synthetic(
        DatasetConfig(name="synthetic", synthetic={"shape": [8, 8, 3], "classes": 3, "train_size": 64, "val_size": 16})
    )
    runner = TrialRunner(dataset, TrainerSettings(compile_ahead=True), "torch")
    assert runner.ahead is False
