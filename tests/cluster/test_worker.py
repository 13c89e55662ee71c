"""The worker's typed inputs and outputs: WorkerSettings from the config and slot, messages to the master."""

from __future__ import annotations

import pickle

import pytest
import ray

from aiperf.cluster.messages import EpochReport, TrialDone, TrialStarted
from aiperf.cluster.plan import Slot
from aiperf.cluster.worker import WorkerSettings
from aiperf.config import load_config


def test_worker_settings_come_from_the_config_once_and_the_slot_per_worker():
    cfg = load_config("smoke", ["train.momentum=0.8", "dataset.decode_threads=3", "dataset.shuffle_buffer=64"])
    base = WorkerSettings.from_config(cfg)
    assert (base.backend, base.precision, base.jit) == (cfg.model.backend, cfg.model.precision, cfg.model.jit_compile)
    assert (base.momentum, base.decode_threads, base.shuffle_buffer) == (0.8, 3, 64)
    assert (base.bn_momentum, base.eval_batch_size, base.max_batch_size) == (
        cfg.model.bn_momentum,
        cfg.train.eval_batch_size,
        cfg.train.max_batch_size,
    )
    gpu_node = base.for_slot(Slot("node-a", 6.0, 4.0, 0))  # per_node placement: one trial on 4 GPUs
    assert (gpu_node.threads, gpu_node.data_parallel) == (6, 4)
    fraction = base.for_slot(Slot("node-b", 0.4, 0.5, 1))  # a fraction of a CPU and of a GPU
    assert (fraction.threads, fraction.data_parallel) == (1, 1)
    assert gpu_node.momentum == base.momentum and base.threads == 1, "the run-wide part is shared, not changed"
    assert pickle.loads(pickle.dumps(gpu_node)) == gpu_node  # crosses to the Ray actor
    assert (
        base.ceiling_s == "auto"
        and WorkerSettings.from_config(load_config("smoke", ["cluster.ceiling_s=0"])).ceiling_s == 0
    )


@pytest.mark.slow  # imports Keras and trains two small models (~30 s)
def test_a_worker_streams_typed_messages_and_measures_its_idle_time(monkeypatch):
    from aiperf.cluster.worker import TrialWorker
    from aiperf.datasets import load_dataset
    from aiperf.training.trial import TrialSpec
    from nas import zoo

    for name in ("KERAS_BACKEND", "OMP_NUM_THREADS", "TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS"):
        monkeypatch.setenv(name, "tensorflow" if name == "KERAS_BACKEND" else "1")  # restored after the test
    cfg = load_config("smoke")
    worker = TrialWorker("w0007", load_dataset(cfg.dataset), WorkerSettings.from_config(cfg))
    hp = {"learning_rate": 0.05, "batch_size": 64, "weight_decay": 0.0, "dropout": 0.0, "kernel_size": 3, "epochs": 2}
    graph = zoo.small_resnet((8, 8, 1), 10, width=8).to_dict()
    trials = [list(worker.run_trial(TrialSpec(f"t{k}", "seed", graph, hp, seed=k).to_dict())) for k in range(2)]
    for messages in trials:
        assert [type(m) for m in messages] == [TrialStarted, EpochReport, EpochReport, TrialDone]
        first, last, done = messages[1], messages[2], messages[3]
        assert first.weights is not None and last.weights is None, "a checkpoint on every epoch but the last"
        assert (first.epoch, last.epoch, first.input, first.batch_size) == (1, 2, "memory", 64)
        assert done.weights and done.requested_batch_size == 64 and done.worker_stats is not None
        assert pickle.loads(pickle.dumps(done)).best_val_acc == done.best_val_acc
    assert trials[0][1].idle_before_s is None, "the worker's first trial has no previous step to be idle after"
    assert trials[1][1].idle_before_s is not None and trials[1][1].idle_before_s > 0
    assert trials[1][2].idle_before_s is None, "only an attempt's first epoch carries the gap"
    assert [t[3].worker_stats["trials"] for t in trials] == [1, 2]
    assert worker.gaps == [trials[1][1].idle_before_s]
    info = worker.info()
    assert info["node"] == "" and not ray.is_initialized(), "asking outside Ray must not start Ray here"
    ceiling = info["ceiling"]  # measured at start, at the worker's precision, inside init_s
    assert ceiling["flops_per_s"] > 0 and ceiling["dtype"] == "float32" and ceiling["error"] is None
    assert ceiling["seconds"] <= worker.init_s and ceiling["devices"] == 1
