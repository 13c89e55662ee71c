"""Architecture graph: a DAG of layers with shape inference, free of any framework.

A :class:`Graph` is an ordered tuple of :class:`Node` objects in topological order. Node 0
is the single ``input``; the last node is the single output and produces the logits (a
rank-1 tensor of ``num_classes``). Shapes exclude the batch axis and are channels-last
(``(H, W, C)`` for images, ``(D,)`` for vectors), matching Keras defaults.

Graphs are immutable by convention: morphisms build new node lists and a new ``Graph``,
which re-validates everything. Construction checks every attribute's type and range and
every shape *before* anything is allocated, so a hostile description fails with one
:class:`NasError` naming the node instead of exhausting memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nas.errors import NasError

Shape = tuple[int, ...]

# Hard caps that keep a hostile or absurd description from reaching a framework.
MAX_NODES = 20_000
MAX_CHANNELS = 1 << 16
MAX_KERNEL = 64
MAX_STRIDE = 64
MAX_SPATIAL = 1 << 14
MAX_UNITS = 1 << 20
MAX_ELEMENTS = 1 << 31  # per tensor, per image
MAX_PARAMS = 1 << 34

ACTIVATIONS = ("relu", "relu6", "sigmoid", "hard_sigmoid", "tanh", "swish", "gelu", "softmax", "linear")
PADDINGS = ("same", "valid")
POOL_MODES = ("max", "avg")

# op -> {attr: (kind, default)}; default ``REQUIRED`` means the attribute must be given.
REQUIRED = object()
_INT, _PAIR, _BOOL, _FLOAT, _CHOICE_PAD, _CHOICE_ACT, _CHOICE_POOL, _SHAPE, _PAD4 = (
    "int",
    "pair",
    "bool",
    "float",
    "padding",
    "activation",
    "pool_mode",
    "shape",
    "pad4",
)
OP_ATTRS: dict[str, dict[str, tuple[str, Any]]] = {
    "input": {"shape": (_SHAPE, REQUIRED)},
    "conv": {
        "filters": (_INT, REQUIRED),
        "kernel": (_PAIR, (3, 3)),
        "strides": (_PAIR, (1, 1)),
        "padding": (_CHOICE_PAD, "same"),
        "groups": (_INT, 1),
        "use_bias": (_BOOL, True),
    },
    "dwconv": {
        "kernel": (_PAIR, (3, 3)),
        "strides": (_PAIR, (1, 1)),
        "padding": (_CHOICE_PAD, "same"),
        "multiplier": (_INT, 1),
        "use_bias": (_BOOL, True),
    },
    "bn": {"epsilon": (_FLOAT, 1e-3)},
    "act": {"fn": (_CHOICE_ACT, "relu")},
    "pool": {
        "mode": (_CHOICE_POOL, "max"),
        "size": (_PAIR, (2, 2)),
        "strides": (_PAIR, None),
        "padding": (_CHOICE_PAD, "valid"),
    },
    "gpool": {"mode": (_CHOICE_POOL, "avg"), "keepdims": (_BOOL, False)},
    "dense": {"units": (_INT, REQUIRED), "use_bias": (_BOOL, True)},
    "dropout": {"rate": (_FLOAT, 0.0)},
    "add": {},
    "concat": {},
    "flatten": {},
    "zeropad": {"pad": (_PAD4, REQUIRED)},
    "reshape": {"shape": (_SHAPE, REQUIRED)},
}
OPS = tuple(OP_ATTRS)
# How many inputs each op takes: (min, max); None means unbounded.
_ARITY: dict[str, tuple[int, int | None]] = {op: (1, 1) for op in OPS}
_ARITY.update({"input": (0, 0), "add": (2, None), "concat": (2, None)})
# Ops whose output channel c depends only on input channel c (used by morphisms).
CHANNELWISE_OPS = frozenset({"bn", "act", "pool", "dropout", "zeropad"})


class NodeDoc(dict):
    """A node's JSON document, as :meth:`Node.to_dict` makes it: JSON holds it as it is.

    Every node's attributes went through :func:`make_node` (finite numbers, text, integer
    tuples made lists here), so a record writer need not walk it again to make it safe.
    """


@dataclass(frozen=True)
class Node:
    """One layer: its id, operation, the ids of the nodes it reads and its attributes."""

    id: int
    op: str
    inputs: tuple[int, ...] = ()
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> NodeDoc:
        """The node's JSON-ready document: made once per node, so every graph sharing the node shares it.

        A morph child shares most nodes with its parent, and every trial's architecture is written
        into its spec and its ledger record. The document is read, never changed, by whoever gets it.
        """
        doc = self.recall("doc", None)
        if doc is None:
            attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in self.attrs.items()}
            doc = self.remember("doc", None, NodeDoc(id=self.id, op=self.op, inputs=list(self.inputs), attrs=attrs))
        return doc

    @property
    def label(self) -> str:
        """A human-readable name used in errors and as the framework layer name."""
        return f"n{self.id}_{self.op}"

    def __hash__(self) -> int:
        # Attribute values are canonical (ints, floats, strings, tuples), so the items hash.
        return hash((self.id, self.op, self.inputs, tuple(sorted(self.attrs.items()))))

    # A morph child shares every node it leaves unchanged with its parent, and the start-up fill
    # builds tens of thousands of children: what a graph derives from one node (its shape, its part
    # of the key, its operation count) is asked again of the same node object with the same inputs.
    # The node remembers the last answer to each question, with what it depended on.
    def recall(self, question: str, given: object) -> Any:
        """The answer :meth:`remember` kept for ``question`` if it was given the same ``given``, else None."""
        memo = self.__dict__.get("_memo")
        if memo is not None:
            kept = memo.get(question)
            if kept is not None and kept[0] == given:
                return kept[1]
        return None

    def remember(self, question: str, given: object, answer: Any) -> Any:
        """Keep ``answer`` (not None) to ``question`` about this node, valid while ``given`` is the same."""
        self.__dict__.setdefault("_memo", {})[question] = (given, answer)
        return answer

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_memo"}  # a copy or a pickle starts afresh


def short_repr(value: object, limit: int = 40) -> str:
    """``repr`` cut to ``limit`` characters, so hostile values cannot flood an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where(node_id: object, op: object) -> str:
    ident = node_id if isinstance(node_id, int) and not isinstance(node_id, bool) else short_repr(node_id)
    kind = op if isinstance(op, str) and op in OP_ATTRS else short_repr(op)
    return f"node {ident} ({kind})"


def _check_int(where: str, name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise NasError(f"{where}: {name} must be an integer, got {short_repr(value)}")
    if not lo <= value <= hi:
        raise NasError(f"{where}: {name} must be between {lo} and {hi}, got {value}")
    return value


def _finite(value: int | float) -> bool:
    """``math.isfinite`` that also answers (False) for integers too large for a float."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _normalise_attr(where: str, name: str, kind: str, value: object) -> Any:
    """Check one attribute's type and range and return it in canonical (hashable) form."""
    if kind == _INT:
        hi = MAX_UNITS if name == "units" else MAX_CHANNELS
        return _check_int(where, name, value, 1, hi)
    if kind == _PAIR:
        if isinstance(value, int) and not isinstance(value, bool):
            value = (value, value)
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise NasError(f"{where}: {name} must be a pair of integers, got {short_repr(value)}")
        hi = MAX_STRIDE if name == "strides" else MAX_KERNEL
        return tuple(_check_int(where, name, v, 1, hi) for v in value)
    if kind == _BOOL:
        if not isinstance(value, bool):
            raise NasError(f"{where}: {name} must be true or false, got {short_repr(value)}")
        return value
    if kind == _FLOAT:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
            raise NasError(f"{where}: {name} must be a finite number, got {short_repr(value)}")
        value = float(value)
        if name == "rate" and not 0.0 <= value < 1.0:
            raise NasError(f"{where}: rate must be in [0, 1), got {value}")
        if name == "epsilon" and not 0.0 < value <= 1.0:
            raise NasError(f"{where}: epsilon must be in (0, 1], got {value}")
        return value
    if kind in (_CHOICE_PAD, _CHOICE_ACT, _CHOICE_POOL):
        choices = {_CHOICE_PAD: PADDINGS, _CHOICE_ACT: ACTIVATIONS, _CHOICE_POOL: POOL_MODES}[kind]
        if not isinstance(value, str) or value not in choices:
            raise NasError(f"{where}: {name} must be one of {', '.join(choices)}, got {short_repr(value)}")
        return value
    if kind == _SHAPE:
        if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= 3:
            raise NasError(f"{where}: {name} must be a list of 1 to 3 positive integers, got {short_repr(value)}")
        return tuple(_check_int(where, name, v, 1, MAX_UNITS) for v in value)
    if kind == _PAD4:
        if isinstance(value, int) and not isinstance(value, bool):
            value = (value,) * 4
        if not isinstance(value, (list, tuple)) or len(value) != 4:
            raise NasError(f"{where}: {name} must be four integers (top, bottom, left, right), got {short_repr(value)}")
        return tuple(_check_int(where, name, v, 0, MAX_KERNEL) for v in value)
    raise AssertionError(kind)  # pragma: no cover - OP_ATTRS is closed


def make_node(node_id: Any, op: Any, inputs: Iterable[Any] = (), attrs: Mapping[str, Any] | None = None) -> Node:
    """Build a node after checking its op, arity and attributes (defaults filled in)."""
    where = _where(node_id, op)
    _check_int(where, "id", node_id, 0, 1 << 40)
    if not isinstance(op, str) or op not in OP_ATTRS:
        raise NasError(f"{where}: unknown op {short_repr(op)} (known: {', '.join(OPS)})")
    inputs = tuple(inputs)
    for i in inputs:
        _check_int(where, "input id", i, 0, 1 << 40)
    lo, hi = _ARITY[op]
    if len(inputs) < lo or (hi is not None and len(inputs) > hi):
        want = f"{lo}" if lo == hi else f"at least {lo}" if hi is None else f"{lo} to {hi}"
        raise NasError(f"{where}: takes {want} inputs, got {len(inputs)}")
    if len(set(inputs)) != len(inputs) and op != "add":
        raise NasError(f"{where}: the same input appears twice")
    attrs = dict(attrs or {})
    spec = OP_ATTRS[op]
    unknown = sorted(set(attrs) - set(spec), key=str)
    if unknown:
        raise NasError(f"{where}: unknown attribute {short_repr(unknown[0])} (known: {', '.join(spec) or 'none'})")
    clean: dict[str, Any] = {}
    for name, (kind, default) in spec.items():
        if name in attrs and attrs[name] is not None:
            clean[name] = _normalise_attr(where, name, kind, attrs[name])
        elif default is REQUIRED:
            raise NasError(f"{where}: missing attribute {name!r}")
        else:
            clean[name] = default
    if op == "pool" and clean["strides"] is None:
        clean["strides"] = clean["size"]
    return Node(node_id, op, inputs, clean)


def _conv_out(where: str, size: int, k: int, s: int, padding: str) -> int:
    out = -(-size // s) if padding == "same" else (size - k) // s + 1
    if out < 1:
        raise NasError(f"{where}: window {k} with stride {s} does not fit an input of size {size}")
    return out


def _infer(node: Node, in_shapes: list[Shape]) -> Shape:
    """Output shape of ``node`` given its input shapes; raises NasError when inconsistent."""
    op, a, where = node.op, node.attrs, node.label
    if op == "input":
        shape = a["shape"]
        if len(shape) == 3 and max(shape[0], shape[1]) > MAX_SPATIAL:
            raise NasError(f"{where}: image side exceeds {MAX_SPATIAL}")
        return shape
    x = in_shapes[0] if in_shapes else ()
    if op in ("conv", "dwconv", "pool", "zeropad", "gpool"):
        if len(x) != 3:
            raise NasError(f"{where}: needs an image input (H, W, C), got shape {x}")
        h, w, c = x
    if op == "conv":
        groups = a["groups"]
        if c % groups or a["filters"] % groups:
            raise NasError(f"{where}: groups={groups} must divide input channels {c} and filters {a['filters']}")
        (kh, kw), (sh, sw) = a["kernel"], a["strides"]
        return (_conv_out(where, h, kh, sh, a["padding"]), _conv_out(where, w, kw, sw, a["padding"]), a["filters"])
    if op == "dwconv":
        (kh, kw), (sh, sw) = a["kernel"], a["strides"]
        channels = c * a["multiplier"]
        if channels > MAX_CHANNELS:
            raise NasError(f"{where}: {channels} output channels exceed {MAX_CHANNELS}")
        return (_conv_out(where, h, kh, sh, a["padding"]), _conv_out(where, w, kw, sw, a["padding"]), channels)
    if op == "pool":
        (kh, kw), (sh, sw) = a["size"], a["strides"]
        return (_conv_out(where, h, kh, sh, a["padding"]), _conv_out(where, w, kw, sw, a["padding"]), c)
    if op == "zeropad":
        t, b, left, r = a["pad"]
        return (h + t + b, w + left + r, c)
    if op == "gpool":
        return (1, 1, c) if a["keepdims"] else (c,)
    if op in ("bn", "act", "dropout"):
        return x
    if op == "dense":
        if len(x) != 1:
            raise NasError(f"{where}: dense needs a flat input (add a flatten or global pool), got shape {x}")
        return (a["units"],)
    if op == "flatten":
        return (math.prod(x),)
    if op == "reshape":
        if math.prod(a["shape"]) != math.prod(x):
            raise NasError(f"{where}: cannot reshape {x} into {a['shape']}")
        return a["shape"]
    if op == "add":
        if any(s != x for s in in_shapes):
            raise NasError(f"{where}: add needs equal input shapes, got {', '.join(map(str, in_shapes))}")
        return x
    if op == "concat":
        if any(len(s) != len(x) or s[:-1] != x[:-1] for s in in_shapes):
            raise NasError(f"{where}: concat needs inputs equal but for channels, got {', '.join(map(str, in_shapes))}")
        return (*x[:-1], sum(s[-1] for s in in_shapes))
    raise AssertionError(op)  # pragma: no cover


def weight_shapes(node: Node, in_shape: Shape) -> list[Shape]:
    """Shapes of a layer's weights in Keras order (kernel, bias / gamma, beta, mean, var)."""
    a = node.attrs
    shapes: list[Shape]
    if node.op == "conv":
        kh, kw = a["kernel"]
        shapes = [(kh, kw, in_shape[-1] // a["groups"], a["filters"])]
        return [*shapes, (a["filters"],)] if a["use_bias"] else shapes
    if node.op == "dwconv":
        kh, kw = a["kernel"]
        shapes = [(kh, kw, in_shape[-1], a["multiplier"])]
        return [*shapes, (in_shape[-1] * a["multiplier"],)] if a["use_bias"] else shapes
    if node.op == "bn":
        return [(in_shape[-1],)] * 4
    if node.op == "dense":
        shapes = [(in_shape[0], a["units"])]
        return [*shapes, (a["units"],)] if a["use_bias"] else shapes
    return []


def _toposort(nodes: Sequence[Node]) -> list[Node]:
    """Kahn's algorithm, ties broken by the caller's order so a valid order is kept as is."""
    import heapq

    by_id: dict[int, int] = {}
    in_order = True  # every node's inputs come before it: the order is kept as is (a morph's nodes mostly)
    for pos, n in enumerate(nodes):
        if n.id in by_id:
            raise NasError(f"node {n.id}: duplicate id")
        if in_order:
            in_order = all(i in by_id for i in n.inputs)
        by_id[n.id] = pos
    if in_order:
        return list(nodes)  # what the algorithm below returns for an order that is already topological
    pending = [0] * len(nodes)
    consumers: list[list[int]] = [[] for _ in nodes]
    for pos, n in enumerate(nodes):
        for i in n.inputs:
            if i not in by_id:
                raise NasError(f"{n.label}: input {i} does not exist")
            consumers[by_id[i]].append(pos)
            pending[pos] += 1
    ready = [pos for pos, count in enumerate(pending) if count == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        pos = heapq.heappop(ready)
        order.append(nodes[pos])
        for c in consumers[pos]:
            pending[c] -= 1
            if pending[c] == 0:
                heapq.heappush(ready, c)
    if len(order) != len(nodes):
        raise NasError(f"{_node_on_cycle(nodes, by_id, pending).label}: the graph has a cycle through this node")
    return order


def _node_on_cycle(nodes: Sequence[Node], by_id: dict[int, int], pending: list[int]) -> Node:
    """A node that lies on a cycle, given Kahn's leftovers (every leftover reads another leftover).

    Walking backwards along unfinished inputs must revisit a node, and the first node seen
    twice is on a cycle (a node merely downstream of one would not be reached again).
    """
    pos = next(p for p, count in enumerate(pending) if count > 0)
    seen: set[int] = set()
    while pos not in seen:
        seen.add(pos)
        pos = next(by_id[i] for i in nodes[pos].inputs if pending[by_id[i]] > 0)
    return nodes[pos]


class Graph:
    """A validated architecture: nodes in topological order with inferred shapes."""

    __slots__ = ("_ancestors", "_consumers", "_index", "_key", "_params", "_shapes", "name", "nodes")

    def __init__(self, nodes: Iterable[Node], name: str = "") -> None:
        nodes = list(nodes)
        if not nodes:
            raise NasError("the graph has no nodes")
        if len(nodes) > MAX_NODES:
            raise NasError(f"the graph has {len(nodes)} nodes, more than the limit of {MAX_NODES}")
        ordered = _toposort(nodes)
        inputs = [n for n in ordered if n.op == "input"]
        if len(inputs) != 1:
            raise NasError(f"the graph must have exactly one input node, found {len(inputs)}")
        if ordered[0].op != "input":
            raise NasError(f"{ordered[0].label}: reads nothing but is not the input node")
        self.nodes: tuple[Node, ...] = tuple(ordered)
        self.name = name
        self._index = {n.id: k for k, n in enumerate(self.nodes)}
        consumers: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                consumers[i].append(n.id)
        self._consumers = consumers
        sinks = [n for n in self.nodes if not consumers[n.id]]
        if len(sinks) != 1:
            names = ", ".join(n.label for n in sinks[:4])
            raise NasError(f"the graph must have exactly one output, found {len(sinks)}: {names}")
        shapes: dict[int, Shape] = {}
        params = 0
        for n in self.nodes:
            in_shapes = tuple([shapes[i] for i in n.inputs])
            known = n.recall("shape", in_shapes)
            if known is None:
                shape = _infer(n, list(in_shapes))
                if any(d < 1 for d in shape) or math.prod(shape) > MAX_ELEMENTS:
                    raise NasError(f"{n.label}: output shape {shape} is out of range")
                if shape[-1] > MAX_UNITS:
                    raise NasError(f"{n.label}: {shape[-1]} channels exceed {MAX_UNITS}")
                weights = sum(math.prod(s) for s in weight_shapes(n, in_shapes[0] if in_shapes else ()))
                known = n.remember("shape", in_shapes, (shape, weights))
            shape, weights = known
            shapes[n.id] = shape
            params += weights
            if params > MAX_PARAMS:
                raise NasError(f"{n.label}: the graph exceeds {MAX_PARAMS} parameters")
        out = shapes[self.nodes[-1].id]
        if len(out) != 1:
            raise NasError(f"{self.nodes[-1].label}: the output must be a vector of class logits, got shape {out}")
        self._shapes = shapes
        self._params = params
        self._key: str | None = None
        self._ancestors: dict[int, frozenset[int]] | None = None

    # --- queries -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self):
        return iter(self.nodes)

    def node(self, node_id: int) -> Node:
        try:
            return self.nodes[self._index[node_id]]
        except KeyError:
            raise NasError(f"node {node_id} is not in the graph") from None

    def position(self, node_id: int) -> int:
        return self._index[node_id]

    def shape(self, node_id: int) -> Shape:
        return self._shapes[node_id]

    def input_shape_of(self, node_id: int) -> Shape:
        """Shape of the first input of ``node_id`` (the one that sizes its weights)."""
        node = self.node(node_id)
        return self._shapes[node.inputs[0]] if node.inputs else ()

    def consumers(self, node_id: int) -> list[int]:
        return list(self._consumers[node_id])

    def consumer_count(self, node_id: int) -> int:
        return len(self._consumers[node_id])

    def ancestors(self, node_id: int) -> frozenset[int]:
        """Every node ``node_id`` depends on (computed once for all nodes: graphs are immutable)."""
        if self._ancestors is None:
            table: dict[int, frozenset[int]] = {}
            for n in self.nodes:
                acc: set[int] = set(n.inputs)
                for i in n.inputs:
                    acc |= table[i]
                table[n.id] = frozenset(acc)
            self._ancestors = table
        try:
            return self._ancestors[node_id]
        except KeyError:
            raise NasError(f"node {node_id} is not in the graph") from None

    def weight_shapes(self, node_id: int) -> list[Shape]:
        return weight_shapes(self.node(node_id), self.input_shape_of(node_id))

    @property
    def input_node(self) -> Node:
        return self.nodes[0]

    @property
    def output_node(self) -> Node:
        return self.nodes[-1]

    @property
    def input_shape(self) -> Shape:
        return self._shapes[self.nodes[0].id]

    @property
    def num_classes(self) -> int:
        return self._shapes[self.nodes[-1].id][0]

    @property
    def param_count(self) -> int:
        return self._params

    @property
    def next_id(self) -> int:
        return max(n.id for n in self.nodes) + 1

    def count(self, *ops: str) -> int:
        return sum(1 for n in self.nodes if n.op in ops)

    @property
    def depth(self) -> int:
        """Number of weighted layers (conv, depthwise conv, dense): the usual notion of depth."""
        return self.count("conv", "dwconv", "dense")

    # --- identity --------------------------------------------------------------------------
    def key(self) -> str:
        """A content hash, equal for equal architectures whatever their node ids and node order.

        Each node is hashed from its op, its attributes (dropout rates excluded: they are a
        hyperparameter) and its inputs' hashes, with the inputs of an ``add`` sorted since
        addition commutes. The key combines the output's hash with the sorted multiset of
        all node hashes, so two branches sharing one node differ from two equal branches.
        """
        if self._key is None:
            import hashlib

            digests: dict[int, str] = {}
            for n in self.nodes:
                inputs = [digests[i] for i in n.inputs]
                in_shape = self._shapes[n.inputs[0]] if n.inputs else ()
                given = (tuple(inputs), in_shape)  # what the node's digest depends on
                digest = n.recall("key", given)
                if digest is None:
                    attrs = n.recall("key_attrs", in_shape)
                    if attrs is None:
                        items = dict(n.attrs)
                        if items.get("padding") == "same" and not self._pads_anything(n):
                            items["padding"] = "valid"  # e.g. a 1x1 conv: "same" adds no padding
                        text = ",".join(f"{k}={v}" for k, v in sorted(items.items()) if k != "rate")
                        attrs = n.remember("key_attrs", in_shape, text)
                    if n.op == "add":
                        inputs.sort()
                    text = f"{n.op}({','.join(inputs)})[{attrs}]"
                    digest = n.remember("key", given, hashlib.blake2b(text.encode(), digest_size=16).hexdigest())
                digests[n.id] = digest
            summary = digests[self.output_node.id] + ";" + ",".join(sorted(digests.values()))
            self._key = hashlib.sha256(summary.encode()).hexdigest()[:16]
        return self._key

    def _pads_anything(self, node: Node) -> bool:
        """Whether a "same"-padded window op really pads its input (else it equals "valid")."""
        h, w = self.input_shape_of(node.id)[:2]
        (kh, kw) = node.attrs["size"] if node.op == "pool" else node.attrs["kernel"]
        sh, sw = node.attrs["strides"]
        return any((-(-n // s) - 1) * s + k > n for n, k, s in ((h, kh, sh), (w, kw, sw)))

    def to_dict(self) -> dict[str, Any]:
        from nas.serialize import graph_to_dict

        return graph_to_dict(self)

    def with_attrs(self, op: str, **attrs: Any) -> Graph:
        """A copy where every node of ``op`` has ``attrs`` overridden (e.g. all dropout rates)."""
        if all(n.attrs.get(k) == v for n in self.nodes if n.op == op for k, v in attrs.items()):
            return self  # nothing changes: no rebuild (the master applies each trial's dropout rate)
        nodes = [make_node(n.id, n.op, n.inputs, {**n.attrs, **attrs}) if n.op == op else n for n in self.nodes]
        if op == "dropout" and set(attrs) <= {"rate"}:
            return self._with_rates(nodes)
        return Graph(nodes, name=self.name)

    def _with_rates(self, nodes: list[Node]) -> Graph:
        """This graph with ``nodes`` (the same but for dropout rates): no shape, count or key changes, so
        nothing is inferred again (a re-tune differs from its lineage by its rate, every start-up tune of the seed)."""
        graph = object.__new__(Graph)
        graph.nodes = tuple(nodes)
        graph.name = self.name
        graph._index = self._index
        graph._consumers = self._consumers
        graph._shapes = self._shapes
        graph._params = self._params
        graph._key = self._key  # the key leaves dropout rates out
        graph._ancestors = self._ancestors
        return graph

    def with_dropout(self, rate: float, ensure: bool = False) -> Graph:
        """A copy whose dropout layers all use ``rate``, so a searched dropout rate always takes effect.

        A graph without dropout (ResNet-50, most imported nets) gets one in front of its
        output layer when ``rate > 0`` or ``ensure``; that node has no weights, so inherited
        weights still fit. Seeds get theirs up front (``ensure``) so that node ids stay the
        same whatever rate a trial later uses.
        """
        if self.count("dropout"):
            return self.with_attrs("dropout", rate=rate)
        if rate == 0 and not ensure:
            return self
        out = self.output_node
        drop = make_node(self.next_id, "dropout", (out.inputs[0],), {"rate": rate})
        head = Node(out.id, out.op, (drop.id, *out.inputs[1:]), out.attrs)
        return Graph([*self.nodes[:-1], drop, head], name=self.name)

    def __repr__(self) -> str:
        return f"Graph({self.name or self.key()}, {len(self.nodes)} nodes, {self.param_count} params)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Graph) and self.nodes == other.nodes

    def __hash__(self) -> int:
        return hash(self.key())


class GraphBuilder:
    """Imperative helper for writing architectures by hand: ``b.add("conv", x, filters=16)``."""

    def __init__(self, input_shape: Sequence[int]) -> None:
        self._nodes: list[Node] = [make_node(0, "input", (), {"shape": tuple(input_shape)})]

    @property
    def input(self) -> int:
        return 0

    def add(self, op: str, *inputs: int, **attrs: Any) -> int:
        node_id = len(self._nodes)
        self._nodes.append(make_node(node_id, op, inputs, attrs))
        return node_id

    def conv_bn_relu(self, x: int, filters: int, kernel: int = 3, strides: int = 1, padding: str = "same") -> int:
        x = self.add("conv", x, filters=filters, kernel=kernel, strides=strides, padding=padding, use_bias=False)
        x = self.add("bn", x)
        return self.add("act", x, fn="relu")

    def build(self, name: str = "") -> Graph:
        return Graph(self._nodes, name=name)
