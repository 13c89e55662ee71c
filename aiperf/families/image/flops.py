"""Analytic operation counts of training and evaluating an architecture, per image.

The benchmark's score is counted work, so the count comes from the architecture alone:
it does not depend on the framework, the device, or a kernel's shortcuts (Winograd,
fused BatchNorm, recomputation). Every constant below is derived in docs/flops.md; this
module is the executable form of that document. Two conventions frame everything:

* one multiply-accumulate (MAC) is 2 operations; add, subtract, multiply, divide,
  compare-and-select, exp, log, sqrt, rsqrt, tanh and erf are 1 operation each; copies,
  padding, slicing, concatenation and reshapes are free;
* a reduction of n values costs n operations (one per value accumulated), exactly as a
  length-n dot product costs n MACs in every published multiply-add count.

``aiperf_compatible_*`` recount the same work with the original AIPerf's conventions
(Ren et al. 2021) so results can be compared with its published scores.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import NotRequired, TypedDict

from aiperf.errors import AiperfError
from nas.graph import Graph, Node, Shape

MAC_OPS = 2
# Per element of the layer's output: (forward, backward). Backward reuses forward values.
ACTIVATION_OPS: dict[str, tuple[int, int]] = {
    "linear": (0, 0),  # identity: the gradient passes through
    "relu": (1, 1),  # max(x, 0); select(y > 0, dy, 0)
    "relu6": (2, 2),  # min(max(x, 0), 6); one compare-and-select per bound
    "sigmoid": (3, 3),  # exp(-x), +1, reciprocal; dy * y * (1 - y)
    "hard_sigmoid": (4, 3),  # (x + 3), max, min, / 6; two selects, * 1/6
    "tanh": (1, 3),  # tanh; dy * (1 - y * y)
    "swish": (4, 5),  # x * sigmoid(x); dy * s * (1 + x * (1 - s))
    "gelu": (5, 8),  # 0.5 * x * (1 + erf(x / sqrt 2)); dy * (Phi + x * phi), phi = c * exp(-x * x / 2)
    "softmax": (5, 4),  # max, shift, exp, sum, divide; y * (dy - sum(dy * y))
}

# BatchNorm, as Keras computes it: mean, variance = mean((x - mean)^2), y = x * a + b with
# a = gamma * rsqrt(var + eps) and b = beta - mean * a per channel.
BN_FORWARD_PER_ELEMENT = 6  # mean 1 + variance 3 + x * a + b 2
BN_INFERENCE_PER_ELEMENT = 2  # x * a + b with the moving statistics folded in
BN_PARAM_GRAD_PER_ELEMENT = 3  # sum(dy * x) 2 + sum(dy) 1
BN_INPUT_GRAD_PER_ELEMENT = 5  # dy * a, + dmean / m, (x - mean) * (2 dvar / m), +
BN_FORWARD_PER_CHANNEL = 13  # 2 divides, + eps, rsqrt, a, b (2), two moving averages (3 each)
BN_PARAM_GRAD_PER_CHANNEL = 3  # da - mean * db (2), dgamma = da * r
BN_INPUT_GRAD_PER_CHANNEL = 8  # dr, dvar = dr * (-1/2) r^3 (4), dmean, dmean / m, 2 dvar / m
DROPOUT_FORWARD_PER_ELEMENT = 3  # compare the random draw, * 1/(1 - rate), * mask
DROPOUT_BACKWARD_PER_ELEMENT = 2  # dy * mask * 1/(1 - rate)
# Optimizer (aiperf/families/image/trainer.py): SGD with Nesterov momentum, decoupled weight decay on kernels.
SGD_NESTEROV_OPS_PER_PARAM = 7  # m = m*mu - g*lr (3); w += m*mu - g*lr (4)
WEIGHT_DECAY_OPS_PER_KERNEL_PARAM = 3  # w - w * wd * lr
LOSS_OPS_PER_STEP = 2  # the batch mean's division and the upstream gradient 1/N

WEIGHTED_OPS = frozenset({"conv", "dwconv", "dense", "bn"})


class LayerCostDict(TypedDict):
    """A :class:`LayerCost` as JSON holds it."""

    node_id: int
    label: str
    op: str
    output_shape: list[int]
    params: int
    macs: int
    forward: float
    backward: float
    inference: float
    per_step: float


class GraphCostDict(TypedDict):
    """A :class:`GraphCost` as JSON holds it; ``batch_size`` and ``train_per_image`` when a batch size is given."""

    forward: float
    backward: float
    loss_forward: float
    loss_backward: float
    update_per_step: float
    eval_per_image: float
    macs: int
    params: int
    trainable_params: int
    batch_size: NotRequired[int]
    train_per_image: NotRequired[float]
    layers: NotRequired[list[LayerCostDict]]  # set last, so it ends the JSON object


@dataclass(frozen=True)
class LayerCost:
    """One node's operations per image (``forward`` is training mode, ``inference`` evaluation mode).

    ``per_step`` is what the node costs once per training step whatever the batch size:
    the optimizer update of its parameters and BatchNorm's per-channel statistics.
    """

    node_id: int
    label: str
    op: str
    output_shape: tuple[int, ...]
    params: int
    forward: float
    backward: float
    macs: int = 0
    inference: float = 0.0
    per_step: float = 0.0

    def to_dict(self) -> LayerCostDict:
        return {
            "node_id": self.node_id,
            "label": self.label,
            "op": self.op,
            "output_shape": list(self.output_shape),
            "params": self.params,
            "macs": self.macs,
            "forward": self.forward,
            "backward": self.backward,
            "inference": self.inference,
            "per_step": self.per_step,
        }


@dataclass(frozen=True)
class GraphCost:
    """Operation counts of one architecture: per image, per training step, and per layer."""

    layers: tuple[LayerCost, ...]
    loss_forward: float
    loss_backward: float
    params: int
    update_per_step: float
    trainable_params: int = 0

    @property
    def forward(self) -> float:
        """Training-mode forward pass per image, softmax cross-entropy included."""
        return sum(layer.forward for layer in self.layers) + self.loss_forward

    @property
    def backward(self) -> float:
        return sum(layer.backward for layer in self.layers) + self.loss_backward

    @property
    def eval_per_image(self) -> float:
        """Evaluation per image: the inference-mode forward pass plus the loss (evaluation reports it)."""
        return sum(layer.inference for layer in self.layers) + self.loss_forward

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the convolution and dense layers: the figure papers publish."""
        return sum(layer.macs for layer in self.layers)

    def train_per_image(self, batch_size: int) -> float:
        """One image's share of a training step at this batch size."""
        _check_batch_size(batch_size)
        return self.forward + self.backward + self.update_per_step / batch_size

    def to_dict(self, batch_size: int | None = None) -> GraphCostDict:
        out: GraphCostDict = {
            "forward": self.forward,
            "backward": self.backward,
            "loss_forward": self.loss_forward,
            "loss_backward": self.loss_backward,
            "update_per_step": self.update_per_step,
            "eval_per_image": self.eval_per_image,
            "macs": self.macs,
            "params": self.params,
            "trainable_params": self.trainable_params,
        }
        if batch_size is not None:
            out["batch_size"] = batch_size
            out["train_per_image"] = self.train_per_image(batch_size)
        out["layers"] = [layer.to_dict() for layer in self.layers]
        return out


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise AiperfError(f"batch size must be a positive integer, got {batch_size!r}")


def _check_images(*counts: int) -> None:
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise AiperfError(f"image counts must be non-negative integers, got {count!r}")


def _elements(shape: Shape) -> int:
    return math.prod(shape)


def _gradient_flows(graph: Graph) -> dict[int, bool]:
    """Which nodes' outputs need a gradient: those that depend on a trainable weight."""
    flows: dict[int, bool] = {}
    for n in graph.nodes:
        flows[n.id] = n.op in WEIGHTED_OPS or any(flows[i] for i in n.inputs)
    return flows


def _weighted_cost(graph: Graph, n: Node, input_grad: bool) -> tuple[int, float, float, float, int]:
    """(macs, forward, backward, per_step, trainable) of a convolution, depthwise convolution or dense layer."""
    kernel, *bias = graph.weight_shapes(n.id)
    out = graph.shape(n.id)
    macs = _elements(out[:-1]) * _elements(kernel)
    bias_ops = _elements(out) if bias else 0
    forward = MAC_OPS * macs + bias_ops
    backward = MAC_OPS * macs + bias_ops + (MAC_OPS * macs if input_grad else 0)
    params = _elements(kernel) + sum(_elements(s) for s in bias)
    per_step = SGD_NESTEROV_OPS_PER_PARAM * params + WEIGHT_DECAY_OPS_PER_KERNEL_PARAM * _elements(kernel)
    return macs, forward, backward, per_step, params


def _layer_cost(graph: Graph, n: Node, flows: dict[int, bool]) -> tuple[LayerCost, int]:
    """The node's cost (without gradient fan-in) and its trainable parameter count."""
    a, out = n.attrs, graph.shape(n.id)
    e_out = _elements(out)
    input_grad = bool(n.inputs) and flows[n.inputs[0]]
    macs = trainable = 0
    forward = backward = per_step = 0.0
    inference: float | None = None  # None: same as the training forward
    if n.op in ("conv", "dwconv", "dense"):
        macs, forward, backward, per_step, trainable = _weighted_cost(graph, n, input_grad)
    elif n.op == "bn":
        channels = out[-1]
        forward = BN_FORWARD_PER_ELEMENT * e_out
        inference = BN_INFERENCE_PER_ELEMENT * e_out
        backward = (BN_PARAM_GRAD_PER_ELEMENT + (BN_INPUT_GRAD_PER_ELEMENT if input_grad else 0)) * e_out
        trainable = 2 * channels  # gamma, beta; the moving statistics are not trained
        statistics = BN_FORWARD_PER_CHANNEL + BN_PARAM_GRAD_PER_CHANNEL
        statistics += BN_INPUT_GRAD_PER_CHANNEL if input_grad else 0
        per_step = SGD_NESTEROV_OPS_PER_PARAM * trainable + statistics * channels
    elif n.op == "act":
        fwd, bwd = ACTIVATION_OPS[a["fn"]]
        forward, backward = fwd * e_out, (bwd * e_out if input_grad else 0)
    elif n.op == "pool":
        window = a["size"][0] * a["size"][1]
        forward = (window if a["mode"] == "max" else window + 1) * e_out  # compares | sums and a scale
        backward = (window + 1) * e_out if input_grad else 0  # locate and route | scale and spread
    elif n.op == "gpool":
        h, w, c = graph.input_shape_of(n.id)
        forward = h * w * c if a["mode"] == "max" else (h * w + 1) * c
        backward = (h * w + 1) * c if input_grad else 0
    elif n.op == "add":
        forward = (len(n.inputs) - 1) * e_out
    elif n.op == "dropout" and a["rate"] > 0:
        forward = DROPOUT_FORWARD_PER_ELEMENT * e_out
        inference = 0.0
        backward = DROPOUT_BACKWARD_PER_ELEMENT * e_out if input_grad else 0
    # input, concat, flatten, reshape, zeropad and a zero-rate dropout move data only.
    params = sum(_elements(s) for s in graph.weight_shapes(n.id))
    cost = LayerCost(
        node_id=n.id,
        label=n.label,
        op=n.op,
        output_shape=tuple(out),
        params=params,
        forward=float(forward),
        backward=float(backward),
        macs=macs,
        inference=float(forward if inference is None else inference),
        per_step=float(per_step),
    )
    return cost, trainable


def softmax_cross_entropy_ops(num_classes: int) -> tuple[int, int]:
    """(forward, backward) per image of the sparse softmax cross-entropy on K logits.

    Forward: max (K), shift (K), exp (K), sum (K), log (1), minus the true logit (1),
    accumulate into the batch mean (1). Backward: p = e / S (K), p_y - 1 (1), * 1/N (K).
    """
    k = num_classes
    return 4 * k + 3, 2 * k + 1


def count_flops(graph: Graph) -> GraphCost:
    """Forward, backward and per-step operation counts of training ``graph`` (docs/flops.md)."""
    flows = _gradient_flows(graph)
    layers: list[LayerCost] = []
    trainable = 0
    for n in graph.nodes:
        fan_in = max(graph.consumer_count(n.id) - 1, 0) if flows[n.id] else 0
        # A layer's count depends on the node, its input and output shapes, whether its input needs a gradient
        # and how many gradients it sums; a morph child shares its unchanged nodes with its parent, whose
        # counts are then remembered (Node.recall).
        in_shape = graph.shape(n.inputs[0]) if n.inputs else ()
        given = (in_shape, graph.shape(n.id), bool(n.inputs) and flows[n.inputs[0]], fan_in)
        known = n.recall("flops", given)
        if known is None:
            cost, node_trainable = _layer_cost(graph, n, flows)
            if fan_in:  # gradients arriving from several consumers are summed
                cost = replace(cost, backward=cost.backward + fan_in * _elements(cost.output_shape))
            known = n.remember("flops", given, (cost, node_trainable))
        cost, node_trainable = known
        trainable += node_trainable
        layers.append(cost)
    loss_forward, loss_backward = softmax_cross_entropy_ops(graph.num_classes)
    update = sum(layer.per_step for layer in layers) + LOSS_OPS_PER_STEP
    return GraphCost(
        tuple(layers), float(loss_forward), float(loss_backward), graph.param_count, float(update), trainable
    )


class FlopsMemo:
    """:func:`count_flops` remembered per architecture, for the master's hot path.

    The master counts every proposal twice (the search's FLOPs limit, then the trial's record)
    and a re-tune repeats an architecture: at thousands of trials a minute the count (about
    0.7 ms for a 30-layer net) is a large share of a proposal's cost. A count depends on the
    architecture (``Graph.key``, which leaves dropout rates out) and on which dropout layers
    have a rate above zero (those cost operations, whatever the rate), so a graph whose
    dropout layers share one rate is remembered under (key, rate > 0); any other graph is
    counted afresh. At most ``capacity`` counts are kept (least recently used out; a count of a
    30-layer net holds about 6 KB).
    """

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._costs: OrderedDict[tuple[str, bool], GraphCost] = OrderedDict()

    @staticmethod
    def _key(graph: Graph) -> tuple[str, bool] | None:
        """(architecture, whether its dropout layers drop); None when its dropout layers disagree (not kept)."""
        dropping = {n.attrs["rate"] > 0 for n in graph.nodes if n.op == "dropout"}
        if len(dropping) > 1:
            return None
        return graph.key(), dropping == {True}

    def __call__(self, graph: Graph) -> GraphCost:
        key = self._key(graph)
        if key is None:
            return count_flops(graph)
        cost = self._costs.get(key)
        if cost is None:
            cost = self._costs[key] = count_flops(graph)
            if len(self._costs) > self.capacity:
                self._costs.popitem(last=False)
        else:
            self._costs.move_to_end(key)
        return cost

    def peek(self, graph: Graph) -> GraphCost | None:
        """The remembered count of ``graph``, if any (without counting)."""
        key = self._key(graph)
        return None if key is None else self._costs.get(key)

    def adopt(self, graph: Graph, cost: GraphCost) -> None:
        """Remember ``cost`` for ``graph``: a count another process made (the start-up expansion pool)."""
        key = self._key(graph)
        if key is not None:
            self._costs[key] = cost
            self._costs.move_to_end(key)
            if len(self._costs) > self.capacity:
                self._costs.popitem(last=False)


count_flops_memo = FlopsMemo()  # one per process: the search's limit and the master's record share counts


class TrainFlopsPerImage:
    """The search's FLOPs limit: training operations per image at the plan's batch size.

    A class, not a closure, so that the start-up expansion processes can be handed it; a count
    made there travels back (``carry``/``adopt``) to this process's memo, where the trial's
    record finds it.
    """

    def __init__(self, batch_size: int) -> None:
        _check_batch_size(batch_size)
        self.batch_size = batch_size

    def __call__(self, graph: Graph) -> float:
        return count_flops_memo(graph).train_per_image(self.batch_size)

    def carry(self, graph: Graph) -> GraphCost | None:
        return count_flops_memo.peek(graph)

    def adopt(self, graph: Graph, cost: GraphCost) -> None:
        count_flops_memo.adopt(graph, cost)


def epoch_operations(cost: GraphCost, train_images: int, eval_images: int, batch_size: int) -> tuple[float, float]:
    """(train ops, eval ops) of one epoch: every image forward and backward, one update per step."""
    _check_batch_size(batch_size)
    _check_images(train_images, eval_images)
    steps = math.ceil(train_images / batch_size)
    train = train_images * (cost.forward + cost.backward) + steps * cost.update_per_step
    return float(train), float(eval_images * cost.eval_per_image)


# --- AIPerf's conventions (scripts/reports/profiler.py of AI-HPC-Research-Team/AIPerf) ---------------------

# AIPerf weighted operations by latency: add, mul, compare 1; MAC 2; divide 4; exp 8.
_AIPERF_BN_BACKWARD = 36.0  # (29 * image_num + 7) / image_num * image_num with image_num = 1: a constant per layer


def aiperf_compatible_per_image(graph: Graph) -> tuple[float, float]:
    """(eval, train) operations per image as AIPerf's profiler counted them (docs/flops.md, "AIPerf").

    AIPerf: eval = forward; train = forward + backward, where the backward of a convolution
    or dense layer also carries 2 operations per weight for the update (per image, not per step).
    """
    forward = backward = 0.0
    first_conv = True
    for n in graph.nodes:
        a, out = n.attrs, graph.shape(n.id)
        in_shape = graph.input_shape_of(n.id)
        if n.op in ("conv", "dwconv"):
            weights = _elements(graph.weight_shapes(n.id)[0])  # the kernel; AIPerf's formula has no bias term
            positions = out[0] * out[1]
            forward += 2 * positions * weights
            backward += weights * ((2 if first_conv else 4) * positions + 2)
            first_conv = False
        elif n.op == "dense":
            d_in, d_out = in_shape[0], a["units"]
            forward += 2 * d_in * d_out
            backward += 4 * d_in * d_out + 2 * (d_in + 1) * d_out
            forward += 8 * d_out + (d_out - 1) + 4 * d_out  # a softmax after every dense layer: exp 8, add, div 4
        elif n.op == "bn":
            forward += 7 * _elements(in_shape)  # mul-add 2 + add 1 + divide 4
            backward += _AIPERF_BN_BACKWARD
        elif n.op == "act":
            forward += _elements(in_shape)  # counted as ReLU: one compare
        elif n.op == "pool":
            (kh, kw), (sh, sw) = a["size"], a["strides"]
            forward += _elements(in_shape) * kh * kw / (sh * sw)
        elif n.op == "gpool":
            h, w, c = in_shape
            forward += (h * w - 1) * c + c
        elif n.op == "add":
            forward += (len(n.inputs) - 1) * _elements(in_shape)
    return forward, forward + backward


def aiperf_compatible_operations(graph: Graph, train_images: int, eval_images: int) -> float:
    """One epoch counted as AIPerf's score.py did: train_images * train + eval_images * eval per image."""
    _check_images(train_images, eval_images)
    eval_per_image, train_per_image = aiperf_compatible_per_image(graph)
    return float(train_images * train_per_image + eval_images * eval_per_image)


# --- presentation ------------------------------------------------------------------------------------------


def _integer(value: float) -> str:
    return f"{round(value):,}"


def format_table(cost: GraphCost, batch_size: int | None = None) -> str:
    """Per-layer table (layer, output shape, params, forward, backward per image), then the totals."""
    from aiperf.metrics.score import format_ops

    header = ("layer", "output shape", "params", "forward", "backward")
    rows = [
        (
            layer.label,
            "x".join(map(str, layer.output_shape)),
            _integer(layer.params),
            _integer(layer.forward),
            _integer(layer.backward),
        )
        for layer in cost.layers
    ]
    rows.append(("softmax cross-entropy", "", "", _integer(cost.loss_forward), _integer(cost.loss_backward)))
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) if k < 2 else c.rjust(w) for k, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    totals = [
        ("forward per image (training)", cost.forward),
        ("backward per image", cost.backward),
        ("evaluation per image", cost.eval_per_image),
        ("update per step", cost.update_per_step),
    ]
    if batch_size is not None:
        totals.append((f"training per image at batch {batch_size}", cost.train_per_image(batch_size)))
    totals.append(("conv + dense multiply-adds", float(cost.macs)))
    lines.append("")
    label_width = max(len(t[0]) for t in totals)
    for label, value in totals:
        lines.append(f"{label.ljust(label_width)}  {_integer(value):>20}  {format_ops(value, 'ops')}")
    lines.append(
        f"{'parameters'.ljust(label_width)}  {_integer(cost.params):>20}  ({_integer(cost.trainable_params)} trainable)"
    )
    return "\n".join(lines)
