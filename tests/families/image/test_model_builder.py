"""Graph -> Keras model: equal to the NumPy reference on every backend, weights in and out, hyperparameters.

The in-process checks use the backend Keras was imported with (TensorFlow unless
``KERAS_BACKEND`` says otherwise); every other backend runs ``tests/backend_check.py`` in a
subprocess, since Keras fixes its backend at import. A backend whose package is not
importable is skipped with the reason. ``AIPERF_BACKEND_PYTHON`` may name another
interpreter (e.g. a virtualenv with JAX and torch) for those subprocesses.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import backend_check  # noqa: E402 - tests/ is on sys.path under pytest
from helpers import REPO, backend_subprocess  # noqa: E402

from aiperf.errors import AiperfError  # noqa: E402
from aiperf.families.image.model import build_model, get_weights, set_weights  # noqa: E402
from aiperf.training.trial import apply_hparams  # noqa: E402
from nas import zoo  # noqa: E402
from nas.forward import forward, init_weights  # noqa: E402
from nas.morph import Morph, apply_morph  # noqa: E402

pytestmark = pytest.mark.slow  # builds and trains models on every backend

BACKENDS = ("tensorflow", "jax", "torch")
GRAPHS_PER_BACKEND = {"tensorflow": 3, "jax": 1, "torch": 2}  # JAX compiles every initializer shape: slow


def test_current_backend_matches_the_reference_and_trains():
    report = backend_check.run_checks(graphs=4, seed=1)
    assert report["failures"] == []
    assert {"every_op", "morphed0", "inherited0"} <= set(report["errors"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_in_a_subprocess(backend):
    if backend == keras.backend.backend():
        pytest.skip(f"{backend} is this process's backend (checked in-process)")
    python, env = backend_subprocess(backend)
    proc = subprocess.run(
        [python, str(REPO / "tests" / "backend_check.py"), "--graphs", str(GRAPHS_PER_BACKEND[backend])],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == backend_check.SKIP:
        pytest.skip(f"{backend}: {json.loads(lines[-1])['skipped']}")
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(lines[-1])
    assert report["backend"] == backend and report["failures"] == []


def small_graph():
    return zoo.small_resnet((8, 8, 3), num_classes=4, width=4, dropout=0.1)


def test_dropout_hyperparameter_reaches_every_dropout_layer():
    model = build_model(apply_hparams(small_graph(), {"dropout": 0.3}))
    rates = [layer.rate for layer in model.layers if isinstance(layer, keras.layers.Dropout)]
    assert rates == [0.3]
    assert [layer.rate for layer in build_model(small_graph()).layers if isinstance(layer, keras.layers.Dropout)] == [
        0.1
    ]


def test_deeper_kernel_size_reaches_the_built_convolution():
    g = small_graph()
    child, _ = apply_morph(g, Morph("deeper", 3, size=5))
    new_conv = next(n for n in child.nodes if n.id >= g.next_id and n.op == "conv")
    layer = build_model(child).get_layer(new_conv.label)
    assert isinstance(layer, keras.layers.Conv2D) and tuple(layer.kernel_size) == (5, 5)


def test_weights_round_trip_and_shapes_are_checked():
    g = small_graph()
    model = build_model(g)
    weights = init_weights(g, 0)
    assert set_weights(model, g, weights) == len(weights)
    back = get_weights(model, g)
    assert all(np.array_equal(a, b) for k in weights for a, b in zip(back[k], weights[k], strict=True))
    with pytest.raises((ValueError, AiperfError), match="n1_conv: weight shapes"):
        set_weights(model, g, {1: [np.zeros((1, 1, 3, 4), np.float32)]})


def test_pixel_scaling_is_applied_before_the_graph():
    g = small_graph()
    weights = init_weights(g, 0)
    model = build_model(g, pixel_scale=1 / 255)
    set_weights(model, g, weights)
    pixels = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3)).astype(np.float32)
    got = keras.ops.convert_to_numpy(model(pixels, training=False))
    np.testing.assert_allclose(got, forward(g, weights, pixels / 255), rtol=1e-4, atol=1e-5)


def test_mixed_precision_still_outputs_float32_logits():
    model = build_model(small_graph(), dtype_policy="mixed_bfloat16")
    out = model(np.zeros((1, 8, 8, 3), np.float32), training=False)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    assert model.get_layer("n1_conv").compute_dtype == "bfloat16"
