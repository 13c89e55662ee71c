"""Trials start hot: a worker reuses the model it compiled for an architecture, and it trains exactly as a fresh build.

Re-tunes and re-queued trials repeat an architecture with other hyperparameters. Those are
runtime values of the compiled step, so the worker keeps its compiled models; these tests
check that a kept model, after any other trials, trains a trial to the same numbers as a
fresh build on every backend, that the optimizer is Keras's Nesterov SGD under cosine decay,
and that the master sends trials to the worker that has their architecture compiled.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from helpers import REPO, cli_env

from aiperf.engine.master import Master, MasterSettings
from aiperf.engine.weights import WeightStore
from aiperf.families.image.compiled_models import CompiledModels, compile_key
from aiperf.ledger.store import LedgerWriter
from nas import zoo
from nas.morph import Morph, apply_morph
from nas.proposer import TrialKind, TrialProposal

HP = {"learning_rate": 0.05, "batch_size": 32, "weight_decay": 5e-4, "dropout": 0.0, "kernel_size": 3, "epochs": 1}


def _seed():
    return zoo.small_resnet((8, 8, 1), 10, width=8, dropout=0.1)


def _child():
    g = _seed()
    relu = next(n.id for n in g.nodes if n.op == "act")
    return apply_morph(g, Morph("deeper", relu, size=3))[0]


def _wider():
    g = _seed()
    return apply_morph(g, Morph("wider", next(n.id for n in g.nodes if n.op == "conv"), size=12), rng=1)[0]


# -- which trials can share a compiled model --------------------------------------------------------
def test_the_compile_key_ignores_dropout_rates_and_nothing_else():
    g = _seed()
    assert compile_key(g.with_dropout(0.1)) == compile_key(g.with_dropout(0.45))
    assert compile_key(g) != compile_key(_child())
    assert compile_key(g) != compile_key(_wider())


def test_the_cache_keeps_the_most_recently_used_models():
    cache = CompiledModels(2)
    for key in ("a", "b"):
        cache.keep(_entry(key))
    assert cache.take("a") is not None  # a is now the most recent
    cache.keep(_entry("c"))
    assert "b" not in cache and "a" in cache and "c" in cache
    assert (cache.hits, cache.misses) == (1, 0)
    assert cache.take("b") is None and cache.misses == 1
    none = CompiledModels(0)
    none.keep(_entry("a"))
    assert len(none) == 0


def _entry(key: str) -> Any:
    from aiperf.families.image.compiled_models import CompiledModel

    return CompiledModel(key, model=None, optimizer_start=[])


# -- the master's affinity --------------------------------------------------------------------------
class _ListProposer:
    """Proposes the given graphs in order (a stand-in for the search)."""

    def __init__(self, graphs: list[Any]) -> None:
        self.graphs = list(graphs)

    def ask(self, trial_id: str) -> TrialProposal:
        return TrialProposal(self.graphs.pop(0), TrialKind.TUNE, dict(HP))

    def at(self, progress: float) -> None:
        pass

    def tell(self, *args: Any) -> None:
        pass

    def forget(self, *args: Any) -> None:
        pass


class _Pool:
    def __init__(self, free: list[str]) -> None:
        self.free = free
        self.submitted: list[tuple[str, str]] = []

    def free_workers(self) -> list[str]:
        return list(self.free)

    def submit(self, worker: str, trial: str, *args: Any) -> None:
        self.submitted.append((worker, trial))

    def put(self, value: Any) -> Any:
        return value

    def worker_info(self, worker: str) -> dict[str, Any]:
        return {}


def _master(tmp_path, graphs, free, compiled_models=4, clock=lambda: 0.0, **settings):
    settings = MasterSettings(**{"time_budget_s": 100.0, "compiled_models": compiled_models, **settings})
    pool = _Pool(free)
    master = Master(settings, _ListProposer(graphs), pool, LedgerWriter(tmp_path), WeightStore(4), clock=clock)
    return master, pool


def test_a_trial_another_worker_has_compiled_waits_for_it_and_this_worker_gets_the_next(tmp_path):
    seed, child = _seed(), _child()
    master, pool = _master(tmp_path, [seed.with_dropout(0.3), child], free=["w0"])
    master._note_compiled("w1", compile_key(seed))
    master._fill()
    assert pool.submitted == [("w0", "t00001")]  # the child; the re-tune of the seed is held for w1
    assert master.held["w1"].trial_id == "t00000"
    pool.free = ["w1"]
    master._fill()
    assert pool.submitted[-1] == ("w1", "t00000")
    assert not master.held


@pytest.mark.parametrize("worth_s, held", [(2.0, True), (0.5, False)])
def test_a_trial_is_held_only_while_that_costs_the_idle_workers_less_than_the_compile_it_saves(tmp_path, worth_s, held):
    # Each proposal takes 20 s of the master's clock here, and one more idle worker waits behind w0: holding the
    # re-tune for w1 makes it wait 20 s x 5 % (the moving average's first step) = 1 s. Worth a 2 s compile,
    # not a 0.5 s one -- at the start of a run of 65,536 workers the waiting ones are tens of thousands.
    seed, ticks = _seed(), iter(range(0, 10**6, 10))
    master, pool = _master(
        tmp_path, [seed.with_dropout(0.3), _child(), _wider()], free=["w0", "w2"], clock=lambda: float(next(ticks)),
        time_budget_s=1e9, held_trial_worth_s=worth_s,
    )  # fmt: skip
    master._note_compiled("w1", compile_key(seed))  # w1 is busy with the seed
    master._fill()
    if held:
        assert pool.submitted == [("w0", "t00001"), ("w2", "t00002")]
        assert master.held["w1"].trial_id == "t00000"
    else:
        assert pool.submitted == [("w0", "t00000"), ("w2", "t00001")]
        assert not master.held


def test_with_a_thousand_workers_waiting_nothing_is_held_however_cheap_the_proposals(tmp_path):
    # The first wave's re-tunes take microseconds each, but the start-up children after them take a
    # millisecond: a re-tune held for a busy worker then leaves a waiting one to the dearer proposals.
    from aiperf.engine.master import HOLD_WAITING_LIMIT

    seed = _seed()
    master, _ = _master(tmp_path, [seed.with_dropout(0.3), seed.with_dropout(0.2), _child()], free=["w0"])
    master._note_compiled("w1", compile_key(seed))  # w1 is busy with the seed
    assert master._next_for("w0", waiting=HOLD_WAITING_LIMIT).trial_id == "t00000" and not master.held
    assert master._next_for("w2", waiting=HOLD_WAITING_LIMIT - 1).trial_id == "t00002"  # the child ...
    assert master.held["w1"].trial_id == "t00001"  # ... as with fewer waiting the re-tune is held for w1


def test_at_the_trial_cap_a_held_trial_goes_to_the_idle_worker(tmp_path):
    seed = _seed()
    master, pool = _master(tmp_path, [seed, _child()], free=["w0"])
    master.settings.max_trials = 1
    master._note_compiled("w1", compile_key(seed))
    master._fill()  # the only trial the cap allows is held for w1 at first, then w0 takes it rather than idle
    assert pool.submitted == [("w0", "t00000")] and not master.held


def test_a_worker_that_has_the_architecture_takes_it_itself(tmp_path):
    seed = _seed()
    master, pool = _master(tmp_path, [seed.with_dropout(0.2)], free=["w0"])
    master._note_compiled("w0", compile_key(seed))
    master._note_compiled("w1", compile_key(seed))
    master._fill()
    assert pool.submitted == [("w0", "t00000")] and not master.held


def test_a_held_trial_of_a_lost_worker_runs_elsewhere(tmp_path):
    from aiperf.cluster.messages import EventKind
    from aiperf.cluster.pool import PoolEvent

    seed, child = _seed(), _child()
    master, pool = _master(tmp_path, [seed, child], free=["w0"])
    master._note_compiled("w1", compile_key(seed))
    master._fill()
    assert "w1" in master.held
    master._handle([PoolEvent(EventKind.LOST, "w1", error="its node left the cluster", worker_lost=True)])
    assert not master.held and [s.trial_id for s in master.retry_queue] == ["t00000"]
    master._fill()  # w0 is still listed free here (a pool with depth 2)
    assert pool.submitted[-1] == ("w0", "t00000")


def test_re_queued_trials_go_to_the_worker_that_has_them_compiled(tmp_path):
    seed, child = _seed(), _child()
    master, pool = _master(tmp_path, [seed, child], free=["w0", "w1"], compiled_models=0)
    master._fill()  # no affinity at capacity 0: the trials go in order
    assert pool.submitted == [("w0", "t00000"), ("w1", "t00001")]
    assert not master.compiled_on
    master, pool = _master(tmp_path / "b", [], free=["w1"])
    states = []
    for graph in (seed, child):
        master.proposer.graphs.append(graph)
        states.append(master._new_trial())
    master.retry_queue.extend(states)
    master._note_compiled("w1", compile_key(child))
    master._fill()
    assert pool.submitted == [("w1", states[1].trial_id)]


# -- the optimizer ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_trial_optimizer_steps_as_keras_sgd_under_cosine_decay():
    """Same model, same gradients: TrialSGD and Keras's SGD(nesterov, weight decay) + CosineDecay agree."""
    import keras

    from aiperf.families.image.runtime_hparams import COSINE_ALPHA, NO_DECAY, trial_sgd

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 6)).astype("float32"), rng.integers(0, 3, 64)

    def model():
        keras.utils.set_random_seed(1)
        inp = keras.Input((6,))
        out = keras.layers.Dense(3, name="head")(keras.layers.BatchNormalization(name="bn")(inp))
        return keras.Model(inp, out)

    lr, wd, steps = 0.2, 0.01, 5
    ours = model()
    optimizer = trial_sgd(keras)()
    ours.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    optimizer.build(ours.trainable_variables)
    optimizer.base_rate.assign(lr)
    optimizer.decay_steps.assign(float(steps))
    optimizer.decay.assign(wd)
    optimizer.momentum_rate.assign(0.9)
    theirs = model()
    schedule = keras.optimizers.schedules.CosineDecay(lr, decay_steps=steps, alpha=COSINE_ALPHA)
    sgd = keras.optimizers.SGD(learning_rate=schedule, momentum=0.9, nesterov=True, weight_decay=wd)
    sgd.exclude_from_weight_decay(var_names=list(NO_DECAY))
    theirs.compile(optimizer=sgd, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for m in (ours, theirs):
        m.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)  # 8 steps: past the schedule's end
    for a, b in zip(ours.get_weights(), theirs.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(optimizer.learning_rate.numpy()) == pytest.approx(float(sgd.learning_rate.numpy()))


# -- reuse trains exactly as a fresh build, on every backend -------------------------------------------
def reuse_trials(backend: str) -> dict[str, Any]:
    """A trial trained by a fresh build, then on a kept model after two other trials (in the backend's process)."""
    from aiperf.config import DatasetConfig
    from aiperf.datasets import load_dataset
    from aiperf.families.image.trainer import TrainerSettings, TrialRunner
    from aiperf.training.backend import choose_jit, describe_device
    from aiperf.training.trial import TrialSpec

    jit = choose_jit("auto", backend, describe_device(backend))  # as a worker compiles: JAX always, the rest not on CPU
    ds = load_dataset(DatasetConfig(name="digits"))
    trial = {**HP, "batch_size": 64, "dropout": 0.25, "epochs": 2}
    other = {**HP, "learning_rate": 0.01, "weight_decay": 1e-3}

    def train(runner: Any, graph: Any, hp: dict[str, Any], seed: int) -> dict[str, Any]:
        items = list(runner.run(TrialSpec("t", "tune", graph.to_dict(), hp, seed=seed)))
        epochs = [[i["train_loss"], i["train_acc"], i["val_acc"], i["val_loss"]] for i in items if i["type"] == "epoch"]
        total = sum(float(np.abs(w).sum()) for arrays in items[-1]["weights"].values() for w in arrays)
        return {"epochs": epochs, "reused": items[-1]["step_reused"], "weights": total}

    fresh = train(TrialRunner(ds, TrainerSettings(jit_compile=jit), backend), _seed(), trial, 3)
    runner = TrialRunner(ds, TrainerSettings(jit_compile=jit, compiled_models=2), backend)
    first = train(runner, _seed(), other, 4)  # compiles the seed (other batch size, rate, decay, dropout)
    second = train(runner, _child(), other, 5)  # another architecture in between
    reused = train(runner, _seed(), trial, 3)  # the kept seed model, reset for this trial
    return {"fresh": fresh, "reused": reused, "flags": [first["reused"], second["reused"]]}


@pytest.mark.slow
def test_each_architecture_traces_its_train_step_once_and_a_kept_one_never(monkeypatch):
    """A first trace that creates variables (Keras's metrics) makes TensorFlow trace the step twice; not here."""
    import keras

    from aiperf.config import DatasetConfig
    from aiperf.datasets import load_dataset
    from aiperf.families.image.trainer import TrainerSettings, TrialRunner
    from aiperf.training.trial import TrialSpec

    traced: list[str] = []
    train_step = keras.Model.train_step

    def counted(self: Any, data: Any) -> Any:
        traced.append(self.name)  # Python runs the step's body only while tracing it
        return train_step(self, data)

    monkeypatch.setattr(keras.Model, "train_step", counted)
    runner = TrialRunner(load_dataset(DatasetConfig(name="digits")), TrainerSettings(compiled_models=2), "tensorflow")
    per_trial = []
    for seed, graph in enumerate((_seed(), _child(), _seed())):
        before = len(traced)
        items = list(runner.run(TrialSpec("t", "tune", graph.to_dict(), {**HP, "epochs": 2}, seed=seed)))
        assert len([i for i in items if i["type"] == "epoch"]) == 2
        per_trial.append(len(traced) - before)
    assert per_trial == [1, 1, 0]


@pytest.mark.slow
def test_trials_keep_tensorflows_compiled_kernels_and_shuffle_the_same_after_any_global_seed(monkeypatch):
    """Setting TensorFlow's global seed clears its kernel cache: a kept model would re-instantiate its steps."""
    import tensorflow as tf

    from aiperf.config import DatasetConfig
    from aiperf.datasets import load_dataset
    from aiperf.families.image.trainer import TrainerSettings, TrialRunner
    from aiperf.training.trial import TrialSpec

    set_seed = tf.random.set_seed
    seeded: list[int] = []
    monkeypatch.setattr(tf.random, "set_seed", lambda seed: (seeded.append(seed), set_seed(seed)))
    runner = TrialRunner(load_dataset(DatasetConfig(name="digits")), TrainerSettings(compiled_models=2), "tensorflow")

    def trial(seed: int) -> list:
        items = list(runner.run(TrialSpec("t", "tune", _seed().to_dict(), {**HP, "epochs": 2}, seed=seed)))
        return [[i["train_loss"], i["val_acc"]] for i in items if i["type"] == "epoch"]

    first = trial(1)
    trial(2)
    assert len(seeded) <= 1, "only a global seed set by someone else is put back, once"
    set_seed(12345)  # e.g. a user's keras.utils.set_random_seed between trials
    assert trial(1) == first  # same shuffles, same dropout, same weights: the trial seed decides


REUSE_SCRIPT = r"""
import json, sys
backend, cache = sys.argv[1], sys.argv[2]
from aiperf.training.backend import configure_process
configure_process(backend, 1, cache)
sys.path[:0] = ["tests", "tests/families/image"]  # helpers, and this module
from test_compiled_reuse import reuse_trials
print("RESULT " + json.dumps(reuse_trials(backend)))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_a_reused_model_trains_exactly_as_a_fresh_build(backend, tmp_path):
    cache = tmp_path / "compile-cache"
    if backend == "tensorflow":  # this process's backend
        result = reuse_trials(backend)
    else:
        pytest.importorskip(backend, reason=f"the {backend} backend is not installed")
        script = tmp_path / "reuse.py"
        script.write_text(REUSE_SCRIPT)
        env = cli_env()
        env.pop("KERAS_BACKEND", None)
        proc = subprocess.run(
            [sys.executable, str(script), backend, str(cache)],
            capture_output=True,
            text=True,
            env=env,
            timeout=400,
            cwd=REPO,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert result["flags"] == [False, False]
    assert result["reused"]["reused"] is True and result["fresh"]["reused"] is False
    assert len(result["reused"]["epochs"]) == 2
    # Same seed, same hyperparameters: bit-for-bit the same trial, whatever the model trained before.
    assert result["reused"]["epochs"] == result["fresh"]["epochs"]
    assert result["reused"]["weights"] == result["fresh"]["weights"]
    if backend == "jax":  # the persistent cache holds what this process compiled
        assert cache.is_dir() and any(cache.iterdir())
