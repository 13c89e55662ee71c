"""A plain NumPy forward pass (inference mode) over a graph, and random weights for one.

It exists so that the search package can prove its morphisms function-preserving in
milliseconds without a deep-learning framework, and so the framework builder can be
checked against an independent implementation. It follows Keras semantics exactly
(channels-last, TensorFlow's "same" padding split, average pooling that ignores padding).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from nas.graph import Graph

Weights = dict[int, list[np.ndarray]]


def init_weights(graph: Graph, rng: np.random.Generator | int | None = None) -> Weights:
    """He-normal kernels, small random biases and non-trivial BatchNorm statistics."""
    rng = np.random.default_rng(rng)
    weights: Weights = {}
    for n in graph.nodes:
        shapes = graph.weight_shapes(n.id)
        if not shapes:
            continue
        if n.op == "bn":
            c = shapes[0][0]
            weights[n.id] = [
                rng.uniform(0.5, 1.5, c).astype(np.float32),
                rng.normal(0, 0.1, c).astype(np.float32),
                rng.normal(0, 0.1, c).astype(np.float32),
                rng.uniform(0.5, 1.5, c).astype(np.float32),
            ]
            continue
        kernel = shapes[0]
        fan_in = math.prod(kernel[:-1]) if n.op != "dwconv" else kernel[0] * kernel[1]
        arrays = [(rng.standard_normal(kernel) * math.sqrt(2.0 / fan_in)).astype(np.float32)]
        arrays += [rng.normal(0, 0.05, s).astype(np.float32) for s in shapes[1:]]
        weights[n.id] = arrays
    return weights


def _same_pads(size: int, k: int, s: int) -> tuple[int, int]:
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def _windows(x: np.ndarray, kh: int, kw: int, sh: int, sw: int, padding: str, fill: float = 0.0):
    """Sliding windows (N, Ho, Wo, C, kh, kw) and a validity mask for average pooling."""
    _, h, w, _ = x.shape
    if padding == "same":
        (pt, pb), (pl, pr) = _same_pads(h, kh, sh), _same_pads(w, kw, sw)
    else:
        pt = pb = pl = pr = 0
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=fill)
    mask = np.pad(np.ones((1, h, w, 1), x.dtype), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    win = sliding_window_view(xp, (kh, kw), axis=(1, 2))[:, ::sh, ::sw]
    mwin = sliding_window_view(mask, (kh, kw), axis=(1, 2))[:, ::sh, ::sw]
    return win, mwin


def _act(fn: str, x: np.ndarray) -> np.ndarray:
    if fn == "relu":
        return np.maximum(x, 0)
    if fn == "relu6":
        return np.clip(x, 0, 6)
    if fn == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if fn == "hard_sigmoid":
        return np.clip(x + 3, 0, 6) / 6
    if fn == "tanh":
        return np.tanh(x)
    if fn == "swish":
        return x / (1 + np.exp(-x))
    if fn == "gelu":
        from scipy.special import erf

        return 0.5 * x * (1 + erf(x / math.sqrt(2)))
    if fn == "softmax":
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    return x


def forward(graph: Graph, weights: Weights, x: np.ndarray) -> np.ndarray:
    """Logits of ``graph`` for a batch ``x`` (inference mode: BN uses moving statistics)."""
    values: dict[int, np.ndarray] = {}
    for n in graph.nodes:
        a = n.attrs
        ins = [values[i] for i in n.inputs]
        if n.op == "input":
            y = x.astype(np.float64)
        elif n.op == "conv":
            (kh, kw), (sh, sw), g = a["kernel"], a["strides"], a["groups"]
            win, _ = _windows(ins[0], kh, kw, sh, sw, a["padding"])
            kernel = weights[n.id][0].astype(np.float64)
            cin = ins[0].shape[-1] // g
            cout = kernel.shape[-1] // g
            parts = [
                np.einsum(
                    "nhwcij,ijcf->nhwf", win[:, :, :, k * cin : (k + 1) * cin], kernel[..., k * cout : (k + 1) * cout]
                )
                for k in range(g)
            ]
            y = np.concatenate(parts, axis=-1)
            if a["use_bias"]:
                y = y + weights[n.id][1]
        elif n.op == "dwconv":
            (kh, kw), (sh, sw) = a["kernel"], a["strides"]
            win, _ = _windows(ins[0], kh, kw, sh, sw, a["padding"])
            kernel = weights[n.id][0].astype(np.float64)
            y = np.einsum("nhwcij,ijcm->nhwcm", win, kernel).reshape(*win.shape[:3], -1)
            if a["use_bias"]:
                y = y + weights[n.id][1]
        elif n.op == "bn":
            gamma, beta, mean, var = (w.astype(np.float64) for w in weights[n.id])
            y = (ins[0] - mean) / np.sqrt(var + a["epsilon"]) * gamma + beta
        elif n.op == "act":
            y = _act(a["fn"], ins[0])
        elif n.op == "pool":
            (kh, kw), (sh, sw) = a["size"], a["strides"]
            if a["mode"] == "max":
                win, _ = _windows(ins[0], kh, kw, sh, sw, a["padding"], fill=-np.inf)
                y = win.max(axis=(-2, -1))
            else:
                win, mwin = _windows(ins[0], kh, kw, sh, sw, a["padding"])
                y = win.sum(axis=(-2, -1)) / mwin.sum(axis=(-2, -1))
        elif n.op == "gpool":
            red = (
                ins[0].max(axis=(1, 2), keepdims=a["keepdims"])
                if a["mode"] == "max"
                else ins[0].mean(axis=(1, 2), keepdims=a["keepdims"])
            )
            y = red
        elif n.op == "dense":
            y = ins[0] @ weights[n.id][0].astype(np.float64)
            if a["use_bias"]:
                y = y + weights[n.id][1]
        elif n.op == "dropout":
            y = ins[0]
        elif n.op == "add":
            y = sum(ins[1:], ins[0])
        elif n.op == "concat":
            y = np.concatenate(ins, axis=-1)
        elif n.op == "flatten":
            y = ins[0].reshape(ins[0].shape[0], -1)
        elif n.op == "zeropad":
            t, b, left, r = a["pad"]
            y = np.pad(ins[0], ((0, 0), (t, b), (left, r), (0, 0)))
        elif n.op == "reshape":
            y = ins[0].reshape(ins[0].shape[0], *a["shape"])
        else:  # pragma: no cover - OP_ATTRS is closed
            raise AssertionError(n.op)
        values[n.id] = y
    return values[graph.output_node.id]
