"""Analytic transformer FLOPs: matmuls are 2x matrix parameters, ~6N for wide models, attention linear in context."""

from __future__ import annotations

import pytest

from nas.errors import NasError
from nas.transformer import TransformerSpec, seed_spec
from nas.transformer_flops import transformer_flops


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


def test_totals_scale_with_tokens_and_training_is_three_forwards():
    flops = transformer_flops(seed_spec())
    assert flops.forward(1000) == pytest.approx(1000 * flops.forward())
    assert flops.training(10) == pytest.approx(30 * flops.forward())
    assert flops.embedding == seed_spec().width  # the lookups are free, adding the two embeddings is not


@pytest.mark.parametrize(
    ("seq_len", "message"), [(0, "seq_len must be"), (129, "seq_len must be"), (True, "seq_len"), (2.0, "seq_len")]
)
def test_bad_requests_are_refused(seq_len, message):
    with pytest.raises(NasError, match=message):
        transformer_flops(seed_spec(), seq_len=seq_len)
    with pytest.raises(NasError, match="TransformerSpec"):
        transformer_flops(seed_spec().to_dict())  # type: ignore[arg-type]
