"""Before the first trial: does every node that will train see the streamed dataset?

The head loaded the dataset and counted its files (``dataset.meta["census"]``); a small task
pinned to each node counts them again where the workers will read them. A node that cannot
see the folder, or sees a different number or set of files (a stale copy, a missing mount),
is named in a one-line error before any worker starts. Nodes that join later are checked by
their workers when they start (:func:`aiperf.datasets.census.check_readable`).
"""

from __future__ import annotations

from collections.abc import Mapping

from aiperf.cluster.resources import NodeInfo
from aiperf.datasets.census import census_on_this_node
from aiperf.errors import AiperfError

CENSUS_TIMEOUT_S = 600.0  # listing 1.3 million files on a parallel file system takes a while


def _label(node: NodeInfo) -> str:
    return node.hostname or node.node_id[:12]


def _problem(node: NodeInfo, got: Mapping[str, object], expected: Mapping[str, object], path: str) -> str | None:
    if "error" in got:
        return f"node {_label(node)} does not see the dataset: {got['error']}"
    if got.get("files") != expected.get("files"):
        return f"node {_label(node)} sees {got.get('files', 0):,} files in {path}, the head saw {expected['files']:,}"
    if got.get("digest") != expected.get("digest"):
        return f"node {_label(node)} sees {got['files']:,} files in {path}, but not the same ones as the head"
    return None


def check_nodes_see_dataset(
    nodes: list[NodeInfo], name: str, path: str, expected: Mapping[str, object], timeout_s: float = CENSUS_TIMEOUT_S
) -> None:
    """Raise a one-line :class:`AiperfError` naming the first node that does not see what the head saw."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0)(census_on_this_node)
    refs = [
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)).remote(name, path)
        for n in nodes
    ]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    problems = []
    for node, ref in zip(nodes, refs, strict=True):
        if ref not in ready:
            problems.append(f"node {_label(node)} did not finish counting the dataset's files in {timeout_s:.0f} s")
            continue
        try:
            got = ray.get(ref)
        except Exception as exc:
            problems.append(f"node {_label(node)} could not count the dataset's files ({type(exc).__name__})")
            continue
        problem = _problem(node, got, expected, path)
        if problem:
            problems.append(problem)
    if problems:
        more = f" ({len(problems) - 1} more node(s) likewise)" if len(problems) > 1 else ""
        raise AiperfError(f"{problems[0]}{more}; every node must see the same dataset at the same path")
