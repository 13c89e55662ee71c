"""Hand-computed operation counts for tiny graphs, one layer type at a time (docs/flops.md).

Every expected number is worked out in the comment beside it from the formulas in the
documentation, not from the code under test.
"""

from __future__ import annotations

import math

import pytest

from aiperf.errors import AiperfError
from aiperf.families.image.flops import (
    ACTIVATION_OPS,
    GraphCost,
    LayerCost,
    aiperf_compatible_operations,
    aiperf_compatible_per_image,
    count_flops,
    epoch_operations,
    format_table,
)
from nas import zoo
from nas.graph import ACTIVATIONS, GraphBuilder


def row(cost: GraphCost, label: str) -> LayerCost:
    return next(layer for layer in cost.layers if layer.label == label)


def head(b: GraphBuilder, x: int, units: int = 3) -> None:
    """Global average pool + dense: the classifier every tiny graph needs to end in logits."""
    b.add("dense", b.add("gpool", x), units=units)


# --- convolution, dense, loss, totals -------------------------------------------------------------------


def conv_net():
    b = GraphBuilder((6, 6, 2))
    x = b.add("conv", b.input, filters=4, kernel=3, strides=2, padding="same", use_bias=True)  # n1 -> 3x3x4
    x = b.add("conv", x, filters=2, kernel=1, padding="valid", use_bias=False)  # n2 -> 3x3x2
    head(b, x)  # n3 gpool -> 2, n4 dense -> 3
    return b.build()


def test_first_conv_needs_no_input_gradient():
    c = row(count_flops(conv_net()), "n1_conv")
    assert c.macs == 3 * 3 * (3 * 3 * 2 * 4)  # output positions x kernel = 648
    assert c.forward == 2 * 648 + 36  # MACs + one bias add per output element (3*3*4)
    assert c.backward == 2 * 648 + 36  # weight gradient + bias gradient, no input gradient
    assert c.inference == c.forward
    assert c.params == 72 + 4
    assert c.per_step == 7 * 76 + 3 * 72  # Nesterov SGD on every parameter, weight decay on the kernel


def test_inner_conv_and_dense_pay_for_the_input_gradient():
    cost = count_flops(conv_net())
    conv = row(cost, "n2_conv")
    assert conv.macs == 9 * 1 * 1 * 4 * 2  # 72
    assert conv.forward == 144
    assert conv.backward == 144 + 144  # weight gradient + input gradient
    dense = row(cost, "n4_dense")
    assert dense.macs == 2 * 3
    assert (dense.forward, dense.backward) == (12 + 3, 12 + 3 + 12)
    assert dense.per_step == 7 * 9 + 3 * 6


def test_totals_loss_and_train_step():
    cost = count_flops(conv_net())
    assert (cost.loss_forward, cost.loss_backward) == (4 * 3 + 3, 2 * 3 + 1)  # K = 3 classes
    # layers: conv 1332 + conv 144 + gpool (9 + 1) * 2 = 20 + dense 15, then the loss 15
    assert cost.forward == 1332 + 144 + 20 + 15 + 15
    assert cost.backward == 1332 + 288 + 20 + 27 + 7
    assert cost.update_per_step == 748 + (7 * 8 + 3 * 8) + 81 + 2  # per layer + the loss's 2 per step
    assert cost.eval_per_image == cost.forward  # nothing here behaves differently in inference
    assert cost.train_per_image(2) == 1526 + 1674 + 911 / 2
    assert cost.macs == 648 + 72 + 6
    assert cost.params == cost.trainable_params == 76 + 8 + 9


def test_grouped_and_depthwise_convolutions():
    b = GraphBuilder((4, 4, 4))
    x = b.add("conv", b.input, filters=6, kernel=3, groups=2, use_bias=False)
    y = b.add("dwconv", x, kernel=3, multiplier=2, use_bias=True)
    head(b, y)
    cost = count_flops(b.build())
    assert row(cost, "n1_conv").macs == 16 * (3 * 3 * 2 * 6)  # each output sees C_in / groups = 2 channels
    dw = row(cost, "n2_dwconv")
    assert dw.output_shape == (4, 4, 12)
    assert dw.macs == 16 * (3 * 3 * 6 * 2)  # one 3x3 filter per (channel, multiplier)
    assert dw.forward == 2 * 1728 + 16 * 12
    assert dw.backward == 2 * 1728 + 192 + 2 * 1728
    assert dw.params == 108 + 12


# --- BatchNorm --------------------------------------------------------------------------------------------


def test_batchnorm_training_inference_and_statistics():
    b = GraphBuilder((2, 2, 3))
    x = b.add("bn", b.add("conv", b.input, filters=3, kernel=1, use_bias=False))
    head(b, x)
    cost = count_flops(b.build())
    bn = row(cost, "n2_bn")
    e, c = 12, 3
    assert bn.forward == 6 * e  # mean 1 + variance 3 + x * a + b 2
    assert bn.inference == 2 * e  # x * a + b with the moving statistics
    assert bn.backward == (3 + 5) * e  # dgamma/dbeta sums 3 + input gradient 5
    assert bn.params == 4 * c  # gamma, beta, moving mean, moving variance
    assert bn.per_step == 7 * 2 * c + (13 + 3 + 8) * c  # SGD on gamma and beta + per-channel statistics
    assert cost.trainable_params == 9 + 6 + 12  # the moving statistics are not trained
    assert cost.eval_per_image == cost.forward - 4 * e


def test_batchnorm_on_the_input_computes_no_input_gradient():
    b = GraphBuilder((2, 2, 3))
    head(b, b.add("bn", b.input))
    bn = row(count_flops(b.build()), "n1_bn")
    assert bn.backward == 3 * 12
    assert bn.per_step == 7 * 6 + (13 + 3) * 3


# --- activations, pooling, elementwise and data movement -------------------------------------------------


EXPECTED_ACTIVATIONS = {  # (forward, backward) per element, derived in docs/flops.md
    "linear": (0, 0),
    "relu": (1, 1),
    "relu6": (2, 2),
    "sigmoid": (3, 3),
    "hard_sigmoid": (4, 3),
    "tanh": (1, 3),
    "swish": (4, 5),
    "gelu": (5, 8),
    "softmax": (5, 4),
}


def test_every_activation_has_a_documented_cost():
    assert set(ACTIVATION_OPS) == set(ACTIVATIONS)
    assert ACTIVATION_OPS == EXPECTED_ACTIVATIONS


@pytest.mark.parametrize("fn", sorted(EXPECTED_ACTIVATIONS))
def test_activation_counts_per_element(fn):
    b = GraphBuilder((2, 2, 1))
    head(b, b.add("act", b.add("conv", b.input, filters=2, kernel=1), fn=fn))
    act = row(count_flops(b.build()), "n2_act")
    fwd, bwd = EXPECTED_ACTIVATIONS[fn]
    assert (act.forward, act.backward, act.inference) == (8 * fwd, 8 * bwd, 8 * fwd)


def test_nothing_flows_back_into_ops_that_read_only_the_input():
    b = GraphBuilder((4, 4, 1))
    x = b.add("zeropad", b.add("act", b.input, fn="relu"), pad=1)  # n1 act, n2 zeropad -> 6x6x1
    head(b, b.add("conv", x, filters=2, kernel=3, padding="valid"))  # n3 conv -> 4x4x2
    cost = count_flops(b.build())
    assert row(cost, "n1_act").forward == 16
    assert row(cost, "n1_act").backward == 0
    assert row(cost, "n2_zeropad").forward == row(cost, "n2_zeropad").backward == 0
    conv = row(cost, "n3_conv")
    assert conv.backward == conv.forward == 2 * 16 * 9 * 2 + 32  # weight and bias gradients only


@pytest.mark.parametrize(
    ("mode", "size", "strides", "padding", "out_elements", "forward", "backward"),
    [
        ("max", 2, None, "valid", 8, 4 * 8, 5 * 8),  # 2x2 compares; locate again and route one add
        ("avg", 2, None, "valid", 8, 5 * 8, 5 * 8),  # 4 adds and a scale; scale and spread 4 adds
        ("max", 3, 1, "same", 32, 9 * 32, 10 * 32),  # the full window counts at the border too
    ],
)
def test_pooling(mode, size, strides, padding, out_elements, forward, backward):
    b = GraphBuilder((4, 4, 1))
    x = b.add(
        "pool", b.add("conv", b.input, filters=2, kernel=1), mode=mode, size=size, strides=strides, padding=padding
    )
    head(b, x)
    pool = row(count_flops(b.build()), "n2_pool")
    assert math.prod(pool.output_shape) == out_elements
    assert (pool.forward, pool.backward) == (forward, backward)


@pytest.mark.parametrize(("mode", "forward", "backward"), [("avg", 10 * 2, 10 * 2), ("max", 9 * 2, 10 * 2)])
def test_global_pooling(mode, forward, backward):
    b = GraphBuilder((3, 3, 1))
    x = b.add("gpool", b.add("conv", b.input, filters=2, kernel=1), mode=mode)
    b.add("dense", x, units=2)
    gpool = row(count_flops(b.build()), "n2_gpool")
    assert (gpool.forward, gpool.backward) == (forward, backward)


def test_add_and_gradient_fan_in():
    b = GraphBuilder((3, 3, 1))
    x = b.add("conv", b.input, filters=2, kernel=1, use_bias=False)  # n1, read by n2, n3 and n4
    y = b.add("conv", x, filters=2, kernel=1, use_bias=False)  # n2
    z = b.add("conv", x, filters=2, kernel=1, use_bias=False)  # n3
    s = b.add("add", x, y, z)  # n4: three inputs
    head(b, s)
    cost = count_flops(b.build())
    assert row(cost, "n4_add").forward == 2 * 18  # two adds per element for three inputs
    assert row(cost, "n4_add").backward == 0  # the gradient passes to every input unchanged
    # n1's gradient arrives from three consumers: two extra adds per element on top of its own backward
    assert row(cost, "n1_conv").backward == 2 * 18 + 2 * 18


def test_add_of_a_tensor_to_itself_sums_both_gradients():
    b = GraphBuilder((3, 3, 1))
    x = b.add("conv", b.input, filters=2, kernel=1, use_bias=False)
    head(b, b.add("add", x, x))
    cost = count_flops(b.build())
    assert row(cost, "n1_conv").backward == 36 + 18


def test_concat_flatten_and_reshape_move_data_only():
    b = GraphBuilder((2, 2, 1))
    x = b.add("conv", b.input, filters=2, kernel=1)
    x = b.add("concat", b.input, x)  # n2 -> 2x2x3
    x = b.add("reshape", b.add("flatten", x), shape=(3, 4))
    x = b.add("flatten", x)
    b.add("dense", x, units=2)
    cost = count_flops(b.build())
    for label in ("n2_concat", "n3_flatten", "n4_reshape", "n5_flatten"):
        assert (row(cost, label).forward, row(cost, label).backward) == (0, 0)
    dense = row(cost, "n6_dense")
    assert dense.backward == 2 * 24 + 2 + 2 * 24  # the concat carries the conv's gradient, so dX is needed


def test_dropout_costs_only_in_training_and_only_when_active():
    def dropout_row(rate):
        b = GraphBuilder((2, 2, 1))
        head(b, b.add("dropout", b.add("conv", b.input, filters=2, kernel=1), rate=rate))
        return row(count_flops(b.build()), "n2_dropout")

    active = dropout_row(0.5)
    assert (active.forward, active.backward, active.inference) == (3 * 8, 2 * 8, 0)
    idle = dropout_row(0.0)
    assert (idle.forward, idle.backward, idle.inference) == (0, 0, 0)


# --- epochs, validation, presentation ----------------------------------------------------------------------


def test_epoch_operations_charge_one_update_per_step():
    cost = count_flops(conv_net())
    train, evaluation = epoch_operations(cost, train_images=100, eval_images=30, batch_size=32)
    assert train == 100 * (1526 + 1674) + 4 * 911  # ceil(100 / 32) = 4 steps
    assert evaluation == 30 * 1526


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_batch_size_is_a_one_line_error(bad):
    cost = count_flops(conv_net())
    with pytest.raises(AiperfError, match="batch size"):
        cost.train_per_image(bad)
    with pytest.raises(AiperfError, match="batch size"):
        epoch_operations(cost, 10, 10, bad)


def test_backward_is_about_twice_forward_on_real_networks():
    """A sanity bound from the literature: training costs about 3x the forward pass."""
    for name in ("resnet50", "vgg16", "mobilenet_v1"):
        cost = count_flops(zoo.by_name(name))
        assert 1.9 < cost.backward / cost.forward < 2.0, name


def test_to_dict_is_json_ready_and_consistent():
    import json

    cost = count_flops(zoo.small_resnet())
    doc = json.loads(json.dumps(cost.to_dict(batch_size=64)))
    assert doc["forward"] == cost.forward
    assert doc["train_per_image"] == cost.train_per_image(64)
    assert sum(layer["forward"] for layer in doc["layers"]) + doc["loss_forward"] == doc["forward"]
    assert [layer["label"] for layer in doc["layers"]] == [n.label for n in zoo.small_resnet().nodes]


def test_format_table_lists_every_layer_and_the_totals():
    graph = zoo.small_resnet()
    text = format_table(count_flops(graph), batch_size=128)
    for node in graph.nodes:
        assert node.label in text
    assert "3,612,672" in text  # n4_conv forward: 2 * 28 * 28 * 9 * 16 * 16
    assert "training per image at batch 128" in text
    assert "conv + dense multiply-adds" in text


# --- AIPerf's conventions ----------------------------------------------------------------------------------


def aiperf_net():
    b = GraphBuilder((4, 4, 3))
    x = b.add("act", b.add("bn", b.add("conv", b.input, filters=8, kernel=3)), fn="relu")  # n1..n3
    x = b.add("pool", x, mode="max", size=2)  # n4 -> 2x2x8
    y = b.add("conv", x, filters=8, kernel=3)  # n5
    x = b.add("add", x, y)  # n6
    b.add("dense", b.add("gpool", x), units=10)  # n7, n8
    return b.build()


def test_aiperf_compatible_counts_by_hand():
    """Each term is AIPerf's profiler.py formula evaluated by hand."""
    conv1_fw, conv1_bw = 2 * 16 * 9 * 3 * 8, 9 * 3 * 8 * (2 * 16 + 2)  # first conv: no input gradient
    bn_fw, bn_bw = 7 * 16 * 8, 36  # BN backward: a constant
    relu_fw = pool_fw = 128  # pool: 128 inputs * 2 * 2 / (2 * 2)
    conv2_fw, conv2_bw = 2 * 4 * 576, 576 * (4 * 4 + 2)
    add_fw = 32
    gpool_fw = (4 - 1) * 8 + 8
    dense_fw, dense_bw = 2 * 80, 4 * 80 + 2 * 9 * 10
    softmax_fw = 8 * 10 + 9 + 4 * 10
    forward = conv1_fw + bn_fw + relu_fw + pool_fw + conv2_fw + add_fw + gpool_fw + dense_fw + softmax_fw
    backward = conv1_bw + bn_bw + conv2_bw + dense_bw
    assert aiperf_compatible_per_image(aiperf_net()) == (forward, forward + backward)
    assert aiperf_compatible_operations(aiperf_net(), 1000, 100) == 1000 * (forward + backward) + 100 * forward


def test_aiperf_and_our_count_agree_where_the_conventions_do():
    """On ResNet-50 both are dominated by the same convolutions: within a few percent."""
    graph = zoo.resnet(50)
    ours = count_flops(graph)
    aiperf_eval, aiperf_train = aiperf_compatible_per_image(graph)
    assert aiperf_eval == pytest.approx(ours.forward, rel=0.01)
    assert aiperf_train == pytest.approx(ours.train_per_image(256), rel=0.03)


@pytest.mark.parametrize("bad", [-1, 2.0, None, True])
def test_bad_image_counts_are_one_line_errors(bad):
    cost = count_flops(conv_net())
    with pytest.raises(AiperfError, match="image counts"):
        epoch_operations(cost, bad, 10, 32)
    with pytest.raises(AiperfError, match="image counts"):
        aiperf_compatible_operations(conv_net(), 10, bad)


# --- the ``aiperf flops`` command --------------------------------------------------------------------------


def _flops(capsys, *args: str) -> str:
    """What ``aiperf flops ARGS`` prints on stdout (it must succeed)."""
    from aiperf.cli import main

    assert main(["flops", *args]) == 0
    return capsys.readouterr().out


def test_flops_command_on_an_architecture_file(tmp_path, capsys):
    import json

    from nas.serialize import save

    graph = zoo.small_resnet()
    path = tmp_path / "arch.json"
    save(graph, path)
    cost = count_flops(graph)
    text = _flops(capsys, str(path), "--batch-size", "32")
    assert f"{graph.output_node.label}" in text and f"{round(cost.train_per_image(32)):,}" in text
    assert "AIPerf-compatible" in text
    doc = json.loads(_flops(capsys, str(path), "--json", "--batch-size", "32"))
    assert doc["forward"] == cost.forward and doc["train_per_image"] == cost.train_per_image(32)
    assert doc["aiperf_compatible"]["eval_per_image"] == aiperf_compatible_per_image(graph)[0]


def test_flops_report_names_the_graph_as_told():
    import json

    from aiperf.families.image.flops_report import flops_report

    graph = zoo.small_resnet()
    assert flops_report(graph, "mine").startswith(f"mine: {len(graph)} nodes")
    assert json.loads(flops_report(graph, "mine", as_json=True))["architecture"] == "mine"


def test_flops_command_on_a_saved_keras_model(tmp_path, capsys):
    keras = pytest.importorskip("keras")
    from aiperf.families.image.keras_import import graph_from_keras_file

    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(5)(x))
    path = tmp_path / "net.keras"
    model.save(path)
    graph = graph_from_keras_file(str(path))
    assert count_flops(graph).macs == 8 * 8 * 3 * 3 * 3 * 4 + 4 * 5
    assert f"{count_flops(graph).macs:,}" in _flops(capsys, str(path))


def test_flops_command_on_a_language_model_counts_per_token(tmp_path, capsys):
    import json

    from nas.language.flops import transformer_flops
    from nas.language.spec import TransformerSpec

    spec = TransformerSpec(vocab_size=256, seq_len=64, width=48, head_dim=16, heads=(3, 2), mlp_hidden=(96, 128))
    path = tmp_path / "lm.json"
    path.write_text(json.dumps(spec.to_dict()))
    flops = transformer_flops(spec)
    doc = json.loads(_flops(capsys, str(path), "--json", "--batch-size", "4"))
    assert [b["forward"] for b in doc["blocks"]] == [b.forward() for b in flops.blocks]  # blocks of their own sizes
    assert doc["forward_per_token"] == flops.forward(1) and doc["six_n_per_token"] == 6 * spec.params()
    assert doc["train_per_token"] == flops.train_per_token(4 * 64)
    text = _flops(capsys, str(path))
    assert text.startswith("lm: 2 blocks, width 48") and f"{flops.update_per_step:,}" in text


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("{not json", "invalid JSON"),
        ('{"format": "other"}', "not an architecture file"),
        ('{"format": "aiperf-transformer", "version": 1}', "transformer: missing key"),
        ('{"format": "aiperf-transformer", "version": 1, "vocab_size": 1e300}', "transformer: "),
    ],
)
def test_flops_command_reports_bad_files_in_one_line(tmp_path, capsys, content, message):
    import re

    from aiperf.cli import main

    path = tmp_path / "arch.json"
    if content is not None:
        path.write_text(content)
    assert main(["flops", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


def test_the_memo_gives_what_a_fresh_count_gives_whatever_the_dropout():
    from aiperf.families.image.flops import FlopsMemo

    def two_dropouts(first: float, second: float):
        b = GraphBuilder((6, 6, 2))
        x = b.add("conv", b.input, filters=4, kernel=3, padding="same", use_bias=True)
        x = b.add("dropout", x, rate=first)
        x = b.add("dense", b.add("gpool", x), units=5)
        b.add("dense", b.add("dropout", x, rate=second), units=3)
        return b.build()

    memo = FlopsMemo(capacity=2)
    plain = two_dropouts(0.0, 0.0)
    cases = [plain, plain.with_dropout(0.3), plain.with_dropout(0.1), two_dropouts(0.0, 0.2), two_dropouts(0.2, 0.0)]
    cases.append(zoo.small_resnet((16, 16, 3), 10))
    for graph in cases * 2:  # the second round meets remembered, evicted and never-remembered counts
        assert memo(graph) == count_flops(graph)
    mixed = {memo(g).train_per_image(8) for g in cases[3:5]} | {memo(plain).train_per_image(8)}
    assert len(mixed) == 3 and memo(plain.with_dropout(0.3)).train_per_image(8) > max(mixed)
    assert len(memo._costs) <= 2


def test_a_morph_child_counts_again_only_the_layers_it_changed(monkeypatch):
    """Nodes a child shares with its parent keep their counts (Node.recall); the totals are a fresh count's."""
    import aiperf.families.image.flops as flops
    from nas.morph import apply_morph, candidate_morphs
    from nas.serialize import graph_from_dict, graph_to_dict

    parent = zoo.small_resnet()
    count_flops(parent)
    counted, real = [], flops._layer_cost
    monkeypatch.setattr(flops, "_layer_cost", lambda graph, n, flows: counted.append(n) or real(graph, n, flows))
    for morph in candidate_morphs(parent)[::3]:  # deeper, wider and skips, all over the net
        child, _ = apply_morph(parent, morph)
        counted.clear()
        cost = count_flops(child)
        assert len(counted) < len(child), morph
        assert cost == count_flops(graph_from_dict(graph_to_dict(child)))  # new nodes: everything counted
    assert counted
