"""Morphisms: validity, function preservation (NumPy reference), symmetry breaking, lineage records."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nas import serialize
from nas.errors import NasError
from nas.forward import forward, init_weights
from nas.graph import MAX_CHANNELS, Graph, GraphBuilder
from nas.limits import Limits
from nas.morph import (
    KINDS,
    SPLIT_JITTER,
    Morph,
    apply_morph,
    candidate_morphs,
    check_weights,
    nonnegative_nodes,
    random_morph,
    split_fractions,
    try_morph,
)

TOLERANCE = 1e-4  # relative, on the logits (float64 reference: the real error is ~1e-7)


def mobile_net() -> Graph:
    """Depthwise convs, a concat, an inverted residual, a flatten and a two-layer head."""
    b = GraphBuilder((8, 8, 3))
    x = b.conv_bn_relu(b.input, 6, strides=2)  # 4x4x6
    y = b.add("act", b.add("bn", b.add("dwconv", x, multiplier=2)), fn="relu6")  # 4x4x12
    y = b.add("bn", b.add("conv", y, filters=6, kernel=1, use_bias=False))
    x = b.add("add", x, y)
    z = b.add("conv", x, filters=4, kernel=1)
    x = b.add("act", b.add("concat", x, z), fn="relu")  # 4x4x10
    x = b.add("pool", x, mode="avg", size=2)  # 2x2x10
    x = b.add("act", b.add("dense", b.add("flatten", x), units=8), fn="relu")
    b.add("dense", x, units=3)
    return b.build("mobile")


def mlp() -> Graph:
    b = GraphBuilder((6,))
    x = b.add("act", b.add("dense", b.input, units=5), fn="relu")
    x = b.add("act", b.add("dense", x, units=7), fn="sigmoid")
    b.add("dense", x, units=2)
    return b.build("mlp")


def residual_net(input_shape=(10, 10, 3), num_classes=3, width=4) -> Graph:
    """A one-stage residual CNN with fixed node ids (the tests below name its nodes):
    n1 stem conv, n4/n7 block convs, n9 add, n11 pool, n12 conv, n16 dropout, n17 dense output."""
    b = GraphBuilder(input_shape)
    x = b.conv_bn_relu(b.input, width)
    y = b.conv_bn_relu(x, width)
    y = b.add("bn", b.add("conv", y, filters=width, kernel=3, use_bias=False))
    x = b.add("act", b.add("add", x, y), fn="relu")
    x = b.conv_bn_relu(b.add("pool", x, mode="max", size=2), 2 * width)
    x = b.add("dropout", b.add("gpool", x, mode="avg"), rate=0.0)
    b.add("dense", x, units=num_classes)
    return b.build("residual_net")


SEEDS = {
    "small_resnet": residual_net,
    "mobile": mobile_net,
    "mlp": mlp,
}


def inputs_for(graph: Graph, seed: int = 0, batch: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(batch, *graph.input_shape))


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(1e-12, float(np.max(np.abs(b)))))


def assert_preserves(parent: Graph, child: Graph, parent_weights, child_weights, seed: int = 0) -> None:
    x = inputs_for(parent, seed)
    assert relative_error(forward(child, child_weights, x), forward(parent, parent_weights, x)) <= TOLERANCE


# --- properties over random morph sequences -------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed_name=st.sampled_from(sorted(SEEDS)),
    seed=st.integers(0, 2**32 - 1),
    steps=st.integers(1, 5),
    kernel=st.sampled_from([1, 3, 5]),
)
def test_random_morph_sequences_stay_valid_and_preserve_the_function(seed_name, seed, steps, kernel):
    rng = np.random.default_rng(seed)
    root = SEEDS[seed_name]()
    limits = Limits(max_layers=root.depth + 3, max_params=4 * root.param_count, max_flops_per_image=1e12)
    root_weights = init_weights(root, rng)
    x = inputs_for(root, seed % 1000)
    want = forward(root, root_weights, x)
    graph, weights, morphs = root, root_weights, []
    for _ in range(steps):
        step = random_morph(graph, rng, kernel_size=kernel, accept=limits.admits)
        if step is None:
            break
        proposed, morph = step
        graph, weights = apply_morph(graph, morph, weights, rng)
        morphs.append(morph)
        # the same child whether or not weights ride along (the master proposes, the worker replays)
        assert graph == proposed and graph.key() == proposed.key()
        assert limits.admits(graph)
        assert all(len(graph.shape(n.id)) in (1, 2, 3) for n in graph.nodes)
        check_weights(graph, weights)
        back = serialize.loads(serialize.dumps(graph))
        assert back == graph and back.key() == graph.key()
        record = json.loads(json.dumps(morph.to_dict()))
        assert Morph.from_dict(record) == morph
        assert "\n" not in morph.describe() and f"n{morph.target}" in morph.describe()
        assert relative_error(forward(graph, weights, x), want) <= TOLERANCE, morph.describe()
    replayed = root
    for morph in morphs:
        replayed, _ = apply_morph(replayed, morph)
    assert [n.id for n in replayed.nodes] == [n.id for n in graph.nodes] and replayed == graph


@settings(max_examples=60, deadline=None)
@given(old=st.integers(1, 12), extra=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_split_fractions_sum_to_one_within_the_documented_bound(old, extra, seed):
    rng = np.random.default_rng(seed)
    mapping = np.concatenate([np.arange(old), rng.integers(0, old, extra)])
    frac = split_fractions(mapping, old, rng)
    counts = np.bincount(mapping, minlength=old)
    np.testing.assert_allclose(np.bincount(mapping, weights=frac, minlength=old), 1.0, rtol=1e-12)
    n = counts[mapping]
    j = SPLIT_JITTER
    assert np.all(n * frac >= (1 - j) / (1 + j) - 1e-12) and np.all(n * frac <= (1 + j) / (1 - j) + 1e-12)
    assert np.all(frac[n == 1] == 1.0)  # a channel without copies is untouched


# --- deeper -----------------------------------------------------------------------------------------------


def test_deeper_inserts_an_identity_conv_of_the_requested_kernel():
    g = SEEDS["small_resnet"]()
    w = init_weights(g, 0)
    child, cw = apply_morph(g, Morph("deeper", 3, size=5), w)
    new = [n for n in child.nodes if n.id >= g.next_id]
    assert [n.op for n in new] == ["conv", "bn", "act"]
    assert new[0].attrs["kernel"] == (5, 5) and new[0].inputs == (3,)
    assert set(child.consumers(3)) == {new[0].id}  # old consumers of n3 now read the new ReLU
    assert set(child.consumers(new[2].id)) == set(g.consumers(3))
    assert_preserves(g, child, w, cw)


def test_deeper_on_a_vector_inserts_an_identity_dense_layer():
    g = mlp()
    w = init_weights(g, 0)
    child, cw = apply_morph(g, Morph("deeper", 2), w)
    assert [n.op for n in child.nodes if n.id >= g.next_id] == ["dense", "act"]
    assert_preserves(g, child, w, cw)


@pytest.mark.parametrize(
    ("morph", "message"),
    [
        (Morph("deeper", 1), "non-negative output"),  # a conv's output can be negative
        (Morph("deeper", 3, size=4), "kernel size must be odd"),
        (Morph("deeper", 17), "non-negative output"),  # the output layer
        (Morph("deeper", 99), "node 99 is not in the graph"),
        (Morph("deeper", 3, size=101), "kernel must be between 1 and 64"),
    ],
)
def test_deeper_refuses_what_it_cannot_keep_the_identity_for(morph, message):
    with pytest.raises(NasError, match=message):
        apply_morph(SEEDS["small_resnet"](), morph)


# --- wider ------------------------------------------------------------------------------------------------


def test_wider_through_a_residual_add_widens_every_producer_of_the_add():
    g = SEEDS["small_resnet"]()  # n1 stem conv and n7 block conv both feed add n9
    w = init_weights(g, 0)
    for target in (1, 7):
        child, cw = apply_morph(g, Morph("wider", target, size=10), w, rng=target)
        widths = {n.id: n.attrs["filters"] for n in child.nodes if n.op == "conv"}
        assert widths == {1: 10, 4: 4, 7: 10, 12: 8}
        assert child.shape(9) == (10, 10, 10)
        assert_preserves(g, child, w, cw)


def test_wider_before_the_classifier_is_absorbed_by_the_output_layer():
    g = SEEDS["small_resnet"]()
    w = init_weights(g, 0)
    child, cw = apply_morph(g, Morph("wider", 12, size=11), w, rng=1)
    assert child.node(12).attrs["filters"] == 11 and child.num_classes == 3
    assert cw[17][0].shape == (11, 3)
    assert_preserves(g, child, w, cw)


@pytest.mark.parametrize("target", [1, 3, 7, 10, 13, 15])
def test_wider_carries_through_depthwise_concat_add_and_flatten(target):
    g = mobile_net()
    w = init_weights(g, 0)
    node = g.node(target)
    key = "filters" if node.op == "conv" else "units"
    result = try_morph(g, Morph("wider", target, size=node.attrs.get(key, 0) + 5), w, rng=2)
    if node.op not in ("conv", "dense"):
        assert result is None
        return
    child, cw = result
    assert child.node(target).attrs[key] == node.attrs[key] + 5
    assert_preserves(g, child, w, cw)


def test_wider_copies_split_their_outgoing_weights_so_copies_can_diverge():
    g = mlp()
    w = init_weights(g, 0)
    child, cw = apply_morph(g, Morph("wider", 1, size=9), w, rng=3)
    kernel_in, bias_in = cw[1]
    out = cw[3][0]  # the consumer's kernel, rows = the widened units
    old_in = w[1][0]
    mapping = [int(np.flatnonzero(np.all(old_in == kernel_in[:, j : j + 1], axis=0))[0]) for j in range(9)]
    assert sorted(set(mapping)) == list(range(5))  # every new unit copies an old one
    for c in range(5):
        rows = [j for j in range(9) if mapping[j] == c]
        np.testing.assert_allclose(out[rows].sum(axis=0), w[3][0][c], rtol=1e-6)  # shares sum to the original
        if len(rows) > 1:  # copies receive different shares, hence different gradients
            assert not np.allclose(out[rows[0]], out[rows[1]])
    np.testing.assert_array_equal(bias_in, w[1][1][mapping])
    assert_preserves(g, child, w, cw)


@pytest.mark.parametrize(
    ("graph", "morph", "message"),
    [
        (SEEDS["small_resnet"](), Morph("wider", 17, size=6), "width is the number of classes"),
        (SEEDS["small_resnet"](), Morph("wider", 1, size=4), "must exceed 4"),
        (SEEDS["small_resnet"](), Morph("wider", 2, size=8), "only ungrouped conv and dense"),
        (SEEDS["small_resnet"](), Morph("wider", 1, size=10**9), "at most 65536"),
        (mobile_net(), Morph("wider", 1, size=2 * MAX_CHANNELS), "at most 65536"),
    ],
)
def test_wider_refusals(graph, morph, message):
    with pytest.raises(NasError, match=message):
        apply_morph(graph, morph, init_weights(graph, 0))


def test_wider_refuses_an_add_partner_it_cannot_widen():
    b = GraphBuilder((6, 6, 4))
    x = b.add("dwconv", b.input)  # a depthwise conv's width is its input's
    y = b.add("conv", b.input, filters=4)
    head = b.add("gpool", b.add("add", x, y))
    b.add("dense", head, units=2)
    g = b.build()
    with pytest.raises(NasError, match="n1_dwconv: an add it feeds is widened"):
        apply_morph(g, Morph("wider", 2, size=6))


def test_wider_refuses_to_feed_a_grouped_convolution():
    b = GraphBuilder((6, 6, 4))
    x = b.add("conv", b.input, filters=4)
    x = b.add("conv", x, filters=4, groups=2)
    b.add("dense", b.add("gpool", x), units=2)
    with pytest.raises(NasError, match="grouped convolution"):
        apply_morph(b.build(), Morph("wider", 1, size=6))


# --- skips ----------------------------------------------------------------------------------------------


def test_add_skip_projects_and_pools_and_starts_at_zero():
    g = SEEDS["small_resnet"]()
    w = init_weights(g, 0)
    child, cw = apply_morph(g, Morph("add_skip", 14, 3), w)  # 10x10x4 -> 5x5x8
    new = [n for n in child.nodes if n.id >= g.next_id]
    assert [n.op for n in new] == ["pool", "conv", "add"]
    assert new[0].attrs["size"] == (2, 2) and new[1].attrs["filters"] == 8 and new[2].inputs == (14, new[1].id)
    assert not np.any(cw[new[1].id][0])
    assert_preserves(g, child, w, cw)


def test_concat_skip_into_a_residual_stream_grows_fresh_channels_on_the_add_partner():
    g = SEEDS["small_resnet"]()
    w = init_weights(g, 0)
    child, cw = apply_morph(g, Morph("concat_skip", 3, 0, size=3), w, rng=4)  # n3 feeds conv n4 and add n9
    assert child.node(7).attrs["filters"] == 7  # the add partner widened by the 3 new channels
    assert child.shape(9) == (10, 10, 7)
    np.testing.assert_array_equal(cw[4][0][:, :, 4:, :], 0)  # consumers ignore the new channels
    assert_preserves(g, child, w, cw)


@pytest.mark.parametrize(
    ("morph", "message"),
    [
        (Morph("add_skip", 3, 3), "distinct source and target"),
        (Morph("add_skip", 3, 6), "the source must come before the target"),
        (Morph("add_skip", 17, 3), "cannot end at the output"),
        (Morph("add_skip", 4, 3), "already directly connected"),
        (Morph("concat_skip", 16, 3), "join image tensors"),
        (Morph("concat_skip", 6, 0, size=MAX_CHANNELS + 1), "exceed 65536"),
    ],
)
def test_skip_refusals(morph, message):
    with pytest.raises(NasError, match=message):
        apply_morph(SEEDS["small_resnet"](), morph)


def test_skips_need_a_whole_downsampling_ratio():
    b = GraphBuilder((9, 9, 2))
    x = b.add("act", b.add("conv", b.input, filters=2), fn="relu")  # 9x9
    y = b.add("act", b.add("conv", x, filters=2, strides=2), fn="relu")  # 5x5
    b.add("dense", b.add("gpool", b.add("conv", y, filters=2)), units=2)
    with pytest.raises(NasError, match="not a whole ratio"):
        apply_morph(b.build(), Morph("add_skip", 4, 2))


# --- the API around the operators ----------------------------------------------------------------------------


def test_weights_must_fit_the_parent():
    g = SEEDS["small_resnet"]()
    w = init_weights(g, 0)
    with pytest.raises(NasError, match="n1_conv has no weights"):
        apply_morph(g, Morph("deeper", 3), {k: v for k, v in w.items() if k != 1})
    with pytest.raises(NasError, match=r"n4_conv needs shapes \[\(3, 3, 4, 4\)\]"):
        apply_morph(g, Morph("deeper", 3), {**w, 4: [np.zeros((3, 3, 4, 5), np.float32)]})
    with pytest.raises(NasError, match="no weighted node 3"):
        apply_morph(g, Morph("deeper", 3), {**w, 3: [np.zeros(1)]})


def test_morph_records_validate_and_round_trip():
    m = Morph("wider", np.int64(7), size=np.int32(12))
    assert json.loads(json.dumps(m.to_dict())) == {"kind": "wider", "target": 7, "source": None, "size": 12}
    for bad, message in [
        ({"kind": "shrink", "target": 1}, "unknown kind 'shrink'"),
        ({"kind": "deeper"}, "needs 'kind' and 'target'"),
        ({"kind": "deeper", "target": "3"}, "target must be a non-negative integer"),
        ({"kind": "deeper", "target": True}, "target must be a non-negative integer"),
        ({"kind": "deeper", "target": -1}, "target must be a non-negative integer"),
        ({"kind": "deeper", "target": 1.5}, "target must be a non-negative integer"),
        ({"kind": "add_skip", "target": 1, "source": [2]}, "source must be a non-negative integer"),
        ({"kind": "deeper", "target": 1, "size": None}, "size must be a non-negative integer"),
        ({"kind": "deeper", "target": 1, "extra": 0}, "unknown key 'extra'"),
        (["deeper", 1], "morph must be an object"),
    ]:
        with pytest.raises(NasError, match=message):
            Morph.from_dict(bad)


def test_descriptions_say_what_happens():
    assert Morph("deeper", 5, size=5).describe().startswith("deeper: identity conv 5x5")
    assert "n9 to 32" in Morph("wider", 9, size=32).describe()
    assert "n3 -> n9" in Morph("add_skip", 9, 3).describe()
    assert "4 new channels" in Morph("concat_skip", 9, 3, size=4).describe()


def test_apply_is_deterministic_for_a_seed():
    g = SEEDS["mobile"]()
    w = init_weights(g, 0)
    a = apply_morph(g, Morph("wider", 1, size=9), w, rng=5)[1]
    b = apply_morph(g, Morph("wider", 1, size=9), w, rng=5)[1]
    assert all(np.array_equal(x, y) for k in a for x, y in zip(a[k], b[k], strict=True))


def test_candidates_cover_every_kind_and_all_apply_on_the_seed():
    g = SEEDS["small_resnet"]()
    cands = candidate_morphs(g, kernel_size=5)
    assert {m.kind for m in cands} == set(KINDS)
    assert all(m.size == 5 for m in cands if m.kind == "deeper")
    w = init_weights(g, 0)
    for m in cands:  # widening a residual stage now works too: every candidate applies
        child, cw = apply_morph(g, m, w, rng=0)
        assert_preserves(g, child, w, cw)


def test_random_morph_respects_the_acceptance_test():
    g = SEEDS["small_resnet"]()
    every_growth_adds_parameters = Limits(max_layers=100, max_params=g.param_count, max_flops_per_image=1e12)
    assert random_morph(g, np.random.default_rng(0), accept=every_growth_adds_parameters.admits) is None
    only_skips = random_morph(g, np.random.default_rng(0), kinds=("add_skip",))
    assert only_skips is not None and only_skips[1].kind == "add_skip"


def test_nonnegative_nodes_follow_relu_through_sign_keeping_ops():
    g = mobile_net()
    nonneg = nonnegative_nodes(g)
    assert {3, 6, 12, 13, 14, 16} <= nonneg  # relu, relu6, and pool / flatten of a relu
    assert not {1, 8, 9, 10} & nonneg  # convs, BN, and an add of a relu and a BN output
