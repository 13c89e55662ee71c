"""Random morphism search (the baseline) and the interface every architecture strategy shares.

An *architecture strategy* proposes the next child architecture: it picks a completed
architecture (an :class:`Origin`, whose trained weights the child can inherit) and a short
sequence of morphs. The composition with hyperparameter tuning, trial bookkeeping and
inheritance lives in :mod:`nas.search`; strategies only see origins, a "taken" predicate
(architectures trained or pending) and, if they model results, status updates.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nas.errors import NasError
from nas.graph import Graph
from nas.morph import Morph, random_morph

Accept = Callable[[Graph], bool]
Taken = Callable[[str], bool]


@dataclass(frozen=True)
class Origin:
    """A completed architecture children may grow from (its best trial's weights exist)."""

    key: str
    graph: Graph
    value: float  # best final validation accuracy of the architecture
    kernel_size: int  # kernel for new layers: that of its best trial's hyperparameters


class Origins(Mapping[str, Origin]):
    """Completed architectures by key, also indexable in arrival order.

    A search draws random origins on every ask; with a plain dict that means listing all of
    them (a cost that grows with the run), here it is one index. Origins are never removed;
    :meth:`put` replaces an architecture's origin when a better trial of it completes.
    """

    def __init__(self) -> None:
        self._by_key: dict[str, Origin] = {}
        self._keys: list[str] = []

    def put(self, origin: Origin) -> None:
        if origin.key not in self._by_key:
            self._keys.append(origin.key)
        self._by_key[origin.key] = origin

    def at(self, index: int) -> Origin:
        """The ``index``-th architecture to have completed (insertion order, as when iterating)."""
        return self._by_key[self._keys[index]]

    def __getitem__(self, key: str) -> Origin:
        return self._by_key[key]

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def get(self, key: str, default: Origin | None = None) -> Origin | None:  # type: ignore[override]
        return self._by_key.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)


def random_origin(origins: Mapping[str, Origin], rng: np.random.Generator) -> Origin:
    """A uniformly random origin (O(1) for :class:`Origins`, a listing for other mappings)."""
    index = int(rng.integers(len(origins)))
    if isinstance(origins, Origins):
        return origins.at(index)
    return list(origins.values())[index]


@dataclass(frozen=True)
class Child:
    """A proposed architecture: ``morphs`` applied in order to ``origin.graph`` give ``graph``."""

    origin: Origin
    graph: Graph
    morphs: tuple[Morph, ...]
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ArchitectureStatus:
    """What is known about one architecture: a final or partial accuracy, or only that it is pending.

    ``progress`` is the fraction of the planned epochs a partial result covers.
    """

    status: str
    value: float | None = None
    progress: float = 1.0

    @property
    def measured(self) -> float:
        """The accuracy of a final or partial result (a pending architecture has none)."""
        if self.value is None:
            raise NasError(f"a {self.status} architecture has no measured accuracy")
        return self.value


def grow(
    graph: Graph, rng: np.random.Generator, steps: int, kernel_size: int, accept: Accept
) -> tuple[Graph, tuple[Morph, ...]] | None:
    """Apply ``steps`` random morphs whose results all pass ``accept``; None when stuck."""
    morphs: list[Morph] = []
    for _ in range(steps):
        result = random_morph(graph, rng, kernel_size=kernel_size, accept=accept)
        if result is None:
            return None
        graph, morph = result
        morphs.append(morph)
    return graph, tuple(morphs)


class ArchitectureStrategy(ABC):
    """Proposes child architectures; told about every change in what is known."""

    name = "abstract"
    note = ""  # why the last propose returned None

    def observe(self, key: str, graph: Graph, status: ArchitectureStatus | None) -> None:  # noqa: B027
        """``status`` of the architecture ``key`` changed (None: nothing is known or pending any more)."""

    @abstractmethod
    def propose(self, origins: Mapping[str, Origin], taken: Taken) -> Child | None:
        """A child of one of ``origins`` (by architecture key) that is not ``taken``, or None."""

    def propose_batch(self, origins: Mapping[str, Origin], taken: Taken, count: int) -> list[Child]:
        """Up to ``count`` distinct children at once (a strategy that gains from batching overrides this)."""
        child = self.propose(origins, taken)
        return [] if child is None else [child]


class RandomMorphSearch(ArchitectureStrategy):
    """Uniformly random origin, then 1..``max_morphs`` random morphs (AIPerf's random baseline)."""

    name = "random"

    def __init__(
        self,
        accept: Accept,
        rng: np.random.Generator,
        max_morphs: int,
        attempts: int = 16,
        size_rank: Callable[[Graph], float] | None = None,
    ) -> None:
        self._accept = accept
        self._rng = rng
        self._max_morphs = max_morphs
        self._attempts = attempts
        self._size_rank = size_rank  # as BayesianMorphSearch's: 0 inside the size band, more below it

    def propose(self, origins: Mapping[str, Origin], taken: Taken) -> Child | None:
        """The first untaken child inside the size band; failing that, of those drawn, the nearest below it."""
        if not origins:
            return None
        fallback, fallback_rank = None, math.inf
        for _ in range(self._attempts):
            origin = random_origin(origins, self._rng)
            steps = int(self._rng.integers(1, self._max_morphs + 1))
            grown = grow(origin.graph, self._rng, steps, origin.kernel_size, self._accept)
            if grown is not None and not taken(grown[0].key()):
                child = Child(origin, grown[0], grown[1], {"strategy": self.name})
                rank = self._size_rank(grown[0]) if self._size_rank is not None else 0.0
                if rank == 0.0:
                    return child
                if rank < fallback_rank:
                    fallback, fallback_rank = child, rank
        return fallback
