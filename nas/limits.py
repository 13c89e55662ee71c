"""Size limits every proposed architecture must respect.

The search never proposes a child over a limit: morphs are drawn with ``limits.admits`` as
their acceptance test. Training FLOPs are counted by the engine, which injects its counter
as ``flops_fn`` (the search package must not depend on the engine); without one the FLOPs
limit is not checked. A counter that other processes use too (the start-up expansion pool)
may offer ``carry(graph)`` and ``adopt(graph, carried)``, so a count made there is not
made again here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nas.errors import NasError
from nas.graph import Graph

FlopsFn = Callable[[Graph], float]
_CACHE_ENTRIES = 100_000


@dataclass(frozen=True)
class Limits:
    """Upper bounds on weighted layers (``graph.depth``), parameters and training FLOPs per image."""

    max_layers: int
    max_params: int
    max_flops_per_image: float
    flops_fn: FlopsFn | None = None
    _verdicts: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)
    _flops: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("max_layers", "max_params"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise NasError(f"limits: {name} must be a positive integer, got {value!r}")
        flops = self.max_flops_per_image
        if isinstance(flops, bool) or not isinstance(flops, (int, float)) or not math.isfinite(flops) or flops <= 0:
            raise NasError(f"limits: max_flops_per_image must be a positive number, got {flops!r}")
        if self.flops_fn is not None and not callable(self.flops_fn):
            raise NasError("limits: flops_fn must be callable (graph -> training FLOPs per image)")

    def __reduce__(self) -> tuple[Any, ...]:
        """Another process gets the bounds and the counter, not this process's caches."""
        return (Limits, (self.max_layers, self.max_params, self.max_flops_per_image, self.flops_fn))

    def reason(self, graph: Graph) -> str:
        """Why ``graph`` is over a limit, or ``""`` when it is within all of them (cached by key)."""
        key = graph.key()
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._judge(graph)
            if len(self._verdicts) >= _CACHE_ENTRIES:
                self._verdicts.clear()
            self._verdicts[key] = verdict
        return verdict

    def flops(self, graph: Graph) -> float | None:
        """Training FLOPs per image by ``flops_fn`` (cached by key); None without a counter."""
        if self.flops_fn is None:
            return None
        key = graph.key()
        value = self._flops.get(key)
        if value is None:
            value = float(self.flops_fn(graph))
            if len(self._flops) >= _CACHE_ENTRIES:
                self._flops.clear()
            self._flops[key] = value
        return value

    def admits(self, graph: Graph) -> bool:
        return not self.reason(graph)

    def carry(self, graph: Graph) -> Any:
        """What ``flops_fn`` kept of ``graph``'s count, for another process's :meth:`learn` (None if nothing)."""
        keep = getattr(self.flops_fn, "carry", None)
        return keep(graph) if keep is not None else None

    def learn(self, graph: Graph, verdict: str, flops: float | None, carried: Any = None) -> None:
        """Take the verdict and count another process made of ``graph`` (the same limits there), as if made here."""
        key = graph.key()
        if len(self._verdicts) >= _CACHE_ENTRIES:
            self._verdicts.clear()
        self._verdicts[key] = verdict
        if flops is not None:
            if len(self._flops) >= _CACHE_ENTRIES:
                self._flops.clear()
            self._flops[key] = flops
        adopt = getattr(self.flops_fn, "adopt", None)
        if carried is not None and adopt is not None:
            adopt(graph, carried)

    def structure_reason(self, graph: Graph) -> str:
        """The cheap part of :meth:`reason` (layers and parameters, no FLOPs count)."""
        if graph.depth > self.max_layers:
            return f"{graph.depth} weighted layers exceed max_layers={self.max_layers}"
        if graph.param_count > self.max_params:
            return f"{graph.param_count} parameters exceed max_params={self.max_params}"
        return ""

    def admits_structure(self, graph: Graph) -> bool:
        """A necessary condition for :meth:`admits`, cheap enough to test on every tree-search node."""
        return not self.structure_reason(graph)

    def _judge(self, graph: Graph) -> str:
        structure = self.structure_reason(graph)
        if structure:
            return structure
        flops = self.flops(graph)
        if flops is not None and not flops <= self.max_flops_per_image:
            return f"{flops:.4g} training FLOPs per image exceed max_flops_per_image={self.max_flops_per_image:.4g}"
        return ""
