"""Distance between architectures: layer edit distance plus skip-connection matching.

Each graph is reduced to its *layer sequence* (the layers that define capacity and
resolution, in topological order, each described by type, width, kernel and stride) and
its *skips* (every add/concat merge, as a pair of positions in that sequence). Two graphs
are compared by

* a Levenshtein distance over the layer sequences: inserting or deleting a layer costs 1;
  substituting a layer costs 1 across types and, within a type, a weighted sum of the
  relative differences of width, kernel and stride (always below 1, so widening a layer is
  cheaper than inserting one);
* plus a minimum-cost matching of the skips (Hungarian assignment): two skips of the same
  merge type cost the normalised difference of their start and length, a skip left
  unmatched costs 1.

The Levenshtein dynamic programme runs for many pairs at once: each DP row is a vector
operation over all pairs and columns (the in-row dependency is a running minimum), so
scoring a batch of candidates against a set of landmarks is a few hundred NumPy calls.
Distinct layer descriptions are few (a search reuses a handful of widths, kernels and
strides), so each gets an id in a vocabulary with a cached substitution-cost table and the
per-pair cost tensor is one gather. Encodings are cached per ``graph.key()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import linear_sum_assignment

from nas.graph import Graph, Node

# Layer types that appear in the sequence; everything else (BN, activations, dropout,
# padding, reshapes, merges) is either attached to one of these or recorded as a skip.
LAYER_TYPES = ("conv", "dwconv", "dense", "pool:max", "pool:avg", "gpool", "flatten")
_TYPE_CODE = {name: k for k, name in enumerate(LAYER_TYPES)}
MERGE_TYPES = ("add", "concat")

# Within-type substitution weights; they sum to 0.9 so a substitution stays below an insertion.
WIDTH_WEIGHT = 0.5
KERNEL_WEIGHT = 0.25
STRIDE_WEIGHT = 0.15
# Pairs per vectorised DP chunk (bounds the (pairs, rows, cols) cost tensor's memory).
_CHUNK_PAIRS = 1024
_MAX_CODES = 50_000
_MAX_VOCABULARY = 4096  # distinct layer descriptions before the caches start over


@dataclass(frozen=True)
class ArchitectureCode:
    """The parts of a graph the distance looks at: layer ids (into a vocabulary) and skips."""

    layers: np.ndarray  # (L,) int32: vocabulary id of each layer's (type, width, kernel, stride)
    skips: np.ndarray  # (S, 3) float: start position, length, merge type

    @property
    def length(self) -> int:
        return len(self.layers)


def _layer_type(node: Node) -> str | None:
    if node.op == "pool":
        return f"pool:{node.attrs['mode']}"
    return node.op if node.op in _TYPE_CODE else None


def describe_layers(graph: Graph) -> tuple[list[tuple[int, int, int, int]], np.ndarray]:
    """The layer sequence as (type, width, kernel, stride) tuples, and the skips as an (S, 3) array."""
    layers: list[tuple[int, int, int, int]] = []
    # last_layer[node] = sequence position of the latest layer this node's value has passed through.
    last_layer: dict[int, int] = {}
    skips = []
    for node in graph.nodes:
        kind = _layer_type(node)
        if kind is not None:
            a = node.attrs
            window = a.get("kernel") or a.get("size") or (1, 1)
            stride = a.get("strides") or (1, 1)
            layers.append((_TYPE_CODE[kind], graph.shape(node.id)[-1], window[0], stride[0]))
            last_layer[node.id] = len(layers) - 1
            continue
        last_layer[node.id] = max((last_layer[i] for i in node.inputs), default=-1)
        if node.op in MERGE_TYPES:
            start = min(last_layer[i] for i in node.inputs) + 1
            skips.append((start, len(layers) - start, MERGE_TYPES.index(node.op)))
    return layers, np.asarray(skips, dtype=np.float64).reshape(-1, 3)


def _relative(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b) / np.maximum(np.maximum(a, b), 1.0)


def substitution_costs(a: ArrayLike, b: ArrayLike) -> np.ndarray:
    """Cost of substituting each layer of ``a`` (rows of type, width, kernel, stride) by each of ``b``."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    within = (
        WIDTH_WEIGHT * _relative(a[:, None, 1], b[None, :, 1])
        + KERNEL_WEIGHT * _relative(a[:, None, 2], b[None, :, 2])
        + STRIDE_WEIGHT * _relative(a[:, None, 3], b[None, :, 3])
    )
    return np.where(a[:, None, 0] == b[None, :, 0], within, 1.0)


def skip_cost_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cost of matching each skip of ``a`` with each of ``b`` (batched over leading axes), in [0, 1]."""
    start_a, len_a, type_a = (a[..., :, None, k] for k in range(3))
    start_b, len_b, type_b = (b[..., None, :, k] for k in range(3))
    gap = np.abs(start_a - start_b) + np.abs(len_a - len_b)
    scale = np.maximum(start_a, start_b) + np.maximum(len_a, len_b) + 1.0
    return np.where(type_a == type_b, gap / scale, 1.0)


def skip_distances(left: Sequence[np.ndarray], right: Sequence[np.ndarray]) -> np.ndarray:
    """Skip matching distance for each pair of skip lists, cost matrices built in one batch.

    Matching costs are at most 1 while leaving a pair unmatched costs 2, so a maximum
    matching is always optimal: the rectangular assignment plus the count difference. With
    one skip on a side that is a minimum; only larger pairs need the Hungarian algorithm.
    """
    n_left = np.array([len(s) for s in left])
    n_right = np.array([len(s) for s in right])
    out = np.abs(n_left - n_right).astype(np.float64)
    both = np.flatnonzero((n_left > 0) & (n_right > 0))
    if len(both) == 0:
        return out
    width_l, width_r = int(n_left[both].max()), int(n_right[both].max())
    pad_l = np.zeros((len(both), width_l, 3))
    pad_r = np.zeros((len(both), width_r, 3))
    for row, p in enumerate(both.tolist()):
        pad_l[row, : n_left[p]] = left[p]
        pad_r[row, : n_right[p]] = right[p]
    cost = skip_cost_matrix(pad_l, pad_r)  # (pairs, width_l, width_r)
    valid = (np.arange(width_l)[None, :, None] < n_left[both][:, None, None]) & (
        np.arange(width_r)[None, None, :] < n_right[both][:, None, None]
    )
    single = np.minimum(n_left[both], n_right[both]) == 1
    if single.any():
        out[both[single]] += np.where(valid[single], cost[single], np.inf).min(axis=(1, 2))
    for row in np.flatnonzero(~single).tolist():
        p = int(both[row])
        block = cost[row, : n_left[p], : n_right[p]]
        rows, cols = linear_sum_assignment(block)
        out[p] += block[rows, cols].sum()
    return out


class ArchitectureDistance:
    """The distance, with its caches: encodings by graph key and the layer vocabulary's cost table."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, int, int, int], int] = {}
        self._described: list[tuple[int, int, int, int]] = []
        self._table = np.zeros((0, 0))
        self._codes: dict[str, ArchitectureCode] = {}
        self._generation = 0  # how many times the caches started over

    def encode(self, graph: Graph, may_clear: bool = True) -> ArchitectureCode:
        """The graph's code; with ``may_clear`` full caches start over first (codes handed out before
        then hold ids of the old vocabulary: :meth:`encode_all` keeps one batch consistent)."""
        key = graph.key()
        code = self._codes.get(key)
        if code is None:
            if may_clear and (len(self._codes) >= _MAX_CODES or len(self._described) >= _MAX_VOCABULARY):
                self.clear()
            layers, skips = describe_layers(graph)
            ids = np.array([self._layer_id(layer) for layer in layers], dtype=np.int32)
            code = self._codes[key] = ArchitectureCode(ids, skips)
        return code

    def encode_all(self, graphs: Sequence[Graph]) -> list[ArchitectureCode]:
        """Codes of one batch, all of the same vocabulary: if the caches started over part-way (a code
        from before would index a table it is not in), the batch is encoded again without starting over."""
        generation = self._generation
        codes = [self.encode(g) for g in graphs]
        if generation != self._generation:
            codes = [self.encode(g, may_clear=False) for g in graphs]
        return codes

    def clear(self) -> None:
        """Start the caches over (codes hold vocabulary ids, so both go together)."""
        self._generation += 1
        self._ids.clear()
        self._described.clear()
        self._table = np.zeros((0, 0))
        self._codes.clear()

    def _layer_id(self, layer: tuple[int, int, int, int]) -> int:
        found = self._ids.get(layer)
        if found is None:
            found = self._ids[layer] = len(self._described)
            self._described.append(layer)
        return found

    def _costs(self) -> np.ndarray:
        """The substitution table over the vocabulary, extended for layers added since last time."""
        known, total = len(self._table), len(self._described)
        if known < total:
            table = np.empty((total, total))
            table[:known, :known] = self._table
            table[:, known:] = substitution_costs(self._described, self._described[known:])
            table[known:, :known] = table[:known, known:].T
            self._table = table
        return self._table

    def levenshtein(self, left: Sequence[ArchitectureCode], right: Sequence[ArchitectureCode]) -> np.ndarray:
        """Layer edit distance for each pair ``(left[p], right[p])``, vectorised over pairs."""
        if len(left) != len(right):
            raise ValueError("levenshtein needs two sequences of equal length (one per pair)")
        table = self._costs()
        out = np.empty(len(left))
        for start in range(0, len(left), _CHUNK_PAIRS):
            stop = start + _CHUNK_PAIRS
            out[start:stop] = _levenshtein_chunk(table, left[start:stop], right[start:stop])
        return out

    def paired(self, left: Sequence[ArchitectureCode], right: Sequence[ArchitectureCode]) -> np.ndarray:
        """Architecture distance for each pair ``(left[p], right[p])``."""
        return self.levenshtein(left, right) + skip_distances([a.skips for a in left], [b.skips for b in right])

    def cross(self, rows: Sequence[Graph], cols: Sequence[Graph]) -> np.ndarray:
        """The ``len(rows) x len(cols)`` matrix of distances between graphs, in one batch."""
        if not rows or not cols:
            return np.zeros((len(rows), len(cols)))
        codes = self.encode_all([*cols, *rows])
        col_codes, row_codes = codes[: len(cols)], codes[len(cols) :]
        left = [r for r in row_codes for _ in col_codes]
        right = col_codes * len(row_codes)
        return self.paired(left, right).reshape(len(rows), len(cols))

    def __call__(self, a: Graph, b: Graph) -> float:
        return float(self.cross([a], [b])[0, 0])


def _pad(codes: Sequence[ArchitectureCode], width: int) -> np.ndarray:
    ids = np.zeros((len(codes), width), dtype=np.int32)
    for k, c in enumerate(codes):
        ids[k, : c.length] = c.layers
    return ids


def _levenshtein_chunk(
    table: np.ndarray, left: Sequence[ArchitectureCode], right: Sequence[ArchitectureCode]
) -> np.ndarray:
    len_left = np.array([c.length for c in left])
    len_right = np.array([c.length for c in right])
    rows, cols = int(len_left.max()), int(len_right.max())
    if rows == 0 or cols == 0:
        return np.maximum(len_left, len_right).astype(np.float64)
    # Padding reads table[0, 0]; padded cells lie past each pair's own end, so they never matter.
    substitute = table[_pad(left, rows)[:, :, None], _pad(right, cols)[:, None, :]]  # (P, rows, cols)
    out = len_right.astype(np.float64)  # distance when the left sequence is empty
    offsets = np.arange(cols + 1, dtype=np.float64)
    prev = np.broadcast_to(offsets, (len(left), cols + 1)).copy()  # DP row 0
    pick = np.arange(len(left))
    step = np.empty_like(prev)
    for i in range(1, rows + 1):
        # Deleting left[i-1] or substituting it; inserting right[j-1] is the running minimum.
        step[:, 0] = i
        np.minimum(prev[:, 1:] + 1.0, prev[:, :-1] + substitute[:, i - 1, :], out=step[:, 1:])
        row = np.minimum.accumulate(step - offsets, axis=1) + offsets
        done = len_left == i
        if done.any():
            out[done] = row[pick[done], len_right[done]]
        prev = row
    return out


def architecture_distance(a: Graph, b: Graph) -> float:
    """Distance between two graphs (one-off; reuse an :class:`ArchitectureDistance` for many)."""
    return ArchitectureDistance()(a, b)
