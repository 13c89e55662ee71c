"""Cross-checks of the analytic counter against references it does not share code with.

1. Published multiply-add counts of reference networks at 224x224 (+/-2 %).
2. An independent counter that walks the *built* Keras model (layer classes, kernel shapes,
   real output shapes) for >= 20 random morphed architectures: conv+dense MACs, output
   shapes and parameter counts must match exactly, and the forward totals too (tolerance
   zero: every count is an integer far below 2**53, so float sums are exact).
3. XLA's own cost analysis of the forward pass, when JAX is available (see
   ``test_forward_matches_xla_cost_analysis`` for what XLA counts differently and the
   tolerance that follows from it).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aiperf.families.image.flops import count_flops
from nas import zoo
from nas.graph import Graph
from nas.morph import random_morph

pytestmark = pytest.mark.slow  # builds Keras models and lowers them with XLA

REPO = Path(__file__).resolve().parents[2]

# --- 1. published figures ------------------------------------------------------------------------------------

PUBLISHED_MULT_ADDS = {  # conv + dense multiply-adds at 224x224x3, 1000 classes
    "resnet18": 1.8e9,  # He et al. 2015, Table 1
    "resnet34": 3.6e9,
    "resnet50": 3.8e9,
    "resnet101": 7.6e9,
    "resnet152": 11.3e9,
    "vgg16": 15.5e9,  # widely cited (15.3-15.5e9)
    "vgg19": 19.6e9,  # He et al. 2015, Table 1 / Fig. 3
    "mobilenet_v1": 569e6,  # Howard et al. 2017, Table 8
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_MULT_ADDS))
def test_multiply_adds_match_the_published_figures(name):
    macs = count_flops(zoo.by_name(name)).macs
    assert macs == pytest.approx(PUBLISHED_MULT_ADDS[name], rel=0.02)


# --- 2. an independent counter on the built Keras model ------------------------------------------------------

INPUT_SHAPES = [(8, 8, 1), (10, 10, 3), (12, 12, 2), (16, 16, 3), (9, 9, 1), (14, 14, 3)]
ARCHITECTURES = 24


def random_architectures() -> list[Graph]:
    """Seeded random morph sequences (1-6 morphs of every kind) from small_resnet seeds."""
    graphs = []
    for seed in range(ARCHITECTURES):
        rng = np.random.default_rng(seed)
        shape = INPUT_SHAPES[seed % len(INPUT_SHAPES)]
        graph = zoo.small_resnet(shape, num_classes=int(rng.integers(2, 11)), width=int(rng.choice([4, 8])))
        for _ in range(int(rng.integers(1, 7))):
            result = random_morph(graph, rng, kernel_size=int(rng.choice([1, 3, 5])))
            if result is not None:
                graph = result[0]
        if seed % 3 == 0:
            graph = graph.with_attrs("dropout", rate=0.25)
        graphs.append(graph)
    return graphs


def reference_architectures() -> list[Graph]:
    """Small-input zoo nets: depthwise convs and relu6, explicit zero-padding, flatten and wide dense layers."""
    return [
        zoo.mobilenet_v1((32, 32, 3), num_classes=10, alpha=0.25),
        zoo.resnet(18, (32, 32, 3), num_classes=10),
        zoo.vgg(11, (32, 32, 3), num_classes=10),
    ]


@pytest.fixture(scope="module")
def architectures() -> list[Graph]:
    return random_architectures() + reference_architectures()


def test_the_random_sample_exercises_every_morph(architectures):
    graphs = architectures[:ARCHITECTURES]
    seeds = [zoo.small_resnet(INPUT_SHAPES[k % len(INPUT_SHAPES)]) for k in range(ARCHITECTURES)]
    assert len({g.key() for g in graphs}) == ARCHITECTURES
    assert any(g.count("concat") for g in graphs)  # concat_skip
    assert any(g.count("add") > 1 for g in graphs)  # add_skip
    assert any(g.depth > seed.depth for g, seed in zip(graphs, seeds, strict=True))  # deeper
    widths = {n.attrs["filters"] for g in graphs for n in g.nodes if n.op == "conv"}
    assert len(widths) > 4  # wider
    assert {n.attrs["kernel"] for g in graphs for n in g.nodes if n.op == "conv"} >= {(1, 1), (3, 3), (5, 5)}


# Per-element forward costs restated from docs/flops.md (not imported: a changed constant must fail here).
ACTIVATION_FORWARD = {
    "relu": 1,
    "sigmoid": 3,
    "hard_sigmoid": 4,
    "tanh": 1,
    "silu": 4,
    "swish": 4,
    "gelu": 5,
    "softmax": 5,
    "linear": 0,
}


def keras_count(model, skip: tuple[str, ...]) -> dict:
    """Count a built Keras model from its layer objects alone: classes, kernels, real output shapes."""
    import keras

    L = keras.layers
    macs, shapes = {}, {}
    forward = inference = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer) or layer.name in skip:
            continue
        out = tuple(layer.output.shape[1:])
        shapes[layer.name] = out
        size = math.prod(out)
        train_cost = infer_cost = None
        if isinstance(layer, (L.Conv2D, L.DepthwiseConv2D)):
            macs[layer.name] = out[0] * out[1] * math.prod(layer.kernel.shape)
            train_cost = 2 * macs[layer.name] + (size if layer.use_bias else 0)
        elif isinstance(layer, L.Dense):
            macs[layer.name] = math.prod(layer.kernel.shape)
            train_cost = 2 * macs[layer.name] + (size if layer.use_bias else 0)
        elif isinstance(layer, L.BatchNormalization):
            train_cost, infer_cost = 6 * size, 2 * size
        elif isinstance(layer, L.ReLU):
            train_cost = (2 if layer.max_value == 6 else 1) * size
        elif isinstance(layer, L.Activation):
            train_cost = ACTIVATION_FORWARD[layer.activation.__name__] * size
        elif isinstance(layer, L.MaxPooling2D):
            train_cost = math.prod(layer.pool_size) * size
        elif isinstance(layer, L.AveragePooling2D):
            train_cost = (math.prod(layer.pool_size) + 1) * size
        elif isinstance(layer, (L.GlobalAveragePooling2D, L.GlobalMaxPooling2D)):
            h, w, c = layer.input.shape[1:]
            train_cost = h * w * c + (c if isinstance(layer, L.GlobalAveragePooling2D) else 0)
        elif isinstance(layer, L.Add):
            train_cost = (len(layer.input) - 1) * size
        elif isinstance(layer, L.Dropout):
            train_cost, infer_cost = (3 * size if layer.rate > 0 else 0), 0
        elif isinstance(layer, (L.Concatenate, L.Flatten, L.Reshape, L.ZeroPadding2D)):
            train_cost = 0
        else:
            raise AssertionError(f"the reference counter does not know {type(layer).__name__}")
        forward += train_cost
        inference += train_cost if infer_cost is None else infer_cost
    classes = model.output.shape[-1]
    loss = 4 * classes + 3  # max, shift, exp, sum per logit; log, true logit, batch mean
    return {
        "macs": macs,
        "shapes": shapes,
        "forward": forward + loss,
        "inference": inference + loss,
        # A dropout layer's rate is a runtime hyperparameter held in a variable (one scalar), not a parameter.
        "params": model.count_params() - sum(1 for layer in model.layers if hasattr(layer, "rate_value")),
    }


def test_counts_match_an_independent_count_of_the_built_keras_model(architectures):
    pytest.importorskip("keras")
    import keras

    from aiperf.families.image.model import PIXELS_LAYER, build_model

    assert len(architectures) >= 20
    for graph in architectures:
        cost = count_flops(graph)
        model = build_model(graph, pixel_scale=1 / 255)  # with the input Rescaling layer, which is not counted
        ref = keras_count(model, skip=(PIXELS_LAYER,))
        where = f"{graph.name} {graph.key()}"
        ours_macs = {layer.label: layer.macs for layer in cost.layers if layer.op in ("conv", "dwconv", "dense")}
        assert ours_macs == ref["macs"], where
        assert {layer.label: layer.output_shape for layer in cost.layers[1:]} == ref["shapes"], where
        assert cost.params == ref["params"], where
        assert cost.forward == ref["forward"], where
        assert cost.eval_per_image == ref["inference"], where
        keras.backend.clear_session()


# --- 3. XLA's cost analysis --------------------------------------------------------------------------------

XLA_CHILD = r"""
import json, os, sys
import jax, jax.numpy as jnp
from aiperf.families.image.model import build_model
from nas.serialize import graph_from_dict


BATCH = {batch}
results = []
for doc in json.load(sys.stdin):
    graph = graph_from_dict(doc)
    model = build_model(graph)
    trainable = [v.value for v in model.trainable_variables]
    fixed = [v.value for v in model.non_trainable_variables]

    def forward(trainable, fixed, x):
        return model.stateless_call(trainable, fixed, x, training=False)[0]

    x = jnp.zeros((BATCH, *graph.input_shape), jnp.float32)
    cost = jax.jit(forward).lower(trainable, fixed, x).cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    per_image = {key: cost.get(key, 0.0) / BATCH for key in ("flops", "transcendentals")}
    results.append(per_image)
print(json.dumps(results))
"""
XLA_BATCH = 8
XLA_CHILD = XLA_CHILD.replace("{batch}", str(XLA_BATCH))
XLA_SLACK_OPS = 8  # per image; measured residuals are 0 to 6 ops on 10^4-10^8 (docs/flops.md)


def _jax_python() -> str | None:
    if importlib.util.find_spec("jax") is not None:
        return sys.executable
    candidate = os.environ.get("AIPERF_JAX_PYTHON")
    return candidate if candidate and Path(candidate).exists() else None


def _taps(size: int, kernel: int, stride: int, padding: str) -> tuple[int, int]:
    """(all taps, taps on real input) along one axis, with TensorFlow's 'same' split of the padding."""
    if padding == "same":
        out = -(-size // stride)
        before = max((out - 1) * stride + kernel - size, 0) // 2
    else:
        out, before = (size - kernel) // stride + 1, 0
    real = sum(1 for o in range(out) for k in range(kernel) if 0 <= o * stride - before + k < size)
    return out * kernel, real


def padding_products(graph: Graph) -> int:
    """Operations our convention spends on implicit zero padding (2 per MAC on a padded tap)."""
    total = 0
    for n in graph.nodes:
        if n.op not in ("conv", "dwconv"):
            continue
        h, w, c = graph.input_shape_of(n.id)
        (kh, kw), (sh, sw) = n.attrs["kernel"], n.attrs["strides"]
        per_tap = c // n.attrs["groups"] * n.attrs["filters"] if n.op == "conv" else c * n.attrs["multiplier"]
        (all_h, real_h), (all_w, real_w) = _taps(h, kh, sh, n.attrs["padding"]), _taps(w, kw, sw, n.attrs["padding"])
        total += 2 * per_tap * (all_h * all_w - real_h * real_w)
    return total


def xla_convention_offset(graph: Graph, batch: int) -> float:
    """What XLA counts differently from us on the ops the search produces, per image.

    A reduction of n values costs XLA n - 1 operations where we count n: one less per
    pooling output and per globally pooled channel. BatchNorm's inference scale and shift
    (+eps, rsqrt, * gamma, -mean * scale, + beta: 6 per channel) are recomputed on every call,
    which we leave uncounted; per image that is 6 * channels / batch.
    """
    pool_outputs = sum(math.prod(graph.shape(n.id)) for n in graph.nodes if n.op == "pool")
    pooled_channels = sum(graph.shape(n.id)[-1] for n in graph.nodes if n.op == "gpool")
    bn_channels = sum(graph.shape(n.id)[-1] for n in graph.nodes if n.op == "bn")
    return -pool_outputs - pooled_channels + 6 * bn_channels / batch


def test_forward_matches_xla_cost_analysis(architectures):
    """XLA's HLO cost analysis of the forward pass as Keras specifies it (the lowered, unoptimised module).

    XLA skips products with implicit zero padding (we count the full window, as published
    multiply-add counts do), counts reductions as n - 1 and recomputes BatchNorm's
    per-channel scale per call; ``padding_products`` and ``xla_convention_offset`` account
    for exactly those, after which the counts agree to within a few operations per image.
    The optimised module is not used: fusion duplicates elementwise work there (+0.6 % on
    ResNet-50) and folds explicit zero-padding into convolutions.
    """
    python = _jax_python()
    if python is None:
        pytest.skip(
            "jax is not installed here and AIPERF_JAX_PYTHON does not name a Python with jax and keras "
            "(pip install jax keras into one and set AIPERF_JAX_PYTHON to run this check)"
        )
    sample = architectures[:ARCHITECTURES:3] + architectures[ARCHITECTURES : ARCHITECTURES + 2]  # ~1 minute
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [python, "-c", XLA_CHILD],
        input=json.dumps([g.to_dict() for g in sample]),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(sample) >= 10
    for graph, xla in zip(sample, results, strict=True):
        cost = count_flops(graph)
        ours = cost.eval_per_image - cost.loss_forward  # the compiled model has no loss
        expected = ours - padding_products(graph) + xla_convention_offset(graph, XLA_BATCH)
        measured = xla["flops"] + xla["transcendentals"]
        assert abs(measured - expected) <= XLA_SLACK_OPS, f"{graph.name} {graph.key()}: {measured} vs {expected}"
