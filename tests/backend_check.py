"""Check ``aiperf.families.image.model`` on one Keras backend; run in a subprocess with ``KERAS_BACKEND`` set.

Keras fixes its backend when it is first imported, so each backend needs its own process:

    KERAS_BACKEND=jax python tests/backend_check.py --graphs 4

Checks, each against the NumPy reference ``nas.forward`` (inference mode): a graph using
every op and activation, and randomly morphed small residual nets, built with random
weights; that inherited weights keep a morphed child's function; that weights round-trip
through the model; and that a short ``fit`` runs and changes the weights. Prints one JSON
line. Exit codes: 0 all passed, 1 a check failed (the JSON says which), 77 the backend's
package is not importable (the caller skips).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nas.graph import ACTIVATIONS, Graph, GraphBuilder
from nas.morph import apply_morph, random_morph
from nas.zoo import small_resnet

SKIP = 77
TOLERANCE = 1e-4
BACKEND_PACKAGES = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}


def every_op_graph(num_classes: int = 5) -> Graph:
    """A small graph that uses every op, both paddings, both pool modes and every activation."""
    b = GraphBuilder((9, 9, 4))
    x = b.add("zeropad", b.input, pad=(1, 0, 0, 1))  # 10x10, asymmetric
    x = b.add("conv", x, filters=8, kernel=3, strides=2, padding="same", groups=2)  # 5x5, grouped
    x = b.add("bn", x, epsilon=1e-3)
    branches = []
    for fn in ACTIVATIONS:
        if fn == "softmax":
            continue
        branches.append(b.add("act", x, fn=fn))
    x = b.add("add", *branches)
    x = b.add("act", x, fn="softmax")
    d = b.add("dwconv", x, kernel=3, strides=1, padding="valid", multiplier=2)  # 3x3x16
    d = b.add("zeropad", d, pad=1)  # 5x5x16
    m = b.add("pool", x, mode="max", size=3, strides=1, padding="same")  # 5x5x8
    a = b.add("pool", x, mode="avg", size=2, strides=2, padding="same")  # 3x3x8
    a = b.add("conv", a, filters=8, kernel=1, padding="valid", use_bias=False)
    a = b.add("reshape", b.add("flatten", a), shape=(3, 3, 8))
    a = b.add("pool", a, mode="avg", size=3, strides=1, padding="same")
    a = b.add("gpool", a, mode="max", keepdims=True)  # 1x1x8
    x = b.add("concat", d, m)  # 5x5x24
    x = b.add("pool", x, mode="max", size=2, padding="valid")  # 2x2x24
    x = b.add("dwconv", x, kernel=2, padding="valid", use_bias=False)  # 1x1x24
    x = b.add("concat", x, a)  # 1x1x32
    x = b.add("flatten", x)
    x = b.add("dropout", b.add("dense", x, units=12), rate=0.25)
    x = b.add("act", x, fn="gelu")
    b.add("dense", x, units=num_classes)
    return b.build("every_op")


def morphed_graphs(count: int, seed: int) -> list[tuple[Graph, Graph, list]]:
    """(parent, child, morphs) triples: small residual nets grown by 1-4 random morphs."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        parent = small_resnet((8, 8, 3), num_classes=4, width=4)
        child, morphs = parent, []
        for _ in range(int(rng.integers(1, 5))):
            step = random_morph(child, rng, kernel_size=int(rng.choice([1, 3, 5])))
            if step is None:
                break
            child, morph = step
            morphs.append(morph)
        out.append((parent, child, morphs))
    return out


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / max(1e-6, float(np.max(np.abs(want)))))


def run_checks(graphs: int, seed: int) -> dict:
    import keras

    from aiperf.families.image.model import build_model, get_weights, set_weights
    from nas.forward import forward, init_weights

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    report: dict = {"backend": keras.backend.backend(), "errors": {}, "failures": []}

    def compare(name: str, graph: Graph, weights: dict, x: np.ndarray, want: np.ndarray | None = None) -> None:
        model = build_model(graph)
        set_weights(model, graph, weights)
        got = np.asarray(keras.ops.convert_to_numpy(model(x, training=False)), dtype=np.float64)
        want = forward(graph, weights, x) if want is None else want
        err = relative_error(got, want)
        report["errors"][name] = err
        if not err <= TOLERANCE:
            report["failures"].append(f"{name}: relative error {err:.2e} > {TOLERANCE}")

    g = every_op_graph()
    compare("every_op", g, init_weights(g, rng), rng.normal(size=(3, *g.input_shape)).astype(np.float32))
    for k, (parent, child, morphs) in enumerate(morphed_graphs(graphs, seed)):
        x = rng.normal(size=(2, *parent.input_shape)).astype(np.float32)
        compare(f"morphed{k}", child, init_weights(child, rng), x)
        weights = init_weights(parent, rng)
        want = forward(parent, weights, x)
        for morph in morphs:
            parent, weights = apply_morph(parent, morph, weights, rng)
        compare(f"inherited{k}", parent, weights, x, want)

    g = small_resnet((8, 8, 3), num_classes=4, width=4)
    model = build_model(g)
    weights = init_weights(g, rng)
    set_weights(model, g, weights)
    back = get_weights(model, g)
    if back.keys() != weights.keys() or any(
        not all(np.array_equal(a, b) for a, b in zip(back[k], weights[k], strict=True)) for k in weights
    ):
        report["failures"].append("weights did not round-trip through set_weights/get_weights")

    model.compile(
        optimizer=keras.optimizers.SGD(0.05), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    xs = rng.normal(size=(16, 8, 8, 3)).astype(np.float32)
    ys = rng.integers(0, 4, 16)
    history = model.fit(xs, ys, batch_size=8, epochs=2, verbose=0)
    losses = [float(v) for v in history.history["loss"]]
    report["fit_losses"] = losses
    if len(losses) != 2 or not all(np.isfinite(losses)):
        report["failures"].append(f"fit gave losses {losses}")
    trained = get_weights(model, g)
    if all(np.array_equal(trained[k][0], weights[k][0]) for k in weights):
        report["failures"].append("fit did not change any weight")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=4, help="randomly morphed graphs to check")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    package = BACKEND_PACKAGES.get(backend)
    if package is None or importlib.util.find_spec(package) is None:
        print(json.dumps({"backend": backend, "skipped": f"package {package or backend!r} is not importable"}))
        return SKIP
    report = run_checks(args.graphs, args.seed)
    print(json.dumps(report))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
