"""A decoder-only transformer language model as a framework-free architecture description.

The image search describes networks as DAGs of layers (:mod:`nas.graph`); a language model
is a stack of identical-in-kind blocks whose interesting knobs are sizes, so it gets its own
small description, :class:`TransformerSpec`, and its own morphisms
(:mod:`nas.language.morph`).

The model (pre-norm, bias-free, learned positions)::

    x = tok_emb[tokens] + pos_emb[:T]
    for each block:  x += Attn(RMSNorm(x))    causal, heads[b] heads of head_dim each
                     x += MLP(RMSNorm(x))     width -> mlp_hidden[b] -> width, GELU
    logits = RMSNorm(x) @ (tok_emb.T if tied_output else out)

Attention projects ``width -> heads*head_dim`` (q, k, v) and back (o), so the residual
width need not equal ``heads * head_dim`` and blocks may differ in heads and MLP width
after morphs. Layers have no biases: fewer special cases for the morphs, as in most
current LMs.

Why RMSNorm (``g * x / sqrt(mean(x**2) + eps)``) and not LayerNorm: ``wider_model``
zero-pads the residual stream. Padding scales ``mean(x**2)`` by exactly ``old/new``, so
rescaling the gain by ``sqrt(old/new)`` and ``eps`` by ``old/new`` leaves every normalised
old coordinate unchanged and the new ones zero. LayerNorm also subtracts the mean, which
padding shifts by a different amount for every token: no per-feature rescale undoes that.

GELU is the tanh approximation (GPT-2's, Keras ``gelu(approximate=True)``, PyTorch
``approximate="tanh"``): it needs nothing beyond NumPy here.

Every field is checked against a hard cap (the ``MAX_*`` constants) and the exact parameter
count against ``MAX_PARAMS`` in plain integer arithmetic before anything is allocated, so a
hostile description fails with one :class:`NasError` naming the field.
"""

from __future__ import annotations

import hashlib
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from nas.errors import NasError
from nas.graph import short_repr

Weights = dict[str, np.ndarray]

FORMAT = "aiperf-transformer"
VERSION = 1
SUPPORTED_VERSIONS = (1,)
NORMS = ("rmsnorm",)

# Hard caps that keep a hostile or absurd description from reaching a framework.
MAX_VOCAB = 1 << 20
MAX_SEQ_LEN = 1 << 17
MAX_WIDTH = 1 << 16
MAX_HEADS = 1 << 10
MAX_HEAD_DIM = 1 << 10
MAX_MLP_HIDDEN = 1 << 18
MAX_BLOCKS = 1 << 10
MAX_PARAMS = 1 << 38

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _int(name: str, value: object, lo: int, hi: int) -> int:
    """``value`` as a Python int in [lo, hi] (NumPy integers accepted; bools, floats and strings refused)."""
    if isinstance(value, bool):
        raise NasError(f"transformer: {name} must be an integer, got {short_repr(value)}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise NasError(f"transformer: {name} must be an integer, got {short_repr(value)}") from None
    if not lo <= number <= hi:
        raise NasError(f"transformer: {name} must be between {lo} and {hi}, got {short_repr(number)}")
    return number


def _int_list(name: str, value: object, lo: int, hi: int) -> tuple[int, ...]:
    """A per-block list as a tuple; its length is checked before any element is looked at."""
    if not isinstance(value, (list, tuple)):
        raise NasError(f"transformer: {name} must be a list of integers (one per block), got {short_repr(value)}")
    if not 1 <= len(value) <= MAX_BLOCKS:
        raise NasError(f"transformer: {name} must list 1 to {MAX_BLOCKS} blocks, got {len(value)}")
    return tuple(_int(f"{name}[{k}]", v, lo, hi) for k, v in enumerate(value))


@dataclass(frozen=True)
class TransformerSpec:
    """A decoder-only LM; ``heads[b]`` and ``mlp_hidden[b]`` size block ``b`` (their length is the depth)."""

    vocab_size: int
    seq_len: int
    width: int
    head_dim: int
    heads: tuple[int, ...]
    mlp_hidden: tuple[int, ...]
    tied_output: bool = True
    norm: str = "rmsnorm"
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "vocab_size", _int("vocab_size", self.vocab_size, 2, MAX_VOCAB))
        put(self, "seq_len", _int("seq_len", self.seq_len, 1, MAX_SEQ_LEN))
        put(self, "width", _int("width", self.width, 1, MAX_WIDTH))
        put(self, "head_dim", _int("head_dim", self.head_dim, 1, MAX_HEAD_DIM))
        put(self, "heads", _int_list("heads", self.heads, 1, MAX_HEADS))
        put(self, "mlp_hidden", _int_list("mlp_hidden", self.mlp_hidden, 1, MAX_MLP_HIDDEN))
        if len(self.heads) != len(self.mlp_hidden):
            raise NasError(
                f"transformer: heads and mlp_hidden must list the same blocks, "
                f"got {len(self.heads)} and {len(self.mlp_hidden)}"
            )
        if not isinstance(self.tied_output, bool):
            raise NasError(f"transformer: tied_output must be true or false, got {short_repr(self.tied_output)}")
        if not isinstance(self.norm, str) or self.norm not in NORMS:
            raise NasError(f"transformer: norm must be one of {', '.join(NORMS)}, got {short_repr(self.norm)}")
        eps = self.norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps <= 1:  # NaN fails 0 < eps
            raise NasError(f"transformer: norm_eps must be a number in (0, 1], got {short_repr(eps)}")
        put(self, "norm_eps", float(eps))
        params = self.params()
        if params > MAX_PARAMS:
            raise NasError(f"transformer: parameter count {params} exceeds MAX_PARAMS={MAX_PARAMS}")

    @property
    def n_blocks(self) -> int:
        return len(self.heads)

    def inner(self, block: int) -> int:
        """Width of block ``block``'s attention (``heads * head_dim``)."""
        return self.heads[block] * self.head_dim

    def params(self) -> int:
        """Exact parameter count (closed form, no allocation)."""
        d, hd = self.width, self.head_dim
        blocks = sum(2 * d + 4 * d * h * hd + 2 * d * f for h, f in zip(self.heads, self.mlp_hidden, strict=True))
        out = 0 if self.tied_output else d * self.vocab_size
        return (self.vocab_size + self.seq_len) * d + blocks + d + out

    def non_embedding_params(self) -> int:
        """Parameters of the blocks and the final norm: Kaplan et al.'s N (embeddings and unembedding left out)."""
        out = 0 if self.tied_output else self.width * self.vocab_size
        return self.params() - (self.vocab_size + self.seq_len) * self.width - out

    def key(self) -> str:
        """A digest equal for equal architectures (every field counts: they all change the function)."""
        text = (
            f"lm;v={self.vocab_size};t={self.seq_len};d={self.width};hd={self.head_dim};"
            f"h={','.join(map(str, self.heads))};f={','.join(map(str, self.mlp_hidden))};"
            f"tied={int(self.tied_output)};norm={self.norm};eps={self.norm_eps!r}"
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight's name and shape, in the naming scheme of :func:`init_weights`."""
        d, v = self.width, self.vocab_size
        shapes: dict[str, tuple[int, ...]] = {"tok_emb": (v, d), "pos_emb": (self.seq_len, d)}
        for b, f in enumerate(self.mlp_hidden):
            inner, p = self.inner(b), f"blocks.{b}."
            shapes.update(
                {
                    p + "attn_norm": (d,),
                    p + "wq": (d, inner),
                    p + "wk": (d, inner),
                    p + "wv": (d, inner),
                    p + "wo": (inner, d),
                    p + "mlp_norm": (d,),
                    p + "w_up": (d, f),
                    p + "w_down": (f, d),
                }
            )
        shapes["final_norm"] = (d,)
        if not self.tied_output:
            shapes["out"] = (d, v)
        return shapes

    def describe(self) -> str:
        return (
            f"LM {self.n_blocks} blocks, width {self.width}, heads {list(self.heads)}x{self.head_dim}, "
            f"mlp {list(self.mlp_hidden)}, vocab {self.vocab_size}, seq {self.seq_len}, "
            f"{'tied' if self.tied_output else 'untied'}, {self.params()} params"
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready document of this spec (what :meth:`from_dict` reads back)."""
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        body["heads"], body["mlp_hidden"] = list(self.heads), list(self.mlp_hidden)
        return {"format": FORMAT, "version": VERSION, **body}

    @classmethod
    def from_dict(cls, data: Any) -> TransformerSpec:
        """Validate a decoded JSON document; anything malformed or unknown raises NasError."""
        if not isinstance(data, Mapping):
            raise NasError(f"transformer: expected a JSON object, got {type(data).__name__}")
        fmt = data.get("format")
        if not isinstance(fmt, str) or fmt != FORMAT:
            raise NasError(f"transformer: 'format' must be {FORMAT!r}, got {short_repr(fmt)}")
        version = data.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version not in SUPPORTED_VERSIONS:
            raise NasError(f"transformer: unsupported version {short_repr(version)} (supported: {SUPPORTED_VERSIONS})")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - {"format", "version", *names}, key=str)
        if unknown:
            raise NasError(f"transformer: unknown key {short_repr(unknown[0])}")
        required = ("vocab_size", "seq_len", "width", "head_dim", "heads", "mlp_hidden")
        missing = [name for name in required if name not in data]
        if missing:
            raise NasError(f"transformer: missing key {missing[0]!r}")
        return cls(**{name: data[name] for name in names if name in data})


def seed_spec() -> TransformerSpec:
    """The search's starting point: a 2-block byte-level model (width 128, 4 heads of 32, MLP 512)."""
    return TransformerSpec(vocab_size=256, seq_len=128, width=128, head_dim=32, heads=(4, 4), mlp_hidden=(512, 512))


# --- reference weights and forward pass ---------------------------------------------------------------


def init_weights(
    spec: TransformerSpec, rng: np.random.Generator | int | None = None, dtype: Any = np.float32
) -> Weights:
    """Fresh weights named as in :meth:`TransformerSpec.weight_shapes`.

    Names: ``tok_emb`` (vocab, width), ``pos_emb`` (seq_len, width), per block ``b``
    ``blocks.b.attn_norm`` (width), ``blocks.b.wq|wk|wv`` (width, heads*head_dim),
    ``blocks.b.wo`` (heads*head_dim, width), ``blocks.b.mlp_norm`` (width),
    ``blocks.b.w_up`` (width, mlp_hidden), ``blocks.b.w_down`` (mlp_hidden, width), then
    ``final_norm`` (width) and, untied only, ``out`` (width, vocab). Matrices are
    ``x @ W`` (rows read, columns write). Embeddings are N(0, 0.02), matrices N(0, 1/fan_in),
    norm gains one.
    """
    if not isinstance(spec, TransformerSpec):
        raise NasError(f"expected a TransformerSpec, got {type(spec).__name__}")
    rng = np.random.default_rng(rng)
    weights: Weights = {}
    for name, shape in spec.weight_shapes().items():
        if len(shape) == 1:
            weights[name] = np.ones(shape, dtype)
        elif name.endswith("_emb"):
            weights[name] = (rng.standard_normal(shape) * 0.02).astype(dtype)
        else:
            weights[name] = (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(dtype)
    return weights


def check_weights(spec: TransformerSpec, weights: Any) -> None:
    """Raise NasError unless ``weights`` holds exactly the weights of ``spec`` with their shapes."""
    if not isinstance(weights, Mapping):
        raise NasError(f"transformer weights must be a mapping of name to array, got {type(weights).__name__}")
    shapes = spec.weight_shapes()
    extra = sorted(set(weights) - set(shapes), key=str)
    if extra:
        raise NasError(f"transformer weights do not fit the spec: unexpected {short_repr(extra[0])}")
    for name, shape in shapes.items():
        if name not in weights:
            raise NasError(f"transformer weights do not fit the spec: {name} is missing")
        got = tuple(np.shape(weights[name]))
        if got != shape:
            raise NasError(f"transformer weights do not fit the spec: {name} needs shape {shape}, got {got}")


def rms_norm(x: np.ndarray, gain: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gain


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation."""
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


def _check_tokens(spec: TransformerSpec, tokens: Any) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.dtype == np.bool_ or not np.issubdtype(tokens.dtype, np.integer):
        raise NasError(f"tokens must be an integer array, got dtype {tokens.dtype}")
    if tokens.ndim != 2 or tokens.shape[0] < 1 or not 1 <= tokens.shape[1] <= spec.seq_len:
        raise NasError(f"tokens must have shape [batch, 1..{spec.seq_len}], got {tokens.shape}")
    if tokens.min() < 0 or tokens.max() >= spec.vocab_size:
        raise NasError(f"tokens must lie in [0, {spec.vocab_size}), got {tokens.min()}..{tokens.max()}")
    return tokens


def forward(spec: TransformerSpec, weights: Weights, tokens: Any) -> np.ndarray:
    """Logits [batch, seq, vocab] in float64: the reference the framework model is checked against."""
    tokens = _check_tokens(spec, tokens)
    check_weights(spec, weights)
    w = {name: np.asarray(a, np.float64) for name, a in weights.items()}
    batch, seq = tokens.shape
    hd, eps = spec.head_dim, spec.norm_eps
    x = w["tok_emb"][tokens] + w["pos_emb"][:seq]
    causal = np.tril(np.ones((seq, seq), dtype=bool))
    for b, heads in enumerate(spec.heads):
        p = f"blocks.{b}."
        a = rms_norm(x, w[p + "attn_norm"], eps)
        q, k, v = ((a @ w[p + n]).reshape(batch, seq, heads, hd).transpose(0, 2, 1, 3) for n in ("wq", "wk", "wv"))
        scores = np.where(causal, q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd), -np.inf)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        mixed = (scores / scores.sum(axis=-1, keepdims=True)) @ v
        x = x + mixed.transpose(0, 2, 1, 3).reshape(batch, seq, heads * hd) @ w[p + "wo"]
        m = rms_norm(x, w[p + "mlp_norm"], eps)
        x = x + gelu(m @ w[p + "w_up"]) @ w[p + "w_down"]
    x = rms_norm(x, w["final_norm"], eps)
    return x @ (w["tok_emb"].T if spec.tied_output else w["out"])
