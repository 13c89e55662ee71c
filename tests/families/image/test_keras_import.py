"""Keras model -> graph import: keras.applications nets compute the same function once imported.

Every application is built with ``weights=None`` at a small input size, its BatchNorm
statistics and biases are randomised (so that normalisation and bias handling are really
exercised), and its output is compared with the imported graph run two ways: the NumPy
reference ``nas.forward`` and the Keras model that ``aiperf.families.image.model.build_model`` builds.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from aiperf.errors import AiperfError  # noqa: E402
from aiperf.families.image.keras_import import (  # noqa: E402
    graph_from_keras,
    graph_from_keras_file,
    import_keras,
    import_keras_file,
    weights_from_keras,
)
from aiperf.families.image.model import build_model, set_weights  # noqa: E402
from nas import zoo  # noqa: E402
from nas.forward import forward  # noqa: E402
from nas.morph import apply_morph, candidate_morphs  # noqa: E402

pytestmark = pytest.mark.slow  # builds keras.applications networks

L = keras.layers
TOLERANCE = 1e-4


def randomise(model, seed: int = 0):
    """Random BN statistics/affine and biases on top of Keras' random kernels."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        arrays = layer.get_weights()
        if not arrays:
            continue
        if isinstance(layer, L.BatchNormalization):
            arrays = [
                rng.uniform(0.5, 1.5, a.shape)
                if v.name in ("gamma", "moving_variance")
                else rng.normal(0, 0.2, a.shape)
                for a, v in zip(arrays, layer.weights, strict=True)
            ]
        else:
            arrays = [
                rng.normal(0, 0.05, a.shape) if v.name == "bias" else a
                for a, v in zip(arrays, layer.weights, strict=True)
            ]
        layer.set_weights([np.asarray(a, np.float32) for a in arrays])
    return model


@functools.cache
def application(name: str, size: int, classifier_activation: str | None = None):
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, name)(
        weights=None, input_shape=(size, size, 3), classes=10, classifier_activation=classifier_activation
    )
    return randomise(model)


def keras_output(model, x: np.ndarray) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(model(x, training=False)), dtype=np.float64)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def assert_same_function(model, graph, weights, batch: int = 2, logits_of_softmax: bool = False) -> None:
    x = np.random.default_rng(1).normal(size=(batch, *graph.input_shape)).astype(np.float32)
    want = keras_output(model, x)
    ours = forward(graph, weights, x)
    built = build_model(graph)
    set_weights(built, graph, weights)
    theirs = keras_output(built, x)
    if logits_of_softmax:
        ours, theirs = softmax(ours), softmax(theirs)
    assert relative_error(ours, want) <= TOLERANCE
    assert relative_error(theirs, want) <= TOLERANCE


APPLICATIONS = [  # (name, a small input size it accepts)
    ("ResNet50", 64),
    ("ResNet50V2", 64),
    ("VGG16", 32),
    ("MobileNetV2", 32),
    ("DenseNet121", 32),
    ("InceptionV3", 75),
    ("Xception", 71),
]


@pytest.mark.parametrize(("name", "size"), APPLICATIONS, ids=[a[0] for a in APPLICATIONS])
def test_application_imports_with_the_same_function(name, size):
    model = application(name, size)
    graph, weights = import_keras(model)
    assert graph.input_shape == (size, size, 3) and graph.num_classes == 10
    # The graph's BN always has a scale; Keras' may not (scale=False), which the import fills with ones.
    unscaled = sum(
        layer.get_weights()[0].shape[0]
        for layer in model.layers
        if isinstance(layer, L.BatchNormalization) and not layer.scale
    )
    assert graph.param_count == model.count_params() + unscaled
    assert_same_function(model, graph, weights)


def test_mobilenet_with_its_softmax_imports_as_logits():
    model = application("MobileNet", 32, "softmax")  # ends in Reshape + Activation("softmax")
    graph, weights = import_keras(model)
    assert graph.output_node.op == "reshape" and graph.count("dwconv") == 13
    assert graph.count("act") == 27  # the 27 ReLU(6) layers, the softmax dropped
    assert all(n.attrs["fn"] == "relu6" for n in graph.nodes if n.op == "act")
    assert_same_function(model, graph, weights, logits_of_softmax=True)


def test_resnet50_import_is_the_zoo_seed_node_for_node():
    assert graph_from_keras(application("ResNet50", 64)) == zoo.resnet(50, (64, 64, 3), num_classes=10)


def test_an_imported_residual_net_morphs_with_its_function_preserved():
    model = application("MobileNetV2", 32)
    graph, weights = import_keras(model)
    x = np.random.default_rng(2).normal(size=(2, 32, 32, 3))
    want = forward(graph, weights, x)
    candidates = candidate_morphs(graph, rng=np.random.default_rng(0), max_skips=2)
    for morph in candidates[::9]:  # a spread of every kind
        child, child_weights = apply_morph(graph, morph, weights, rng=0)
        assert relative_error(forward(child, child_weights, x), want) <= TOLERANCE, morph.describe()
    first_add = next(n for n in graph.nodes if n.op == "add")
    project = graph.node(first_add.inputs[1]).inputs[0]  # the block's 1x1 projection conv, behind its BN
    wider = next(m for m in candidates if m.kind == "wider" and m.target == project)
    child, child_weights = apply_morph(graph, wider, weights, rng=1)
    grown = [n.id for n in child.nodes if n.op == "conv" and n.attrs["filters"] != graph.node(n.id).attrs["filters"]]
    assert project in grown and len(grown) >= 2  # the add's other producer widened with it
    assert relative_error(forward(child, child_weights, x), want) <= TOLERANCE


# --- layer conversions ------------------------------------------------------------------------------------


def functional(build, shape=(8, 8, 3), name="net"):
    keras.utils.set_random_seed(0)
    inp = keras.Input(shape)
    return randomise(keras.Model(inp, build(inp), name=name))


def test_fused_activations_separable_relu6_identity_and_softmax_layers():
    def build(x):
        x = L.Conv2D(6, 3, groups=3, activation="relu", name="conv_relu")(x)
        x = L.SeparableConv2D(8, 3, strides=2, padding="same", depth_multiplier=2, activation="swish")(x)
        x = L.BatchNormalization(center=False, epsilon=1e-2)(x)
        x = L.ReLU(max_value=6.0)(x)
        x = L.Activation("linear")(x)
        x = L.Identity()(x)
        x = L.Softmax()(x)  # not trailing: kept
        x = L.GlobalMaxPooling2D()(x)
        x = L.Dense(5, activation="tanh")(x)
        return L.Dense(3, activation="softmax")(x)  # trailing: dropped

    model = functional(build)
    graph, weights = import_keras(model)
    assert [n.op for n in graph.nodes] == [
        "input",
        "conv",
        "act",
        "dwconv",
        "conv",
        "act",
        "bn",
        "act",
        "act",
        "gpool",
        "dense",
        "act",
        "dense",
    ]
    assert [n.attrs["fn"] for n in graph.nodes if n.op == "act"] == ["relu", "swish", "relu6", "softmax", "tanh"]
    assert (
        graph.node(1).attrs["groups"] == 3
        and graph.node(3).attrs["multiplier"] == 2
        and graph.node(3).attrs["strides"] == (2, 2)
    )
    assert graph.node(4).attrs["kernel"] == (1, 1) and graph.node(4).attrs["filters"] == 8
    assert_same_function(model, graph, weights, logits_of_softmax=True)


def test_nested_models_and_sequential_are_inlined():
    inner_in = keras.Input((6, 6, 4))
    inner = keras.Model(inner_in, L.Add()([inner_in, L.Conv2D(4, 1)(inner_in)]), name="inner")
    tail = keras.Sequential(
        [
            L.ZeroPadding2D(((0, 1), (2, 0))),
            L.AveragePooling2D(3, 2, padding="same"),
            L.Flatten(),
            L.Dropout(0.5),
            L.Dense(3),
        ],
        name="tail",
    )

    def build(x):
        x = L.Conv2D(4, 3)(x)
        x = inner(x)
        return tail(L.Concatenate()([x, L.MaxPooling2D(3, 1, padding="same")(x)]))

    model = functional(build)
    graph, weights = import_keras(model)
    assert [n.op for n in graph.nodes] == [
        "input",
        "conv",
        "conv",
        "add",
        "pool",
        "concat",
        "zeropad",
        "pool",
        "flatten",
        "dropout",
        "dense",
    ]
    assert_same_function(model, graph, weights)
    seq = keras.Sequential([keras.Input((5,)), L.Dense(4, activation="relu"), L.Dense(2)])
    g, w = import_keras(seq)
    assert [n.op for n in g.nodes] == ["input", "dense", "act", "dense"]
    assert_same_function(seq, g, w)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda x: L.Dense(2)(L.GlobalAveragePooling2D()(L.Multiply(name="se_excite")([x, x]))),
            "cannot import layer 'se_excite' (Multiply): not representable as an aiperf graph op",
        ),
        (
            lambda x: L.Dense(2)(L.Flatten()(L.LeakyReLU(name="leaky")(x))),
            "cannot import layer 'leaky' (LeakyReLU): not representable as an aiperf graph op",
        ),
        (
            lambda x: L.Dense(2)(L.Flatten()(L.Conv2D(2, 3, dilation_rate=2, name="atrous")(x))),
            "cannot import layer 'atrous' (Conv2D): dilation_rate (2, 2) is not supported (only 1)",
        ),
        (
            lambda x: L.Dense(2)(L.Flatten()(L.ReLU(max_value=4.0, name="r4")(x))),
            "cannot import layer 'r4' (ReLU): only ReLU",
        ),
        (
            lambda x: L.Dense(2)(L.Flatten()(L.Activation("elu", name="elu")(x))),
            "cannot import layer 'elu' (Activation): activation 'elu' is not supported",
        ),
        (
            lambda x: L.Dense(2)(L.Flatten()(L.BatchNormalization(axis=1, name="bn1")(x))),
            "cannot import layer 'bn1' (BatchNormalization): normalises axis 1",
        ),
        (lambda x: L.Dense(2, name="fc")(x), "cannot import layer 'fc' (Dense): input of shape (8, 8, 3)"),
        (
            lambda x: L.Dense(2)(L.Flatten()(L.Concatenate(axis=1, name="cat")([x, x]))),
            "cannot import layer 'cat' (Concatenate): concatenates axis 1",
        ),
        (
            lambda x: L.Conv2D(2, 3, name="last")(x),
            "cannot import model 'net': layer 'last' (Conv2D): the output must be a vector of class logits",
        ),
    ],
    ids=[
        "multiply",
        "leaky_relu",
        "dilated",
        "relu4",
        "elu",
        "bn_axis",
        "dense_on_image",
        "concat_axis",
        "image_output",
    ],
)
def test_unsupported_layers_are_named(build, message):
    with pytest.raises(AiperfError) as err:
        graph_from_keras(functional(build))
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_an_application_with_unsupported_layers_is_refused_at_the_first_one():
    model = keras.applications.EfficientNetB0(weights=None, input_shape=(32, 32, 3), classes=10)
    with pytest.raises(AiperfError, match=r"^cannot import layer 'rescaling' \(Rescaling\): not representable"):
        graph_from_keras(model)


def test_models_that_are_not_single_input_single_output_graphs_are_refused():
    a, b = keras.Input((4,)), keras.Input((4,))
    with pytest.raises(AiperfError, match="it has 2 inputs"):
        graph_from_keras(keras.Model([a, b], L.Dense(2)(L.Add()([a, b]))))
    with pytest.raises(AiperfError, match="it has 2 outputs"):
        graph_from_keras(keras.Model(a, [L.Dense(2)(a), L.Dense(3)(a)]))
    free = keras.Input((None, None, 3))
    with pytest.raises(AiperfError, match=r"input shape \(None, None, 3\) must be fully defined"):
        graph_from_keras(keras.Model(free, L.Dense(2)(L.GlobalAveragePooling2D()(free))))

    class Subclassed(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(AiperfError, match="only built functional or Sequential models"):
        graph_from_keras(Subclassed())
    with pytest.raises(AiperfError, match="expected a Keras model, got str"):
        graph_from_keras("resnet50")


def test_weights_belong_to_the_graph_they_were_imported_with():
    model = functional(lambda x: L.Dense(3)(L.GlobalAveragePooling2D()(L.Conv2D(4, 3)(x))))
    graph = graph_from_keras(model)
    assert weights_from_keras(model, graph).keys() == {1, 3}
    with pytest.raises(AiperfError, match="is not the import of model"):
        weights_from_keras(model, zoo.small_resnet((8, 8, 3), num_classes=3))


# --- files ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_saved_models_import_with_their_weights(tmp_path, suffix):
    model = functional(lambda x: L.Dense(3)(L.GlobalAveragePooling2D()(L.BatchNormalization()(L.Conv2D(4, 3)(x)))))
    path = tmp_path / f"model{suffix}"
    model.save(path)
    graph, weights = import_keras_file(path)
    assert graph == graph_from_keras(model) == graph_from_keras_file(path)
    reference = weights_from_keras(model, graph)
    assert all(np.array_equal(a, b) for k in reference for a, b in zip(weights[k], reference[k], strict=True))


def test_bad_model_files_give_one_line_errors(tmp_path):
    with pytest.raises(AiperfError, match="no such file"):
        graph_from_keras_file(tmp_path / "missing.keras")
    with pytest.raises(AiperfError, match=r"not a Keras model file \(expected .keras, .h5, .hdf5\)"):
        graph_from_keras_file(tmp_path / "model.onnx")
    for name, content in [("corrupt.keras", b"PK\x03\x04 not a zip"), ("corrupt.h5", b"\x89HDF\r\n garbage")]:
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(AiperfError, match="cannot load the Keras model") as err:
            graph_from_keras_file(path)
        assert "\n" not in str(err.value)
