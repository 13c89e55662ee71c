"""What crosses the process boundary between the master and a worker for one trial.

A :class:`TrialSpec` carries everything a worker needs to train a trial reproducibly on
any node: the architecture, its hyperparameters, and — for weight inheritance — the
parent's architecture and the morph list, so the worker itself turns the parent's trained
weights into the child's (the master never spends CPU on weight surgery).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import numpy as np

from nas.errors import NasError
from nas.graph import Graph
from nas.morph import Morph, apply_morph
from nas.serialize import graph_from_dict

Weights = dict[int, list[np.ndarray]]


class TrialSpecDict(TypedDict):
    """A :class:`TrialSpec` as it crosses to a worker (:meth:`TrialSpec.to_dict`): its fields by name."""

    trial_id: str
    kind: str
    graph: dict[str, Any]
    hparams: dict[str, float]
    seed: int
    parent_graph: NotRequired[dict[str, Any] | None]
    morphs: NotRequired[list[dict[str, Any]]]
    attempt: NotRequired[int]
    start_epoch: NotRequired[int]
    checkpoint_every_epoch: NotRequired[bool]
    steps_per_epoch: NotRequired[int | None]


@dataclass
class TrialSpec:
    """One trial as the worker sees it; plain data with one (dict) serialisation."""

    trial_id: str
    kind: str
    graph: dict[str, Any]  # the family's architecture document (nas.serialize.graph_to_dict, TransformerSpec.to_dict)
    hparams: dict[str, float]  # nas.defaults.Hparams: learning_rate, batch_size, ... (ints are whole numbers)
    seed: int
    parent_graph: dict[str, Any] | None = None  # set when weights are inherited
    morphs: list[dict[str, Any]] = field(default_factory=list)  # nas.morph.Morph.to_dict() each
    attempt: int = 0
    start_epoch: int = 0  # epochs already completed (re-queued trial resuming from a checkpoint)
    checkpoint_every_epoch: bool = True
    # The steps its epochs were trained with, for a later attempt continuing from a checkpoint: a trial
    # whose worker sized its epochs (lm.steps_per_epoch auto) keeps them on any worker. None: the worker's.
    steps_per_epoch: int | None = None

    @property
    def epochs(self) -> int:
        return int(self.hparams["epochs"])

    def to_dict(self) -> TrialSpecDict:
        """The fields as they are, not deep-copied: the master builds every spec afresh, and
        ``dataclasses.asdict``'s recursive copy of the graphs was a noticeable share of its time with
        thousands of workers (benchmarks/RESULTS.md). Every field, in the order they are declared."""
        return {
            "trial_id": self.trial_id,
            "kind": self.kind,
            "graph": self.graph,
            "hparams": self.hparams,
            "seed": self.seed,
            "parent_graph": self.parent_graph,
            "morphs": self.morphs,
            "attempt": self.attempt,
            "start_epoch": self.start_epoch,
            "checkpoint_every_epoch": self.checkpoint_every_epoch,
            "steps_per_epoch": self.steps_per_epoch,
        }

    @classmethod
    def from_dict(cls, data: TrialSpecDict) -> TrialSpec:
        return cls(**data)

    def architecture(self) -> Graph:
        return graph_from_dict(self.graph)


def apply_hparams(graph: Graph, hparams: Mapping[str, float]) -> Graph:
    """The graph as it must be built for these hyperparameters (the dropout rate on every dropout).

    Lives beside the trial spec, not the model builder, so the master can compute the
    architecture a worker will build (and count its FLOPs) without importing Keras code.
    """
    if "dropout" in hparams:
        return graph.with_dropout(float(hparams["dropout"]))
    return graph


def inherit_weights(spec: TrialSpec, parent_weights: Weights) -> Weights:
    """Replay the spec's morphs on the parent's trained weights, giving function-preserving child weights.

    The replay is seeded by the trial seed so every retry of the trial starts identically.
    Raises NasError if the replayed architecture is not the spec's (a corrupted lineage).
    """
    if spec.parent_graph is None:
        raise NasError(f"trial {spec.trial_id}: inherits weights but carries no parent architecture")
    graph = graph_from_dict(spec.parent_graph)
    weights: Weights = parent_weights
    rng = np.random.default_rng(spec.seed)
    for raw in spec.morphs:
        graph, weights = apply_morph(graph, Morph.from_dict(raw), weights, rng)
    target = spec.architecture()
    if graph.key() != target.key() or [n.id for n in graph.nodes] != [n.id for n in target.nodes]:
        raise NasError(f"trial {spec.trial_id}: replaying the lineage does not give the proposed architecture")
    return weights
