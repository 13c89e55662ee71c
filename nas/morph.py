"""Function-preserving network morphisms with weight inheritance.

Four operators grow an architecture; each returns a child graph and, when the parent's
weights are given, child weights under which the child computes the parent's function
(BatchNorm in inference mode):

* ``deeper``  inserts conv(k x k)+BN+ReLU (or dense+ReLU on vectors) after a node whose
  output is non-negative, initialised to the identity (ReLU is the identity there).
* ``wider``   widens a conv or dense layer (Net2WiderNet): new units copy random existing
  units, and every consumer splits the copied unit's outgoing weights among the copies.
  When the widened tensor meets an ``add``, every other producer of that add (through
  BN, activations, pooling, padding, dropout and further adds) is widened with the *same*
  copy pattern, so a whole residual stage widens at once and the sums stay copies.
* ``add_skip``   adds ``proj(source)`` to a later ``target``; the projection (optional
  pooling, then a 1x1 conv) starts at zero.
* ``concat_skip`` concatenates ``proj(source)`` to a later ``target``; consumers of the
  target get zero weights on the new channels (an ``add`` downstream is handled as for
  ``wider``: its other producers grow matching fresh channels, which consumers also zero).

Symmetry breaking: copies made by ``wider`` would otherwise receive identical gradients
forever. Instead of adding noise (which would perturb the function), the outgoing weights
of a unit with n copies are split by positive random fractions f_1..f_n that sum to one:
each is ``(1 + u_i) / sum_j (1 + u_j)`` with ``u_i`` uniform in +/-``SPLIT_JITTER``, so
``(1 - J) / (1 + J) <= n * f_i <= (1 + J) / (1 - J)`` (0.67 to 1.5 for J = 0.2). The
function is unchanged to rounding and the copies' gradients differ (in proportion to f_i).

Every operator first builds and validates the child architecture and only then, when
weights are given, allocates the child's weights: an impossible or oversized request fails
with :class:`NasError` before any memory is spent. Weights are framework-free:
``{node_id: [arrays in Keras order]}``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from nas.errors import NasError
from nas.graph import CHANNELWISE_OPS, MAX_CHANNELS, MAX_UNITS, Graph, Node, make_node, short_repr

Weights = dict[int, list[np.ndarray]]
KINDS = ("deeper", "wider", "add_skip", "concat_skip")
SPLIT_JITTER = 0.2
_NONNEGATIVE_ACTIVATIONS = frozenset({"relu", "relu6", "sigmoid", "hard_sigmoid", "softmax"})
_SIGN_KEEPING_OPS = frozenset({"pool", "gpool", "dropout", "zeropad", "flatten", "reshape", "add", "concat"})
# Ops a ``wider`` demand may walk back through to reach the producers of an add.
_PASS_BACK_OPS = frozenset({"bn", "act", "pool", "dropout", "zeropad"})


def _index(where: str, name: str, value: Any, allow_none: bool = False) -> int | None:
    """``value`` as a non-negative int (NumPy integers accepted, bools and floats refused)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool):
        raise NasError(f"{where}: {name} must be a non-negative integer, got {short_repr(value)}")
    try:
        number = operator.index(value)
    except TypeError:
        raise NasError(f"{where}: {name} must be a non-negative integer, got {short_repr(value)}") from None
    if not 0 <= number < 1 << 40:
        raise NasError(f"{where}: {name} must be a non-negative integer, got {number}")
    return number


@dataclass(frozen=True)
class Morph:
    """One morphism request; ``size`` is the kernel (deeper), new width (wider) or added channels (concat).

    ``target`` and ``source`` are node ids of the graph the morph applies to; a size of 0
    means the operator's default (3x3 kernel, half the target's channels).
    """

    kind: str
    target: int
    source: int | None = None
    size: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in KINDS:
            raise NasError(f"morph: unknown kind {short_repr(self.kind)} (known: {', '.join(KINDS)})")
        where = f"morph {self.kind}"
        object.__setattr__(self, "target", _index(where, "target", self.target))
        object.__setattr__(self, "source", _index(where, "source", self.source, allow_none=True))
        object.__setattr__(self, "size", _index(where, "size", self.size))

    def describe(self) -> str:
        """A one-line, human-readable account of the morph for logs and the ledger's lineage."""
        if self.kind == "deeper":
            k = self.size or 3
            return f"deeper: identity conv {k}x{k}+BN+ReLU (dense+ReLU on vectors) after n{self.target}"
        if self.kind == "wider":
            return f"wider: n{self.target} to {self.size} filters/units (Net2Wider, add partners follow)"
        if self.kind == "add_skip":
            return f"add_skip: n{self.source} -> n{self.target} through a zero 1x1 projection"
        extra = f"{self.size}" if self.size else "half as many"
        return f"concat_skip: n{self.source} -> n{self.target}, {extra} new channels"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "source": self.source, "size": self.size}

    @classmethod
    def from_dict(cls, data: Any) -> Morph:
        """Rebuild a morph from :meth:`to_dict` output; anything malformed raises NasError."""
        if not isinstance(data, Mapping):
            raise NasError(f"morph must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"kind", "target", "source", "size"}, key=str)
        if unknown:
            raise NasError(f"morph: unknown key {short_repr(unknown[0])}")
        if "kind" not in data or "target" not in data:
            raise NasError("morph: needs 'kind' and 'target'")
        return cls(data["kind"], data["target"], data.get("source"), data.get("size", 0))


class _Refused(NasError):
    """This morph does not apply to this graph (an internal, expected outcome)."""


@dataclass
class _Plan:
    """A morph's child architecture, and how to turn parent weights into child weights."""

    nodes: list[Node]
    finish: Callable[[Weights, np.random.Generator], Weights]


# --- helpers ---------------------------------------------------------------------------------


def nonnegative_nodes(graph: Graph) -> set[int]:
    """Nodes whose output is >= 0 for every input (after ReLU, and ops that keep the sign)."""
    out: set[int] = set()
    for n in graph.nodes:
        sign_kept = n.op in _SIGN_KEEPING_OPS and all(i in out for i in n.inputs)
        if sign_kept or (n.op == "act" and n.attrs["fn"] in _NONNEGATIVE_ACTIVATIONS):
            out.add(n.id)
    return out


def _rewire(nodes: list[Node], old: int, new: int, skip: set[int]) -> list[Node]:
    """Make every node but ``skip`` read ``new`` where it read ``old``."""
    result = []
    for n in nodes:
        if n.id not in skip and old in n.inputs:
            n = Node(n.id, n.op, tuple(new if i == old else i for i in n.inputs), n.attrs)
        result.append(n)
    return result


def _insert_after(
    graph: Graph,
    anchor: int,
    chain: list[tuple[str, dict[str, Any]]],
    first_input: int | None = None,
    join: tuple[str, int] | None = None,
) -> tuple[list[Node], list[int]]:
    """Insert a chain of new nodes right after ``anchor`` and make ``anchor``'s consumers read its end.

    The chain starts from ``first_input`` (default: ``anchor``); with ``join=(op, other)``
    it ends in a merge node ``op(anchor, chain_end)`` (how skips attach).
    """
    next_id = graph.next_id
    new_nodes: list[Node] = []
    prev = anchor if first_input is None else first_input
    for op, attrs in chain:
        new_nodes.append(make_node(next_id, op, (prev,), attrs))
        prev, next_id = next_id, next_id + 1
    if join is not None:
        new_nodes.append(make_node(next_id, join[0], (anchor, prev), {}))
        prev = next_id
    nodes = _rewire(list(graph.nodes), anchor, prev, {n.id for n in new_nodes})
    pos = graph.position(anchor) + 1
    nodes[pos:pos] = new_nodes
    return nodes, [n.id for n in new_nodes]


def _he(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    return (rng.standard_normal(shape) * np.sqrt(2.0 / max(1, fan_in))).astype(np.float32)


def split_fractions(mapping: np.ndarray, n_old: int, rng: np.random.Generator | None) -> np.ndarray:
    """Per new channel, its share of the source channel's outgoing weights (shares of a source sum to 1).

    A channel with a single copy keeps share exactly 1; with ``rng`` the shares of a
    channel with n copies are ``(1 + u_i) / sum(1 + u_j)``, u uniform in +/-SPLIT_JITTER,
    otherwise 1/n each. Entries of ``mapping`` below zero (brand-new channels) get 0.
    """
    valid = mapping >= 0
    src = np.where(valid, mapping, 0)
    weight = np.ones(len(mapping)) if rng is None else 1.0 + rng.uniform(-SPLIT_JITTER, SPLIT_JITTER, len(mapping))
    weight = np.where(valid, weight, 0.0)
    totals = np.bincount(src, weights=weight, minlength=n_old)
    return np.where(valid, weight / np.where(totals[src] > 0, totals[src], 1.0), 0.0)


def check_weights(graph: Graph, weights: Weights) -> None:
    """Raise NasError unless ``weights`` holds exactly the weighted layers of ``graph`` with their shapes."""
    expected = {n.id for n in graph.nodes if graph.weight_shapes(n.id)}
    extra = sorted(set(weights) - expected, key=str)
    if extra:
        raise NasError(f"weights do not fit the architecture: no weighted node {short_repr(extra[0])}")
    for node_id in sorted(expected):
        node = graph.node(node_id)
        if node_id not in weights:
            raise NasError(f"weights do not fit the architecture: {node.label} has no weights")
        want = [tuple(s) for s in graph.weight_shapes(node_id)]
        got = [tuple(np.shape(a)) for a in weights[node_id]]
        if got != want:
            raise NasError(f"weights do not fit the architecture: {node.label} needs shapes {want}, got {got}")


# --- channel expansion (shared by wider and concat_skip) ------------------------------------


@dataclass
class _Flow:
    """How the channels of one expanded tensor map to the tensor before expansion.

    ``mapping[j]`` is the old channel that new channel ``j`` copies, or -1 for a brand-new
    channel; ``frac[j]`` is its share of that old channel's outgoing weights (0 if new).
    """

    mapping: np.ndarray
    frac: np.ndarray

    def same_channels(self, other: _Flow) -> bool:
        return self is other or np.array_equal(self.mapping, other.mapping)


class _Expansion:
    """Which tensors carry a channel expansion, solved over the whole graph.

    ``producers`` are the nodes whose own output is expanded: conv/dense layers that get
    more filters (copies by ``mapping``, fresh filters for -1), and a new concat. Carrying
    the expansion forward stops at weighted consumers, which absorb it; an ``add`` needs
    all its inputs expanded alike, so it *demands* the same expansion of its other inputs,
    walking back to their producers. Each demand adds a producer, so solving terminates.
    """

    def __init__(
        self, nodes: list[Node], shape_of: Callable[[int], tuple[int, ...]], output_id: int, seeds: dict[int, _Flow]
    ) -> None:
        self.by_id = {n.id: n for n in nodes}
        self.order = [n.id for n in nodes]
        self.shape_of = shape_of
        self.output_id = output_id
        self.producers = dict(seeds)
        while True:
            self.flows, demands = self._carry()
            if not demands:
                break
            for node_id, flow in demands:
                self._demand(node_id, flow)

    def _carry(self) -> tuple[dict[int, _Flow], list[tuple[int, _Flow]]]:
        """Flows of every tensor given the producers; stops at the first add that needs more producers."""
        flows: dict[int, _Flow] = {}
        for node_id in self.order:
            node = self.by_id[node_id]
            affected = [i for i in node.inputs if i in flows]
            if node_id in self.producers:
                if affected and node.op not in ("conv", "dense"):
                    raise _Refused(f"{node.label}: cannot expand a merge whose input is already expanded")
                flows[node_id] = self.producers[node_id]
                continue
            if not affected:
                continue
            op = node.op
            if op in ("conv", "dense"):
                if op == "conv" and node.attrs["groups"] != 1:
                    raise _Refused(f"{node.label}: cannot widen the input of a grouped convolution")
                continue  # absorbed by the layer's input weights
            if node_id == self.output_id:
                raise _Refused(f"{node.label}: the expansion would change the output")
            f = flows[affected[0]]
            if op in CHANNELWISE_OPS or op == "gpool":
                flows[node_id] = f
            elif op == "dwconv":
                mult = node.attrs["multiplier"]
                mapping = np.where(f.mapping[:, None] >= 0, f.mapping[:, None] * mult + np.arange(mult), -1)
                flows[node_id] = _Flow(mapping.reshape(-1), np.repeat(f.frac, mult))
            elif op == "flatten":
                shape = self.shape_of(node.inputs[0])
                positions, c_old = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
                base = (np.arange(positions) * c_old)[:, None]
                mapping = np.where(f.mapping[None, :] >= 0, base + f.mapping[None, :], -1).reshape(-1)
                flows[node_id] = _Flow(mapping, np.tile(f.frac, positions))
            elif op == "concat":
                flows[node_id] = self._concat_flow(node, flows)
            elif op == "add":
                if any(not flows[i].same_channels(f) for i in affected):
                    raise _Refused(f"{node.label}: an add would mix differently expanded branches")
                missing = [i for i in node.inputs if i not in flows]
                if missing:
                    return flows, [(i, f) for i in missing]
                flows[node_id] = f
            else:
                raise _Refused(f"{node.label}: cannot carry a channel expansion through {op}")
        return flows, []

    def _concat_flow(self, node: Node, flows: dict[int, _Flow]) -> _Flow:
        parts_map, parts_frac, offset = [], [], 0
        for i in node.inputs:
            c_old = self.shape_of(i)[-1]
            if i in flows:
                fi = flows[i]
                parts_map.append(np.where(fi.mapping >= 0, fi.mapping + offset, -1))
                parts_frac.append(fi.frac)
            else:
                parts_map.append(np.arange(c_old) + offset)
                parts_frac.append(np.ones(c_old))
            offset += c_old
        return _Flow(np.concatenate(parts_map), np.concatenate(parts_frac))

    def _demand(self, start: int, flow: _Flow) -> None:
        """Make ``start`` output ``flow`` by widening the producers it is computed from."""
        stack = [start]
        while stack:
            node_id = stack.pop()
            node = self.by_id[node_id]
            have = self.producers.get(node_id) or self.flows.get(node_id)
            if have is not None:
                if not have.same_channels(flow):
                    raise _Refused(f"{node.label}: already expanded differently")
                continue
            if node.op == "dense" or (node.op == "conv" and node.attrs["groups"] == 1):
                self.producers[node_id] = flow
            elif node.op in _PASS_BACK_OPS:
                stack.append(node.inputs[0])
            elif node.op == "add":
                stack.extend(node.inputs)
            else:
                raise _Refused(f"{node.label}: an add it feeds is widened, but a {node.op} cannot be")

    def resized(self) -> list[Node]:
        """The nodes with every producing conv/dense layer at its new width."""
        out = []
        for node_id in self.order:
            node = self.by_id[node_id]
            if node_id in self.producers and node.op in ("conv", "dense"):
                key = "filters" if node.op == "conv" else "units"
                node = make_node(
                    node.id, node.op, node.inputs, {**node.attrs, key: len(self.producers[node_id].mapping)}
                )
            out.append(node)
        return out

    def transform(self, weights: Weights, rng: np.random.Generator) -> Weights:
        """Child weights: producers copy (or freshly draw) filters, consumers split or zero inputs."""
        out = dict(weights)
        for node_id in self.order:
            node = self.by_id[node_id]
            if node_id not in out:
                continue
            f_in = self.flows.get(node.inputs[0]) if node.inputs else None
            f_out = self.producers.get(node_id)
            if node.op == "bn" and f_in is not None:
                defaults = (1.0, 0.0, 0.0, 1.0)
                src = np.maximum(f_in.mapping, 0)
                out[node_id] = [
                    np.where(f_in.mapping >= 0, w[src], d).astype(w.dtype)
                    for w, d in zip(out[node_id], defaults, strict=True)
                ]
            elif node.op == "dwconv" and f_in is not None:
                out[node_id] = self._dwconv(out[node_id], f_in, node.attrs["multiplier"], rng)
            elif node.op in ("conv", "dense"):
                kernel, *rest = out[node_id]
                if f_in is not None:
                    axis = kernel.ndim - 2
                    kernel = np.take(kernel, np.maximum(f_in.mapping, 0), axis=axis)
                    shape = [1] * kernel.ndim
                    shape[axis] = len(f_in.mapping)
                    kernel = (kernel * f_in.frac.reshape(shape)).astype(weights[node_id][0].dtype)
                if f_out is not None:
                    fresh = f_out.mapping < 0
                    kernel = np.take(kernel, np.maximum(f_out.mapping, 0), axis=-1)
                    if fresh.any():
                        fan_in = int(np.prod(kernel.shape[:-1]))
                        kernel[..., fresh] = _he(rng, (*kernel.shape[:-1], int(fresh.sum())), fan_in)
                    rest = [np.where(fresh, 0, b[np.maximum(f_out.mapping, 0)]).astype(b.dtype) for b in rest]
                out[node_id] = [kernel, *rest]
        return out

    @staticmethod
    def _dwconv(arrays: list[np.ndarray], f: _Flow, mult: int, rng: np.random.Generator) -> list[np.ndarray]:
        kernel, *rest = arrays
        kh, kw, _, _ = kernel.shape
        src = kernel[:, :, np.maximum(f.mapping, 0), :]
        fresh = _he(rng, (kh, kw, len(f.mapping), mult), kh * kw)
        out = [np.where((f.mapping >= 0)[None, None, :, None], src, fresh).astype(kernel.dtype)]
        if rest:
            bias = rest[0].reshape(-1, mult)[np.maximum(f.mapping, 0)]
            bias[f.mapping < 0] = 0
            out.append(bias.reshape(-1).astype(rest[0].dtype))
        return out


# --- the four operators ------------------------------------------------------------------------


def _deeper(graph: Graph, m: Morph, rng: np.random.Generator) -> _Plan:
    anchor = graph.node(m.target)
    if anchor.id == graph.output_node.id or anchor.id not in nonnegative_nodes(graph):
        raise _Refused(f"{anchor.label}: deeper needs a non-negative output (after a ReLU)")
    shape = graph.shape(anchor.id)
    k = m.size or 3
    if len(shape) == 3:
        if k % 2 == 0:
            raise _Refused(f"deeper: kernel size must be odd for an identity initialisation, got {k}")
        c = shape[-1]
        chain: list[tuple[str, dict[str, Any]]] = [
            ("conv", {"filters": c, "kernel": k, "padding": "same", "use_bias": False}),
            ("bn", {}),
            ("act", {"fn": "relu"}),
        ]
    elif len(shape) == 1:
        c = shape[0]
        chain = [("dense", {"units": c, "use_bias": True}), ("act", {"fn": "relu"})]
    else:
        raise _Refused(f"{anchor.label}: deeper needs an image or vector output")
    nodes, new_ids = _insert_after(graph, anchor.id, chain)

    def finish(weights: Weights, rng: np.random.Generator) -> Weights:
        out = dict(weights)
        if len(shape) == 3:
            kernel = np.zeros((k, k, c, c), np.float32)
            kernel[k // 2, k // 2] = np.eye(c, dtype=np.float32)
            eps = next(n for n in nodes if n.id == new_ids[1]).attrs["epsilon"]
            out[new_ids[0]] = [kernel]
            # BN(x) = (x - 0) / sqrt(1 + eps) * sqrt(1 + eps) + 0 = x
            out[new_ids[1]] = [
                np.full(c, np.sqrt(1 + eps), np.float32),
                np.zeros(c, np.float32),
                np.zeros(c, np.float32),
                np.ones(c, np.float32),
            ]
        else:
            out[new_ids[0]] = [np.eye(c, dtype=np.float32), np.zeros(c, np.float32)]
        return out

    return _Plan(nodes, finish)


def _wider(graph: Graph, m: Morph, rng: np.random.Generator) -> _Plan:
    node = graph.node(m.target)
    if node.id == graph.output_node.id:
        raise _Refused(f"{node.label}: the output layer's width is the number of classes")
    if node.op not in ("conv", "dense") or (node.op == "conv" and node.attrs["groups"] != 1):
        raise _Refused(f"{node.label}: only ungrouped conv and dense layers can be widened")
    key, limit = ("filters", MAX_CHANNELS) if node.op == "conv" else ("units", MAX_UNITS)
    old, new = node.attrs[key], m.size
    if not old < new <= limit:
        raise _Refused(f"{node.label}: new width {new} must exceed {old} and be at most {limit}")
    mapping = np.concatenate([np.arange(old), rng.integers(0, old, new - old)])
    flow = _Flow(mapping, split_fractions(mapping, old, rng))
    expansion = _Expansion(list(graph.nodes), graph.shape, graph.output_node.id, {node.id: flow})
    return _Plan(expansion.resized(), expansion.transform)


def _skip_projection(graph: Graph, m: Morph, source: int, out_channels: int) -> list[tuple[str, dict[str, Any]]]:
    src, dst = graph.shape(source), graph.shape(m.target)
    if len(src) != 3 or len(dst) != 3:
        raise _Refused("skip connections join image tensors")
    if src[0] % dst[0] or src[1] % dst[1] or src[0] // dst[0] != src[1] // dst[1]:
        raise _Refused(f"skip n{m.source}->n{m.target}: spatial sizes {src[:2]} and {dst[:2]} are not a whole ratio")
    ratio = src[0] // dst[0]
    chain: list[tuple[str, dict[str, Any]]] = []
    if ratio > 1:
        chain.append(("pool", {"mode": "avg", "size": ratio, "strides": ratio, "padding": "valid"}))
    chain.append(("conv", {"filters": out_channels, "kernel": 1, "use_bias": False}))
    return chain


def _check_skip_endpoints(graph: Graph, m: Morph) -> int:
    """The skip's source node, once the endpoints can carry a skip."""
    if m.source is None or m.source == m.target:
        raise _Refused("a skip needs distinct source and target")
    if m.target == graph.output_node.id:
        raise _Refused("a skip cannot end at the output")
    if m.source not in graph.ancestors(m.target):
        raise _Refused(f"skip n{m.source}->n{m.target}: the source must come before the target")
    if m.source in graph.node(m.target).inputs:
        raise _Refused(f"skip n{m.source}->n{m.target}: already directly connected")
    return m.source


def _add_skip(graph: Graph, m: Morph, rng: np.random.Generator) -> _Plan:
    source = _check_skip_endpoints(graph, m)
    channels = graph.shape(m.target)[-1]
    chain = _skip_projection(graph, m, source, channels)
    nodes, new_ids = _insert_after(graph, m.target, chain, first_input=source, join=("add", m.target))
    conv_id, c_in = new_ids[-2], graph.shape(source)[-1]

    def finish(weights: Weights, rng: np.random.Generator) -> Weights:
        return {**weights, conv_id: [np.zeros((1, 1, c_in, channels), np.float32)]}

    return _Plan(nodes, finish)


def _concat_skip(graph: Graph, m: Morph, rng: np.random.Generator) -> _Plan:
    source = _check_skip_endpoints(graph, m)
    target_shape = graph.shape(m.target)
    old_c = target_shape[-1]
    extra = m.size or max(1, old_c // 2)
    if extra > MAX_CHANNELS:
        raise _Refused(f"concat_skip: {extra} new channels exceed {MAX_CHANNELS}")
    chain = [*_skip_projection(graph, m, source, extra), ("bn", {}), ("act", {"fn": "relu"})]
    nodes, new_ids = _insert_after(graph, m.target, chain, first_input=source, join=("concat", m.target))
    conv_id, bn_id, cat_id = new_ids[-4], new_ids[-3], new_ids[-1]
    c_in = graph.shape(source)[-1]
    new_shapes = {cat_id: target_shape}

    def shape_of(node_id: int) -> tuple[int, ...]:  # shapes before the expansion
        return new_shapes[node_id] if node_id in new_shapes else graph.shape(node_id)

    mapping = np.concatenate([np.arange(old_c), np.full(extra, -1)])
    flow = _Flow(mapping, np.concatenate([np.ones(old_c), np.zeros(extra)]))
    expansion = _Expansion(nodes, shape_of, graph.output_node.id, {cat_id: flow})

    def finish(weights: Weights, rng: np.random.Generator) -> Weights:
        out = dict(weights)
        out[conv_id] = [_he(rng, (1, 1, c_in, extra), c_in)]
        out[bn_id] = [
            np.ones(extra, np.float32),
            np.zeros(extra, np.float32),
            np.zeros(extra, np.float32),
            np.ones(extra, np.float32),
        ]
        return expansion.transform(out, rng)

    return _Plan(expansion.resized(), finish)


_APPLY: dict[str, Callable[[Graph, Morph, np.random.Generator], _Plan]] = {
    "deeper": _deeper,
    "wider": _wider,
    "add_skip": _add_skip,
    "concat_skip": _concat_skip,
}


@overload
def apply_morph(
    graph: Graph, morph: Morph, weights: Weights, rng: np.random.Generator | int | None = None
) -> tuple[Graph, Weights]: ...
@overload
def apply_morph(
    graph: Graph, morph: Morph, weights: None = None, rng: np.random.Generator | int | None = None
) -> tuple[Graph, None]: ...
def apply_morph(
    graph: Graph, morph: Morph, weights: Weights | None = None, rng: np.random.Generator | int | None = None
) -> tuple[Graph, Weights | None]:
    """Apply one morphism; with ``weights`` also return function-preserving child weights.

    The child is validated before any weight is allocated. Raises NasError when the morph
    does not apply to this graph or ``weights`` do not fit it. ``rng`` draws the copy
    pattern and split of ``wider`` and the fresh filters of ``concat_skip``.
    """
    if not isinstance(morph, Morph):
        raise NasError(f"expected a Morph, got {type(morph).__name__}")
    rng = np.random.default_rng(rng)
    if weights is not None:
        check_weights(graph, weights)
    plan = _APPLY[morph.kind](graph, morph, rng)
    child = Graph(plan.nodes, name=graph.name)
    if weights is None:
        return child, None
    keep = {n.id for n in child.nodes}
    new_weights = {k: v for k, v in plan.finish(dict(weights), rng).items() if k in keep}
    check_weights(child, new_weights)
    return child, new_weights


def candidate_morphs(
    graph: Graph,
    kernel_size: int = 3,
    widen_factor: float = 2.0,
    rng: np.random.Generator | None = None,
    max_skips: int = 24,
) -> list[Morph]:
    """Morphs that plausibly apply to ``graph`` (cheap structural filter; apply may still refuse)."""
    out: list[Morph] = []
    nonneg = nonnegative_nodes(graph)
    out_id = graph.output_node.id
    for n in graph.nodes:
        if n.id == out_id:
            continue
        rank = len(graph.shape(n.id))
        if n.id in nonneg and n.op == "act" and rank in (1, 3):
            out.append(Morph("deeper", n.id, size=kernel_size if rank == 3 else 1))
        if n.op in ("conv", "dense") and (n.op == "dense" or n.attrs["groups"] == 1):
            width = n.attrs["filters" if n.op == "conv" else "units"]
            limit = MAX_CHANNELS if n.op == "conv" else MAX_UNITS
            new = min(limit, max(width + 1, round(width * widen_factor)))
            if new > width:
                out.append(Morph("wider", n.id, size=new))
    anchors = [
        n.id for n in graph.nodes if n.op in ("act", "add", "pool") and len(graph.shape(n.id)) == 3 and n.id != out_id
    ]
    pairs = []
    for k, dst in enumerate(anchors):
        ancestors = graph.ancestors(dst)
        for src in anchors[:k]:
            if src in ancestors and src not in graph.node(dst).inputs:
                s, d = graph.shape(src), graph.shape(dst)
                if s[0] % d[0] == 0 and s[1] % d[1] == 0 and s[0] // d[0] == s[1] // d[1]:
                    pairs.append((src, dst))
    if rng is not None and len(pairs) > max_skips:
        pairs = [pairs[i] for i in rng.choice(len(pairs), max_skips, replace=False)]
    else:
        pairs = pairs[-max_skips:]
    for src, dst in pairs:
        out.append(Morph("add_skip", dst, src))
        out.append(Morph("concat_skip", dst, src, size=max(1, graph.shape(dst)[-1] // 2)))
    return out


def try_morph(
    graph: Graph, morph: Morph, weights: Weights | None = None, rng: np.random.Generator | int | None = None
) -> tuple[Graph, Weights | None] | None:
    """Like :func:`apply_morph` but returns None when the morph does not apply."""
    try:
        return apply_morph(graph, morph, weights, rng)
    except NasError:
        return None


def random_morph(
    graph: Graph,
    rng: np.random.Generator,
    kernel_size: int = 3,
    accept: Callable[[Graph], bool] | None = None,
    kinds: Iterable[str] = KINDS,
) -> tuple[Graph, Morph] | None:
    """One random applicable morph whose child passes ``accept`` (e.g. the size limits), or None."""
    kinds = set(kinds)
    cands = [m for m in candidate_morphs(graph, kernel_size, rng=rng) if m.kind in kinds]
    if not cands:
        return None
    # Pick the kind first so that the many skip pairs do not crowd out deeper/wider.
    by_kind: dict[str, list[Morph]] = {}
    for m in cands:
        by_kind.setdefault(m.kind, []).append(m)
    kind_order = list(by_kind)
    rng.shuffle(kind_order)
    for kind in kind_order:
        options = by_kind[kind]
        for idx in rng.permutation(len(options)):
            result = try_morph(graph, options[idx], None, rng)
            if result is not None and (accept is None or accept(result[0])):
                return result[0], options[idx]
    return None
