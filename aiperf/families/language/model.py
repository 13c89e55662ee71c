"""TransformerSpec -> Keras 3 language model, weights in and out by the NumPy names, and the LM loss.

The language-model counterpart of :mod:`aiperf.families.image.model`: :func:`build_lm` turns a
:class:`nas.language.spec.TransformerSpec` into a functional Keras model computing exactly
:func:`nas.language.spec.forward` (to float32 rounding) on the TensorFlow, JAX and torch
backends, and :func:`lm_weights_to_keras` / :func:`lm_weights_from_keras` move weights
named as in :func:`nas.language.spec.init_weights` in and out, so a morphed child's inherited
weights (:mod:`nas.language.morph`) load 1:1 into its model.

Layers (all bias-free, registered under the ``aiperf`` package so a saved ``.keras`` model
loads back after :func:`custom_objects` or any build has run in the process):

* ``LMEmbedding`` (``embedding``): ``tok_emb`` and ``pos_emb``; called again with
  ``reverse=True`` it is the tied output head ``x @ tok_emb.T`` (one variable, as in
  KerasHub's ``ReversibleEmbedding``);
* ``LMRMSNorm`` (``block{b}_attn_norm``, ``block{b}_mlp_norm``, ``final_norm``): ``gain``,
  the spec's ``norm_eps``;
* ``CausalSelfAttention`` (``block{b}_attn``): ``wq``, ``wk``, ``wv`` (width, heads*head_dim)
  and ``wo`` (heads*head_dim, width);
* ``GeluMLP`` (``block{b}_mlp``): ``w_up``, ``w_down``, tanh-approximation GELU;
* ``LMHead`` (``out``): the untied output kernel ``out``.

Attention: with ``fused_attention`` the layer calls ``keras.ops.dot_product_attention``
(Keras >= 3.6; ``is_causal=True``), which each backend lowers its own way: TensorFlow to
einsum + float32 softmax (XLA-friendly, no flash kernel), JAX to
``jax.nn.dot_product_attention`` (cuDNN flash attention on Ampere+ GPUs for 16-bit inputs,
XLA elsewhere), torch to ``scaled_dot_product_attention`` (flash/memory-efficient kernels on
GPU). Otherwise, or with an older Keras, it computes ``softmax(QK^T/sqrt(d) + causal mask) V``
explicitly, the softmax in float32.

Precision: under a mixed policy (``mixed_bfloat16``) the matrices run in the compute dtype,
while every RMSNorm and the output head compute in float32 from float32 variables (their
variables are not autocast), so the logits are float32 whatever the policy.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from aiperf.errors import AiperfError, excerpt
from nas.language.spec import TransformerSpec

if TYPE_CHECKING:
    # KerasTensor names any tensor a layer sees: symbolic while the functional model is built, the backend's own
    # when it runs (Keras has no public name for the latter).
    from keras import KerasTensor, Model, Variable
    from keras.initializers import Initializer

Weights = dict[str, np.ndarray]
Shape = tuple[int | None, ...]
"""A Keras shape: ``None`` where a dimension (batch, sequence) is only known at run time."""
FeatureShape = tuple[*tuple[int | None, ...], int]
"""A shape whose last (feature) axis is known: what these layers' ``build`` reads their width from."""
PACKAGE = "aiperf"
TOKENS_INPUT = "tokens"
EMBEDDING_LAYER = "embedding"
FINAL_NORM_LAYER = "final_norm"
OUT_LAYER = "out"
LOG2E = 1.0 / math.log(2.0)
_MASKED = -1e9  # added to future positions' float32 scores: exp() of it is exactly 0
_BLOCK_LAYER = re.compile(r"block(\d+)_attn")

_LAYERS: dict[str, type] = {}


def has_fused_attention() -> bool:
    """Whether the installed Keras has ``keras.ops.dot_product_attention`` (Keras >= 3.6)."""
    import keras

    return hasattr(keras.ops, "dot_product_attention")


def _layer_classes() -> dict[str, type]:
    """The custom layer classes, defined (and registered for saving) once, at first use.

    They are made here rather than at import so that importing this module does not import
    Keras (the head never imports the framework; see :mod:`aiperf.training.backend`).
    """
    if _LAYERS:
        return _LAYERS
    import keras
    from keras import ops

    register = keras.saving.register_keras_serializable(package=PACKAGE)

    def normal(std: float) -> Initializer:
        return keras.initializers.RandomNormal(stddev=std)

    @register
    class LMEmbedding(keras.layers.Layer):
        """Token plus learned position embedding; ``reverse=True`` is the tied output head (float32)."""

        def __init__(self, vocab_size: int, seq_len: int, width: int, **kwargs: object) -> None:
            super().__init__(**kwargs)
            self.vocab_size, self.seq_len, self.width = int(vocab_size), int(seq_len), int(width)

        def build(self, input_shape: Shape | None = None) -> None:
            # Not autocast: the tied head reads tok_emb in float32 whatever the policy.
            self.tok_emb = self.add_weight(
                shape=(self.vocab_size, self.width), initializer=normal(0.02), autocast=False, name="tok_emb"
            )
            self.pos_emb = self.add_weight(
                shape=(self.seq_len, self.width), initializer=normal(0.02), autocast=False, name="pos_emb"
            )
            self.built = True

        def call(self, inputs: KerasTensor, reverse: bool = False) -> KerasTensor:
            if reverse:
                x = ops.cast(inputs, "float32")
                return ops.matmul(x, ops.transpose(ops.cast(self.tok_emb, "float32")))
            tokens = ops.cast(inputs, "int32")
            seq = ops.shape(tokens)[1]
            x = ops.take(self.tok_emb, tokens, axis=0) + self.pos_emb[:seq]
            return ops.cast(x, self.compute_dtype)

        def compute_output_shape(self, input_shape: Shape, reverse: bool = False) -> Shape:
            if reverse:
                return (*tuple(input_shape)[:-1], self.vocab_size)
            return (*tuple(input_shape), self.width)

        def compute_output_spec(self, inputs: KerasTensor, reverse: bool = False) -> KerasTensor:
            shape = self.compute_output_shape(inputs.shape, reverse)
            return keras.KerasTensor(shape, dtype="float32" if reverse else self.compute_dtype)

        def get_config(self) -> dict[str, object]:
            return {
                **super().get_config(),
                "vocab_size": self.vocab_size,
                "seq_len": self.seq_len,
                "width": self.width,
            }

    @register
    class LMRMSNorm(keras.layers.Layer):
        """``gain * x / sqrt(mean(x**2) + eps)`` over the last axis, computed in float32."""

        def __init__(self, epsilon: float = 1e-5, **kwargs: object) -> None:
            super().__init__(**kwargs)
            self.epsilon = float(epsilon)

        def build(self, input_shape: FeatureShape) -> None:
            self.gain = self.add_weight(shape=(input_shape[-1],), initializer="ones", autocast=False, name="gain")
            self.built = True

        def call(self, inputs: KerasTensor) -> KerasTensor:
            x = ops.cast(inputs, "float32")
            scale = ops.rsqrt(ops.mean(ops.square(x), axis=-1, keepdims=True) + self.epsilon)
            return ops.cast(x * scale * ops.cast(self.gain, "float32"), self.compute_dtype)

        def compute_output_shape(self, input_shape: Shape) -> Shape:
            return input_shape

        def get_config(self) -> dict[str, object]:
            return {**super().get_config(), "epsilon": self.epsilon}

    @register
    class CausalSelfAttention(keras.layers.Layer):
        """Causal multi-head self-attention, width -> heads*head_dim -> width, no biases."""

        def __init__(self, heads: int, head_dim: int, fused: bool = True, **kwargs: object) -> None:
            super().__init__(**kwargs)
            self.heads, self.head_dim, self.fused = int(heads), int(head_dim), bool(fused)

        def build(self, input_shape: FeatureShape) -> None:
            width, inner = int(input_shape[-1]), self.heads * self.head_dim
            for name in ("wq", "wk", "wv"):
                setattr(self, name, self.add_weight(shape=(width, inner), initializer=normal(width**-0.5), name=name))
            self.wo = self.add_weight(shape=(inner, width), initializer=normal(inner**-0.5), name="wo")
            self.built = True

        def call(self, inputs: KerasTensor) -> KerasTensor:
            batch, seq = ops.shape(inputs)[0], ops.shape(inputs)[1]
            split = (batch, seq, self.heads, self.head_dim)
            q, k, v = (ops.reshape(ops.matmul(inputs, w), split) for w in (self.wq, self.wk, self.wv))
            scale = 1.0 / math.sqrt(self.head_dim)
            if self.fused and hasattr(ops, "dot_product_attention"):
                mixed = ops.dot_product_attention(q, k, v, scale=scale, is_causal=True)  # [B, T, H, D]
            else:
                scores = ops.einsum("bqhd,bkhd->bhqk", q, k)
                scores = ops.cast(scores, "float32") * scale
                causal = ops.tril(ops.ones((seq, seq), dtype="bool"))
                scores = ops.where(causal, scores, _MASKED)
                probs = ops.cast(ops.softmax(scores, axis=-1), self.compute_dtype)
                mixed = ops.einsum("bhqk,bkhd->bqhd", probs, v)
            mixed = ops.reshape(mixed, (batch, seq, self.heads * self.head_dim))
            return ops.matmul(mixed, self.wo)

        def compute_output_shape(self, input_shape: Shape) -> Shape:
            return input_shape

        def get_config(self) -> dict[str, object]:
            return {**super().get_config(), "heads": self.heads, "head_dim": self.head_dim, "fused": self.fused}

    @register
    class GeluMLP(keras.layers.Layer):
        """``gelu_tanh(x @ w_up) @ w_down``, no biases."""

        def __init__(self, hidden: int, **kwargs: object) -> None:
            super().__init__(**kwargs)
            self.hidden = int(hidden)

        def build(self, input_shape: FeatureShape) -> None:
            width = int(input_shape[-1])
            self.w_up = self.add_weight(shape=(width, self.hidden), initializer=normal(width**-0.5), name="w_up")
            self.w_down = self.add_weight(
                shape=(self.hidden, width), initializer=normal(self.hidden**-0.5), name="w_down"
            )
            self.built = True

        def call(self, inputs: KerasTensor) -> KerasTensor:
            return ops.matmul(ops.gelu(ops.matmul(inputs, self.w_up), approximate=True), self.w_down)

        def compute_output_shape(self, input_shape: Shape) -> Shape:
            return input_shape

        def get_config(self) -> dict[str, object]:
            return {**super().get_config(), "hidden": self.hidden}

    @register
    class LMHead(keras.layers.Layer):
        """The untied output projection ``x @ out`` (width, vocab), computed in float32."""

        def __init__(self, vocab_size: int, **kwargs: object) -> None:
            super().__init__(**kwargs)
            self.vocab_size = int(vocab_size)

        def build(self, input_shape: FeatureShape) -> None:
            width = int(input_shape[-1])
            self.out = self.add_weight(
                shape=(width, self.vocab_size), initializer=normal(width**-0.5), autocast=False, name="out"
            )
            self.built = True

        def call(self, inputs: KerasTensor) -> KerasTensor:
            return ops.matmul(ops.cast(inputs, "float32"), ops.cast(self.out, "float32"))

        def compute_output_shape(self, input_shape: Shape) -> Shape:
            return (*tuple(input_shape)[:-1], self.vocab_size)

        def compute_output_spec(self, inputs: KerasTensor) -> KerasTensor:
            return keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype="float32")

        def get_config(self) -> dict[str, object]:
            return {**super().get_config(), "vocab_size": self.vocab_size}

    for cls in (LMEmbedding, LMRMSNorm, CausalSelfAttention, GeluMLP, LMHead):
        _LAYERS[cls.__name__] = cls
    return _LAYERS


def custom_objects() -> dict[str, type]:
    """The custom layers by class name (pass to ``keras.saving.load_model``; they are also registered)."""
    return dict(_layer_classes())


def build_lm(
    spec: TransformerSpec,
    weights: Mapping[str, ArrayLike] | None = None,
    *,
    dtype_policy: str | None = None,
    fused_attention: bool = True,
) -> Model:
    """The functional Keras model of ``spec``: int tokens [batch, seq <= seq_len] -> float32 logits [batch, seq, vocab].

    ``weights`` (named as in :func:`nas.language.spec.init_weights`) are loaded with
    :func:`lm_weights_to_keras`; without them the layers draw their own initial values
    (the same distributions as ``init_weights``, from Keras's seed). ``dtype_policy`` is a
    Keras policy name such as ``mixed_bfloat16``; ``fused_attention`` picks
    ``keras.ops.dot_product_attention`` where Keras has it.
    """
    if not isinstance(spec, TransformerSpec):
        raise AiperfError(f"build_lm needs a TransformerSpec, got {type(spec).__name__}")
    import keras

    layers = _layer_classes()
    dtype = keras.DTypePolicy(dtype_policy) if dtype_policy else None
    eps = spec.norm_eps
    tokens = keras.Input(shape=(None,), dtype="int32", name=TOKENS_INPUT)
    embedding = layers["LMEmbedding"](spec.vocab_size, spec.seq_len, spec.width, name=EMBEDDING_LAYER, dtype=dtype)
    x = embedding(tokens)
    for b, (heads, hidden) in enumerate(zip(spec.heads, spec.mlp_hidden, strict=True)):
        a = layers["LMRMSNorm"](eps, name=f"block{b}_attn_norm", dtype=dtype)(x)
        a = layers["CausalSelfAttention"](heads, spec.head_dim, fused_attention, name=f"block{b}_attn", dtype=dtype)(a)
        x = keras.layers.Add(name=f"block{b}_attn_add", dtype=dtype)([x, a])
        m = layers["LMRMSNorm"](eps, name=f"block{b}_mlp_norm", dtype=dtype)(x)
        m = layers["GeluMLP"](hidden, name=f"block{b}_mlp", dtype=dtype)(m)
        x = keras.layers.Add(name=f"block{b}_mlp_add", dtype=dtype)([x, m])
    x = layers["LMRMSNorm"](eps, name=FINAL_NORM_LAYER, dtype=dtype)(x)
    if spec.tied_output:
        logits = embedding(x, reverse=True)
    else:
        logits = layers["LMHead"](spec.vocab_size, name=OUT_LAYER, dtype=dtype)(x)
    model = keras.Model(tokens, logits, name=f"lm_{spec.key()}")
    if weights is not None:
        lm_weights_to_keras(model, weights)
    return model


def _variables(model: Model) -> dict[str, Variable]:
    """The model's variables under the NumPy naming scheme, in ``TransformerSpec.weight_shapes`` order."""
    try:
        embedding = model.get_layer(EMBEDDING_LAYER)
        final = model.get_layer(FINAL_NORM_LAYER)
    except ValueError:
        raise AiperfError(f"model {model.name!r} is not a language model built by build_lm") from None
    blocks = sorted(int(m.group(1)) for layer in model.layers if (m := _BLOCK_LAYER.fullmatch(layer.name)))
    if blocks != list(range(len(blocks))):
        raise AiperfError(f"model {model.name!r}: its attention layers are not numbered 0..n-1")
    out: dict[str, Variable] = {"tok_emb": embedding.tok_emb, "pos_emb": embedding.pos_emb}
    for b in blocks:
        attn = model.get_layer(f"block{b}_attn")
        mlp = model.get_layer(f"block{b}_mlp")
        p = f"blocks.{b}."
        out[p + "attn_norm"] = model.get_layer(f"block{b}_attn_norm").gain
        out.update({p + n: getattr(attn, n) for n in ("wq", "wk", "wv", "wo")})
        out[p + "mlp_norm"] = model.get_layer(f"block{b}_mlp_norm").gain
        out[p + "w_up"], out[p + "w_down"] = mlp.w_up, mlp.w_down
    out["final_norm"] = final.gain
    if any(layer.name == OUT_LAYER for layer in model.layers):
        out["out"] = model.get_layer(OUT_LAYER).out
    return out


def lm_weights_to_keras(model: Model, weights: Mapping[str, ArrayLike]) -> int:
    """Load NumPy-named weights into ``model`` (built by :func:`build_lm`); returns how many tensors were set.

    ``weights`` must hold exactly the model's tensors with their exact shapes; otherwise one
    AiperfError names the first offending tensor, before anything is assigned.
    """
    if not isinstance(weights, Mapping):
        raise AiperfError(f"LM weights must be a mapping of name to array, got {type(weights).__name__}")
    variables = _variables(model)
    extra = sorted((k for k in weights if k not in variables), key=str)
    if extra:
        raise AiperfError(f"LM weights do not fit model {model.name!r}: unexpected tensor {excerpt(extra[0])}")
    arrays: dict[str, np.ndarray] = {}
    for name, var in variables.items():
        if name not in weights:
            raise AiperfError(f"LM weights do not fit model {model.name!r}: tensor {name} is missing")
        array = np.asarray(weights[name])
        want = tuple(int(d) for d in var.shape)
        if array.shape != want:
            raise AiperfError(
                f"LM weights do not fit model {model.name!r}: {name} needs shape {want}, got {array.shape}"
            )
        if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
            raise AiperfError(f"LM weights: {name} must be a numeric array, got dtype {array.dtype}")
        arrays[name] = array
    for name, var in variables.items():
        var.assign(arrays[name].astype(var.dtype, copy=False))
    return len(arrays)


def lm_weights_from_keras(model: Model) -> Weights:
    """The model's weights as float32 NumPy arrays named as in :func:`nas.language.spec.init_weights`."""
    import keras

    return {name: np.asarray(keras.ops.convert_to_numpy(var), np.float32) for name, var in _variables(model).items()}


# --- loss ----------------------------------------------------------------------------------------------


def next_token_pairs(tokens: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) for next-token prediction: ``tokens[:, :-1]`` and ``tokens[:, 1:]``."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise AiperfError(f"next-token pairs need tokens of shape [batch, >=2], got {tokens.shape}")
    return tokens[:, :-1], tokens[:, 1:]


def lm_cross_entropy(logits: KerasTensor | ArrayLike, targets: KerasTensor | ArrayLike) -> KerasTensor:
    """Mean next-token cross-entropy in nats, as a backend scalar tensor (differentiable; usable as a loss).

    ``logits`` [batch, seq, vocab] at position ``t`` are scored against ``targets[:, t]``,
    the token that follows position ``t`` (see :func:`next_token_pairs`). Computed in float32.
    """
    from keras import ops

    logits = ops.cast(logits, "float32")
    per_token = ops.sparse_categorical_crossentropy(ops.cast(targets, "int32"), logits, from_logits=True)
    return ops.mean(per_token)


def lm_loss_and_metrics(
    logits: KerasTensor | ArrayLike, targets: KerasTensor | ArrayLike, bytes_per_token: float = 1.0
) -> dict[str, float]:
    """Mean next-token cross-entropy in nats, bits per token and bits per byte, as Python floats.

    ``bits_per_token = nats / ln 2`` and ``bits_per_byte = bits_per_token / bytes_per_token``.
    With the byte-level vocabulary (``vocab_size`` 256, one token per byte) ``bytes_per_token``
    is 1 and bits per byte equals bits per token; a tokenizer whose tokens cover on average
    ``c`` bytes of the evaluated text passes ``bytes_per_token=c``, which makes bits per byte
    comparable across vocabularies.
    """
    if isinstance(bytes_per_token, bool) or not isinstance(bytes_per_token, (int, float)) or not bytes_per_token > 0:
        raise AiperfError(f"bytes_per_token must be a positive number, got {excerpt(bytes_per_token)}")
    from keras import ops

    nats = float(ops.convert_to_numpy(lm_cross_entropy(logits, targets)))
    bits = nats * LOG2E
    return {"loss_nats": nats, "bits_per_token": bits, "bits_per_byte": bits / float(bytes_per_token)}
