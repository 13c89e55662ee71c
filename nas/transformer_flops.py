"""Analytic FLOPs of a :class:`~nas.transformer.TransformerSpec` language model, per token and per layer.

Conventions (one multiply-add = 2 FLOPs):

* Counts are per token for a context of ``seq_len`` tokens (default: the spec's ``seq_len``).
* Attention scores ``QK^T`` and the weighted sum ``AV`` count the *full* ``seq_len x seq_len``
  square by default, ``2 * seq_len * heads * head_dim`` each per token: the accounting of
  PaLM (6N + 12·L·H·Q·T per training token) and Chinchilla, and what a dense
  masked-softmax kernel executes. The ``*_causal`` fields count only the keys a query can
  see, on average ``(seq_len + 1) / 2``; ``forward(causal=True)`` uses them.
* Token and position embedding lookups count 0 FLOPs (adding the two counts ``width``).
* Elementwise work is small and counted approximately: RMSNorm 4 FLOPs per element
  (square, sum, scale, gain), softmax 5 per score (scale, max-subtract, exp, sum,
  divide; the causal variant only for visible scores), tanh-GELU 8 per hidden unit, a
  residual add 1 per element.
* Training = forward + backward, backward = 2 x forward. This is exact for matmuls
  (gradients for the input and for the weight) and a convention for the elementwise
  terms, which are a fraction of a percent of the total for any realistic width.

So with ``seq_len`` small relative to ``width`` the training cost is close to Kaplan et
al.'s ``6 * N`` per token, N the non-embedding parameters
(:meth:`TransformerSpec.non_embedding_params`), plus ``6 * width * vocab`` for the output layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from nas.errors import NasError
from nas.transformer import TransformerSpec

NORM_FLOPS = 4  # per element
SOFTMAX_FLOPS = 5  # per score
GELU_FLOPS = 8  # per hidden unit
BACKWARD_FACTOR = 2


@dataclass(frozen=True)
class BlockFlops:
    """Forward FLOPs per token of one transformer block, by operation."""

    qkv: int  # the three projections width -> heads*head_dim
    attn_out: int  # heads*head_dim -> width
    scores: int  # QK^T, full square
    scores_causal: float  # QK^T, visible keys only
    weighted_sum: int  # softmax(QK^T) V, full square
    weighted_sum_causal: float
    mlp: int  # width -> hidden -> width
    elementwise: int  # two norms, softmax over the full square, GELU, two residual adds
    elementwise_causal: float

    @property
    def matmul(self) -> int:
        """The weight matmuls: twice this block's matrix parameters."""
        return self.qkv + self.attn_out + self.mlp

    def forward(self, causal: bool = False) -> float:
        if causal:
            return self.matmul + self.scores_causal + self.weighted_sum_causal + self.elementwise_causal
        return self.matmul + self.scores + self.weighted_sum + self.elementwise


@dataclass(frozen=True)
class TransformerFlops:
    """Per-token forward FLOPs of a whole model: its blocks, the final norm and the output layer."""

    seq_len: int  # tokens of context each token attends over
    blocks: tuple[BlockFlops, ...]
    embedding: int  # adding token and position embeddings (the lookups are free)
    final_norm: int
    output: int  # width -> vocab

    def forward(self, tokens: float = 1, causal: bool = False) -> float:
        """Forward FLOPs for ``tokens`` tokens (each attending over ``seq_len`` positions)."""
        per_token = sum(b.forward(causal) for b in self.blocks) + self.embedding + self.final_norm + self.output
        return per_token * tokens

    def training(self, tokens: float = 1, causal: bool = False) -> float:
        """Forward plus backward (2 x forward) FLOPs for ``tokens`` tokens."""
        return (1 + BACKWARD_FACTOR) * self.forward(tokens, causal)

    @property
    def attention(self) -> int:
        """Forward per-token FLOPs of the context-dependent part (scores and weighted sums, full square)."""
        return sum(b.scores + b.weighted_sum for b in self.blocks)


def transformer_flops(spec: TransformerSpec, seq_len: int | None = None) -> TransformerFlops:
    """Per-token forward FLOPs of ``spec``, by layer, for ``seq_len`` tokens of context (default: the spec's)."""
    if not isinstance(spec, TransformerSpec):
        raise NasError(f"expected a TransformerSpec, got {type(spec).__name__}")
    if seq_len is None:
        seq_len = spec.seq_len
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= spec.seq_len:
        raise NasError(f"flops: seq_len must be an integer between 1 and the spec's {spec.seq_len}, got {seq_len!r}")
    d, visible = spec.width, (seq_len + 1) / 2
    blocks = []
    for b, hidden in enumerate(spec.mlp_hidden):
        inner, heads = spec.inner(b), spec.heads[b]
        elementwise_fixed = 2 * NORM_FLOPS * d + GELU_FLOPS * hidden + 2 * d
        blocks.append(
            BlockFlops(
                qkv=2 * d * 3 * inner,
                attn_out=2 * inner * d,
                scores=2 * seq_len * inner,
                scores_causal=2 * visible * inner,
                weighted_sum=2 * seq_len * inner,
                weighted_sum_causal=2 * visible * inner,
                mlp=2 * 2 * d * hidden,
                elementwise=elementwise_fixed + SOFTMAX_FLOPS * heads * seq_len,
                elementwise_causal=elementwise_fixed + SOFTMAX_FLOPS * heads * visible,
            )
        )
    return TransformerFlops(
        seq_len=seq_len,
        blocks=tuple(blocks),
        embedding=d,
        final_norm=NORM_FLOPS * d,
        output=2 * d * spec.vocab_size,
    )
