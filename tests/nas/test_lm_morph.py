"""Transformer morphisms: exact function preservation (float64 reference), spec-only proposals, refusals."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from nas.errors import NasError
from nas.language.morph import (
    KINDS,
    LMMorph,
    apply_morph,
    apply_spec_morph,
    candidate_morphs,
    deeper,
    more_heads,
    random_morph,
    wider_mlp,
    wider_model,
)
from nas.language.spec import MAX_HEADS, MAX_WIDTH, TransformerSpec, check_weights, forward, init_weights, seed_spec

TOLERANCE = 1e-10  # relative to the largest logit; the real error is rounding, ~1e-15


def small(tied: bool = True, **changes) -> TransformerSpec:
    """Unequal blocks, width != heads * head_dim and a large eps, so the eps rescale matters."""
    fields = dict(
        vocab_size=23, seq_len=9, width=10, head_dim=3, heads=(2, 3), mlp_hidden=(7, 5), tied_output=tied, norm_eps=0.05
    )
    return TransformerSpec(**{**fields, **changes})


def perturbed(spec: TransformerSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """float64 weights with every tensor, norm gains included, moved well away from its init (nothing is zero)."""
    rng = np.random.default_rng(seed)
    return {k: v + rng.normal(0, 0.5, v.shape) for k, v in init_weights(spec, rng, np.float64).items()}


def tokens_for(spec: TransformerSpec, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, spec.vocab_size, (3, spec.seq_len))


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def assert_preserves(parent, parent_w, child, child_w, seed: int = 0) -> None:
    check_weights(child, child_w)
    tokens = tokens_for(parent, seed)
    assert relative_error(forward(child, child_w, tokens), forward(parent, parent_w, tokens)) <= TOLERANCE


def frozen(weights):
    return {k: v.copy() for k, v in weights.items()}


def assert_unchanged(weights, before) -> None:
    assert weights.keys() == before.keys() and all(np.array_equal(weights[k], before[k]) for k in before)


# --- each morph ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("at", [0, 1, 2])
def test_deeper_inserts_a_block_that_adds_nothing(tied, at):
    spec, w = small(tied), perturbed(small(tied), at)
    before = frozen(w)
    child, cw = deeper(spec, w, at, rng=1)
    assert child.n_blocks == 3 and child.heads[at] == spec.heads[max(at - 1, 0)]
    p = f"blocks.{at}."
    assert not cw[p + "wo"].any() and not cw[p + "w_down"].any()
    assert all(cw[p + n].std() > 0.1 for n in ("wq", "wk", "wv", "w_up"))  # trainable at once, not all zero
    assert np.all(cw[p + "attn_norm"] == 1) and np.all(cw[p + "mlp_norm"] == 1)
    old = 1 if at == 0 else 0  # where the parent's block 0 went
    assert cw[f"blocks.{old}.wq"] is w["blocks.0.wq"]  # unchanged arrays are shared, not copied
    assert_preserves(spec, w, child, cw)
    assert_unchanged(w, before)


def test_deeper_takes_explicit_sizes():
    spec, w = small(), perturbed(small())
    child, cw = deeper(spec, w, 1, rng=0, heads=5, mlp_hidden=11)
    assert child.heads == (2, 5, 3) and child.mlp_hidden == (7, 11, 5)
    assert_preserves(spec, w, child, cw)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("block", [0, 1])
def test_wider_mlp_adds_units_with_zero_outputs(tied, block):
    spec, w = small(tied), perturbed(small(tied), block)
    before = frozen(w)
    child, cw = wider_mlp(spec, w, block, spec.mlp_hidden[block] + 6, rng=2)
    assert child.mlp_hidden[block] == spec.mlp_hidden[block] + 6
    p, old = f"blocks.{block}.", spec.mlp_hidden[block]
    np.testing.assert_array_equal(cw[p + "w_up"][:, :old], w[p + "w_up"])
    assert not cw[p + "w_down"][old:].any() and cw[p + "w_up"][:, old:].std() > 0.1
    assert_preserves(spec, w, child, cw)
    assert_unchanged(w, before)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("block", [0, 1])
def test_more_heads_adds_heads_with_zero_output_rows(tied, block):
    spec, w = small(tied), perturbed(small(tied), block + 10)
    before = frozen(w)
    child, cw = more_heads(spec, w, block, spec.heads[block] + 2, rng=3)
    inner = spec.inner(block)
    assert child.inner(block) == inner + 2 * spec.head_dim
    p = f"blocks.{block}."
    assert not cw[p + "wo"][inner:].any()
    assert all(cw[p + n][:, inner:].std() > 0.1 for n in ("wq", "wk", "wv"))
    assert_preserves(spec, w, child, cw)
    assert_unchanged(w, before)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("new_width", [11, 16, 37])
def test_wider_model_zero_pads_the_stream_and_rescales_the_norms(tied, new_width):
    spec, w = small(tied), perturbed(small(tied), new_width)
    before = frozen(w)
    child, cw = wider_model(spec, w, new_width, rng=4)
    old, scale = spec.width, np.sqrt(spec.width / new_width)
    assert child.width == new_width and child.norm_eps == pytest.approx(spec.norm_eps * old / new_width, rel=1e-15)
    for name in ("tok_emb", "pos_emb", "blocks.0.wo", "blocks.1.w_down"):  # writers of the stream
        assert not cw[name][:, old:].any()
    for name in ("blocks.0.wq", "blocks.1.w_up", *(["out"] if not tied else [])):  # readers: random new rows
        np.testing.assert_array_equal(cw[name][:old], w[name])
        assert cw[name][old:].std() > 0.01
    np.testing.assert_allclose(cw["final_norm"][:old], w["final_norm"] * scale, rtol=1e-15)
    assert_preserves(spec, w, child, cw)
    assert_unchanged(w, before)


def test_wider_model_needs_the_eps_rescale():
    """With the parent's eps kept, padding changes the function (by about eps * (1 - old/new) / mean(x**2))."""
    spec, w = small(), perturbed(small())
    child, cw = wider_model(spec, w, 40, rng=0)
    tokens = tokens_for(spec)
    kept_eps = dataclasses.replace(child, norm_eps=spec.norm_eps)
    assert relative_error(forward(kept_eps, cw, tokens), forward(spec, w, tokens)) > 1e-4
    assert relative_error(forward(child, cw, tokens), forward(spec, w, tokens)) <= TOLERANCE


def test_morphs_keep_float32_weights_float32():
    spec = small()
    w = init_weights(spec, 0)
    for morph in candidate_morphs(spec):
        _, cw = apply_morph(spec, morph, w, 0)
        assert {a.dtype for a in cw.values()} == {np.dtype(np.float32)}, morph


# --- chains -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_random_chains_of_morphs_preserve_the_function(tied, seed):
    rng = np.random.default_rng(seed)
    root = small(tied)
    root_w = perturbed(root, seed)
    tokens = tokens_for(root, seed)
    want = forward(root, root_w, tokens)
    spec, w, morphs = root, root_w, []
    steps = 3 + seed % 4  # 3 to 6 morphs
    for _ in range(steps):
        step = random_morph(spec, rng, accept=lambda s: s.params() <= 20 * root.params())
        assert step is not None
        proposed, morph = step
        spec, w = apply_morph(spec, morph, w, rng)
        assert spec == proposed and spec.key() == proposed.key()  # the search's child is the trained child
        assert LMMorph.from_dict(json.loads(json.dumps(morph.to_dict()))) == morph
        assert TransformerSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
        assert relative_error(forward(spec, w, tokens), want) <= TOLERANCE, morph.describe()
        morphs.append(morph)
    replayed = root
    for morph in morphs:
        replayed = apply_spec_morph(replayed, morph)
    assert replayed == spec


def test_chains_cover_every_kind():
    seen = set()
    for seed in range(6):
        rng, spec = np.random.default_rng(seed), small()
        for _ in range(6):
            step = random_morph(spec, rng)
            assert step is not None
            spec, morph = step
            seen.add(morph.kind)
    assert seen == set(KINDS)


# --- proposals ----------------------------------------------------------------------------------------------


def test_candidate_morphs_are_distinct_valid_and_accepted():
    spec = small(heads=(2, 2, 3), mlp_hidden=(7, 7, 5))
    cands = candidate_morphs(spec)
    children = [apply_spec_morph(spec, m) for m in cands]
    assert len({c.key() for c in children}) == len(children)  # deeper between equal blocks is proposed once
    assert {m.kind for m in cands} == set(KINDS)
    assert [m for m in cands if m.kind == "deeper"] == [LMMorph("deeper", 0), LMMorph("deeper", 3)]
    limit = spec.params() * 1.5
    small_ones = candidate_morphs(spec, accept=lambda s: s.params() <= limit)
    assert small_ones and all(apply_spec_morph(spec, m).params() <= limit for m in small_ones)
    assert candidate_morphs(spec, accept=lambda s: False) == []
    assert random_morph(spec, np.random.default_rng(0), accept=lambda s: False) is None
    assert random_morph(spec, np.random.default_rng(0), kinds=["wider_model"])[1].kind == "wider_model"


def test_candidate_morphs_respect_the_caps():
    spec = small(width=MAX_WIDTH - 1, heads=(MAX_HEADS, 3), head_dim=1, vocab_size=2, seq_len=1)
    by_kind = {(m.kind, m.block): m for m in candidate_morphs(spec)}
    assert by_kind[("wider_model", None)].size == MAX_WIDTH  # clipped to the cap
    assert ("more_heads", 0) not in by_kind and ("more_heads", 1) in by_kind
    at_cap = small(width=MAX_WIDTH, vocab_size=2, seq_len=1)
    assert "wider_model" not in {m.kind for m in candidate_morphs(at_cap)}


def test_random_morph_is_deterministic():
    picks = [random_morph(seed_spec(), np.random.default_rng(42)) for _ in range(3)]
    assert picks[0] == picks[1] == picks[2]
    many = {random_morph(seed_spec(), np.random.default_rng(s))[1] for s in range(40)}
    assert len(many) > 3


# --- refusals -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s, w: deeper(s, w, 3), "at must be between 0 and 2, got 3"),
        (lambda s, w: deeper(s, w, -1), "at must be between 0 and 2"),
        (lambda s, w: deeper(s, w, True), "at must be an integer"),
        (lambda s, w: deeper(s, w, 1.0), "at must be an integer"),
        (lambda s, w: deeper(s, w, 1, heads=0), r"heads\[1\] must be between"),
        (lambda s, w: wider_mlp(s, w, 2, 20), "block must be between 0 and 1, got 2"),
        (lambda s, w: wider_mlp(s, w, 0, 7), "new mlp_hidden must exceed block 0's 7, got 7"),
        (lambda s, w: wider_mlp(s, w, 0, 2**18 + 1), r"mlp_hidden\[0\] must be between"),
        (lambda s, w: wider_mlp(s, w, 0, "8"), "mlp_hidden must be an integer"),
        (lambda s, w: more_heads(s, w, 1, 3), "new heads must exceed block 1's 3"),
        (lambda s, w: more_heads(s, w, 0, 2**11), r"heads\[0\] must be between"),
        (lambda s, w: wider_model(s, w, 10), "new width must exceed 10, got 10"),
        (lambda s, w: wider_model(s, w, 2**40), "width must be between"),  # refused before any allocation
        (lambda s, w: wider_model(s, {**w, "out": w["tok_emb"].T}, 12), "unexpected 'out'"),
        (lambda s, w: wider_mlp(s, {k: v for k, v in w.items() if k != "pos_emb"}, 0, 9), "pos_emb is missing"),
        (lambda s, w: deeper(s.to_dict(), w, 0), "expected a TransformerSpec"),
        (lambda s, w: apply_morph(s, {"kind": "deeper"}, w), "expected an LMMorph"),
        (lambda s, w: apply_spec_morph(s, LMMorph("more_heads", 5, 9)), "block must be between 0 and 1"),
        (lambda s, w: candidate_morphs(s, widen_factor=1.0), "widen_factor"),
        (lambda s, w: random_morph(s, 0), "numpy Generator"),
    ],
)
def test_refusals_name_the_problem(call, message):
    spec = small()
    with pytest.raises(NasError, match=message):
        call(spec, init_weights(spec, 0))


def test_wider_model_over_the_parameter_cap_fails_before_allocating():
    spec = small(width=1024, heads=(1024, 1024), head_dim=1024, vocab_size=2, seq_len=1)
    with pytest.raises(NasError, match="parameter count"):
        apply_spec_morph(spec, LMMorph("wider_model", None, 2**16))
    with pytest.raises(NasError, match="parameter count"):
        wider_model(spec, {}, 2**16)  # the child is refused before the (absent) weights are even looked at


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "wider"}, "unknown kind 'wider'"),
        ({"kind": "deeper", "block": 0, "size": 4}, "takes no size"),
        ({"kind": "wider_model", "block": 0, "size": 4}, "takes no block"),
        ({"kind": "wider_mlp", "size": 4}, "block must be an integer"),
        ({"kind": "wider_mlp", "block": False, "size": 4}, "block must be an integer"),
        ({"kind": "wider_mlp", "block": 0, "size": -4}, "size must be between"),
        ({"kind": "deeper", "block": 0, "extra": 1}, "unknown key 'extra'"),
        ({"block": 0}, "needs 'kind'"),
        ([], "morph must be an object"),
    ],
)
def test_morph_records_are_validated(data, message):
    with pytest.raises(NasError, match=message):
        LMMorph.from_dict(data)


def test_morph_records_round_trip_and_describe():
    for morph in candidate_morphs(small()):
        assert LMMorph.from_dict(json.loads(json.dumps(morph.to_dict()))) == morph
        assert morph.kind in morph.describe() and "\n" not in morph.describe()
