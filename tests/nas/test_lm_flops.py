"""Analytic transformer FLOPs: matmuls are 2x matrix parameters, ~6N for wide models, attention linear in context;
elementwise work, the loss and the AdamW update by the image counter's rules (docs/flops.md)."""

from __future__ import annotations

import pytest

from nas.errors import NasError
from nas.language.flops import LOSS_OPS_PER_STEP, transformer_flops
from nas.language.spec import TransformerSpec, seed_spec


def wide(seq_len: int = 4096) -> TransformerSpec:
    return TransformerSpec(
        vocab_size=256, seq_len=seq_len, width=4096, head_dim=128, heads=(32,) * 4, mlp_hidden=(16384,) * 4
    )


def matrix_params(spec: TransformerSpec) -> int:
    """Parameters that take part in a matmul per token: block matrices and the output layer."""
    return spec.non_embedding_params() - (2 * spec.n_blocks + 1) * spec.width + spec.width * spec.vocab_size


@pytest.mark.parametrize(
    "spec",
    [
        seed_spec(),
        TransformerSpec(vocab_size=50, seq_len=16, width=12, head_dim=5, heads=(2, 7), mlp_hidden=(9, 3)),
        TransformerSpec(
            vocab_size=50, seq_len=16, width=12, head_dim=5, heads=(2,), mlp_hidden=(9,), tied_output=False
        ),
    ],
)
def test_weight_matmuls_cost_two_flops_per_matrix_parameter(spec):
    flops = transformer_flops(spec)
    assert sum(b.matmul for b in flops.blocks) + flops.output == 2 * matrix_params(spec)
    assert len(flops.blocks) == spec.n_blocks and flops.seq_len == spec.seq_len
    for b, block in enumerate(flops.blocks):  # unequal blocks are counted each with its own sizes
        assert block.qkv == 6 * spec.width * spec.inner(b) and block.mlp == 4 * spec.width * spec.mlp_hidden[b]


def test_wide_model_with_short_context_trains_at_about_six_n_per_token():
    spec = wide()
    tokens = 1_000_000
    n = spec.non_embedding_params()
    training = transformer_flops(spec, seq_len=64).training(tokens)
    assert training == pytest.approx(6 * n * tokens, rel=0.02)
    assert training > 6 * n * tokens  # attention, output layer and norms come on top


def test_attention_grows_linearly_with_context_per_token():
    spec = wide()
    per_token = {t: transformer_flops(spec, seq_len=t) for t in (512, 1024, 1536, 2048)}
    assert per_token[1024].attention == 2 * per_token[512].attention
    assert per_token[2048].attention == 4 * per_token[512].attention
    f = {t: per_token[t].forward() for t in per_token}
    assert f[1536] - f[1024] == pytest.approx(f[1024] - f[512], rel=1e-12)  # everything else is fixed per token
    assert f[2048] > f[512]
    # PaLM's accounting: 6N + 12 * layers * heads * head_dim * context training FLOPs per token
    t = 2048
    assert 3 * per_token[t].attention == 12 * spec.n_blocks * spec.heads[0] * spec.head_dim * t


def test_causal_variant_counts_only_the_visible_keys():
    spec = seed_spec()
    flops = transformer_flops(spec)
    t = spec.seq_len
    for block in flops.blocks:
        assert block.scores_causal == pytest.approx(block.scores * (t + 1) / (2 * t))
        assert block.weighted_sum_causal == pytest.approx(block.weighted_sum * (t + 1) / (2 * t))
        assert block.elementwise_causal < block.elementwise
    assert flops.forward(causal=True) < flops.forward()
    one = transformer_flops(spec, seq_len=1)  # a single token sees only itself: both conventions agree
    assert one.forward(causal=True) == pytest.approx(one.forward())


def test_totals_scale_with_tokens_and_training_is_three_network_forwards_plus_the_loss():
    flops = transformer_flops(seed_spec())
    assert flops.forward(1000) == pytest.approx(1000 * flops.forward())
    assert flops.forward() == flops.network() + flops.loss_forward
    assert flops.backward() == 2 * flops.network() + flops.loss_backward
    assert flops.training(10) == pytest.approx(10 * (3 * flops.network() + flops.loss_forward + flops.loss_backward))
    assert flops.embedding == seed_spec().width  # the lookups are free, adding the two embeddings is not


def small() -> TransformerSpec:
    return TransformerSpec(vocab_size=50, seq_len=16, width=12, head_dim=5, heads=(2, 7), mlp_hidden=(9, 3))


def test_elementwise_terms_follow_the_counting_rules_by_hand():
    """d = 12, T = 16, V = 50; block 0: 2 heads, MLP 9; block 1: 7 heads, MLP 3."""
    flops = transformer_flops(small())
    norm = 4 * 12 + 3  # square, sum, * rsqrt, * gain per element; divide, + eps, rsqrt per token
    assert flops.final_norm == norm == 51
    # two norms 102 + tanh-GELU 9 per unit + two residual adds 24 + softmax 7 per score (H x T scores)
    assert flops.blocks[0].elementwise == 102 + 9 * 9 + 24 + 7 * 2 * 16 == 431
    assert flops.blocks[1].elementwise == 102 + 9 * 3 + 24 + 7 * 7 * 16 == 937
    assert flops.blocks[0].elementwise_causal == 102 + 81 + 24 + 7 * 2 * 8.5 == 326  # (T + 1) / 2 keys
    # the loss over V logits, as the image counter's softmax cross-entropy over K classes
    assert (flops.loss_forward, flops.loss_backward) == (4 * 50 + 3, 2 * 50 + 1) == (203, 101)


def test_adamw_update_per_step_by_hand():
    spec = small()
    params = (50 + 16) * 12 + (24 + 4 * 12 * 10 + 2 * 12 * 9) + (24 + 4 * 12 * 35 + 2 * 12 * 3) + 12
    assert params == spec.params() == 3300
    gains = (2 * 2 + 1) * 12  # two per block and the final norm's: no weight decay
    # clip 3 + Adam 12 + decay 3 per decayed parameter, 15 per gain, the loss's mean 2 per step
    flops = transformer_flops(spec)
    assert flops.update_per_step == 18 * (params - gains) + 15 * gains + LOSS_OPS_PER_STEP == 59222
    assert transformer_flops(spec, seq_len=4).update_per_step == flops.update_per_step  # every row is updated


def test_train_per_token_amortises_the_update_over_the_step():
    flops = transformer_flops(small())
    assert flops.train_per_token(1) == flops.training(1) + flops.update_per_step
    assert flops.train_per_token(64) == pytest.approx(flops.training(1) + flops.update_per_step / 64)
    assert flops.train_per_token(64, causal=True) == pytest.approx(flops.training(1, True) + 59222 / 64)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(NasError, match="tokens_per_step"):
            flops.train_per_token(bad)  # type: ignore[arg-type]


def test_seed_counts():
    """The seed (d 128, 2 blocks of 4 x 32 heads and MLP 512, V 256, T 128), checked against XLA in
    tests/families/language/test_lm_flops_crosscheck.py (network 1,002,639 + XLA's conventions = 1,003,016)."""
    flops = transformer_flops(seed_spec())
    assert flops.network() == 1_002_639
    assert flops.forward() == 1_002_639 + 4 * 256 + 3 == 1_003_666
    assert flops.training() == 3 * 1_002_639 + (4 * 256 + 3) + (2 * 256 + 1) == 3_009_457
    assert flops.update_per_step == 18 * 443_008 - 3 * 5 * 128 + 2 == 7_972_226
    assert flops.train_per_token(32 * 128) == pytest.approx(3_009_457 + 7_972_226 / 4096)


@pytest.mark.parametrize(
    ("seq_len", "message"), [(0, "seq_len must be"), (129, "seq_len must be"), (True, "seq_len"), (2.0, "seq_len")]
)
def test_bad_requests_are_refused(seq_len, message):
    with pytest.raises(NasError, match=message):
        transformer_flops(seed_spec(), seq_len=seq_len)
    with pytest.raises(NasError, match="TransformerSpec"):
        transformer_flops(seed_spec().to_dict())  # type: ignore[arg-type]
