"""The architecture graph: shape inference per op, rejection of inconsistent graphs, identity (key), seeds."""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest

from nas import zoo
from nas.errors import NasError
from nas.graph import MAX_CHANNELS, MAX_NODES, OPS, Graph, GraphBuilder, Node, make_node
from nas.morph import apply_morph, candidate_morphs, random_morph
from nas.serialize import graph_from_dict, graph_to_dict


def head(b: GraphBuilder, x: int, units: int = 3) -> int:
    """Global average pool + dense, so a test graph ends in logits."""
    return b.add("dense", b.add("gpool", x), units=units)


def shape_after(input_shape, op, **attrs):
    """Output shape of one ``op`` node (n1) reading the input, closed by flatten + dense."""
    b = GraphBuilder(input_shape)
    x = b.add(op, b.input, **attrs)
    b.add("dense", b.add("flatten", x), units=3)
    return b.build().shape(1)


@pytest.mark.parametrize(
    ("input_shape", "op", "attrs", "expected"),
    [
        ((8, 8, 3), "conv", {"filters": 5}, (8, 8, 5)),  # 3x3 "same" keeps the size
        ((8, 8, 3), "conv", {"filters": 5, "padding": "valid"}, (6, 6, 5)),
        ((7, 7, 3), "conv", {"filters": 5, "strides": 2}, (4, 4, 5)),  # same: ceil(7 / 2)
        ((7, 7, 3), "conv", {"filters": 5, "strides": 2, "padding": "valid"}, (3, 3, 5)),  # (7 - 3) // 2 + 1
        ((8, 6, 4), "conv", {"filters": 6, "kernel": (3, 1), "padding": "valid", "groups": 2}, (6, 6, 6)),
        ((8, 8, 3), "dwconv", {"multiplier": 2}, (8, 8, 6)),
        ((8, 8, 3), "dwconv", {"kernel": 5, "strides": 2, "padding": "valid"}, (2, 2, 3)),
        ((8, 8, 3), "pool", {}, (4, 4, 3)),  # strides default to the window
        ((7, 7, 3), "pool", {"mode": "avg", "size": 3, "strides": 2, "padding": "same"}, (4, 4, 3)),
        ((7, 7, 3), "pool", {"size": 3, "strides": 1, "padding": "valid"}, (5, 5, 3)),
        ((8, 8, 3), "gpool", {}, (3,)),
        ((8, 8, 3), "gpool", {"mode": "max", "keepdims": True}, (1, 1, 3)),
        ((8, 8, 3), "zeropad", {"pad": (1, 2, 3, 4)}, (11, 15, 3)),
        ((8, 8, 3), "zeropad", {"pad": 2}, (12, 12, 3)),
        ((8, 8, 3), "bn", {}, (8, 8, 3)),
        ((8, 8, 3), "act", {"fn": "swish"}, (8, 8, 3)),
        ((8, 8, 3), "dropout", {"rate": 0.5}, (8, 8, 3)),
        ((8, 8, 3), "flatten", {}, (192,)),
        ((8, 8, 3), "reshape", {"shape": (4, 16, 3)}, (4, 16, 3)),
        ((8, 8, 3), "reshape", {"shape": (192,)}, (192,)),
        ((10,), "dense", {"units": 7}, (7,)),
    ],
)
def test_shape_inference_per_op(input_shape, op, attrs, expected):
    assert shape_after(input_shape, op, **attrs) == expected


def test_merges_infer_shapes():
    b = GraphBuilder((6, 6, 2))
    a = b.add("conv", b.input, filters=3)
    c = b.add("conv", b.input, filters=5)
    cat = b.add("concat", a, c, b.input)
    s = b.add("add", cat, cat)  # an add may read one tensor twice (x + x)
    head(b, s)
    g = b.build()
    assert g.shape(cat) == (6, 6, 10) and g.shape(s) == (6, 6, 10)
    assert g.num_classes == 3 and g.input_shape == (6, 6, 2)


def test_every_op_is_covered_by_a_shape_test():
    covered = {
        "input",
        "conv",
        "dwconv",
        "pool",
        "gpool",
        "zeropad",
        "bn",
        "act",
        "dropout",
        "flatten",
        "reshape",
        "dense",
        "add",
        "concat",
    }
    assert covered == set(OPS)


def test_parameter_count_matches_the_weight_shapes():
    b = GraphBuilder((5, 5, 4))
    x = b.add("conv", b.input, filters=6, kernel=3, groups=2)  # 3*3*2*6 + 6 = 114
    x = b.add("dwconv", x, multiplier=2, use_bias=False)  # 3*3*6*2 = 108
    x = b.add("bn", x)  # 4 * 12 = 48
    b.add("dense", b.add("gpool", x), units=3)  # 12*3 + 3 = 39
    g = b.build()
    assert g.param_count == 114 + 108 + 48 + 39
    assert g.weight_shapes(1) == [(3, 3, 2, 6), (6,)]
    assert g.weight_shapes(2) == [(3, 3, 6, 2)]
    assert g.depth == 3


# --- rejection of inconsistent graphs: one NasError naming the node ---------------------------------


def build(*specs, input_shape=(8, 8, 3)):
    """Graph from (op, inputs, attrs) specs after the input node 0; ids are positions."""
    nodes = [make_node(0, "input", (), {"shape": input_shape})]
    nodes += [make_node(k + 1, op, inputs, attrs) for k, (op, inputs, attrs) in enumerate(specs)]
    return Graph(nodes)


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ([("gpool", (0,), {}), ("conv", (1,), {"filters": 2})], "n2_conv: needs an image input"),
        ([("dense", (0,), {"units": 3})], "n1_dense: dense needs a flat input"),
        (
            [("conv", (0,), {"filters": 4}), ("add", (0, 1), {}), ("dense", (2,), {"units": 2})],
            "n2_add: add needs equal input shapes",
        ),
        ([("pool", (0,), {}), ("concat", (0, 1), {})], "n2_concat: concat needs inputs equal but for channels"),
        ([("conv", (0,), {"filters": 4, "groups": 2})], "n1_conv: groups=2 must divide input channels 3"),
        ([("conv", (0,), {"filters": 4, "kernel": 9, "padding": "valid"})], "n1_conv: window 9 with stride 1"),
        ([("reshape", (0,), {"shape": (5,)})], "n1_reshape: cannot reshape"),
        ([("conv", (0,), {"filters": 4})], "n1_conv: the output must be a vector of class logits"),
        (
            [("gpool", (0,), {}), ("dense", (1,), {"units": 2}), ("dense", (1,), {"units": 2})],
            "exactly one output, found 2",
        ),
        ([("gpool", (9,), {})], "n1_gpool: input 9 does not exist"),
        ([("input", (), {"shape": (3,)}), ("concat", (0, 1), {})], "exactly one input node"),
    ],
)
def test_inconsistent_graphs_are_rejected_naming_the_layer(specs, message):
    with pytest.raises(NasError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(*specs)


def test_duplicate_ids_are_rejected():
    nodes = [
        make_node(0, "input", (), {"shape": (4,)}),
        make_node(1, "dense", (0,), {"units": 2}),
        make_node(1, "dense", (0,), {"units": 2}),
    ]
    with pytest.raises(NasError, match="node 1: duplicate id"):
        Graph(nodes)


def test_a_cycle_is_reported_at_a_node_on_the_cycle():
    # 0 -> 1 -> add(1, 3) = 2 -> 3 -> 2 (cycle 2-3), and 4 downstream of the cycle
    nodes = [
        make_node(0, "input", (), {"shape": (4,)}),
        make_node(4, "dense", (3,), {"units": 2}),  # listed first: downstream of the cycle, not on it
        make_node(1, "dense", (0,), {"units": 4}),
        make_node(2, "add", (1, 3)),
        make_node(3, "act", (2,), {"fn": "relu"}),
    ]
    with pytest.raises(NasError, match="cycle") as err:
        Graph(nodes)
    assert str(err.value).startswith(("n2_add", "n3_act"))


def test_a_self_loop_is_a_cycle():
    nodes = [
        make_node(0, "input", (), {"shape": (4,)}),
        make_node(1, "add", (0, 1)),
        make_node(2, "dense", (1,), {"units": 2}),
    ]
    with pytest.raises(NasError, match="n1_add: the graph has a cycle"):
        Graph(nodes)


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "message"),
    [
        ("conv", (0,), {"filters": 10**9}, "filters must be between 1 and 65536"),
        ("conv", (0,), {"filters": True}, "filters must be an integer, got True"),
        ("conv", (0,), {"filters": 16.0}, "filters must be an integer, got 16.0"),
        ("conv", (0,), {"filters": "16"}, "filters must be an integer"),
        ("conv", (0,), {}, "missing attribute 'filters'"),
        ("conv", (0,), {"filters": 4, "kernal": 3}, "unknown attribute 'kernal'"),
        ("conv", (0,), {"filters": 4, "kernel": (3, 3, 3)}, "kernel must be a pair of integers"),
        ("conv", (0,), {"filters": 4, "strides": 0}, "strides must be between 1 and 64"),
        ("conv", (0,), {"filters": 4, "padding": "SAME"}, "padding must be one of same, valid"),
        ("conv", (0,), {"filters": 4, "padding": ["same"]}, "padding must be one of"),
        ("pool", (0,), {"mode": "min"}, "mode must be one of max, avg"),
        ("dropout", (0,), {"rate": 1.0}, "rate must be in [0, 1)"),
        ("dropout", (0,), {"rate": float("nan")}, "rate must be a finite number"),
        ("bn", (0,), {"epsilon": 10**400}, "epsilon must be a finite number"),
        ("bn", (0,), {"epsilon": 0}, "epsilon must be in (0, 1]"),
        ("act", (0,), {"fn": "leaky"}, "fn must be one of"),
        ("zeropad", (0,), {"pad": (1, 2, 3)}, "pad must be four integers"),
        ("add", (0,), {}, "takes at least 2 inputs, got 1"),
        ("conv", (0, 0), {"filters": 2}, "takes 1 inputs, got 2"),
        ("concat", (0, 0), {}, "the same input appears twice"),
        ("conv", ("0",), {"filters": 2}, "input id must be an integer"),
        ("fancy", (0,), {}, "unknown op 'fancy'"),
        (["conv"], (0,), {}, "unknown op ['conv']"),
    ],
)
def test_bad_attributes_are_rejected(op, inputs, attrs, message):
    with pytest.raises(NasError) as err:
        make_node(1, op, inputs, attrs)
    assert message in str(err.value)
    assert str(err.value).startswith("node 1 (")


def test_hostile_values_do_not_flood_the_message():
    with pytest.raises(NasError) as err:
        make_node(1, "x" * 100_000 + "\n", (0,), {})
    assert len(str(err.value)) < 300 and "\n" not in str(err.value)
    with pytest.raises(NasError) as err:
        make_node(1, "conv", (0,), {"filters": 4, "kernel": list(range(10**5))})
    assert len(str(err.value)) < 300


def test_caps_reject_absurd_sizes_before_allocation():
    with pytest.raises(NasError, match="image side exceeds"):
        build(("gpool", (0,), {}), input_shape=(1 << 15, 8, 3))
    with pytest.raises(NasError, match="out of range"):
        build(("gpool", (0,), {}), input_shape=(1 << 14, 1 << 14, 64))  # 2^34 elements per image
    with pytest.raises(NasError, match=r"exceeds \d+ parameters"):
        # 2^20 x 2^20 dense weights: over the hard cap of 2^34 parameters
        build(("dense", (0,), {"units": 1 << 20}), ("dense", (1,), {"units": 1 << 20}), input_shape=(1 << 20,))
    nodes = [make_node(0, "input", (), {"shape": (4,)})]
    nodes += [make_node(k, "dropout", (k - 1,)) for k in range(1, MAX_NODES + 1)]
    with pytest.raises(NasError, match=f"more than the limit of {MAX_NODES}"):
        Graph(nodes)
    with pytest.raises(NasError, match="between 1 and"):
        make_node(1, "conv", (0,), {"filters": MAX_CHANNELS + 1})


# --- identity ---------------------------------------------------------------------------------------


def relabel(graph: Graph, offset: int) -> Graph:
    return Graph([Node(n.id + offset, n.op, tuple(i + offset for i in n.inputs), n.attrs) for n in graph.nodes])


def two_branch(order: str, add_order=(1, 2), rate=0.0, padding="same") -> Graph:
    b = GraphBuilder((6, 6, 3))
    first, second = ({"filters": 4, "kernel": 3}, {"filters": 4, "kernel": 1, "padding": padding})
    if order == "ba":
        first, second = second, first
    x1 = b.add("conv", b.input, **first)
    x2 = b.add("conv", b.input, **second)
    s = b.add("add", *((x1, x2) if add_order == (1, 2) else (x2, x1)))
    b.add("dense", b.add("dropout", b.add("gpool", s), rate=rate), units=2)
    return b.build()


def test_key_ignores_ids_node_order_add_order_and_dropout_rate():
    g = two_branch("ab")
    assert relabel(g, 100).key() == g.key()
    assert two_branch("ba").key() == g.key()  # same branches listed in the other order
    assert two_branch("ab", add_order=(2, 1)).key() == g.key()  # addition commutes
    assert two_branch("ab", rate=0.4).key() == g.key()  # a hyperparameter, not the architecture
    assert two_branch("ab", padding="valid").key() == g.key()  # a 1x1 conv pads nothing either way
    assert relabel(g, 100) != g  # equality, unlike the key, is node-for-node


def test_key_tells_different_architectures_apart():
    g = two_branch("ab")
    assert g.with_attrs("conv", filters=5).key() != g.key()
    b = GraphBuilder((6, 6, 3))
    x = b.add("conv", b.input, filters=4, kernel=1)
    b.add("dense", b.add("gpool", b.add("add", x, x)), units=2)  # one conv read twice
    b2 = GraphBuilder((6, 6, 3))
    x1 = b2.add("conv", b2.input, filters=4, kernel=1)
    x2 = b2.add("conv", b2.input, filters=4, kernel=1)
    b2.add("dense", b2.add("gpool", b2.add("add", x1, x2)), units=2)  # two equal convs
    assert b.build().key() != b2.build().key()
    c1 = GraphBuilder((6, 6, 3))
    c1.add("dense", c1.add("gpool", c1.add("concat", c1.input, c1.add("conv", c1.input, filters=2))), units=2)
    c2 = GraphBuilder((6, 6, 3))
    c2.add("dense", c2.add("gpool", c2.add("concat", c2.add("conv", c2.input, filters=2), c2.input)), units=2)
    assert c1.build().key() != c2.build().key()  # channel order differs: weights are not interchangeable


def test_nodes_hash_and_graphs_pickle():
    g = zoo.small_resnet()
    assert len(set(g.nodes)) == len(g.nodes)
    assert hash(make_node(3, "conv", (1,), {"filters": 2})) == hash(make_node(3, "conv", [1], {"filters": 2}))
    copy = pickle.loads(pickle.dumps(g))
    assert copy == g and copy.key() == g.key() and copy.shape(5) == g.shape(5)


def test_queries():
    g = zoo.small_resnet((16, 16, 1), num_classes=7, width=8)
    assert g.num_classes == 7 and g.output_node.op == "dense"
    add = next(n.id for n in g.nodes if n.op == "add")
    assert sorted(g.consumers(3)) == [4, add]
    assert g.ancestors(add) >= {0, 1, 2, 3, 7, 8}
    dropout = next(n.id for n in g.nodes if n.op == "dropout")
    assert g.with_attrs("dropout", rate=0.3).node(dropout).attrs["rate"] == 0.3
    with pytest.raises(NasError, match="node 999 is not in the graph"):
        g.node(999)


def test_with_dropout_sets_every_rate_or_adds_one_before_the_classifier():
    g = zoo.small_resnet(dropout=0.1)
    assert [n.attrs["rate"] for n in g.with_dropout(0.3).nodes if n.op == "dropout"] == [0.3]
    r = zoo.resnet(18, (32, 32, 3), 10)
    assert r.with_dropout(0.0) is r
    d = r.with_dropout(0.25)
    drop = d.node(d.output_node.inputs[0])
    assert drop.op == "dropout" and drop.attrs["rate"] == 0.25 and drop.inputs == r.output_node.inputs
    assert d.param_count == r.param_count and len(d) == len(r) + 1
    with pytest.raises(NasError, match=r"rate must be in \[0, 1\)"):
        r.with_dropout(1.5)


def test_a_new_dropout_rate_derives_nothing_again(monkeypatch):
    """Only rates change: shapes, counts and the key (which leaves rates out) are the original graph's."""
    import nas.graph

    g = zoo.small_resnet(dropout=0.1)
    key = g.key()
    monkeypatch.setattr(nas.graph, "_infer", lambda *a: pytest.fail("shapes inferred again"))
    d = g.with_dropout(0.3)
    assert (
        d.key() == key and d.param_count == g.param_count and [d.shape(n.id) for n in d] == [g.shape(n.id) for n in g]
    )
    monkeypatch.undo()
    fresh = Graph([make_node(n.id, n.op, n.inputs, n.attrs) for n in d.nodes])  # built from new nodes
    assert fresh == d and fresh.key() == key and fresh.param_count == d.param_count
    assert [fresh.shape(n.id) for n in fresh] == [d.shape(n.id) for n in d]


def _child_and_fresh(graph: Graph, rng: np.random.Generator) -> tuple[Graph, Graph]:
    """A random morph child of ``graph`` (sharing its unchanged nodes) and the same graph built from new nodes."""
    child, _ = random_morph(graph, rng)
    return child, graph_from_dict(graph_to_dict(child))


def test_what_nodes_remember_is_what_a_graph_of_new_nodes_derives():
    rng = np.random.default_rng(0)
    graph = zoo.small_resnet()
    for _ in range(40):  # deeper, wider and skips, each child grown from the last
        child, fresh = _child_and_fresh(graph, rng)
        assert child.key() == fresh.key() and child.param_count == fresh.param_count
        assert [child.shape(n.id) for n in child] == [fresh.shape(n.id) for n in fresh]
        graph = child


def test_a_morph_child_infers_only_the_shapes_of_the_nodes_it_changed(monkeypatch):
    import nas.graph

    parent = zoo.small_resnet()
    parent.key()
    inferred, real = [], nas.graph._infer
    monkeypatch.setattr(nas.graph, "_infer", lambda node, shapes: inferred.append(node) or real(node, shapes))
    deeper = [m for m in candidate_morphs(parent) if m.kind == "deeper" and len(parent.shape(m.target)) == 3]
    child, _ = apply_morph(parent, deeper[-1])  # a layer near the end: the nodes before it are shared
    new = [n for n in child.nodes if not any(n is p for p in parent.nodes)]
    assert inferred == new and 0 < len(new) < len(child) // 4


def test_a_copy_or_a_pickle_of_a_node_remembers_nothing():
    g = zoo.small_resnet()
    g.key()
    node = g.nodes[3]
    remembered = (g.shape(node.id), sum(math.prod(s) for s in g.weight_shapes(node.id)))
    assert node.recall("shape", (g.shape(node.inputs[0]),)) == remembered  # what building the graph derived
    for other in (pickle.loads(pickle.dumps(node)), copy.deepcopy(node)):
        assert other == node and other.recall("shape", (g.shape(node.inputs[0]),)) is None


# --- seeds --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params"),
    [("resnet50", 25_636_712), ("resnet101", 44_707_176), ("vgg16", 138_357_544), ("mobilenet_v1", 4_253_864)],
)
def test_reference_networks_have_their_published_parameter_counts(name, params):
    g = zoo.by_name(name)
    assert g.param_count == params and g.input_shape == (224, 224, 3) and g.num_classes == 1000


def test_resnet50_has_keras_shapes_at_each_stage():
    g = zoo.resnet(50)
    adds = [g.shape(n.id) for n in g.nodes if n.op == "add"]
    assert len(adds) == 16 and adds[0] == (56, 56, 256) and adds[-1] == (7, 7, 2048)
    assert g.depth == 54  # 53 convolutions (49 in blocks + 4 projections) + the classifier


def test_small_resnet_is_a_small_residual_seed():
    g = zoo.small_resnet()
    assert g.input_shape == (28, 28, 1) and g.num_classes == 10
    assert g.count("add") == 1 and g.param_count < 40_000
    assert [g.shape(n.id)[:2] for n in g.nodes if n.op == "pool"] == [(14, 14), (7, 7)]  # two downsampling stages
    assert zoo.small_resnet((32, 32, 3), num_classes=100, width=32).num_classes == 100
    assert zoo.small_resnet((4, 4, 1)).count("pool") == 1  # maps stay at least 2 pixels wide


def test_every_zoo_name_builds_and_unknown_names_fail():
    for name in zoo.NAMES:
        assert zoo.by_name(name, input_shape=(64, 64, 3), num_classes=10).num_classes == 10
    with pytest.raises(NasError, match="unknown seed architecture 'resnet51'"):
        zoo.by_name("resnet51")
    assert zoo.by_name("small_resnet").key() == zoo.small_resnet().key()
