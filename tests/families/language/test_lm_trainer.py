"""One language-model trial: training on the real text corpus, per-epoch records, schedule, FLOPs, morphs, limits.

Tiny model (width 32, 2 blocks, seq_len 32) on a 300 kB slice of the Python text corpus:
a few seconds on one CPU core in all.
"""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from aiperf.errors import AiperfError  # noqa: E402
from aiperf.families.language.model import build_lm  # noqa: E402
from aiperf.families.language.text_corpus import load_text_corpus  # noqa: E402
from aiperf.families.language.token_shards import convert_folder, open_token_folder  # noqa: E402
from aiperf.families.language.trainer import (  # noqa: E402
    COSINE_ALPHA,
    MAX_BATCH,
    EpochLM,
    LMTrialResult,
    ShardWindows,
    train_lm_trial,
    warmup_cosine_rate,
    warmup_cosine_schedule,
    warmup_steps,
)
from nas.language.flops import transformer_flops  # noqa: E402
from nas.language.morph import LMMorph, apply_morph  # noqa: E402
from nas.language.spec import TransformerSpec, init_weights  # noqa: E402

SEQ = 32
BATCH = 16
STEPS = 20
EPOCHS = 3
EVAL_WINDOWS = 32
HPARAMS = {
    "learning_rate": 3e-3,
    "warmup_fraction": 0.1,
    "weight_decay": 0.01,
    "batch_size": BATCH,
    "seq_len": SEQ,
    "epochs": EPOCHS,
}


def tiny_spec() -> TransformerSpec:
    return TransformerSpec(vocab_size=256, seq_len=SEQ, width=32, head_dim=16, heads=(2, 2), mlp_hidden=(64, 64))


class Spy:
    """The corpus, recording every call the trainer makes."""

    def __init__(self, data) -> None:
        self.data = data
        self.train_calls: list[tuple] = []
        self.val_calls: list[tuple] = []

    def train_windows(self, seq_len, epoch, count=None, seed=None):
        self.train_calls.append((seq_len, epoch, count, seed))
        return self.data.train_windows(seq_len, epoch, count, seed)

    def val_windows(self, seq_len, max_windows=None):
        self.val_calls.append((seq_len, max_windows))
        return self.data.val_windows(seq_len, max_windows)


class Untouchable:
    """Data that must not be read: hostile arguments are refused before any work."""

    def train_windows(self, *args, **kwargs):
        raise AssertionError("train_windows read before the arguments were checked")

    def val_windows(self, *args, **kwargs):
        raise AssertionError("val_windows read before the arguments were checked")


@pytest.fixture(scope="module")
def corpus():
    return load_text_corpus(max_bytes=300_000, seed=0)


@pytest.fixture(scope="module")
def parent(corpus) -> tuple[LMTrialResult, list[EpochLM], Spy]:
    spy = Spy(corpus)
    seen: list[EpochLM] = []
    result = train_lm_trial(
        tiny_spec(), HPARAMS, spy, steps_per_epoch=STEPS, eval_windows=EVAL_WINDOWS, on_epoch=seen.append, seed=7
    )
    return result, seen, spy


def test_loss_decreases_over_the_epochs_on_the_text_corpus(parent):
    result, _, _ = parent
    val = [e.val_loss for e in result.epochs]
    train = [e.train_loss for e in result.epochs]
    assert result.initial_val_loss > math.log(256) - 0.1  # an untrained byte model is near uniform
    assert result.initial_val_loss > val[0] > val[1] > val[2], (result.initial_val_loss, val)
    assert train[0] > train[1] > train[2], train
    assert val[-1] < math.log(256) - 1.0  # well below uniform after 60 steps
    assert result.val_loss == val[-1] and result.best_val_loss == min(val)


def test_every_epoch_record_has_every_field(parent):
    result, seen, _ = parent
    assert seen == result.epochs  # on_epoch got each record as it completed
    assert [e.epoch for e in seen] == [1, 2, 3]
    for record in seen:
        for f in fields(EpochLM):
            value = getattr(record, f.name)
            assert isinstance(value, (int, float)) and not isinstance(value, bool), f.name
            assert math.isfinite(value) and value >= 0, (f.name, value)
        assert record.tokens == STEPS * BATCH * SEQ and record.steps == STEPS
        assert record.eval_tokens == EVAL_WINDOWS * SEQ
        assert record.step_seconds > 0 and record.eval_seconds > 0
        assert record.tokens_per_second == pytest.approx(record.tokens / record.step_seconds)
        assert record.bits_per_byte == pytest.approx(record.val_loss / math.log(2))  # bytes: 1 per token
    assert seen[0].compile_seconds > 0 and all(e.compile_seconds == 0 for e in seen[1:])
    assert result.tokens == EPOCHS * STEPS * BATCH * SEQ
    assert result.backend == keras.backend.backend() and result.precision == "float32"
    assert result.schedule_steps == EPOCHS * STEPS and result.warmup_steps == 6
    assert seen[-1].learning_rate == pytest.approx(COSINE_ALPHA * HPARAMS["learning_rate"])
    doc = result.to_dict()
    assert "weights" not in doc and len(doc["epochs"]) == EPOCHS and doc["hparams"]["batch_size"] == BATCH
    assert set(result.weights) == set(tiny_spec().weight_shapes())


def test_validation_windows_are_fetched_once_and_the_same_for_every_evaluation(parent, corpus):
    result, _, spy = parent
    assert spy.val_calls == [(SEQ, EVAL_WINDOWS)]
    assert spy.train_calls == [(SEQ, epoch, STEPS * BATCH, 7) for epoch in (1, 2, 3)]  # new windows each epoch
    x, y = corpus.val_windows(SEQ, EVAL_WINDOWS)
    again = train_lm_trial(
        tiny_spec(), {**HPARAMS, "epochs": 1}, corpus, steps_per_epoch=1, eval_windows=EVAL_WINDOWS, seed=1
    )
    assert again.val_fingerprint == result.val_fingerprint and result.eval_windows == EVAL_WINDOWS
    # The final weights scored on those windows give the last epoch's validation loss.
    model = build_lm(tiny_spec(), result.weights)
    logits = np.asarray(model.predict(x, verbose=0), np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    nll = np.log(np.exp(logits).sum(-1)) - np.take_along_axis(logits, y[..., None].astype(np.int64), -1)[..., 0]
    assert float(nll.mean()) == pytest.approx(result.val_loss, rel=1e-5)


def test_flops_per_epoch_are_the_analytic_count_times_tokens(parent):
    result, _, _ = parent
    flops = transformer_flops(tiny_spec(), SEQ)
    per_token = flops.training(1) + flops.update_per_step / (BATCH * SEQ)  # one optimizer update per step
    assert result.train_flops_per_token == pytest.approx(flops.train_per_token(BATCH * SEQ)) == pytest.approx(per_token)
    for record in result.epochs:
        assert record.train_flops == pytest.approx(per_token * STEPS * BATCH * SEQ)
        assert record.train_flops == pytest.approx(flops.training(STEPS * BATCH * SEQ) + STEPS * flops.update_per_step)
        assert record.eval_flops == flops.forward(1) * EVAL_WINDOWS * SEQ
    assert result.train_flops == pytest.approx(per_token * result.tokens)
    assert result.eval_flops == flops.forward(1) * EVAL_WINDOWS * SEQ * (EPOCHS + 1)  # the initial evaluation too


def test_warmup_then_cosine_schedule_values():
    peak = 1e-3
    assert warmup_steps(0.1, 60) == 6 and warmup_steps(0.0, 60) == 0 and warmup_steps(0.99, 2) == 1
    expected = {
        0: peak / 3,  # warm-up: (k + 1) / 3
        1: 2 * peak / 3,
        2: peak,
        3: peak,  # cosine starts at the peak
        6: peak * (COSINE_ALPHA + (1 - COSINE_ALPHA) * 0.5),  # halfway: (6 - 3) / (10 - 3 - 1)
        9: COSINE_ALPHA * peak,  # the last update
        20: COSINE_ALPHA * peak,  # past the end: held
    }
    for step, want in expected.items():
        assert warmup_cosine_rate(step, peak, 3, 10) == pytest.approx(want, rel=1e-12), step
    assert warmup_cosine_rate(0, peak, 0, 10) == peak  # no warm-up: the peak at once
    schedule = warmup_cosine_schedule(keras)(peak, 3, 10)
    for step in range(12):
        got = float(keras.ops.convert_to_numpy(schedule(step)))
        assert got == pytest.approx(warmup_cosine_rate(step, peak, 3, 10), rel=1e-6), step


@pytest.mark.parametrize("morph", [LMMorph("deeper", 1), LMMorph("wider_model", None, 48)], ids=lambda m: m.kind)
def test_a_morphed_child_starts_at_its_trained_parents_validation_loss(parent, corpus, morph):
    result, _, _ = parent
    child_spec, child_weights = apply_morph(tiny_spec(), morph, result.weights, np.random.default_rng(3))
    assert child_spec != tiny_spec()
    child = train_lm_trial(
        child_spec,
        {**HPARAMS, "epochs": 1},
        corpus,
        weights=child_weights,
        steps_per_epoch=1,
        eval_windows=EVAL_WINDOWS,
        seed=3,
    )
    assert child.val_fingerprint == result.val_fingerprint
    assert child.initial_val_loss == pytest.approx(result.val_loss, rel=1e-5, abs=1e-5)
    assert child.initial_val_loss < result.initial_val_loss - 1.0  # it really inherited the training


def test_mixed_bfloat16_trains_with_float32_losses(corpus):
    result = train_lm_trial(
        tiny_spec(),
        {**HPARAMS, "epochs": 1},
        corpus,
        steps_per_epoch=3,
        eval_windows=8,
        precision="mixed_bfloat16",
        seed=0,
    )
    assert result.precision == "mixed_bfloat16"
    assert math.isfinite(result.val_loss) and result.val_loss < result.initial_val_loss + 0.5
    assert all(w.dtype == np.float32 for w in result.weights.values())


def test_token_shard_folder_through_the_adapter(tmp_path):
    src = tmp_path / "texts"
    src.mkdir()
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "def", "return", "(x)", "\n"]
    for k in range(12):
        (src / f"doc{k:02d}.txt").write_text(" ".join(rng.choice(words, size=400)), encoding="utf-8")
    convert_folder(src, tmp_path / "out", val_fraction=0.25, shard_tokens=4000, seed=0)
    data = ShardWindows(open_token_folder(tmp_path / "out"), seed=5)
    x, y = data.train_windows(SEQ, 1, 10, 5)
    x2, _ = data.train_windows(SEQ, 1, 10, 5)
    x3, _ = data.train_windows(SEQ, 2, 10, 5)
    assert x.shape == y.shape == (10, SEQ) and np.array_equal(x, x2) and not np.array_equal(x, x3)
    assert np.array_equal(data.val_windows(SEQ, 4)[0], data.val_windows(SEQ, 4)[0])
    result = train_lm_trial(tiny_spec(), {**HPARAMS, "epochs": 1}, data, steps_per_epoch=2, eval_windows=4, seed=0)
    assert result.eval_windows == 4 and result.tokens == 2 * BATCH * SEQ and data.describe()["name"] == "token_shards"


HOSTILE = [
    ({"batch_size": 0}, {}, "batch_size"),
    ({"batch_size": MAX_BATCH + 1}, {}, "batch_size"),
    ({"batch_size": 16.5}, {}, "batch_size"),
    ({"batch_size": True}, {}, "batch_size"),
    ({"batch_size": "16"}, {}, "batch_size"),
    ({"seq_len": SEQ + 1}, {}, "seq_len"),
    ({"seq_len": 0}, {}, "seq_len"),
    ({"seq_len": float("nan")}, {}, "seq_len"),
    ({"epochs": 0}, {}, "epochs"),
    ({"epochs": 10**40}, {}, "epochs"),
    ({"learning_rate": float("inf")}, {}, "learning_rate"),
    ({"learning_rate": 0.0}, {}, "learning_rate"),
    ({"learning_rate": -1e-3}, {}, "learning_rate"),
    ({"warmup_fraction": 1.0}, {}, "warmup_fraction"),
    ({"warmup_fraction": float("nan")}, {}, "warmup_fraction"),
    ({"weight_decay": -0.1}, {}, "weight_decay"),
    ({"weight_decay": None}, {}, "weight_decay"),
    ({}, {"steps_per_epoch": 0}, "steps_per_epoch"),
    ({}, {"steps_per_epoch": 1 << 40}, "steps_per_epoch"),
    ({"batch_size": MAX_BATCH}, {"steps_per_epoch": 1 << 20}, "per epoch"),
    ({}, {"eval_windows": 0}, "eval_windows"),
    ({}, {"eval_windows": 10**9}, "eval_windows"),
    ({}, {"epochs": EPOCHS + 1}, "epochs"),
    ({}, {"precision": "mixed_float8"}, "precision"),
    ({}, {"seed": -1}, "seed"),
]


@pytest.mark.parametrize(("bad_hparams", "bad_kwargs", "field"), HOSTILE)
def test_hostile_arguments_are_refused_before_any_work(bad_hparams, bad_kwargs, field):
    kwargs = {"steps_per_epoch": STEPS, "eval_windows": EVAL_WINDOWS, "seed": 0, **bad_kwargs}
    with pytest.raises(AiperfError) as excinfo:
        train_lm_trial(tiny_spec(), {**HPARAMS, **bad_hparams}, Untouchable(), **kwargs)
    message = str(excinfo.value)
    assert field in message and "\n" not in message and len(message) < 300, message


def test_missing_hparam_wrong_data_and_mismatched_weights_are_refused():
    spec = tiny_spec()
    kwargs = {"steps_per_epoch": 1, "eval_windows": 1, "seed": 0}
    without = {k: v for k, v in HPARAMS.items() if k != "warmup_fraction"}
    with pytest.raises(AiperfError, match="warmup_fraction"):
        train_lm_trial(spec, without, Untouchable(), **kwargs)
    with pytest.raises(AiperfError, match="hparams must be a mapping"):
        train_lm_trial(spec, [1, 2], Untouchable(), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(AiperfError, match="train_windows"):
        train_lm_trial(spec, HPARAMS, object(), **kwargs)  # type: ignore[arg-type]
    wrong = init_weights(TransformerSpec(256, SEQ, 48, 16, (2, 2), (64, 64)), 0)
    with pytest.raises(AiperfError, match="tok_emb"):
        train_lm_trial(spec, HPARAMS, Untouchable(), weights=wrong, **kwargs)


def test_windows_outside_the_vocabulary_are_refused(corpus):
    small = TransformerSpec(vocab_size=64, seq_len=SEQ, width=32, head_dim=16, heads=(2,), mlp_hidden=(64,))
    with pytest.raises(AiperfError, match=r"data's vocabulary \(256\) is larger than the model's \(64\)"):
        train_lm_trial(small, HPARAMS, corpus, steps_per_epoch=1, eval_windows=4, seed=0)
    with pytest.raises(AiperfError, match=r"validation windows inputs hold token ids .* outside"):
        train_lm_trial(small, HPARAMS, Spy(corpus), steps_per_epoch=1, eval_windows=4, seed=0)  # no vocab_size
