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

Expanding a node (its morphs, their graphs, keys and FLOPs counts) is most of the start-up
fill's cost and depends on nothing but the node: each node draws from its own generator,
seeded by the run's seed and the node's key, so the nodes ahead in the queue can be expanded
in other processes (:mod:`nas.expand_pool`) while the master hands out children, and the
children come out the same, in the same order, whatever the number of processes.

The master does not sit idle while the node it needs next is still being expanded elsewhere:
it expands the first queued node that no process has been given yet, itself, and looks again.
So the work splits by what each side can do: with one expansion process on a 2-core box the
master expanded about 60 % of the nodes at 65,536 simulated workers (it builds a child for less
than the process judges, pickles and sends one); with processes to spare it waits for none.
"""

from __future__ import annotations

import logging
import math
import pickle
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from nas.graph import Graph
from nas.limits import Limits
from nas.morph import Morph, candidate_morphs, try_morph

Accept = Callable[[Graph], bool]
Taken = Callable[[str], bool]
Ceiling = Callable[[], float]
logger = logging.getLogger(__name__)
LOOKAHEAD_PER_PROCESS = 4  # nodes queued ahead per expanding process, so none waits for the master


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


@dataclass(frozen=True)
class Expanded:
    """One child of an expanded node, with what the limits found (carried back to the master's caches)."""

    graph: Graph
    morph: Morph
    judged: bool  # whether the limits were applied where it was expanded (then the three fields below are set)
    verdict: str = ""  # Limits.reason: "" when within the limits
    flops: float | None = None
    carried: Any = None  # the FLOPs counter's own record of the count (Limits.carry)


def refused(verdict: str, flops: float | None, ceiling: float) -> bool:
    """Whether a child with this limits ``verdict`` and count is refused at ``ceiling`` (the ceiling contract)."""
    return bool(verdict) or (flops is not None and flops > ceiling)


@dataclass(frozen=True)
class Packed:
    """A child that the master would refuse as things stood when it was expanded, still pickled.

    Over the limits, or above the FLOPs ceiling (the size schedule's band) at that moment:
    about a quarter of the start-up children at 65,536 workers. The master reads its key,
    verdict and count, and unpickles the child only if the ceiling has risen past it since.
    """

    key: str
    verdict: str
    flops: float | None
    pickled: bytes  # the Expanded child

    @staticmethod
    def of(item: Expanded) -> Packed:
        return Packed(item.graph.key(), item.verdict, item.flops, pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))

    def refused(self, ceiling: float) -> bool:
        """Whether an ``accept`` that keeps the ceiling contract (see :class:`StartupChildren`) refuses it."""
        return refused(self.verdict, self.flops, ceiling)

    def unpack(self) -> Expanded:
        item = pickle.loads(self.pickled)
        if not isinstance(item, Expanded):
            raise TypeError(f"a packed child holds a {type(item).__name__}")
        return item


def node_generator(seed: int, graph: Graph) -> np.random.Generator:
    """The draws of one node's expansion: the same for the same run seed and node, in any process."""
    return np.random.default_rng([seed, int(graph.key(), 16)])


def expand(graph: Graph, kernel: int, seed: int, limits: Limits | None, skip: Taken | None = None) -> list[Expanded]:
    """Every child of ``graph`` by one morph, in the node's seeded order; morphs that do not apply are left out.

    With ``limits`` (in another process) each child is also judged; without (here), the master
    judges only the children it has not seen: about a quarter of them repeat another node's child.
    Children whose key ``skip`` answers True for are left out before they are judged.
    """
    rng = node_generator(seed, graph)
    out = []
    for morph in reversed(interleaved(candidate_morphs(graph, kernel, rng=rng), rng)):
        result = try_morph(graph, morph, None, rng)
        if result is None:
            continue
        child = result[0]
        key = child.key()  # computed here, carried in the graph
        if skip is not None and skip(key):
            continue
        if limits is None:
            out.append(Expanded(child, morph, judged=False))
        else:
            verdict = limits.reason(child)
            out.append(Expanded(child, morph, True, verdict, limits.flops(child), limits.carry(child)))
    return out


class Expansion(Protocol):
    def done(self) -> bool: ...

    def result(self) -> Sequence[Expanded | Packed]: ...


class Expander(Protocol):
    """Starts a node's expansion (here, or in another process) and gives it back on ``result()``.

    Children refused at ``ceiling`` (:meth:`Packed.refused`) may come back packed.
    """

    lookahead: int

    def start(self, graph: Graph, kernel: int, seed: int, limits: Limits, ceiling: float = math.inf) -> Expansion: ...


class _Later:
    def __init__(self, graph: Graph, kernel: int, seed: int, limits: Limits) -> None:
        self._args = (graph, kernel, seed, limits)

    def done(self) -> bool:
        return True  # its result is made when asked for, without waiting on anything

    def result(self) -> list[Expanded]:
        graph, kernel, seed, _ = self._args
        return expand(graph, kernel, seed, None)


class _Done:
    """A node the master expanded itself while the node it needed was still being expanded elsewhere."""

    def __init__(self, children: list[Expanded]) -> None:
        self._children = children

    def done(self) -> bool:
        return True

    def result(self) -> list[Expanded]:
        return self._children


class InlineExpander:
    """Expands each node in this process when its children are first wanted."""

    lookahead = 0

    def start(self, graph: Graph, kernel: int, seed: int, limits: Limits, ceiling: float = math.inf) -> Expansion:
        return _Later(graph, kernel, seed, limits)


class StartupChildren:
    """Hands out distinct children of the seed, breadth first (see the module docstring).

    ``ceiling`` (training FLOPs per image, now) is a promise about ``accept``: it refuses every
    child over the limits or counted above the ceiling. Children refused at the ceiling of the
    moment their node was sent to an expansion process come back packed (:class:`Packed`), so
    the master does not unpickle what it would drop; one the ceiling has risen past since is
    unpacked and judged as any other, so the children handed out are the same either way.
    """

    def __init__(
        self,
        seed_graph: Graph,
        seed: int,
        kernel_size: int,
        limits: Limits,
        accept: Accept,
        max_depth: int,
        expander: Expander | None = None,
        ceiling: Ceiling | None = None,
    ) -> None:
        self._seed = seed
        self._kernel = kernel_size
        self._limits = limits
        self._accept = accept
        self._max_depth = max_depth
        self._expander = expander or InlineExpander()
        self._ceiling = ceiling or (lambda: math.inf)
        # Nodes to expand, each with its morphs from the seed and its expansion once started.
        self._queue: deque[tuple[Graph, tuple[Morph, ...], Expansion | None]] = deque()
        self._started = 0  # the first ``_started`` entries of the queue have their expansion started
        self._in_expander = 0  # of those, how many the expander has (the others the master expanded itself)
        self.nodes_taken = 0  # nodes whose children have been taken, however expanded
        self.expanded_here = 0  # of those, the ones this process expanded while the expander was behind
        self._children: deque[Expanded | Packed] = deque()
        self._path: tuple[Morph, ...] = ()
        self._seen = {seed_graph.key()}
        self._enqueue(seed_graph, ())

    def _enqueue(self, graph: Graph, path: tuple[Morph, ...]) -> None:
        self._queue.append((graph, path, None))
        self._start_ahead()

    def _start_ahead(self) -> None:
        while self._in_expander < self._expander.lookahead and self._started < len(self._queue):
            graph, path, _ = self._queue[self._started]
            expansion = self._expander.start(graph, self._kernel, self._seed, self._limits, self._ceiling())
            self._queue[self._started] = (graph, path, expansion)
            self._started += 1
            self._in_expander += 1

    def _expand_next_unstarted(self) -> bool:
        """Expand here the first queued node the expander has not been given; False when there is none."""
        if self._started >= len(self._queue):
            return False
        graph, path, _ = self._queue[self._started]
        self._queue[self._started] = (graph, path, _Done(expand(graph, self._kernel, self._seed, None)))
        self._started += 1
        self.expanded_here += 1
        return True

    def expand_here(self) -> None:
        """From now on expand nodes in this process (the expander is being closed; what it started is dropped)."""
        self._expander = InlineExpander()
        self._queue = deque((graph, path, None) for graph, path, _ in self._queue)
        self._started = self._in_expander = 0

    def next(self, taken: Taken) -> tuple[Graph, tuple[Morph, ...]] | None:
        """The next child not ``taken`` and within ``accept``, with the morphs from the seed; None when none is left."""
        while True:
            if not self._children:
                if not self._queue:
                    return None
                graph, self._path, expansion = self._queue.popleft()
                self.nodes_taken += 1
                if expansion is None:  # nothing was started ahead (no expander, or the queue ran short)
                    expansion = _Later(graph, self._kernel, self._seed, self._limits)
                else:
                    self._started -= 1
                    self._in_expander -= not isinstance(expansion, _Done)
                self._start_ahead()
                try:
                    while not expansion.done() and self._expand_next_unstarted():
                        pass  # rather than wait, the master does a node the expander would do later
                    children = expansion.result()
                except Exception as exc:  # a broken pool (a process killed) must not end the run
                    why = f"{type(exc).__name__}: {str(exc)[:200]}"
                    logger.warning(f"start-up expansion processes failed ({why}); expanding here instead")
                    self.expand_here()
                    children = expand(graph, self._kernel, self._seed, None)
                self._children.extend(children)
                continue
            item = self._children.popleft()
            if isinstance(item, Packed):
                if item.key in self._seen:
                    continue
                if item.refused(self._ceiling()):
                    self._seen.add(item.key)  # as accept would refuse it, below
                    continue
                item = item.unpack()  # the ceiling has risen past it since its node was sent
            child = item.graph
            key = child.key()
            if key in self._seen:
                continue
            self._seen.add(key)
            if item.judged:
                self._limits.learn(child, item.verdict, item.flops, item.carried)
            if not self._accept(child):
                continue
            morphs = (*self._path, item.morph)
            if len(morphs) < self._max_depth:
                self._enqueue(child, morphs)
            if not taken(key):
                return child, morphs
