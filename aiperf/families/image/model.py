"""Graph -> Keras 3 model, and weights in and out by node id.

The single place where an architecture becomes a trainable model; it speaks only Keras
(``keras.layers``), so it runs unchanged on the TensorFlow, JAX and torch backends. Each
Keras layer is named after its node (``n7_conv``), which is how inherited weights find
their layer and how the FLOP cross-check finds the graph node.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from nas.graph import Graph, Node

if TYPE_CHECKING:
    from keras import DTypePolicy, Initializer, KerasTensor, Layer, Model

Weights = dict[int, list[np.ndarray]]
PIXELS_LAYER = "pixels"


def he_normal_values(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    """A He-normal draw from NumPy's global RNG, as Keras's ``HeNormal`` computes it.

    Truncated normal (redrawn beyond two standard deviations), std ``sqrt(2 / fan_in)`` with
    Keras's fan-in and truncation correction. Seeded per trial by ``aiperf.training.backend.seed_trial``.
    """
    receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    fan_in = max(1, shape[-2] * receptive if len(shape) >= 2 else shape[0])
    std = np.sqrt(2.0 / fan_in) / 0.87962566103423978  # Keras's truncation correction
    values = np.random.standard_normal(shape)
    outside = np.abs(values) > 2.0
    while outside.any():
        values[outside] = np.random.standard_normal(int(outside.sum()))
        outside = np.abs(values) > 2.0
    return (values * std).astype(dtype)


def _host_he_normal(keras: Any) -> Initializer:  # keras: the module (see trial_sgd)
    """Keras's He-normal initialiser, drawn with NumPy on the host (:func:`he_normal_values`).

    On the JAX backend Keras's own random initialisers compile one XLA program per kernel
    shape, which made building a 30-layer net slow; one NumPy draw per layer costs a small
    fraction of that (figures: benchmarks/RESULTS.md).
    """

    class HostHeNormal(keras.initializers.Initializer):
        def __call__(
            self, shape: tuple[int, ...], dtype: str | None = None
        ) -> KerasTensor:  # the backend's tensor type
            return keras.ops.convert_to_tensor(he_normal_values(tuple(shape), dtype or "float32"))

        def get_config(self) -> dict[str, object]:
            return {}

    return HostHeNormal()


def initial_weights(graph: Graph) -> Weights:
    """The weights a freshly built model of ``graph`` starts with, drawn in the same order.

    Building a model draws every kernel, node by node, from NumPy's global RNG (biases,
    BatchNorm scales and statistics are constants). This makes the same draws without a
    model, so a worker that reuses an already compiled model of this architecture starts
    a trial from exactly the weights a fresh build would have given it.
    """
    out: Weights = {}
    for node in graph.nodes:
        shapes = graph.weight_shapes(node.id)
        if not shapes:
            continue
        if node.op == "bn":
            ones, zeros = np.ones(shapes[0], np.float32), np.zeros(shapes[0], np.float32)
            out[node.id] = [ones, zeros, zeros.copy(), ones.copy()]  # gamma, beta, moving mean, moving variance
        else:  # conv, dwconv, dense: the kernel, then an optional zero bias
            out[node.id] = [he_normal_values(tuple(shapes[0])), *(np.zeros(s, np.float32) for s in shapes[1:])]
    return out


def _layer(node: Node, keras: ModuleType, dtype: DTypePolicy | None, bn_momentum: float, output: bool) -> Layer:
    a, name, L = node.attrs, node.label, keras.layers
    kw: dict[str, str | DTypePolicy | None] = {"name": name, "dtype": "float32" if output else dtype}
    if node.op == "conv":
        return L.Conv2D(
            a["filters"],
            a["kernel"],
            strides=a["strides"],
            padding=a["padding"],
            groups=a["groups"],
            use_bias=a["use_bias"],
            kernel_initializer=_host_he_normal(keras),
            **kw,
        )
    if node.op == "dwconv":
        return L.DepthwiseConv2D(
            a["kernel"],
            strides=a["strides"],
            padding=a["padding"],
            depth_multiplier=a["multiplier"],
            use_bias=a["use_bias"],
            depthwise_initializer=_host_he_normal(keras),
            **kw,
        )
    if node.op == "bn":
        return L.BatchNormalization(epsilon=a["epsilon"], momentum=bn_momentum, **kw)
    if node.op == "act":
        if a["fn"] == "relu":
            return L.ReLU(**kw)
        if a["fn"] == "relu6":
            return L.ReLU(max_value=6.0, **kw)
        return L.Activation(a["fn"], **kw)
    if node.op == "pool":
        cls = L.MaxPooling2D if a["mode"] == "max" else L.AveragePooling2D
        return cls(pool_size=a["size"], strides=a["strides"], padding=a["padding"], **kw)
    if node.op == "gpool":
        cls = L.GlobalMaxPooling2D if a["mode"] == "max" else L.GlobalAveragePooling2D
        return cls(keepdims=a["keepdims"], **kw)
    if node.op == "dense":
        return L.Dense(a["units"], use_bias=a["use_bias"], kernel_initializer=_host_he_normal(keras), **kw)
    if node.op == "dropout":
        from aiperf.families.image.runtime_hparams import runtime_dropout

        return runtime_dropout(keras)(a["rate"], **kw)
    if node.op == "add":
        return L.Add(**kw)
    if node.op == "concat":
        return L.Concatenate(axis=-1, **kw)
    if node.op == "flatten":
        return L.Flatten(**kw)
    if node.op == "zeropad":
        t, b, left, r = a["pad"]
        return L.ZeroPadding2D(((t, b), (left, r)), **kw)
    if node.op == "reshape":
        return L.Reshape(a["shape"], **kw)
    raise AssertionError(node.op)  # pragma: no cover - OP_ATTRS is closed


def build_model(
    graph: Graph,
    *,
    dtype_policy: str | None = None,
    bn_momentum: float = 0.9,
    pixel_scale: float | None = None,
    pixel_offset: float = 0.0,
) -> Model:
    """Build the Keras functional model of ``graph`` (outputs float32 logits).

    With ``pixel_scale`` an input ``Rescaling`` layer named ``pixels`` maps stored pixel
    values (e.g. uint8) to the floats the graph expects; it is not part of the architecture.
    """
    import keras

    dtype = keras.DTypePolicy(dtype_policy) if dtype_policy else None
    inp = keras.Input(shape=graph.input_shape, name=graph.input_node.label)
    x = inp
    if pixel_scale is not None:
        x = keras.layers.Rescaling(pixel_scale, pixel_offset, name=PIXELS_LAYER, dtype=dtype)(x)
    values = {graph.input_node.id: x}
    out_id = graph.output_node.id
    for node in graph.nodes[1:]:
        layer = _layer(node, keras, dtype, bn_momentum, node.id == out_id)
        args = [values[i] for i in node.inputs]
        values[node.id] = layer(args if node.op in ("add", "concat") else args[0])
    return keras.Model(inp, values[out_id], name=re.sub(r"[^\w.-]", "_", graph.name or "net"))


def get_weights(model: Model, graph: Graph) -> Weights:
    """The model's weights as ``{node_id: [arrays in Keras order]}`` (float32 NumPy)."""
    out: Weights = {}
    for node in graph.nodes:
        if graph.weight_shapes(node.id):
            out[node.id] = [np.asarray(w, dtype=np.float32) for w in model.get_layer(node.label).get_weights()]
    return out


def set_weights(model: Model, graph: Graph, weights: Weights) -> int:
    """Load the given layers' weights; returns how many layers were set. Shapes must match."""
    count = 0
    for node_id, arrays in weights.items():
        node = graph.node(node_id)
        layer = model.get_layer(node.label)
        expected = [tuple(s) for s in graph.weight_shapes(node_id)]
        got = [tuple(a.shape) for a in arrays]
        if got != expected:
            raise ValueError(f"{node.label}: weight shapes {got} do not match the architecture's {expected}")
        layer.set_weights(arrays)
        count += 1
    return count
