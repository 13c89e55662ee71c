"""Function-preserving morphisms of a :class:`~nas.language.spec.TransformerSpec` language model.

Four operators grow the model; each child computes exactly the parent's logits (to rounding)
because every new path into the residual stream or the logits starts at zero:

* ``deeper(at)``         inserts a block at position ``at`` whose attention output ``wo`` and MLP
  output ``w_down`` are zero, so it adds nothing to the stream; its other weights are
  random (so ``wo``/``w_down`` get non-zero gradients at once) and its norm gains one.
* ``wider_mlp(block)``   appends hidden units with random input columns and zero output rows.
* ``more_heads(block)``  appends heads with random q/k/v columns and zero ``wo`` rows; the old
  heads' softmax is per head, so they are untouched.
* ``wider_model(width)`` zero-pads the residual stream. Writers of the stream (token and
  position embeddings, every ``wo`` and ``w_down``) get zero new columns, so the new stream
  coordinates stay exactly zero through the whole network. Padding scales each RMSNorm's
  ``mean(x**2)`` by ``old/new``; rescaling every gain by ``sqrt(old/new)`` *and* ``norm_eps``
  by ``old/new`` makes ``g' * x / sqrt(mean' + eps')`` equal the old normalised values on
  the old coordinates (exact in real arithmetic), and zero on the new ones whatever their
  gain. Readers of the normalised stream (q/k/v, ``w_up``, an untied ``out``) may take
  random new rows: they multiply exact zeros. A tied output reads ``tok_emb``, whose new
  columns are zero. Without the ``eps`` rescale the function is preserved only when
  ``eps == 0``; the relative change is about ``eps * (1 - old/new) / mean(x**2)``.

Each operator has a spec-only form for the search (:func:`apply_spec_morph` with a
:class:`LMMorph`), and validates the child spec, the caps included, before checking the
parent's weights and allocating the child's. Weights come back as a new dict; arrays a
morph does not change are shared with the parent (never written), new arrays take the
dtype of the tensor they extend.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from nas.errors import NasError
from nas.graph import short_repr
from nas.language.spec import (
    MAX_HEADS,
    MAX_MLP_HIDDEN,
    MAX_WIDTH,
    TransformerSpec,
    Weights,
    check_weights,
)

KINDS = ("deeper", "wider_mlp", "more_heads", "wider_model")
Accept = Callable[[TransformerSpec], bool]
RngLike = np.random.Generator | int | None
# Weights that read the (normalised) residual stream, by name suffix, and those that write it.
_READERS = (".wq", ".wk", ".wv", ".w_up")
_WRITERS = (".wo", ".w_down")


def _number(where: str, name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool):
        raise NasError(f"{where}: {name} must be an integer, got {short_repr(value)}")
    try:
        number = operator.index(value)
    except TypeError:
        raise NasError(f"{where}: {name} must be an integer, got {short_repr(value)}") from None
    if not lo <= number <= hi:
        raise NasError(f"{where}: {name} must be between {lo} and {hi}, got {short_repr(number)}")
    return number


def _spec(spec: Any) -> TransformerSpec:
    if not isinstance(spec, TransformerSpec):
        raise NasError(f"expected a TransformerSpec, got {type(spec).__name__}")
    return spec


@dataclass(frozen=True)
class LMMorph:
    """One morph request: ``block`` is the insert position (deeper) or the block changed, ``size`` the new size.

    ``wider_model`` takes no block; ``deeper`` takes no size (the new block copies the sizes
    of the block before it, or of block 0 when inserted first).
    """

    kind: str
    block: int | None = None
    size: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in KINDS:
            raise NasError(f"morph: unknown kind {short_repr(self.kind)} (known: {', '.join(KINDS)})")
        where = f"morph {self.kind}"
        if self.kind == "wider_model":
            if self.block is not None:
                raise NasError(f"{where}: takes no block, got {short_repr(self.block)}")
        else:
            object.__setattr__(self, "block", _number(where, "block", self.block, 0, 1 << 40))
        if self.kind == "deeper" and self.size != 0:
            raise NasError(f"{where}: takes no size, got {short_repr(self.size)}")
        object.__setattr__(self, "size", _number(where, "size", self.size, 0, 1 << 40))

    def describe(self) -> str:
        if self.kind == "deeper":
            return f"deeper: zero-output block inserted at position {self.block}"
        if self.kind == "wider_mlp":
            return f"wider_mlp: block {self.block} MLP to {self.size} hidden units (new outputs zero)"
        if self.kind == "more_heads":
            return f"more_heads: block {self.block} to {self.size} heads (new wo rows zero)"
        return f"wider_model: residual width to {self.size} (zero-padded, norms rescaled)"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "block": self.block, "size": self.size}

    @classmethod
    def from_dict(cls, data: Any) -> LMMorph:
        if not isinstance(data, Mapping):
            raise NasError(f"morph must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"kind", "block", "size"}, key=str)
        if unknown:
            raise NasError(f"morph: unknown key {short_repr(unknown[0])}")
        if "kind" not in data:
            raise NasError("morph: needs 'kind'")
        return cls(data["kind"], data.get("block"), data.get("size", 0))


# --- child specs (no weights) -------------------------------------------------------------------------


def _deeper_spec(spec: TransformerSpec, at: int, heads: int | None, hidden: int | None) -> TransformerSpec:
    at = _number("morph deeper", "at", at, 0, spec.n_blocks)
    like = max(at - 1, 0)
    h = spec.heads[like] if heads is None else heads
    f = spec.mlp_hidden[like] if hidden is None else hidden
    return replace(
        spec,
        heads=(*spec.heads[:at], h, *spec.heads[at:]),
        mlp_hidden=(*spec.mlp_hidden[:at], f, *spec.mlp_hidden[at:]),
    )


def _grow_block(spec: TransformerSpec, kind: str, field: str, block: int, size: int) -> TransformerSpec:
    where = f"morph {kind}"
    block = _number(where, "block", block, 0, spec.n_blocks - 1)
    values: tuple[int, ...] = getattr(spec, field)
    size = _number(where, field, size, 1, 1 << 40)
    if size <= values[block]:
        raise NasError(f"{where}: new {field} must exceed block {block}'s {values[block]}, got {size}")
    grown = (*values[:block], size, *values[block + 1 :])
    return replace(spec, heads=grown) if field == "heads" else replace(spec, mlp_hidden=grown)


def _wider_model_spec(spec: TransformerSpec, width: int) -> TransformerSpec:
    width = _number("morph wider_model", "width", width, 1, 1 << 40)
    if width <= spec.width:
        raise NasError(f"morph wider_model: new width must exceed {spec.width}, got {width}")
    return replace(spec, width=width, norm_eps=spec.norm_eps * spec.width / width)


def apply_spec_morph(spec: TransformerSpec, morph: LMMorph) -> TransformerSpec:
    """The child architecture of ``morph`` (what the search proposes); NasError when it does not apply."""
    spec = _spec(spec)
    if not isinstance(morph, LMMorph):
        raise NasError(f"expected an LMMorph, got {type(morph).__name__}")
    block = -1 if morph.block is None else morph.block
    if morph.kind == "deeper":
        return _deeper_spec(spec, block, None, None)
    if morph.kind == "wider_mlp":
        return _grow_block(spec, "wider_mlp", "mlp_hidden", block, morph.size)
    if morph.kind == "more_heads":
        return _grow_block(spec, "more_heads", "heads", block, morph.size)
    return _wider_model_spec(spec, morph.size)


# --- weight transforms --------------------------------------------------------------------------------


def _fresh(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, dtype: Any) -> np.ndarray:
    return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(dtype)


def _pad(a: np.ndarray, axis: int, block: np.ndarray) -> np.ndarray:
    return np.concatenate([a, block.astype(a.dtype, copy=False)], axis=axis)


def deeper(
    spec: TransformerSpec,
    weights: Weights,
    at: int,
    rng: RngLike = None,
    heads: int | None = None,
    mlp_hidden: int | None = None,
) -> tuple[TransformerSpec, Weights]:
    """Insert a block at position ``at`` (0 = first) with zero ``wo`` and ``w_down``; later blocks shift up."""
    child = _deeper_spec(_spec(spec), at, heads, mlp_hidden)
    check_weights(spec, weights)
    rng = np.random.default_rng(rng)
    at = int(at)
    dtype = np.asarray(weights["tok_emb"]).dtype
    out: Weights = {}
    for name, array in weights.items():
        if name.startswith("blocks."):
            _, b, leaf = name.split(".", 2)
            index = int(b)
            name = f"blocks.{index + 1 if index >= at else index}.{leaf}"
        out[name] = array
    d = spec.width
    for name, shape in child.weight_shapes().items():
        if not name.startswith(f"blocks.{at}."):
            continue
        if len(shape) == 1:
            out[name] = np.ones(shape, dtype)
        elif name.endswith(_WRITERS):
            out[name] = np.zeros(shape, dtype)
        else:
            out[name] = _fresh(rng, shape, d, dtype)
    return child, out


def wider_mlp(
    spec: TransformerSpec, weights: Weights, block: int, new_hidden: int, rng: RngLike = None
) -> tuple[TransformerSpec, Weights]:
    """Grow block ``block``'s MLP to ``new_hidden`` units: random input columns, zero output rows."""
    child = _grow_block(_spec(spec), "wider_mlp", "mlp_hidden", block, new_hidden)
    check_weights(spec, weights)
    rng = np.random.default_rng(rng)
    p, d = f"blocks.{block}.", spec.width
    extra = child.mlp_hidden[block] - spec.mlp_hidden[block]
    out = dict(weights)
    out[p + "w_up"] = _pad(weights[p + "w_up"], 1, _fresh(rng, (d, extra), d, np.float64))
    out[p + "w_down"] = _pad(weights[p + "w_down"], 0, np.zeros((extra, d)))
    return child, out


def more_heads(
    spec: TransformerSpec, weights: Weights, block: int, new_heads: int, rng: RngLike = None
) -> tuple[TransformerSpec, Weights]:
    """Grow block ``block`` to ``new_heads`` heads: random q/k/v columns, zero ``wo`` rows."""
    child = _grow_block(_spec(spec), "more_heads", "heads", block, new_heads)
    check_weights(spec, weights)
    rng = np.random.default_rng(rng)
    p, d = f"blocks.{block}.", spec.width
    extra = child.inner(block) - spec.inner(block)
    out = dict(weights)
    for name in ("wq", "wk", "wv"):
        out[p + name] = _pad(weights[p + name], 1, _fresh(rng, (d, extra), d, np.float64))
    out[p + "wo"] = _pad(weights[p + "wo"], 0, np.zeros((extra, d)))
    return child, out


def wider_model(
    spec: TransformerSpec, weights: Weights, new_width: int, rng: RngLike = None
) -> tuple[TransformerSpec, Weights]:
    """Zero-pad the residual stream to ``new_width``; norm gains times sqrt(old/new), ``norm_eps`` times old/new."""
    child = _wider_model_spec(_spec(spec), new_width)
    check_weights(spec, weights)
    rng = np.random.default_rng(rng)
    old, new = spec.width, child.width
    extra, scale = new - old, math.sqrt(old / new)
    out: Weights = {}
    for name, array in weights.items():
        array = np.asarray(array)
        if array.ndim == 1:  # an RMSNorm gain; its new entries multiply zeros, one scaled like the rest
            out[name] = _pad(array * array.dtype.type(scale), 0, np.full(extra, scale))
        elif name in ("tok_emb", "pos_emb") or name.endswith(_WRITERS):
            out[name] = _pad(array, 1, np.zeros((array.shape[0], extra)))
        elif name == "out" or name.endswith(_READERS):
            out[name] = _pad(array, 0, _fresh(rng, (extra, array.shape[1]), new, np.float64))
        else:  # pragma: no cover - check_weights admits only the names above
            raise AssertionError(name)
    return child, out


def apply_morph(
    spec: TransformerSpec, morph: LMMorph, weights: Weights, rng: RngLike = None
) -> tuple[TransformerSpec, Weights]:
    """Apply ``morph`` with weights: the child spec and weights computing the parent's logits."""
    if not isinstance(morph, LMMorph):
        raise NasError(f"expected an LMMorph, got {type(morph).__name__}")
    block = -1 if morph.block is None else morph.block
    if morph.kind == "deeper":
        return deeper(spec, weights, block, rng)
    if morph.kind == "wider_mlp":
        return wider_mlp(spec, weights, block, morph.size, rng)
    if morph.kind == "more_heads":
        return more_heads(spec, weights, block, morph.size, rng)
    return wider_model(spec, weights, morph.size, rng)


# --- proposals for the search -------------------------------------------------------------------------


def _grown(value: int, factor: float, cap: int) -> int:
    return min(cap, max(value + 1, round(value * factor)))


def candidate_morphs(spec: TransformerSpec, widen_factor: float = 2.0, accept: Accept | None = None) -> list[LMMorph]:
    """Every morph whose child is valid (within the ``MAX_*`` caps) and passes ``accept``, one per distinct child.

    Deeper at each position, each block's MLP and heads times ``widen_factor`` (at least one
    more), and the residual width likewise. Inserting copies of equal neighbours gives equal
    children; only the first morph per child key is kept so deeper does not crowd out the rest.
    """
    spec = _spec(spec)
    if isinstance(widen_factor, bool) or not isinstance(widen_factor, (int, float)) or not 1 < widen_factor < 1e6:
        raise NasError(f"morph: widen_factor must be a number above 1, got {short_repr(widen_factor)}")
    options = [LMMorph("deeper", at) for at in range(spec.n_blocks + 1)]
    for b in range(spec.n_blocks):
        options.append(LMMorph("wider_mlp", b, _grown(spec.mlp_hidden[b], widen_factor, MAX_MLP_HIDDEN)))
        options.append(LMMorph("more_heads", b, _grown(spec.heads[b], widen_factor, MAX_HEADS)))
    options.append(LMMorph("wider_model", None, _grown(spec.width, widen_factor, MAX_WIDTH)))
    out: list[LMMorph] = []
    seen: set[str] = set()
    for morph in options:
        try:
            child = apply_spec_morph(spec, morph)
        except NasError:
            continue  # at a cap, or over the parameter limit
        if child.key() in seen or (accept is not None and not accept(child)):
            continue
        seen.add(child.key())
        out.append(morph)
    return out


def random_morph(
    spec: TransformerSpec,
    rng: np.random.Generator,
    accept: Accept | None = None,
    kinds: Iterable[str] = KINDS,
    widen_factor: float = 2.0,
) -> tuple[TransformerSpec, LMMorph] | None:
    """One admissible morph drawn by ``rng`` (a kind first, then one of its options), or None; deterministic."""
    if not isinstance(rng, np.random.Generator):
        raise NasError(f"random_morph needs a numpy Generator, got {type(rng).__name__}")
    wanted = set(kinds)
    by_kind: dict[str, list[LMMorph]] = {}
    for morph in candidate_morphs(spec, widen_factor, accept):
        if morph.kind in wanted:
            by_kind.setdefault(morph.kind, []).append(morph)
    if not by_kind:
        return None
    kind = sorted(by_kind)[int(rng.integers(len(by_kind)))]
    options = by_kind[kind]
    morph = options[int(rng.integers(len(options)))]
    return apply_spec_morph(spec, morph), morph
