"""The LM hyperparameter space and its TPE tuner: validation, samples inside the space, learning, bounded history."""

from __future__ import annotations

import math

import pytest

from nas.errors import NasError
from nas.language.hpo import (
    DEFAULT_LM_HPARAMS,
    LM_HPARAM_KEYS,
    LMHyperparameterSpace,
    LMTuner,
    normalise_lm_hparams,
)

SPACE = LMHyperparameterSpace(
    learning_rate=(1e-4, 1e-2),
    warmup_fraction=(0.0, 0.2),
    weight_decay=(1e-3, 0.3),
    batch_sizes=(8, 16, 32, 64),
    seq_lens=(32, 64, 128),
    epochs=(1, 3),
    max_batch_tokens=2048,
)


def test_asks_are_plain_values_inside_the_space_within_the_token_bound():
    tuner = LMTuner(SPACE, seed=0)
    for k in range(30):
        h = tuner.ask(f"t{k}")
        assert tuple(h) == LM_HPARAM_KEYS
        assert [type(h[key]) for key in LM_HPARAM_KEYS] == [float, float, float, int, int, int]
        assert SPACE.contains(h), h
        assert h["batch_size"] * h["seq_len"] <= 2048
        tuner.tell(f"t{k}", -abs(math.log10(h["learning_rate"]) + 3))
    assert tuner.completed == 30


def test_tpe_learns_where_the_gain_is():
    tuner = LMTuner(SPACE, seed=1)
    for k in range(40):
        h = tuner.ask(f"t{k}")
        tuner.tell(f"t{k}", -abs(math.log10(h["learning_rate"]) + 3) - 5 * abs(h["warmup_fraction"] - 0.1))
    late = [tuner.ask(f"late{k}") for k in range(10)]
    near = sum(abs(math.log10(h["learning_rate"]) + 3) < 0.5 for h in late)
    assert near >= 6, [h["learning_rate"] for h in late]  # uniform on the log range: ~5 of 10
    best, value = tuner.best()  # type: ignore[misc]
    assert SPACE.contains(best) and value > -0.5


def test_the_history_stays_bounded_and_failures_are_dropped():
    tuner = LMTuner(SPACE, seed=2, keep_best=4, keep_recent=4, keep_running=2, rebuild_every=8)
    for k in range(60):
        h = tuner.ask(f"t{k}")
        if k % 5 == 0:
            tuner.fail(f"t{k}")
        else:
            tuner.tell(f"t{k}", h["learning_rate"])
        assert tuner.study_trials <= 4 + 4 + 2 + 8
    assert tuner.rebuilds >= 3
    with pytest.raises(NasError, match="not running"):
        tuner.tell("t0", 1.0)
    assert tuner.add_completed(dict(DEFAULT_LM_HPARAMS, seq_len=64), 0.1)
    assert not tuner.add_completed(dict(DEFAULT_LM_HPARAMS, seq_len=1024), 0.1)  # outside today's space


def test_a_seeded_tuner_repeats_itself():
    def run(seed: int) -> list[dict]:
        tuner = LMTuner(SPACE, seed=seed)
        out = []
        for k in range(15):
            out.append(tuner.ask(f"t{k}"))
            tuner.tell(f"t{k}", out[-1]["weight_decay"])
        return out

    assert run(3) == run(3) != run(4)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"learning_rate": (0.0, 1e-2)}, "learning_rate"),
        ({"learning_rate": (1e-2, 1e-4)}, "learning_rate"),
        ({"weight_decay": "big"}, "weight_decay"),
        ({"warmup_fraction": (0.0, 1.0)}, "warmup_fraction"),
        ({"warmup_fraction": (0.0, float("nan"))}, "warmup_fraction"),
        ({"batch_sizes": ()}, "batch_sizes"),
        ({"batch_sizes": (8, True)}, "batch_sizes"),
        ({"seq_lens": (0, 64)}, "seq_lens"),
        ({"epochs": (0, 3)}, "epochs"),
        ({"epochs": (1.5, 3)}, "epochs"),
        ({"max_batch_tokens": 100}, "max_batch_tokens"),
        ({"max_batch_tokens": -1}, "max_batch_tokens"),
    ],
)
def test_a_bad_space_is_one_error_naming_the_field(changes, field):
    base = {
        "learning_rate": (1e-4, 1e-2),
        "warmup_fraction": (0.0, 0.2),
        "weight_decay": (1e-3, 0.3),
        "batch_sizes": (8, 16),
        "seq_lens": (32, 64),
        "epochs": (1, 3),
    }
    with pytest.raises(NasError, match=field):
        LMHyperparameterSpace(**{**base, **changes})


def test_the_space_must_fit_the_models_context():
    SPACE.check_context(128)
    with pytest.raises(NasError, match="seq_lens"):
        SPACE.check_context(64)


def test_hyperparameters_are_normalised_or_refused_naming_the_field():
    assert normalise_lm_hparams({**DEFAULT_LM_HPARAMS, "batch_size": 32.0})["batch_size"] == 32
    with pytest.raises(NasError, match="exactly the keys"):
        normalise_lm_hparams({"learning_rate": 0.1})
    with pytest.raises(NasError, match="dropout"):
        normalise_lm_hparams({**DEFAULT_LM_HPARAMS, "dropout": 0.1})
    for key, bad in (("learning_rate", 0.0), ("warmup_fraction", 1.0), ("seq_len", 1.5), ("epochs", True)):
        with pytest.raises(NasError, match=key):
            normalise_lm_hparams({**DEFAULT_LM_HPARAMS, key: bad})
    with pytest.raises(NasError, match="mapping"):
        normalise_lm_hparams([1, 2])
