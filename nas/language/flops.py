"""Analytic FLOPs of a :class:`~nas.language.spec.TransformerSpec` language model, per token and per layer.

The counting rules are the image counter's (``aiperf/families/image/flops.py``, docs/flops.md
"Conventions"): one multiply-add = 2 operations; add, subtract, multiply, divide,
compare-and-select, exp, log, sqrt, rsqrt and tanh 1 each; a reduction of ``n`` values ``n``;
copies, reshapes, transposes and casts 0. Applied to the model that
``aiperf.families.language.model.build_lm`` specifies:

* Counts are per token for a context of ``seq_len`` tokens (default: the spec's ``seq_len``).
* Attention scores ``QK^T`` and the weighted sum ``AV`` count the *full* ``seq_len x seq_len``
  square by default, ``2 * seq_len * heads * head_dim`` each per token: the accounting of
  PaLM (6N + 12·L·H·Q·T per training token) and Chinchilla, and what a dense
  masked-softmax kernel executes. The ``*_causal`` fields count only the keys a query can
  see, on average ``(seq_len + 1) / 2``; ``forward(causal=True)`` uses them.
* Token and position embedding lookups count 0 FLOPs (adding the two counts ``width``).
* Elementwise work: RMSNorm 4 per element (square, sum, ``x * rsqrt``, gain) and 3 per token
  (the mean's divide, ``+ eps``, ``rsqrt``); the attention softmax 7 per score (scale by
  ``1/sqrt(head_dim)``, the causal mask's select, max, subtract, exp, sum, divide; the causal
  variant the same 7 for visible scores only); tanh-GELU 9 per hidden unit (the cube is two
  products, then ``* 0.044715``, ``+ x``, ``* sqrt(2/pi)``, tanh, ``+ 1``, ``* x``, ``* 0.5``);
  a residual add 1 per element.
* The loss: the sparse softmax cross-entropy over the ``vocab_size`` logits of every token,
  ``4V + 3`` forward and ``2V + 1`` backward, as the image counter charges it per image.
* Training = forward + backward, backward = 2 x the network's forward plus the loss's
  backward. Exact for matmuls (gradients for the input and for the weight) and a convention
  for the elementwise terms (XLA's reverse mode does 0.1-0.3 % less in all). Those terms are
  not negligible for small models and long contexts: 2.0 % of the seed's training count,
  1.8 % at width 256 and context 2048 with heads of 64, 3.3 % with heads of 32; 0.06 % at
  width 4096 and context 128.
* The optimizer update (``update_per_step``) is per step, whatever the number of tokens in it:
  AdamW with global-norm clipping as the LM trainer configures it (``aiperf/families/language/trainer.py``),
  18 operations per decayed parameter, 15 per RMSNorm gain (no decay), plus the loss's 2 per
  step; :meth:`TransformerFlops.train_per_token` amortises it like ``GraphCost.train_per_image``.

So with ``seq_len`` small relative to ``width`` the training cost is close to Kaplan et
al.'s ``6 * N`` per token, N the non-embedding parameters
(:meth:`TransformerSpec.non_embedding_params`), plus ``6 * width * vocab`` for the output layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from nas.errors import NasError
from nas.language.spec import TransformerSpec

NORM_FLOPS = 4  # per element: square, sum, x * rsqrt(...), * gain
NORM_FLOPS_PER_TOKEN = 3  # the mean's divide, + eps, rsqrt
SOFTMAX_FLOPS = 7  # per score: * 1/sqrt(head_dim), mask select, max, subtract, exp, sum, divide
GELU_FLOPS = 9  # per hidden unit, tanh form: x^3 (2), * c, + x, * sqrt(2/pi), tanh, + 1, * x, * 0.5
BACKWARD_FACTOR = 2
# Optimizer (aiperf/families/language/trainer.py): Keras AdamW with global_clipnorm, decay on all but the gains.
CLIP_OPS_PER_PARAM = 3  # square, accumulate into the global norm, scale the gradient
ADAM_OPS_PER_PARAM = 12  # m += (g - m)(1 - b1) 3; v += (g^2 - v)(1 - b2) 4; w -= m * lr / (sqrt(v) + eps) 5
WEIGHT_DECAY_OPS_PER_PARAM = 3  # w - w * wd * lr, every variable but the RMSNorm gains
LOSS_OPS_PER_STEP = 2  # the mean's division over the step's tokens and the upstream gradient 1/N


def softmax_cross_entropy_ops(vocab_size: int) -> tuple[int, int]:
    """(forward, backward) per token of the sparse softmax cross-entropy on ``vocab_size`` logits.

    The same count as ``aiperf.families.image.flops.softmax_cross_entropy_ops`` per image (restated:
    ``nas`` does not import ``aiperf``). Forward: max, shift, exp, sum (``V`` each), log,
    minus the true logit, accumulate into the mean (1 each). Backward: ``p = e / S`` (``V``),
    ``p_y - 1`` (1), ``* 1/N`` (``V``).
    """
    v = vocab_size
    return 4 * v + 3, 2 * v + 1


def adamw_update_ops(spec: TransformerSpec) -> int:
    """Operations of one optimizer step on ``spec``'s parameters (embeddings included: trained densely).

    Per-variable scalar work (bias corrections ``beta^t``, the learning-rate schedule, the
    global norm's ``sqrt``: about 22 operations per variable) is not counted, as the image
    counter counts none for its optimizer.
    """
    params = spec.params()
    gains = (2 * spec.n_blocks + 1) * spec.width
    per_param = CLIP_OPS_PER_PARAM + ADAM_OPS_PER_PARAM
    return per_param * params + WEIGHT_DECAY_OPS_PER_PARAM * (params - gains) + LOSS_OPS_PER_STEP


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
    """Per-token FLOPs of a whole model (blocks, final norm, output layer, loss); per step: the update."""

    seq_len: int  # tokens of context each token attends over
    blocks: tuple[BlockFlops, ...]
    embedding: int  # adding token and position embeddings (the lookups are free)
    final_norm: int
    output: int  # width -> vocab
    loss_forward: int  # softmax cross-entropy over the vocabulary, per token
    loss_backward: int
    update_per_step: int  # AdamW over every parameter, once per step whatever its tokens

    def network(self, tokens: float = 1, causal: bool = False) -> float:
        """Forward FLOPs of the network alone (logits, no loss) for ``tokens`` tokens."""
        per_token = sum(b.forward(causal) for b in self.blocks) + self.embedding + self.final_norm + self.output
        return per_token * tokens

    def forward(self, tokens: float = 1, causal: bool = False) -> float:
        """Forward FLOPs, loss included (what evaluation computes), for ``tokens`` tokens."""
        return self.network(tokens, causal) + self.loss_forward * tokens

    def backward(self, tokens: float = 1, causal: bool = False) -> float:
        """Backward FLOPs: 2 x the network's forward plus the loss's backward, for ``tokens`` tokens."""
        return BACKWARD_FACTOR * self.network(tokens, causal) + self.loss_backward * tokens

    def training(self, tokens: float = 1, causal: bool = False) -> float:
        """Forward plus backward FLOPs for ``tokens`` tokens (the optimizer update is per step: ``update_per_step``)."""
        return self.forward(tokens, causal) + self.backward(tokens, causal)

    def train_per_token(self, tokens_per_step: int, causal: bool = False) -> float:
        """One token's share of a training step of ``tokens_per_step`` tokens (batch x seq_len): update included."""
        if isinstance(tokens_per_step, bool) or not isinstance(tokens_per_step, int) or tokens_per_step < 1:
            raise NasError(f"flops: tokens_per_step must be a positive integer, got {tokens_per_step!r}")
        return self.training(1, causal) + self.update_per_step / tokens_per_step

    @property
    def attention(self) -> int:
        """Forward per-token FLOPs of the context-dependent part (scores and weighted sums, full square)."""
        return sum(b.scores + b.weighted_sum for b in self.blocks)


def transformer_flops(spec: TransformerSpec, seq_len: int | None = None) -> TransformerFlops:
    """Per-token FLOPs of ``spec``, by layer, for ``seq_len`` tokens of context (default: the spec's)."""
    if not isinstance(spec, TransformerSpec):
        raise NasError(f"expected a TransformerSpec, got {type(spec).__name__}")
    if seq_len is None:
        seq_len = spec.seq_len
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= spec.seq_len:
        raise NasError(f"flops: seq_len must be an integer between 1 and the spec's {spec.seq_len}, got {seq_len!r}")
    d, visible = spec.width, (seq_len + 1) / 2
    norm = NORM_FLOPS * d + NORM_FLOPS_PER_TOKEN
    blocks = []
    for b, hidden in enumerate(spec.mlp_hidden):
        inner, heads = spec.inner(b), spec.heads[b]
        elementwise_fixed = 2 * norm + GELU_FLOPS * hidden + 2 * d
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
    loss_forward, loss_backward = softmax_cross_entropy_ops(spec.vocab_size)
    return TransformerFlops(
        seq_len=seq_len,
        blocks=tuple(blocks),
        embedding=d,
        final_norm=norm,
        output=2 * d * spec.vocab_size,
        loss_forward=loss_forward,
        loss_backward=loss_backward,
        update_per_step=adamw_update_ops(spec),
    )
