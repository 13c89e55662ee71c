"""The trainer: every hyperparameter reaches training, inheritance preserves the function, OOM shrinks."""

from __future__ import annotations

import subprocess
import sys

import keras
import numpy as np
import pytest
from helpers import REPO, cli_env

from aiperf.config import DatasetConfig
from aiperf.datasets import load_dataset
from aiperf.families.image.trainer import (
    TrainerSettings,
    TrialRunner,
    batch_limit,
    classification_metrics,
    evaluate_weights,
)
from aiperf.training.step_timing import compile_overhead, eval_compile_overhead
from aiperf.training.trial import TrialSpec, inherit_weights
from nas import zoo
from nas.morph import Morph, apply_morph

pytestmark = pytest.mark.slow  # trains Keras models

HP = {"learning_rate": 0.05, "batch_size": 64, "weight_decay": 5e-4, "dropout": 0.0, "kernel_size": 3, "epochs": 2}


@pytest.fixture(scope="module")
def digits():
    return load_dataset(DatasetConfig(name="digits"))


def _seed():
    return zoo.small_resnet((8, 8, 1), 10, width=8, dropout=0.1)


def test_every_hyperparameter_reaches_training(digits):
    runner = TrialRunner(digits, TrainerSettings())
    hp = {
        "learning_rate": 0.0123,
        "batch_size": 32,
        "weight_decay": 0.0031,
        "dropout": 0.37,
        "kernel_size": 5,
        "epochs": 3,
    }
    # The kernel size shapes the architecture the search hands over (a deeper morph's new conv).
    graph = _seed()
    relu = next(n.id for n in graph.nodes if n.op == "act")
    graph, _ = apply_morph(graph, Morph("deeper", relu, size=hp["kernel_size"]))
    items = list(runner.run(TrialSpec("t1", "arch", graph.to_dict(), hp, seed=3)))
    epochs = [i for i in items if i["type"] == "epoch"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3]  # epochs
    assert all(e["batch_size"] == 32 for e in epochs)  # batch size
    assert all(e["steps"] == digits.train_size // 32 for e in epochs)  # full batches only
    assert all(e["train_images"] == e["steps"] * 32 for e in epochs)
    model = runner.last_model
    opt = model.optimizer
    steps = digits.train_size // 32
    assert float(opt.base_rate.numpy()) == pytest.approx(0.0123)  # learning rate, the cosine schedule's start
    assert float(opt.decay_steps.numpy()) == 3 * steps  # the schedule spans the trial's epochs
    assert int(opt.iterations.numpy()) == 3 * steps
    assert float(opt.learning_rate.numpy()) == pytest.approx(0.0123 * 0.01)  # ... and ended at its floor
    assert float(opt.decay.numpy()) == pytest.approx(0.0031)  # weight decay
    assert float(opt.momentum_rate.numpy()) == pytest.approx(0.9)  # momentum (the config's)
    dropouts = [layer for layer in model.layers if isinstance(layer, keras.layers.Dropout)]
    assert dropouts and all(float(layer.rate_value.numpy()) == pytest.approx(0.37) for layer in dropouts)  # dropout
    kernels = {tuple(layer.kernel_size) for layer in model.layers if layer.__class__.__name__ == "Conv2D"}
    assert (5, 5) in kernels  # kernel size of the new layer
    done = items[-1]
    assert done["type"] == "done" and set(done["weights"]) == {n.id for n in graph.nodes if graph.weight_shapes(n.id)}


def test_inherited_weights_start_from_the_parents_function(digits):
    settings = TrainerSettings()
    runner = TrialRunner(digits, settings)
    parent = _seed()
    items = list(runner.run(TrialSpec("t0", "seed", parent.to_dict(), HP, seed=1)))
    parent_weights = items[-1]["weights"]
    parent_acc = evaluate_weights(digits, parent, parent_weights, settings)
    assert parent_acc == pytest.approx(items[-2]["val_acc"])  # the reported accuracy is the weights' accuracy
    relu = [n.id for n in parent.nodes if n.op == "act"][1]
    child, _ = apply_morph(parent, Morph("deeper", relu, size=3))
    child, _ = apply_morph(child, Morph("wider", next(n.id for n in child.nodes if n.op == "conv"), size=12), rng=5)
    morphs = [
        Morph("deeper", relu, size=3).to_dict(),
        Morph("wider", next(n.id for n in child.nodes if n.op == "conv"), size=12).to_dict(),
    ]
    spec = TrialSpec("t1", "arch", child.to_dict(), HP, seed=9, parent_graph=parent.to_dict(), morphs=morphs)
    child_weights = inherit_weights(spec, parent_weights)
    child_acc = evaluate_weights(digits, child, child_weights, settings)
    assert child_acc == pytest.approx(parent_acc, abs=1.5 / digits.val_size)  # same function, before training
    # Training the child continues from there rather than from scratch.
    trained = [i for i in runner.run(spec, parent_weights) if i["type"] == "epoch"]
    assert trained[0]["val_acc"] > 0.5


def test_classification_metrics_match_keras(digits):
    import keras

    runner = TrialRunner(digits, TrainerSettings())
    list(runner.run(TrialSpec("t0", "seed", _seed().to_dict(), dict(HP, epochs=1), seed=1)))
    model = runner.last_model
    logits = model.predict(digits.x_val, verbose=0)
    loss, acc = classification_metrics(logits, digits.y_val)
    ref = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(digits.y_val, logits)
    assert loss == pytest.approx(float(ref), rel=1e-5)
    assert acc == pytest.approx(float(np.mean(np.argmax(logits, 1) == digits.y_val)))


def test_out_of_memory_halves_the_batch_and_retries(digits, monkeypatch):
    import keras

    class ResourceExhaustedError(RuntimeError):
        pass

    calls = {"n": 0}
    original = keras.Model.fit

    def flaky_fit(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ResourceExhaustedError("OOM when allocating tensor with shape [64,8,8,8]")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "fit", flaky_fit)
    runner = TrialRunner(digits, TrainerSettings())
    items = list(runner.run(TrialSpec("t0", "seed", _seed().to_dict(), dict(HP, epochs=2), seed=1)))
    epochs = [i for i in items if i["type"] == "epoch"]
    assert [e["batch_size"] for e in epochs] == [32, 32]
    assert epochs[0]["oom_retries"] == 1
    assert items[-1]["requested_batch_size"] == 64 and items[-1]["batch_size"] == 32


def test_other_errors_are_not_retried(digits, monkeypatch):
    import keras

    def broken_fit(self, *args, **kwargs):
        raise ValueError("something else")

    monkeypatch.setattr(keras.Model, "fit", broken_fit)
    runner = TrialRunner(digits, TrainerSettings())
    with pytest.raises(ValueError, match="something else"):
        list(runner.run(TrialSpec("t0", "seed", _seed().to_dict(), HP, seed=1)))


def test_batch_limit_from_device_memory():
    assert batch_limit(1e6, 0, 512) == 512  # CPU: no device bound
    assert batch_limit(1e6, 2**30, 4096) == 512  # 0.6 GiB / 1 MB -> 644 -> 512
    assert batch_limit(1e9, 2**30, 4096) == 1


DP_SCRIPT = r"""
import os, sys
backend = sys.argv[1]
os.environ["KERAS_BACKEND"] = backend
if backend == "jax":
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
else:
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from aiperf.config import DatasetConfig
from aiperf.datasets import load_dataset
from aiperf.families.image.trainer import TrainerSettings, TrialRunner
from aiperf.training.trial import TrialSpec
from nas import zoo

ds = load_dataset(DatasetConfig(name="digits"))
g = zoo.small_resnet((8, 8, 1), 10, width=8)
runner = TrialRunner(ds, TrainerSettings(data_parallel=2), backend)
hp = {"learning_rate": 0.05, "batch_size": 32, "weight_decay": 0.0, "dropout": 0.0, "kernel_size": 3, "epochs": 2}
items = [i for i in runner.run(TrialSpec("t0", "seed", g.to_dict(), hp, seed=1)) if i["type"] == "epoch"]
model = runner.last_model
if backend == "tensorflow":
    replicas = model.distribute_strategy.num_replicas_in_sync
else:
    import keras
    replicas = len(keras.distribution.distribution().device_mesh.devices.flatten())
print("RESULT", replicas, items[-1]["batch_size"], items[-1]["val_acc"])
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_data_parallel_over_two_devices(backend, tmp_path):
    if backend == "jax":
        pytest.importorskip("jax", reason="the jax backend is not installed")
    script = tmp_path / "dp.py"
    script.write_text(DP_SCRIPT)
    env = cli_env()
    env.pop("KERAS_BACKEND", None)
    proc = subprocess.run(
        [sys.executable, str(script), backend], capture_output=True, text=True, env=env, timeout=300, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    _, replicas, batch, acc = line.split()
    assert int(replicas) == 2
    assert int(batch) == 64  # the per-device batch of 32 on each of two devices
    assert float(acc) > 0.3


def test_compilation_is_the_first_step_beyond_an_ordinary_step_of_its_epoch():
    # 10 steps in 1.9 s, the first 1.0 s: the other nine took 0.1 s each, so 0.9 s was tracing/compiling.
    assert compile_overhead(1.0, 1.9, 10) == pytest.approx(0.9)
    assert compile_overhead(0.05, 1.0, 11) == 0.0  # a first step no slower than the rest compiled nothing
    assert compile_overhead(0.7, 0.7, 1) == 0.7  # nothing to compare with: all of it
    # The first evaluation traces the predict step: its excess over the trial's later evaluations.
    assert eval_compile_overhead([0.66, 0.34, 0.35]) == pytest.approx(0.32)
    assert eval_compile_overhead([0.3, 0.34]) == 0.0 and eval_compile_overhead([0.66]) == 0.0


def test_a_trainer_made_without_a_config_trains_with_the_config_s_defaults():
    """One source per default: a trainer a test or benchmark makes bare trains as a default run's workers do
    (its maximum batch was 4,096 against the config's 512)."""
    from aiperf.cluster.worker import WorkerSettings, trainer_settings
    from aiperf.config import load_config
    from aiperf.training.backend import DeviceInfo

    bare = TrainerSettings()
    workers = trainer_settings(WorkerSettings.from_config(load_config("default")), DeviceInfo("cpu", "a CPU"))
    for name in ("bn_momentum", "momentum", "eval_batch_size", "max_batch_size", "max_bad_fraction",
                 "shuffle_buffer", "compiled_models", "compile_ahead"):  # fmt: skip
        assert getattr(bare, name) == getattr(workers, name), name
