"""Train one language-model trial, epoch by epoch, reporting each epoch as it completes.

The LM counterpart of :mod:`aiperf.families.image.trainer`: a :class:`~nas.language.spec.TransformerSpec`
(from scratch, or starting from weights inherited through :mod:`nas.language.morph`) is
built with :func:`~aiperf.families.language.model.build_lm` and trained on next-token prediction:

* **Optimizer**: Keras 3 ``AdamW`` (betas 0.9/0.95, decoupled weight decay ``weight_decay``
  applied to matrices and embeddings, not to the RMSNorm gains; global gradient-norm clip
  :data:`CLIP_NORM`).
* **Schedule** (:func:`warmup_cosine_rate`, the same numbers as the Keras schedule the
  optimizer reads): over the trial's ``S = hparams["epochs"] * steps_per_epoch`` updates,
  with ``W = floor(warmup_fraction * S)`` warm-up updates, update ``k`` (0-based) uses
  ``lr * (k + 1) / W`` while ``k < W``, then a cosine from ``lr`` at ``k = W`` down to
  ``COSINE_ALPHA * lr`` at the last update ``k = S - 1``.
* **Data**: anything with the :class:`LMData` methods. An epoch draws
  ``steps_per_epoch * batch_size`` random windows of ``seq_len`` tokens
  (``train_windows(seq_len, epoch, count, seed)``: the same trial seed gives the same
  windows); validation uses the fixed windows ``val_windows(seq_len, eval_windows)``,
  fetched once and used for every evaluation, so epochs and trials are comparable.
  :func:`load_text_corpus`'s corpus fits as it is; a token-shard folder through
  :class:`ShardWindows`.
* **Evaluation**: mean next-token cross-entropy (nats per token) on the validation windows
  before training (``initial_val_loss``: a morphed child starts at its parent's loss) and
  after every epoch, and bits per byte (``nats / ln 2 / bytes_per_token``; byte-level
  tokens: 1 byte each).
* **Time**: an epoch's training time is split into its first step's tracing/compilation
  overhead (:func:`~aiperf.training.step_timing.compile_overhead`) and the steps proper;
  ``tokens_per_second`` is tokens over the steps' time.
* **FLOPs** (analytic, :func:`nas.language.flops.transformer_flops` at the trial's
  ``seq_len``, full-square attention): ``train_flops = train_per_token(batch * seq_len) * tokens``
  (forward, backward and the loss per token, one AdamW update per step) and
  ``eval_flops = forward(1) * validation tokens`` per epoch.
* **Precision**: ``float32`` (default) or ``mixed_bfloat16`` (bf16 matrices, float32
  norms, logits and variables; no loss scaling needed).
* **Epoch by epoch**: :class:`LMTraining` is the built trial, its :meth:`~LMTraining.train`
  a generator of epochs (the worker's :mod:`aiperf.families.language.runner` reports and checkpoints
  each); it resumes a re-queued trial at ``start_epoch`` on the same windows and schedule
  position (the optimizer's moments restart). :func:`train_lm_trial` runs every epoch of one.

Every size (batch, sequence length, steps, epochs, evaluation windows, tokens per epoch)
and every hyperparameter is checked before anything is built or drawn; a bad one raises one
:class:`AiperfError` naming the field.

Runs on the process's Keras backend (TensorFlow, JAX or torch).
"""

from __future__ import annotations

import functools
import hashlib
import math
import operator
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from aiperf.errors import AiperfError, excerpt
from aiperf.families.language.model import LOG2E, build_lm, lm_weights_from_keras, lm_weights_to_keras
from aiperf.training.backend import seed_trial
from aiperf.training.step_timing import compile_overhead
from nas.errors import NasError
from nas.language.flops import transformer_flops
from nas.language.spec import TransformerSpec, Weights, check_weights, init_weights

if TYPE_CHECKING:
    from keras import KerasTensor, Model
    from keras.optimizers import Optimizer

    from aiperf.families.language.token_shards import TokenFolder, TokenFolderFacts

PRECISIONS = ("float32", "mixed_bfloat16")
HPARAMS = ("learning_rate", "warmup_fraction", "weight_decay", "batch_size", "seq_len", "epochs")
COSINE_ALPHA = 0.1  # the cosine ends at 10 % of the peak rate (GPT-3, Chinchilla)
BETA_1, BETA_2, ADAM_EPSILON = 0.9, 0.95, 1e-8
CLIP_NORM = 1.0  # global gradient-norm clip
NO_DECAY = ("gain",)  # variable names weight decay leaves alone: the RMSNorm gains

# Hard caps, checked before any work.
MAX_BATCH = 1 << 16  # sequences per step
MAX_EPOCHS = 1 << 12
MAX_STEPS_PER_EPOCH = 1 << 24
MAX_TOTAL_STEPS = 1 << 31
MAX_EVAL_WINDOWS = 1 << 20
MAX_EPOCH_TOKENS = 1 << 27  # an epoch's windows are held in memory as int32 inputs and targets: 1 GiB
MAX_EVAL_TOKENS = 1 << 27
MAX_LEARNING_RATE = 10.0
MAX_WEIGHT_DECAY = 1.0


class LMData(Protocol):
    """What the trainer reads: seeded random training windows and fixed validation windows.

    Both return ``(inputs, targets)`` integer arrays of shape ``(n, seq_len)``, targets the
    inputs shifted by one token. An optional ``bytes_per_token`` attribute (default 1.0, the
    byte-level tokenizer) turns nats per token into bits per byte.
    """

    def train_windows(
        self, seq_len: int, epoch: int, count: int | None = None, seed: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def val_windows(self, seq_len: int, max_windows: int | None = None) -> tuple[np.ndarray, np.ndarray]: ...


class ShardWindows:
    """A :class:`~aiperf.families.language.token_shards.TokenFolder` as :class:`LMData`.

    Training windows are ``folder.train.random_windows`` drawn from ``(seed, epoch)`` (the
    folder's own ``seed`` when the call gives none), validation windows
    ``folder.val.fixed_windows``. ``bytes_per_token`` must be given for any tokenizer but
    the byte-level one.
    """

    def __init__(self, folder: TokenFolder, seed: int = 0, bytes_per_token: float | None = None) -> None:
        tokenizer = folder.manifest.get("tokenizer")
        if bytes_per_token is None:
            if tokenizer != "bytes":
                raise AiperfError(
                    f"token shards {folder.root}: tokenizer {excerpt(tokenizer)} is not byte-level; "
                    "give bytes_per_token to report bits per byte"
                )
            bytes_per_token = 1.0
        self.bytes_per_token = _positive("bytes_per_token", bytes_per_token, 1e6)
        self.folder = folder
        self.seed = _integer("seed", seed, 0, (1 << 63) - 1)
        self.vocab_size = folder.vocab_size

    def train_windows(
        self, seq_len: int, epoch: int, count: int | None = None, seed: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        epoch = _integer("epoch", epoch, 0, (1 << 63) - 1)
        if count is None:
            count = self.folder.train.tokens // max(1, seq_len)
        rng = np.random.default_rng([self.seed if seed is None else seed, epoch])
        return self.folder.train.random_windows(seq_len, count, rng)

    def val_windows(self, seq_len: int, max_windows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        return self.folder.val.fixed_windows(seq_len, max_windows)

    def describe(self) -> TokenFolderFacts:
        return self.folder.describe()


@dataclass(frozen=True)
class EpochLM:
    """One completed epoch. Losses in nats per token; FLOPs analytic (see the module docstring)."""

    epoch: int  # 1-based
    train_loss: float  # mean training loss over the epoch's steps
    val_loss: float  # on the fixed validation windows, after the epoch
    bits_per_byte: float  # of val_loss
    tokens: int  # training tokens (targets) this epoch: steps * batch_size * seq_len
    step_seconds: float  # training time of the epoch without the first step's compilation overhead
    compile_seconds: float  # tracing/compilation overhead of the train step within this epoch
    tokens_per_second: float  # tokens / step_seconds (0 when no step time was left to measure)
    train_flops: float = 0.0  # training FLOPs per token x tokens
    eval_flops: float = 0.0  # forward FLOPs per token x validation tokens
    eval_tokens: int = 0
    eval_seconds: float = 0.0
    steps: int = 0
    learning_rate: float = 0.0  # the rate of the epoch's last update

    def to_dict(self) -> dict[str, int | float]:
        return asdict(self)


@dataclass
class LMTrialResult:
    """A trained trial: its per-epoch records, final weights (NumPy names) and the totals."""

    spec: TransformerSpec
    epochs: list[EpochLM]
    weights: Weights
    initial_val_loss: float  # before the first update (a morphed child: its parent's loss)
    initial_bits_per_byte: float
    backend: str
    precision: str
    batch_size: int
    seq_len: int
    steps_per_epoch: int
    schedule_steps: int  # the schedule's length: hparams["epochs"] * steps_per_epoch
    warmup_steps: int
    eval_windows: int  # validation windows actually used (the data may hold fewer than asked for)
    val_fingerprint: str  # SHA-256 of the validation windows
    train_flops_per_token: float
    eval_flops_per_token: float
    initial_eval_flops: float
    startup_seconds: float  # building, loading weights, compiling the optimizer
    initial_eval_seconds: float  # includes tracing the evaluation step
    hparams: dict[str, float] = field(default_factory=dict)

    @property
    def val_loss(self) -> float:
        return self.epochs[-1].val_loss

    @property
    def best_val_loss(self) -> float:
        return min(e.val_loss for e in self.epochs)

    @property
    def bits_per_byte(self) -> float:
        return self.epochs[-1].bits_per_byte

    @property
    def tokens(self) -> int:
        return sum(e.tokens for e in self.epochs)

    @property
    def train_flops(self) -> float:
        return sum(e.train_flops for e in self.epochs)

    @property
    def eval_flops(self) -> float:
        return self.initial_eval_flops + sum(e.eval_flops for e in self.epochs)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready, without the weights."""
        return {
            "spec": self.spec.to_dict(),
            "epochs": [e.to_dict() for e in self.epochs],
            "initial_val_loss": self.initial_val_loss,
            "initial_bits_per_byte": self.initial_bits_per_byte,
            "val_loss": self.val_loss,
            "best_val_loss": self.best_val_loss,
            "bits_per_byte": self.bits_per_byte,
            "tokens": self.tokens,
            "train_flops": self.train_flops,
            "eval_flops": self.eval_flops,
            "backend": self.backend,
            "precision": self.precision,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "steps_per_epoch": self.steps_per_epoch,
            "schedule_steps": self.schedule_steps,
            "warmup_steps": self.warmup_steps,
            "eval_windows": self.eval_windows,
            "val_fingerprint": self.val_fingerprint,
            "train_flops_per_token": self.train_flops_per_token,
            "eval_flops_per_token": self.eval_flops_per_token,
            "startup_seconds": self.startup_seconds,
            "initial_eval_seconds": self.initial_eval_seconds,
            "hparams": dict(self.hparams),
        }


# --- checks --------------------------------------------------------------------------------------------


def _integer(name: str, value: object, lo: int, hi: int) -> int:
    """An int in [lo, hi]; a float that is a whole number counts (search hyperparameters are floats)."""
    if isinstance(value, bool):
        raise AiperfError(f"LM trial: {name} must be an integer, got {excerpt(value)}")
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value) or value != int(value):
            raise AiperfError(f"LM trial: {name} must be an integer, got {excerpt(float(value))}")
        value = int(value)
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise AiperfError(f"LM trial: {name} must be an integer, got {excerpt(value)}") from None
    if not lo <= number <= hi:
        raise AiperfError(f"LM trial: {name} must be from {lo} to {hi}, got {excerpt(number)}")
    return number


def _number(name: str, value: object, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise AiperfError(f"LM trial: {name} must be a number, got {excerpt(value)}")
    number = float(value)
    above = number > lo if lo_open else number >= lo
    below = number < hi if hi_open else number <= hi
    if not (math.isfinite(number) and above and below):  # NaN fails every comparison
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise AiperfError(f"LM trial: {name} must be a number in {interval}, got {excerpt(number)}")
    return number


def _positive(name: str, value: object, hi: float) -> float:
    return _number(name, value, 0.0, hi, lo_open=True)


@dataclass(frozen=True)
class LMPlan:
    """A trial's checked sizes and hyperparameters."""

    learning_rate: float
    warmup_fraction: float
    weight_decay: float
    batch_size: int
    seq_len: int
    schedule_epochs: int  # hparams["epochs"]: the schedule spans these
    epochs: int  # epochs run now (at most schedule_epochs)
    steps_per_epoch: int
    eval_windows: int
    precision: str
    seed: int

    @property
    def schedule_steps(self) -> int:
        return self.schedule_epochs * self.steps_per_epoch

    @property
    def warmup_steps(self) -> int:
        return warmup_steps(self.warmup_fraction, self.schedule_steps)

    @property
    def tokens_per_epoch(self) -> int:
        return self.steps_per_epoch * self.batch_size * self.seq_len

    def hparams(self) -> dict[str, float]:
        return {
            "learning_rate": self.learning_rate,
            "warmup_fraction": self.warmup_fraction,
            "weight_decay": self.weight_decay,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "epochs": self.schedule_epochs,
        }


def check_lm_trial(
    spec: TransformerSpec,
    hparams: Mapping[str, object],
    *,
    epochs: int | None,
    steps_per_epoch: int,
    eval_windows: int,
    precision: str | None,
    seed: int,
) -> LMPlan:
    """Every argument of :func:`train_lm_trial` checked against its limits; one AiperfError naming the field."""
    if not isinstance(spec, TransformerSpec):
        raise AiperfError(f"LM trial: spec must be a TransformerSpec, got {type(spec).__name__}")
    if not isinstance(hparams, Mapping):
        raise AiperfError(f"LM trial: hparams must be a mapping, got {excerpt(hparams)}")
    for name in HPARAMS:
        if name not in hparams:
            raise AiperfError(f"LM trial: hparams lack {name!r} (needed: {', '.join(HPARAMS)})")
    learning_rate = _positive("learning_rate", hparams["learning_rate"], MAX_LEARNING_RATE)
    warmup = _number("warmup_fraction", hparams["warmup_fraction"], 0.0, 1.0, hi_open=True)
    decay = _number("weight_decay", hparams["weight_decay"], 0.0, MAX_WEIGHT_DECAY)
    batch = _integer("batch_size", hparams["batch_size"], 1, MAX_BATCH)
    seq_len = _integer("seq_len", hparams["seq_len"], 1, spec.seq_len)
    schedule_epochs = _integer("epochs", hparams["epochs"], 1, MAX_EPOCHS)
    run_epochs = schedule_epochs if epochs is None else _integer("epochs", epochs, 1, schedule_epochs)
    steps = _integer("steps_per_epoch", steps_per_epoch, 1, MAX_STEPS_PER_EPOCH)
    if schedule_epochs * steps > MAX_TOTAL_STEPS:
        raise AiperfError(
            f"LM trial: epochs x steps_per_epoch = {schedule_epochs * steps:,} exceeds {MAX_TOTAL_STEPS:,} steps"
        )
    if steps * batch * (seq_len + 1) > MAX_EPOCH_TOKENS:
        raise AiperfError(
            f"LM trial: steps_per_epoch x batch_size x (seq_len + 1) = {steps * batch * (seq_len + 1):,} tokens "
            f"per epoch exceeds {MAX_EPOCH_TOKENS:,}; use shorter epochs"
        )
    windows = _integer("eval_windows", eval_windows, 1, MAX_EVAL_WINDOWS)
    if windows * (seq_len + 1) > MAX_EVAL_TOKENS:
        raise AiperfError(
            f"LM trial: eval_windows x (seq_len + 1) = {windows * (seq_len + 1):,} tokens exceeds {MAX_EVAL_TOKENS:,}"
        )
    chosen = "float32" if precision is None else precision
    if not isinstance(chosen, str) or chosen not in PRECISIONS:
        raise AiperfError(f"LM trial: precision must be one of {', '.join(PRECISIONS)}, got {excerpt(precision)}")
    return LMPlan(
        learning_rate=learning_rate,
        warmup_fraction=warmup,
        weight_decay=decay,
        batch_size=batch,
        seq_len=seq_len,
        schedule_epochs=schedule_epochs,
        epochs=run_epochs,
        steps_per_epoch=steps,
        eval_windows=windows,
        precision=chosen,
        seed=_integer("seed", seed, 0, (1 << 63) - 1),
    )


def _windows(
    raw: object, seq_len: int, vocab_size: int, what: str, count: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The data's ``(inputs, targets)`` checked (shape, integer ids below the vocabulary) and as int32."""
    if not isinstance(raw, tuple) or len(raw) != 2:
        raise AiperfError(f"LM trial: {what} must be an (inputs, targets) pair, got {excerpt(raw)}")
    arrays = []
    for part, array in zip(("inputs", "targets"), raw, strict=True):
        array = np.asarray(array)
        if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
            raise AiperfError(f"LM trial: {what} {part} must be integer token ids, got dtype {array.dtype}")
        if array.ndim != 2 or array.shape[1] != seq_len or array.shape[0] < 1:
            raise AiperfError(f"LM trial: {what} {part} must have shape (n >= 1, {seq_len}), got {array.shape}")
        if count is not None and array.shape[0] != count:
            raise AiperfError(f"LM trial: {what} {part}: asked for {count} windows, got {array.shape[0]}")
        low, high = int(array.min()), int(array.max())
        if low < 0 or high >= vocab_size:
            raise AiperfError(
                f"LM trial: {what} {part} hold token ids {low}..{high}, "
                f"outside the model's vocabulary [0, {vocab_size})"
            )
        arrays.append(np.ascontiguousarray(array, dtype=np.int32))
    if arrays[0].shape != arrays[1].shape:
        raise AiperfError(f"LM trial: {what}: inputs {arrays[0].shape} and targets {arrays[1].shape} differ")
    return arrays[0], arrays[1]


def _fingerprint(x: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of the windows' shape and int32 contents: equal fingerprints, equal validation sets."""
    digest = hashlib.sha256(f"lm-windows;{x.shape}".encode())
    digest.update(x.data)
    digest.update(y.data)
    return digest.hexdigest()


def _bytes_per_token(data: object) -> float:
    return _positive("bytes_per_token", getattr(data, "bytes_per_token", 1.0), 1e6)


# --- the schedule ----------------------------------------------------------------------------------------


def warmup_steps(warmup_fraction: float, total_steps: int) -> int:
    """``floor(warmup_fraction * total_steps)``: at most ``total_steps - 1`` (fraction below 1)."""
    return min(math.floor(warmup_fraction * total_steps), max(0, total_steps - 1))


def warmup_cosine_rate(step: int, peak: float, warmup: int, total: int, alpha: float = COSINE_ALPHA) -> float:
    """The learning rate of update ``step`` (0-based): linear warm-up over ``warmup`` updates, then cosine.

    ``peak * (step + 1) / warmup`` while ``step < warmup``; then ``peak * (alpha + (1 - alpha) *
    (1 + cos(pi * p)) / 2)`` with ``p = (step - warmup) / max(1, total - warmup - 1)`` clipped to
    [0, 1]: ``peak`` at the first update after warm-up, ``alpha * peak`` at the last (``total - 1``).
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, max(0.0, (step - warmup) / max(1, total - warmup - 1)))
    return peak * (alpha + (1.0 - alpha) * 0.5 * (1.0 + math.cos(math.pi * progress)))


@functools.cache
def warmup_cosine_schedule(keras: Any) -> type:  # keras: the module (see runtime_hparams.trial_sgd)
    """The Keras ``LearningRateSchedule`` class computing :func:`warmup_cosine_rate` (made once per process)."""
    ops = keras.ops

    class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
        def __init__(self, peak: float, warmup: int, total: int, alpha: float = COSINE_ALPHA) -> None:
            self.peak, self.warmup, self.total, self.alpha = float(peak), int(warmup), int(total), float(alpha)

        def __call__(self, step: KerasTensor) -> KerasTensor:
            step = ops.cast(step, "float32")
            warm = self.peak * (step + 1.0) / float(max(1, self.warmup))
            span = float(max(1, self.total - self.warmup - 1))
            progress = ops.clip((step - float(self.warmup)) / span, 0.0, 1.0)
            cosine = self.peak * (self.alpha + (1.0 - self.alpha) * 0.5 * (1.0 + ops.cos(math.pi * progress)))
            return ops.where(step < float(self.warmup), warm, cosine)

        def get_config(self) -> dict[str, float]:
            return {"peak": self.peak, "warmup": self.warmup, "total": self.total, "alpha": self.alpha}

    return WarmupCosine


def make_optimizer(plan: LMPlan) -> Optimizer:
    """AdamW under the trial's warm-up/cosine schedule; the RMSNorm gains are not decayed."""
    import keras

    schedule = warmup_cosine_schedule(keras)(plan.learning_rate, plan.warmup_steps, plan.schedule_steps)
    optimizer = keras.optimizers.AdamW(
        learning_rate=schedule,
        weight_decay=plan.weight_decay,
        beta_1=BETA_1,
        beta_2=BETA_2,
        epsilon=ADAM_EPSILON,
        global_clipnorm=CLIP_NORM,
    )
    optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY))
    return optimizer


# --- the trial -------------------------------------------------------------------------------------------


class _FirstStepTimer:
    """Records when the epoch's second step starts (the first step's end, compilation included).

    Listening for a step's start rather than its end keeps Keras from synchronising with the
    device after every step (as in :mod:`aiperf.families.image.trainer`).
    """

    def __init__(self, keras: Any) -> None:  # keras: the module (see runtime_hparams.trial_sgd)
        outer = self

        class _Callback(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch: int, logs: dict[str, float] | None = None) -> None:
                if batch == 1 and outer.first_end is None:
                    outer.first_end = time.perf_counter()

        self.first_end: float | None = None
        self.callback = _Callback()


def _evaluate(model: Model, x: np.ndarray, y: np.ndarray, batch: int) -> float:
    """Mean next-token cross-entropy (nats per token) over the windows."""
    value = model.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)["loss"]
    loss = float(value)
    if not math.isfinite(loss):
        raise AiperfError(f"LM trial: the validation loss is {loss} (training diverged)")
    return loss


def compiled_lm(spec: TransformerSpec, plan: LMPlan, jit_compile: bool | str, weights: Weights | None = None) -> Model:
    """``spec``'s Keras model compiled for ``plan`` (its AdamW and schedule), its optimizer built (not stepped)."""
    import keras

    model = build_lm(spec, weights, dtype_policy=None if plan.precision == "float32" else plan.precision)
    model.compile(
        optimizer=make_optimizer(plan),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    model.optimizer.build(model.trainable_variables)
    return model


class LMTraining:
    """A trial checked, built and compiled, trained one epoch at a time by :meth:`train`.

    The worker reports (and checkpoints) each epoch as it completes and continues a re-queued
    trial at the epoch its checkpoint holds, so the epochs are a generator over a model that
    lives between them; :func:`train_lm_trial` runs them all at once.

    ``start_epoch`` (epochs already trained, their weights in ``weights``) resumes a trial:
    epochs ``start_epoch + 1 .. epochs`` are trained, each on the windows of its own epoch
    number, and the schedule continues at update ``start_epoch * steps_per_epoch``, so the
    resumed trial sees the data and learning rates of an uninterrupted one. The AdamW moments
    are not in a checkpoint (weights only): they restart from zero, so the losses after a resume
    are close to, not bitwise equal to, an uninterrupted trial's.
    """

    def __init__(
        self,
        spec: TransformerSpec,
        hparams: Mapping[str, object],
        data: LMData,
        *,
        weights: Mapping[str, np.ndarray] | None = None,
        epochs: int | None = None,
        steps_per_epoch: int,
        eval_windows: int,
        precision: str | None = None,
        seed: int,
        jit_compile: bool | str = "auto",
        start_epoch: int = 0,
        model: Model | None = None,
    ) -> None:
        t0 = time.perf_counter()
        plan = check_lm_trial(
            spec,
            hparams,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            eval_windows=eval_windows,
            precision=precision,
            seed=seed,
        )
        self.start_epoch = _integer("start_epoch", start_epoch, 0, plan.epochs)
        if self.start_epoch and weights is None:
            raise AiperfError(f"LM trial: resuming after epoch {self.start_epoch} needs that epoch's weights")
        for method in ("train_windows", "val_windows"):
            if not callable(getattr(data, method, None)):
                raise AiperfError(f"LM trial: data has no {method}() method ({type(data).__name__})")
        self.bytes_per_token = _bytes_per_token(data)
        data_vocab = getattr(data, "vocab_size", None)
        if isinstance(data_vocab, int) and not isinstance(data_vocab, bool) and data_vocab > spec.vocab_size:
            raise AiperfError(
                f"LM trial: the data's vocabulary ({data_vocab}) is larger than the model's ({spec.vocab_size})"
            )
        if weights is not None:
            try:
                check_weights(spec, weights)
            except NasError as exc:
                raise AiperfError(f"LM trial: {exc}") from None
        self.spec, self.plan, self.data = spec, plan, data
        self.x_val, self.y_val = _windows(
            data.val_windows(plan.seq_len, plan.eval_windows), plan.seq_len, spec.vocab_size, "validation windows"
        )
        self.val_fingerprint = _fingerprint(self.x_val, self.y_val)
        flops = transformer_flops(spec, plan.seq_len)
        # Training counts one AdamW update per step spread over its tokens, as an image epoch counts one per batch.
        self.train_flops_per_token = flops.train_per_token(plan.batch_size * plan.seq_len)
        self.eval_flops_per_token = flops.forward(1)

        seed_trial(plan.seed % (2**31))
        start = dict(weights) if weights is not None else init_weights(spec, plan.seed)
        if model is None:
            self.model = compiled_lm(spec, plan, jit_compile, start)
        else:  # built and compiled ahead for this trial (LMTrialRunner.prepare), its optimizer never stepped
            lm_weights_to_keras(model, start)
            self.model = model
        self.model.optimizer.iterations.assign(self.start_epoch * plan.steps_per_epoch)
        self.startup_seconds = time.perf_counter() - t0
        self.first_step_seconds: float | None = None  # the first trained epoch's first step, compilation included
        self.window: tuple[float, float] | None = None  # perf_counter at the last epoch's fit start and eval end

    @property
    def eval_tokens(self) -> int:
        return int(self.y_val.size)

    @property
    def updates(self) -> int:
        """Optimizer updates so far, counting a resumed trial's earlier ones: the schedule's position."""
        import keras

        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def evaluate(self) -> tuple[float, float]:
        """(validation loss in nats per token, seconds it took) of the model's current weights."""
        t_eval = time.perf_counter()
        loss = _evaluate(self.model, self.x_val, self.y_val, self.plan.batch_size)
        return loss, time.perf_counter() - t_eval

    def weights(self) -> Weights:
        """The current weights as NumPy arrays named as in :func:`~nas.language.spec.init_weights`."""
        return lm_weights_from_keras(self.model)

    def train(self) -> Iterator[EpochLM]:
        """Train the remaining epochs, yielding each one's record as it completes."""
        import keras

        plan, spec = self.plan, self.spec
        count = plan.steps_per_epoch * plan.batch_size
        tokens = count * plan.seq_len
        for epoch in range(self.start_epoch + 1, plan.epochs + 1):
            x, y = _windows(
                self.data.train_windows(plan.seq_len, epoch, count, plan.seed),
                plan.seq_len,
                spec.vocab_size,
                "training windows",
                count,
            )
            timer = _FirstStepTimer(keras)
            t_fit = time.perf_counter()
            hist = self.model.fit(
                x, y, batch_size=plan.batch_size, epochs=1, shuffle=False, verbose=0, callbacks=[timer.callback]
            )
            train_s = time.perf_counter() - t_fit
            compile_s = 0.0
            if self.first_step_seconds is None:
                self.first_step_seconds = train_s if timer.first_end is None else timer.first_end - t_fit
                compile_s = compile_overhead(self.first_step_seconds, train_s, plan.steps_per_epoch)
            step_s = max(0.0, train_s - compile_s)
            train_loss = float(hist.history["loss"][-1])
            if not math.isfinite(train_loss):
                raise AiperfError(f"LM trial: the training loss is {train_loss} in epoch {epoch} (training diverged)")
            t_eval = time.perf_counter()
            val_loss, eval_s = self.evaluate()
            self.window = (t_fit, t_eval + eval_s)
            last_step = epoch * plan.steps_per_epoch - 1
            yield EpochLM(
                epoch=epoch,
                train_loss=train_loss,
                val_loss=val_loss,
                bits_per_byte=val_loss * LOG2E / self.bytes_per_token,
                tokens=tokens,
                step_seconds=step_s,
                compile_seconds=compile_s,
                tokens_per_second=tokens / step_s if step_s > 0 else 0.0,
                train_flops=self.train_flops_per_token * tokens,
                eval_flops=self.eval_flops_per_token * self.eval_tokens,
                eval_tokens=self.eval_tokens,
                eval_seconds=eval_s,
                steps=plan.steps_per_epoch,
                learning_rate=warmup_cosine_rate(last_step, plan.learning_rate, plan.warmup_steps, plan.schedule_steps),
            )


def train_lm_trial(
    spec: TransformerSpec,
    hparams: Mapping[str, object],
    data: LMData,
    *,
    weights: Mapping[str, np.ndarray] | None = None,
    epochs: int | None = None,
    steps_per_epoch: int,
    eval_windows: int,
    on_epoch: Callable[[EpochLM], None] | None = None,
    precision: str | None = None,
    seed: int,
    jit_compile: bool | str = "auto",
) -> LMTrialResult:
    """Train ``spec`` on ``data`` for ``epochs`` epochs of ``steps_per_epoch`` steps; ``on_epoch`` after each.

    ``hparams``: ``learning_rate`` (peak), ``warmup_fraction`` in [0, 1), ``weight_decay``,
    ``batch_size`` (sequences per step), ``seq_len`` (at most the spec's), ``epochs`` (the
    schedule's length in epochs). ``epochs`` (default ``hparams["epochs"]``, at most it) is
    how many to run now: a shortened trial keeps the schedule of the full one.
    ``weights`` (named as in :func:`nas.language.spec.init_weights`; a parent's, transformed by
    :func:`nas.language.morph.apply_morph`) are the starting point; without them fresh
    ``init_weights(spec, seed)``. ``precision``: ``float32`` (None) or ``mixed_bfloat16``.
    ``jit_compile`` goes to Keras's ``compile`` (``auto``: XLA on accelerators, not on CPU).
    Also evaluates the starting weights (``initial_val_loss``), which :class:`LMTraining` alone does not.
    """
    import keras

    if on_epoch is not None and not callable(on_epoch):
        raise AiperfError(f"LM trial: on_epoch must be callable, got {excerpt(on_epoch)}")
    trial = LMTraining(
        spec,
        hparams,
        data,
        weights=weights,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        eval_windows=eval_windows,
        precision=precision,
        seed=seed,
        jit_compile=jit_compile,
    )
    initial, initial_eval_s = trial.evaluate()
    records: list[EpochLM] = []
    for record in trial.train():
        records.append(record)
        if on_epoch is not None:
            on_epoch(record)
    plan = trial.plan
    return LMTrialResult(
        spec=spec,
        epochs=records,
        weights=trial.weights(),
        initial_val_loss=initial,
        initial_bits_per_byte=initial * LOG2E / trial.bytes_per_token,
        backend=keras.backend.backend(),
        precision=plan.precision,
        batch_size=plan.batch_size,
        seq_len=plan.seq_len,
        steps_per_epoch=plan.steps_per_epoch,
        schedule_steps=plan.schedule_steps,
        warmup_steps=plan.warmup_steps,
        eval_windows=int(trial.x_val.shape[0]),
        val_fingerprint=trial.val_fingerprint,
        train_flops_per_token=trial.train_flops_per_token,
        eval_flops_per_token=trial.eval_flops_per_token,
        initial_eval_flops=trial.eval_flops_per_token * trial.eval_tokens,
        startup_seconds=trial.startup_seconds,
        initial_eval_seconds=initial_eval_s,
        hparams=plan.hparams(),
    )
