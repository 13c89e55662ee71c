"""The steady state's tree-search expansions, in this process or in the expansion processes.

Each ask of the Bayesian search expands a tree of morph children from good origins and scores
every new child by the GP (:meth:`nas.bayesian.BayesianMorphSearch._tree_search`). Building a
child, its key, its FLOPs count and its landmark embedding (distances to 32 landmark graphs)
cost about 1.1 ms a child on one core, and an ask at 4,096 workers builds about 190 of them:
most of the master's steady-state time (benchmarks/RESULTS.md, "Steady-state expansions in
processes"). They depend only on the node, so they can be made elsewhere.

So a node's untried morphs are not drawn from the search's generator one at a time: the node
lists them once in an order seeded by the search's seed and the node (:func:`morph_order`),
and the search keeps only how far down that list it has tried (``tried``). "The next
``wanted`` children of this node from ``tried`` on" (:class:`GrowTask`) is then a pure
function of the task (:func:`grow`), answered the same here or in any process: the proposals
are the same whatever the number of processes, as the start-up's are (:mod:`nas.startup`).
An expansion process also judges each child by the limits, counts its FLOPs and embeds it; the
master only files what comes back (:class:`Grown`) in its caches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from nas.graph import Graph
from nas.limits import Limits
from nas.morph import Morph, candidate_morphs, try_morph
from nas.startup import interleaved

logger = logging.getLogger(__name__)
Accept = Callable[[Graph], bool]
Embed = Callable[[Sequence[Graph]], np.ndarray]
MAX_ORDERS = 4096  # nodes whose morph order a process keeps (a start node is expanded over many asks)


class GrowTask(NamedTuple):
    """The next ``wanted`` children of ``graph`` within the cheap limits, trying its morphs from ``tried`` on."""

    graph: Graph
    kernel: int
    seed: int
    tried: int
    wanted: int


@dataclass(frozen=True)
class Grown:
    """One child, with what the process that built it found (None where it was built in the master)."""

    graph: Graph
    morph: Morph
    verdict: str | None = None  # Limits.reason
    flops: float | None = None
    carried: Any = None  # the FLOPs counter's record of the count (Limits.carry)
    row: np.ndarray | None = None  # its landmark embedding


@dataclass(frozen=True)
class Growth:
    """A task's children, and how far down the node's morphs it went: ``tried`` of ``total``."""

    children: list[Grown]
    tried: int
    total: int


def morph_order(graph: Graph, kernel: int, seed: int) -> list[Morph]:
    """``graph``'s morphs in the order its expansions try them: the same for the same seed and node, anywhere."""
    rng = np.random.default_rng([seed, int(graph.key(), 16), kernel])
    return interleaved(candidate_morphs(graph, kernel, rng=rng), rng)


def grow(
    task: GrowTask,
    accept_cheap: Accept,
    orders: dict[tuple[str, int, int], list[Morph]],
    limits: Limits | None = None,
    embed: Embed | None = None,
) -> Growth:
    """The task's children (see the module docstring); ``orders`` caches morph orders between tasks.

    With ``limits`` and ``embed`` (in an expansion process) each child is also judged, counted
    and embedded.
    """
    slot = (task.graph.key(), task.kernel, task.seed)
    order = orders.get(slot)
    if order is None:
        if len(orders) >= MAX_ORDERS:
            orders.clear()
        order = orders[slot] = morph_order(task.graph, task.kernel, task.seed)
    built: list[tuple[Graph, Morph]] = []
    tried = task.tried
    while len(built) < task.wanted and tried < len(order):
        morph = order[tried]
        tried += 1
        result = try_morph(task.graph, morph, None, 0)  # without weights the draws change nothing
        if result is not None and accept_cheap(result[0]):
            result[0].key()  # computed where it is built, carried in the graph
            built.append((result[0], morph))
    if limits is None or embed is None or not built:
        return Growth([Grown(child, morph) for child, morph in built], tried, len(order))
    rows = embed([child for child, _ in built])
    children = [
        Grown(child, morph, limits.reason(child), limits.flops(child), limits.carry(child), row)
        for (child, morph), row in zip(built, rows, strict=True)
    ]
    return Growth(children, tried, len(order))


def share_nodes(child: Graph, parent: Graph) -> None:
    """The layers ``child`` left as they were become ``parent``'s own node objects.

    A child built here shares them (a morph changes one to three layers); one that came
    pickled from a process has copies, and the trials keep their graphs for the whole run:
    at 65,536 simulated workers the copies took 2 GB more of the master's memory.
    """
    mine = {n.id: n for n in parent.nodes}
    child.nodes = tuple(n if mine.get(n.id) != n else mine[n.id] for n in child.nodes)


class Grower(Protocol):
    """Answers a round's tasks, in task order (here, or in the expansion processes)."""

    def grow(self, tasks: Sequence[GrowTask]) -> list[Growth]: ...


class InlineGrower:
    """Every task answered in this process; the master then judges and embeds the children it keeps."""

    def __init__(self, accept_cheap: Accept) -> None:
        self._accept_cheap = accept_cheap
        self._orders: dict[tuple[str, int, int], list[Morph]] = {}

    def grow(self, tasks: Sequence[GrowTask]) -> list[Growth]:
        return [grow(task, self._accept_cheap, self._orders) for task in tasks]


class PoolGrower:
    """A round's tasks spread over the expansion processes; if they fail, this process answers the same.

    ``pool`` is a :class:`nas.expand_pool.ExpandPool` started with the search's landmarks. The
    cheap test there is ``limits.admits_structure``, so the search must use that one. What a
    process found of each child (verdict, count) goes into ``limits``' caches here.
    """

    def __init__(self, pool: Any, limits: Limits) -> None:
        self._pool = pool
        self._limits = limits
        self._inline = InlineGrower(limits.admits_structure)

    @property
    def active(self) -> bool:
        return self._pool is not None

    def grow(self, tasks: Sequence[GrowTask]) -> list[Growth]:
        """The round's tasks: a share answered here while the processes answer the rest.

        The master would otherwise wait idle for the round (rounds depend on each other's
        scores, so they cannot overlap); with ``P`` processes it takes one task in ``P + 1``.
        """
        if self._pool is not None and len(tasks) > 1:
            here = len(tasks) // (self._pool.processes + 1)
            try:
                pending = [self._pool.grow(task) for task in tasks[here:]]
                mine = self._inline.grow(tasks[:here])
                growths = [p.result() for p in pending]
            except Exception as exc:  # a broken pool (a process killed) must not end the run
                why = f"{type(exc).__name__}: {str(exc)[:200]}"
                logger.warning(f"tree-search expansion processes failed ({why}); expanding in the master instead")
                self.close()
            else:
                for task, growth in zip(tasks[here:], growths, strict=True):
                    for child in growth.children:
                        share_nodes(child.graph, task.graph)
                        if child.verdict is not None:
                            self._limits.learn(child.graph, child.verdict, child.flops, child.carried)
                return mine + growths
        return self._inline.grow(tasks)

    def close(self) -> None:
        """Stop the processes; later rounds are answered here (the same children)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
