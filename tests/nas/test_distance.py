"""The architecture distance: metric basics, agreement with a plain reference, and its costs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nas.distance import (
    ArchitectureDistance,
    architecture_distance,
    describe_layers,
    skip_cost_matrix,
    skip_distances,
    substitution_costs,
)
from nas.graph import GraphBuilder
from nas.morph import Morph, apply_morph, random_morph
from nas.zoo import small_resnet


def _grown(count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    graphs = [small_resnet()]
    while len(graphs) < count:
        result = random_morph(graphs[int(rng.integers(len(graphs)))], rng)
        if result is not None:
            graphs.append(result[0])
    return graphs


def _reference(a, b) -> float:
    """Scalar Levenshtein plus brute-force skip matching: slow but obviously right."""
    la, sa = describe_layers(a)
    lb, sb = describe_layers(b)
    sub = substitution_costs(la, lb)
    table = np.zeros((len(la) + 1, len(lb) + 1))
    table[:, 0] = np.arange(len(la) + 1)
    table[0, :] = np.arange(len(lb) + 1)
    for i in range(1, len(la) + 1):
        for j in range(1, len(lb) + 1):
            table[i, j] = min(table[i - 1, j] + 1, table[i, j - 1] + 1, table[i - 1, j - 1] + sub[i - 1, j - 1])
    n, m = len(sa), len(sb)
    if n == 0 or m == 0:
        return table[-1, -1] + n + m
    cost = skip_cost_matrix(sa, sb)
    if n > m:
        cost, n, m = cost.T, m, n
    best = min(sum(cost[i, perm[i]] for i in range(n)) for perm in itertools.permutations(range(m), n))
    return table[-1, -1] + best + (m - n)


def test_batched_distance_matches_the_scalar_reference():
    graphs = _grown(24)
    dist = ArchitectureDistance()
    fast = dist.cross(graphs[:12], graphs[12:])
    slow = np.array([[_reference(a, b) for b in graphs[12:]] for a in graphs[:12]])
    np.testing.assert_allclose(fast, slow, atol=1e-12)
    assert fast.max() > 1.0  # the set is not trivially close


def test_identity_is_zero_and_distance_is_symmetric():
    graphs = _grown(16, seed=1)
    matrix = ArchitectureDistance().cross(graphs, graphs)
    np.testing.assert_allclose(np.diag(matrix), 0.0)
    np.testing.assert_allclose(matrix, matrix.T)
    off_diagonal = matrix[~np.eye(len(graphs), dtype=bool)]
    distinct = len({g.key() for g in graphs}) == len(graphs)
    assert not distinct or off_diagonal.min() > 0


def test_widening_costs_less_than_inserting_a_layer():
    seed = small_resnet()
    inner = [n for n in seed.nodes if n.op == "conv"][1]  # inside the residual branch
    last_act = [n for n in seed.nodes if n.op == "act"][-1]  # after every skip, so none shifts
    wider, _ = apply_morph(seed, Morph("wider", inner.id, size=2 * inner.attrs["filters"]))
    deeper, _ = apply_morph(seed, Morph("deeper", last_act.id, size=3))
    d_wider = architecture_distance(seed, wider)
    d_deeper = architecture_distance(seed, deeper)
    assert 0 < d_wider < 1.0 <= d_deeper
    assert d_deeper == pytest.approx(1.0)  # one inserted conv; BN and ReLU ride along


def test_a_new_skip_costs_one_unmatched_skip_plus_its_projection():
    seed = small_resnet()
    acts = [n.id for n in seed.nodes if n.op == "act"]
    skipped, _ = apply_morph(seed, Morph("add_skip", acts[1], acts[0]))
    layers_seed, skips_seed = describe_layers(seed)
    layers_skip, skips_skip = describe_layers(skipped)
    assert len(skips_skip) == len(skips_seed) + 1
    assert len(layers_skip) == len(layers_seed) + 1  # the 1x1 projection conv
    # the old skip matches at zero cost only if it sits at the same place; here the projection
    # shifts later positions, so the matched pair costs a little and the new skip costs 1
    assert architecture_distance(seed, skipped) == pytest.approx(2.0, abs=0.5)
    assert architecture_distance(seed, skipped) > 2.0 - 1e-9


def test_skip_matching_is_an_optimal_assignment_not_an_order():
    a = np.array([[0.0, 2.0, 0.0], [5.0, 3.0, 0.0], [9.0, 1.0, 1.0]])
    b = a[[2, 0, 1]]
    assert skip_distances([a], [b])[0] == pytest.approx(0.0)
    # one concat against adds only: the type mismatch costs 1, and an extra skip costs 1
    c = np.array([[0.0, 2.0, 0.0], [5.0, 3.0, 0.0]])
    d = np.array([[0.0, 2.0, 1.0]])
    assert skip_distances([c], [d])[0] == pytest.approx(2.0)
    # greedy would pair (1,1)->(1,1) and leave a costly pair; the assignment finds the cheaper total
    e = np.array([[1.0, 1.0, 0.0], [1.0, 4.0, 0.0]])
    f = np.array([[1.0, 2.0, 0.0], [1.0, 9.0, 0.0]])
    cost = skip_cost_matrix(e, f)
    best = min(cost[0, 0] + cost[1, 1], cost[0, 1] + cost[1, 0])
    assert skip_distances([e], [f])[0] == pytest.approx(best)
    assert skip_distances([np.zeros((0, 3))], [f])[0] == 2.0


def test_only_capacity_layers_enter_the_sequence():
    b = GraphBuilder((8, 8, 3))
    x = b.conv_bn_relu(b.input, 4, kernel=5, strides=2)
    x = b.add("dropout", x, rate=0.1)
    x = b.add("pool", x, mode="avg", size=2)
    x = b.add("gpool", x)
    b.add("dense", x, units=3)
    layers, skips = describe_layers(b.build())
    assert [layer[0] for layer in layers] == [0, 4, 5, 2]  # conv, pool:avg, gpool, dense
    assert layers[0][1:] == (4, 5, 2)
    assert skips.shape == (0, 3)


@pytest.mark.parametrize("vocabulary", [8, 20])
def test_caches_starting_over_inside_one_batch_keep_the_batch_consistent(monkeypatch, vocabulary):
    """A 64-node simulated run crashed with "index 112 is out of bounds": the layer vocabulary filled
    while a batch's rows were encoded, so the rows encoded before the caches started over held ids of
    the old vocabulary. Every distance of such a batch must equal a fresh computation."""
    import nas.distance as distance_module

    monkeypatch.setattr(distance_module, "_MAX_VOCABULARY", vocabulary)
    graphs = _grown(14, seed=3)
    distance = ArchitectureDistance()
    distance.cross(graphs[:3], graphs[:2])  # a warm cache from an earlier batch
    got = distance.cross(graphs[2:], graphs[:5])
    fresh = np.array([[architecture_distance(a, b) for b in graphs[:5]] for a in graphs[2:]])
    np.testing.assert_allclose(got, fresh)
