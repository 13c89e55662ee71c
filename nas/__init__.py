"""Pure search algorithms: architecture graphs, morphisms, distance, GP, Bayesian and TPE search.

Nothing here imports Ray or a deep-learning framework, so the whole package is testable in
milliseconds. The names below are the public surface (imported lazily, so ``import nas.graph``
stays cheap); everything else is an implementation detail of its module.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "architecture_distance": "nas.distance",
    "NasError": "nas.errors",
    "Graph": "nas.graph",
    "GraphBuilder": "nas.graph",
    "Node": "nas.graph",
    "make_node": "nas.graph",
    "HyperparameterSpace": "nas.hpo",
    "Limits": "nas.limits",
    "Morph": "nas.morph",
    "apply_morph": "nas.morph",
    "candidate_morphs": "nas.morph",
    "random_morph": "nas.morph",
    "try_morph": "nas.morph",
    "HPARAM_KEYS": "nas.proposer",
    "Proposer": "nas.proposer",
    "TrialProposal": "nas.proposer",
    "SearchSettings": "nas.search",
    "make_proposer": "nas.search",
    "TransformerSpec": "nas.language.spec",
    "LMMorph": "nas.language.morph",
    "transformer_flops": "nas.language.flops",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'nas' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
