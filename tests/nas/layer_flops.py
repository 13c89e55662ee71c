"""A FLOPs counter for the search's tests that needs no deep-learning framework (``nas`` must not import one)."""

from __future__ import annotations

import math

from nas.graph import Graph


def conv_dense_train_flops(graph: Graph) -> float:
    """Training FLOPs per image of the conv and dense layers (3x forward multiply-adds x2)."""
    total = 0
    for node in graph.nodes:
        if node.op in ("conv", "dense"):
            kernel = graph.weight_shapes(node.id)[0]
            total += math.prod(kernel) * math.prod(graph.shape(node.id)[:-1])
    return 6.0 * total
