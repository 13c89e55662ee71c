"""What ``aiperf flops FILE`` prints for one graph: a per-layer table and totals, or the same as JSON.

Loading the file (an architecture JSON or a saved Keras model) is the CLI's part (``aiperf.cli``);
this module only formats the counts of a graph it is given.
"""

from __future__ import annotations

import json

from aiperf.metrics.flops import aiperf_compatible_per_image, count_flops, format_table
from aiperf.metrics.score import format_ops
from nas.graph import Graph


def flops_report(graph: Graph, name: str, as_json: bool = False, batch_size: int = 128) -> str:
    """The operation counts of ``graph`` (called ``name`` in the output) as text or JSON."""
    cost = count_flops(graph)
    aiperf_eval, aiperf_train = aiperf_compatible_per_image(graph)
    if as_json:
        doc = {
            "architecture": name,
            **cost.to_dict(batch_size),
            "aiperf_compatible": {"eval_per_image": aiperf_eval, "train_per_image": aiperf_train},
        }
        return json.dumps(doc, indent=1)
    title = (
        f"{name}: {len(graph)} nodes, input {'x'.join(map(str, graph.input_shape))}, "
        f"{graph.num_classes} classes (operations per image; docs/flops.md)"
    )
    aiperf_line = (
        f"AIPerf-compatible per image: training {format_ops(aiperf_train, 'ops')}, "
        f"evaluation {format_ops(aiperf_eval, 'ops')}"
    )
    return "\n".join([title, "", format_table(cost, batch_size), aiperf_line])
