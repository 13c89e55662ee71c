"""The worker's language-model runner: its items fit the worker's messages, inheritance, resume.

Tiny model (width 16, 1 block, seq_len 16), 2 steps of 4 windows per epoch on a 100 kB slice
of the text corpus: a few seconds on one CPU core in all.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from aiperf.cluster.messages import EpochReport, TrialDone  # noqa: E402
from aiperf.errors import AiperfError  # noqa: E402
from aiperf.families.language.runner import (  # noqa: E402
    LMRunnerSettings,
    LMTrialRunner,
    lm_precision,
    lm_quality,
)
from aiperf.families.language.text_corpus import load_text_corpus  # noqa: E402
from aiperf.families.language.trainer import LMTraining, warmup_cosine_rate, warmup_steps  # noqa: E402
from aiperf.training.trial import TrialSpec  # noqa: E402
from nas.language.morph import LMMorph, apply_spec_morph  # noqa: E402
from nas.language.spec import TransformerSpec, init_weights  # noqa: E402

SEQ, BATCH, STEPS, WINDOWS = 16, 4, 2, 2
HPARAMS = {
    "learning_rate": 3e-3,
    "warmup_fraction": 0.25,
    "weight_decay": 0.01,
    "batch_size": BATCH,
    "seq_len": SEQ,
    "epochs": 2,
}
SETTINGS = LMRunnerSettings(precision="float32", jit_compile=False, steps_per_epoch=STEPS, eval_windows=WINDOWS)
PARENT = TransformerSpec(vocab_size=256, seq_len=SEQ, width=16, head_dim=8, heads=(2,), mlp_hidden=(32,))


class Source:
    """A worker's language data: in memory or not, and the windows it opens."""

    def __init__(self, data, streaming: bool = False) -> None:
        self.data, self.streaming = data, streaming

    def windows(self):
        return self.data


class Spy:
    """The corpus, recording the training windows asked for."""

    def __init__(self, data) -> None:
        self.data = data
        self.train_calls: list[tuple] = []

    def train_windows(self, seq_len, epoch, count=None, seed=None):
        self.train_calls.append((seq_len, epoch, count, seed))
        return self.data.train_windows(seq_len, epoch, count, seed)

    def val_windows(self, seq_len, max_windows=None):
        return self.data.val_windows(seq_len, max_windows)


def trial(spec: TransformerSpec = PARENT, **changes) -> TrialSpec:
    fields = {"trial_id": "t00001", "kind": "seed", "graph": spec.to_dict(), "hparams": dict(HPARAMS), "seed": 5}
    return TrialSpec(**{**fields, **changes})


def as_messages(items: list[dict]) -> list[EpochReport | TrialDone]:
    """What TrialWorker.run_trial makes of the items: an unknown key would be a TypeError there."""
    out: list[EpochReport | TrialDone] = []
    for raw in items:
        item = dict(raw)
        kind = item.pop("type")
        if kind == "epoch":
            item.pop("window")
            out.append(EpochReport(**item))
        else:
            assert kind == "done"
            out.append(TrialDone(**item))
    return out


@pytest.fixture(scope="module")
def corpus():
    return load_text_corpus(max_bytes=100_000, seed=0)


@pytest.fixture(scope="module")
def parent(corpus) -> tuple[LMTrialRunner, LMTraining, list[dict], list[tuple]]:
    """A two-epoch trial: its runner (reused by later tests), its training, its items, the windows it asked for."""
    spy = Spy(corpus)
    runner = LMTrialRunner(Source(spy), SETTINGS)
    items = list(runner.run(trial()))
    assert runner.last_training is not None
    return runner, runner.last_training, items, list(spy.train_calls)


def test_epoch_and_done_items_fit_the_worker_messages(parent):
    _, training, items, _ = parent
    assert [i["type"] for i in items] == ["epoch", "epoch", "done"]
    epochs, done = items[:2], items[2]
    for k, item in enumerate(epochs, start=1):
        assert item["epoch"] == k and item["steps"] == STEPS and item["batch_size"] == BATCH
        assert item["train_images"] == STEPS * BATCH and item["eval_images"] == WINDOWS
        assert item["train_tokens"] == STEPS * BATCH * SEQ and item["eval_tokens"] == WINDOWS * SEQ
        assert item["train_acc"] is None and item["input"] == "memory" and item["precision"] == "float32"
        assert item["val_acc"] == lm_quality(item["bits_per_byte"]) and 0 < item["val_acc"] < 1
        assert item["bits_per_byte"] == pytest.approx(item["val_loss"] / math.log(2))
        begin, end = item["window"]
        assert begin < end and item["train_s"] > 0 and item["eval_s"] > 0
        assert item["train_s"] + item["eval_s"] <= end - begin + 1e-6
    assert set(epochs[0]["weights"]) == set(PARENT.weight_shapes())  # a checkpoint for a re-queue
    assert "weights" not in epochs[1]  # the last epoch's weights are the done item's
    assert done["best_val_acc"] == max(e["val_acc"] for e in epochs)
    assert done["startup_s"] > 0 and done["first_step_s"] > 0 and done["compile_s"] >= 0
    assert done["step_reused"] is False and done["requested_batch_size"] == done["batch_size"] == BATCH
    final = training.weights()
    assert all(np.array_equal(done["weights"][n], final[n]) for n in final)
    messages = as_messages(items)
    assert isinstance(messages[0], EpochReport) and messages[0].weights is not None and messages[1].weights is None
    assert isinstance(messages[2], TrialDone) and messages[2].best_val_acc == done["best_val_acc"]


def test_no_checkpoints_unless_asked_and_streamed_data_says_so(corpus):
    runner = LMTrialRunner(Source(corpus, streaming=True), SETTINGS)
    items = list(runner.run(trial(hparams={**HPARAMS, "epochs": 1}, checkpoint_every_epoch=False)))
    assert [i["type"] for i in items] == ["epoch", "done"]
    assert items[0]["input"] == "stream" and "weights" not in items[0]
    as_messages(items)


def test_a_child_starts_at_its_parents_final_validation_loss(parent, corpus):
    runner, _, items, _ = parent
    morph = LMMorph("wider_mlp", 0, 48)
    child = trial(
        apply_spec_morph(PARENT, morph),
        trial_id="t00002",
        kind="morph",
        parent_graph=PARENT.to_dict(),
        morphs=[morph.to_dict()],
        hparams={**HPARAMS, "epochs": 1},
    )
    start = runner.start_weights(child, parent_weights=items[-1]["weights"])
    assert start is not None and set(start) == set(apply_spec_morph(PARENT, morph).weight_shapes())
    again = runner.start_weights(child, parent_weights=items[-1]["weights"])
    assert all(np.array_equal(start[n], again[n]) for n in start)  # every retry starts identically
    kwargs = {"steps_per_epoch": STEPS, "eval_windows": WINDOWS, "seed": 5, "jit_compile": False}
    loss, _ = LMTraining(apply_spec_morph(PARENT, morph), child.hparams, corpus, weights=start, **kwargs).evaluate()
    assert loss == pytest.approx(items[1]["val_loss"], rel=1e-5, abs=1e-5)
    grown = list(runner.run(child, parent_weights=items[-1]["weights"]))
    assert [i["type"] for i in grown] == ["epoch", "done"] and grown[0]["epoch"] == 1


def test_a_resumed_trial_trains_the_same_windows_at_the_same_schedule_position(parent, corpus):
    _, training, items, calls = parent
    total = training.updates
    full_lr = float(keras.ops.convert_to_numpy(training.model.optimizer.learning_rate))
    assert total == 2 * STEPS
    assert calls == [(SEQ, epoch, STEPS * BATCH, 5) for epoch in (1, 2)]
    resumed_spy = Spy(corpus)
    resumed = LMTrialRunner(Source(resumed_spy), SETTINGS)
    again = list(resumed.run(trial(start_epoch=1), resume_weights=items[0]["weights"]))
    assert [i["type"] for i in again] == ["epoch", "done"] and again[0]["epoch"] == 2
    assert resumed_spy.train_calls == calls[1:]  # epoch 2's windows, not epoch 1's again
    assert resumed.last_training is not None
    assert resumed.last_training.updates == total  # the schedule continued where the first attempt stopped
    lr = float(keras.ops.convert_to_numpy(resumed.last_training.model.optimizer.learning_rate))
    assert lr == pytest.approx(full_lr, rel=1e-6)
    # Before its first update a resumed trial reads the rate of update start_epoch * steps_per_epoch.
    kwargs = {"steps_per_epoch": STEPS, "eval_windows": WINDOWS, "seed": 5, "jit_compile": False}
    fresh = LMTraining(PARENT, HPARAMS, corpus, weights=items[0]["weights"], start_epoch=1, **kwargs)
    rate = float(keras.ops.convert_to_numpy(fresh.model.optimizer.learning_rate))
    warm = warmup_steps(HPARAMS["warmup_fraction"], 2 * STEPS)
    assert fresh.updates == STEPS and rate == pytest.approx(warmup_cosine_rate(STEPS, 3e-3, warm, 2 * STEPS), rel=1e-6)
    # Optimizer moments restart on a resume (a checkpoint holds weights only): close, not bitwise equal.
    assert math.isfinite(again[0]["val_loss"]) and again[0]["val_loss"] < math.log(256)


def test_precision_mapping_and_refused_trials(corpus):
    assert lm_precision("mixed_float16") == "float32" and lm_precision("mixed_bfloat16") == "mixed_bfloat16"
    with pytest.raises(AiperfError, match="precision"):
        lm_precision("float16")
    assert LMTrialRunner(Source(corpus), LMRunnerSettings("mixed_float16", False, 1, 1)).precision == "float32"
    runner = LMTrialRunner(Source(corpus), SETTINGS)
    with pytest.raises(AiperfError, match=r"trial t00001: the architecture is not a language model"):
        next(runner.run(trial(graph={"nodes": []})))
    wrong = trial(trial_id="t00003", parent_graph=PARENT.to_dict(), morphs=[LMMorph("deeper", 0).to_dict()])
    with pytest.raises(AiperfError, match=r"trial t00003: replaying the lineage does not give"):
        next(runner.run(wrong, parent_weights=init_weights(PARENT, 0)))
    with pytest.raises(AiperfError, match="trial t00004: inherits weights but carries no parent"):
        next(runner.run(trial(trial_id="t00004"), parent_weights=init_weights(PARENT, 0)))
    with pytest.raises(AiperfError, match="resuming after epoch 1 needs"):
        next(runner.run(trial(start_epoch=1)))
    with pytest.raises(AiperfError, match="batch_size"):
        next(runner.run(trial(hparams={**HPARAMS, "batch_size": 0})))


def test_auto_steps_are_sized_by_the_ceiling_and_a_later_attempt_keeps_its_epochs_steps(corpus):
    from aiperf.families.language.epoch_size import auto_steps_per_epoch

    auto = LMRunnerSettings("float32", False, "auto", WINDOWS, epoch_device_s=0.004, ceiling_flops_per_s=5e9)
    runner = LMTrialRunner(Source(corpus), auto)
    sized = auto_steps_per_epoch(PARENT, BATCH, SEQ, HPARAMS["epochs"], 5e9, 0.004)
    assert sized > STEPS
    epochs = [item for item in runner.run(trial(hparams={**HPARAMS, "epochs": 1})) if item["type"] == "epoch"]
    assert [e["steps"] for e in epochs] == [auto_steps_per_epoch(PARENT, BATCH, SEQ, 1, 5e9, 0.004)]
    assert epochs[0]["train_tokens"] == epochs[0]["steps"] * BATCH * SEQ
    # the master sends a re-queued attempt the steps its epochs had: another worker's ceiling does not change them
    kept = [i for i in runner.run(trial(steps_per_epoch=3, hparams={**HPARAMS, "epochs": 1})) if i["type"] == "epoch"]
    assert [e["steps"] for e in kept] == [3]
    unmeasured = LMTrialRunner(Source(corpus), LMRunnerSettings("float32", False, "auto", WINDOWS))
    with pytest.raises(AiperfError, match="measured none"):
        list(unmeasured.run(trial()))
