"""Start-up children: distinct architectures near the seed for the first wave of trials.

Until a trial completes nothing can be inherited, so the first wave on ``W`` workers is about
``W`` new architectures trained from scratch. Drawing each by a random walk from the seed and
retrying when the walk lands on an architecture already taken costs more graph builds per
child the fuller the neighbourhood gets: at 4,096 simulated workers a start-up child cost
46 ms (about 90 graphs built), and filling the cluster took 127 s (benchmarks/RESULTS.md,
"Thousands of nodes").

Here the seed's morph tree is walked breadth first in a seeded random order instead: each
node's applicable morphs are listed once, each child is built once, and every child that
passes the limits and is not taken is handed out, then expanded in turn (up to ``max_depth``
morphs from the seed). So the first wave covers the one-morph neighbourhood, then two morphs,
and so on, at about one graph build per child however large the wave. A child over the
limits is not expanded: growth morphs only add layers, parameters and work.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from nas.graph import Graph
from nas.morph import Morph, candidate_morphs, try_morph

Accept = Callable[[Graph], bool]
Taken = Callable[[str], bool]


def interleaved(morphs: list[Morph], rng: np.random.Generator) -> list[Morph]:
    """``morphs`` shuffled so that each kind is spread evenly over the list.

    A node has many more skip connections than deeper or wider options; a plain shuffle would
    let the skips crowd the first children (random_morph picks the kind first for the same reason).
    """
    by_kind: dict[str, list[Morph]] = {}
    for m in morphs:
        by_kind.setdefault(m.kind, []).append(m)
    ranked = []
    for options in by_kind.values():
        order = rng.permutation(len(options))
        jitter = rng.random(len(options))
        for position, (index, noise) in enumerate(zip(order, jitter, strict=True)):
            ranked.append(((position + noise) / len(options), options[int(index)]))
    ranked.sort(key=lambda item: item[0])
    return [m for _, m in ranked]


class StartupChildren:
    """Hands out distinct children of the seed, breadth first (see the module docstring)."""

    def __init__(
        self, seed_graph: Graph, rng: np.random.Generator, kernel_size: int, accept: Accept, max_depth: int
    ) -> None:
        self._rng = rng
        self._kernel = kernel_size
        self._accept = accept
        self._max_depth = max_depth
        self._queue: deque[tuple[Graph, tuple[Morph, ...]]] = deque([(seed_graph, ())])
        self._node: tuple[Graph, tuple[Morph, ...]] | None = None
        self._options: list[Morph] = []
        self._seen = {seed_graph.key()}

    def next(self, taken: Taken) -> tuple[Graph, tuple[Morph, ...]] | None:
        """The next child not ``taken`` and within ``accept``, with the morphs from the seed; None when none is left."""
        while True:
            if not self._options:
                if not self._queue:
                    return None
                self._node = self._queue.popleft()
                self._options = interleaved(candidate_morphs(self._node[0], self._kernel, rng=self._rng), self._rng)
                continue
            assert self._node is not None
            graph, path = self._node
            morph = self._options.pop()
            result = try_morph(graph, morph, None, self._rng)
            if result is None:
                continue
            child = result[0]
            key = child.key()
            if key in self._seen:
                continue
            self._seen.add(key)
            if not self._accept(child):
                continue
            morphs = (*path, morph)
            if len(morphs) < self._max_depth:
                self._queue.append((child, morphs))
            if not taken(key):
                return child, morphs
