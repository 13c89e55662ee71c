"""A language epoch sized by the worker's measured ceiling (lm.steps_per_epoch auto; issue 44, item 3)."""

from __future__ import annotations

import pytest

from aiperf.config import load_config
from aiperf.errors import AiperfError
from aiperf.families.language.epoch_size import MIN_AUTO_STEPS, auto_steps_per_epoch
from aiperf.families.language.trainer import MAX_EPOCH_TOKENS
from nas.language.flops import transformer_flops
from nas.language.spec import TransformerSpec

SEED = TransformerSpec(vocab_size=256, seq_len=1024, width=512, head_dim=64, heads=(8,) * 4, mlp_hidden=(2048,) * 4)
WIDER = TransformerSpec(vocab_size=256, seq_len=1024, width=1024, head_dim=64, heads=(16,) * 4, mlp_hidden=(4096,) * 4)
H100_BF16 = 700e12  # about what a worker's matmul ceiling measures on one (dense bf16)


def _step_s(spec: TransformerSpec, batch: int, seq: int, steps: int, rate: float) -> float:
    tokens = batch * seq
    return steps * transformer_flops(spec, seq).train_per_token(tokens) * tokens / rate


def test_an_epoch_lasts_the_asked_seconds_at_the_ceiling_whatever_the_device_or_model():
    for rate in (H100_BF16, H100_BF16 / 10):
        for spec in (SEED, WIDER):
            steps = auto_steps_per_epoch(spec, 32, 1024, 3, rate, 10.0)
            assert 10.0 <= _step_s(spec, 32, 1024, steps, rate) < 10.0 + _step_s(spec, 32, 1024, 1, rate)
    # a ten times faster device trains ten times the steps in the same seconds; a larger model fewer
    assert auto_steps_per_epoch(SEED, 32, 1024, 3, H100_BF16, 10.0) > 9 * auto_steps_per_epoch(
        SEED, 32, 1024, 3, H100_BF16 / 10, 10.0
    )
    assert auto_steps_per_epoch(WIDER, 32, 1024, 3, H100_BF16, 10.0) < auto_steps_per_epoch(
        SEED, 32, 1024, 3, H100_BF16, 10.0
    )


def test_the_steps_stay_within_the_trainers_limits():
    assert auto_steps_per_epoch(SEED, 32, 1024, 3, 1e9, 0.001) == MIN_AUTO_STEPS  # a slow device: still 10 steps
    most = auto_steps_per_epoch(SEED, 64, 1024, 3, 1e18, 3600.0)  # an absurd ceiling: the epoch's token bound
    assert most == MAX_EPOCH_TOKENS // (64 * 1025)


@pytest.mark.parametrize("rate", [None, 0.0, -1.0, float("nan"), float("inf")])
def test_without_a_measured_ceiling_auto_says_what_to_set(rate):
    with pytest.raises(AiperfError, match=r"measured none .* give lm.steps_per_epoch a number"):
        auto_steps_per_epoch(SEED, 32, 1024, 3, rate, 10.0)


def test_the_config_takes_auto_or_a_bounded_number_and_auto_needs_the_ceiling():
    assert load_config("gpu").lm.steps_per_epoch == "auto"
    assert load_config("llm", ["lm.steps_per_epoch=auto", "lm.epoch_device_s=2.5"]).lm.epoch_device_s == 2.5
    for bad, says in (
        (["lm.steps_per_epoch=0"], "lm.steps_per_epoch: must be 'auto' or an integer"),
        (["lm.steps_per_epoch=auto", "cluster.ceiling_s=0"], "cluster.ceiling_s must not be 0"),
        (["lm.epoch_device_s=0"], "lm.epoch_device_s"),
        (["lm.epoch_device_s=4000"], "lm.epoch_device_s"),
    ):
        with pytest.raises(AiperfError, match=says):
            load_config("llm", bad)
