"""The compiled models a worker keeps, so a trial of an architecture it already trained starts hot.

A worker's first trial of an architecture builds the Keras model and pays for tracing (and,
on JAX or with XLA, compiling) its train and predict steps in its first steps. Its
hyperparameters are runtime values (:mod:`aiperf.families.image.runtime_hparams`), so a later
trial of the same architecture -- a re-tune with the same kernel size, a re-queued trial --
takes the model from here: weights set, optimizer state restored to its freshly built
values, hyperparameters written, and the steps already compiled.

Least recently used models go first; ``capacity`` 0 keeps none (every trial builds afresh).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from nas.graph import Graph

if TYPE_CHECKING:
    from keras import Model


def compile_key(graph: Graph) -> str:
    """What must match for a compiled model to train ``graph``: everything but the dropout rates.

    That is the architecture's key, which leaves dropout rates out (``Graph.key``), so no graph
    with its rates reset is built (it cost half a millisecond a trial at 65,536 workers).
    """
    return graph.key()


@dataclass
class CompiledModel:
    """A built, compiled model and the optimizer state it had before its first step."""

    key: str
    model: Model
    optimizer_start: list[np.ndarray]
    trials: int = 0  # trials trained on it so far

    @classmethod
    def capture(cls, key: str, model: Model) -> CompiledModel:
        """Record a just-compiled model (its optimizer built, not yet stepped)."""
        return cls(key, model, [np.array(v.numpy() if hasattr(v, "numpy") else v) for v in model.optimizer.variables])

    def restart_optimizer(self) -> None:
        """Momenta, step counter and loss scale as they were before this model's first step."""
        for variable, value in zip(self.model.optimizer.variables, self.optimizer_start, strict=True):
            variable.assign(value)


class CompiledModels:
    """Least-recently-used compiled models by :func:`compile_key`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, int(capacity))
        self._models: OrderedDict[str, CompiledModel] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def take(self, key: str) -> CompiledModel | None:
        """The compiled model for ``key``, or None (counted as a hit or a miss)."""
        entry = self._models.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._models.move_to_end(key)
        self.hits += 1
        return entry

    def peek(self, key: str) -> CompiledModel | None:
        """The compiled model for ``key`` without using it (not counted, its place kept)."""
        return self._models.get(key)

    def make_room(self) -> None:
        """Drop the least recently used models until a new one fits."""
        while self._models and len(self._models) >= max(1, self.capacity):
            self._models.popitem(last=False)

    def keep(self, entry: CompiledModel) -> None:
        """Remember a newly compiled model (nothing is kept at capacity 0)."""
        if self.capacity:
            self.make_room()
            self._models[entry.key] = entry

    def clear(self) -> None:
        """Forget every kept model (a trial ran out of device memory: theirs is needed back)."""
        self._models.clear()

    def __len__(self) -> int:
        return len(self._models)

    def __contains__(self, key: object) -> bool:
        return key in self._models
