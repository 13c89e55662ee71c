"""``aiperf flops FILE``: the operation counts of one architecture file or saved Keras model."""

from __future__ import annotations

import json
from pathlib import Path

from aiperf.errors import AiperfError
from aiperf.metrics.flops import aiperf_compatible_per_image, count_flops, format_table
from aiperf.metrics.score import format_ops
from nas.errors import NasError
from nas.graph import Graph

KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")


def load_graph(path: str) -> Graph:
    """An architecture JSON (``nas.serialize``) or a saved Keras model, as a graph."""
    try:
        if Path(path).suffix.lower() in KERAS_SUFFIXES:
            from aiperf.training.keras_import import graph_from_keras_file

            return graph_from_keras_file(path)
        from nas.serialize import load

        return load(path)
    except NasError as exc:
        raise AiperfError(str(exc)) from None


def flops_command(path: str, as_json: bool = False, batch_size: int = 128) -> str:
    """The text ``aiperf flops`` prints: a per-layer table and totals, or the same as JSON."""
    graph = load_graph(path)
    cost = count_flops(graph)
    aiperf_eval, aiperf_train = aiperf_compatible_per_image(graph)
    if as_json:
        doc = {
            "architecture": graph.name or Path(path).stem,
            **cost.to_dict(batch_size),
            "aiperf_compatible": {"eval_per_image": aiperf_eval, "train_per_image": aiperf_train},
        }
        return json.dumps(doc, indent=1)
    title = (
        f"{graph.name or Path(path).stem}: {len(graph)} nodes, input {'x'.join(map(str, graph.input_shape))}, "
        f"{graph.num_classes} classes (operations per image; docs/flops.md)"
    )
    aiperf_line = (
        f"AIPerf-compatible per image: training {format_ops(aiperf_train, 'ops')}, "
        f"evaluation {format_ops(aiperf_eval, 'ops')}"
    )
    return "\n".join([title, "", format_table(cost, batch_size), aiperf_line])
