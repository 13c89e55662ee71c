"""Run one language-model trial inside a worker, yielding the items the worker turns into messages.

The LM counterpart of :class:`~aiperf.families.image.trainer.TrialRunner`: the same ``run(spec,
parent_weights, resume_weights)`` generator and the same items (``epoch`` per completed epoch,
then ``done``), so :meth:`~aiperf.cluster.worker.TrialWorker.run_trial` serves both workloads
unchanged. The trial is :class:`~aiperf.families.language.trainer.LMTraining`; this module chooses its
starting weights and says each epoch in the worker's words:

* ``train_images`` / ``eval_images`` are sequences (windows), ``train_tokens`` / ``eval_tokens``
  the tokens the FLOPs scale with, ``train_acc`` is None (not measured);
* ``val_acc`` is the LM's quality, :func:`lm_quality` of the validation bits per byte, so the
  search, the best-trial choice and the regulated score read one number for either workload.

A trial starts from its own checkpoint (``resume_weights``, after ``spec.start_epoch`` epochs),
else from its parent's trained weights replayed through ``spec.morphs`` (function-preserving,
seeded by the trial seed so every retry starts identically), else from a fresh initialisation.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from aiperf.errors import AiperfError, excerpt, first_line
from aiperf.families.language.epoch_size import auto_steps_per_epoch
from aiperf.families.language.trainer import PRECISIONS, LMData, LMPlan, LMTraining, check_lm_trial, compiled_lm
from aiperf.training.compile_ahead import Prepared, StepShapes, compile_ahead, install
from aiperf.training.step_timing import CompileShares
from aiperf.training.trial import TrialSpec
from nas.errors import NasError
from nas.language.morph import LMMorph, apply_morph
from nas.language.spec import TransformerSpec, Weights, check_weights

if TYPE_CHECKING:
    from keras import Model

BITS_PER_BYTE_SCALE = 8.0  # quality 0 at 8 bits per byte: no better than storing the bytes as they are


def lm_quality(bits_per_byte: float) -> float:
    """``clamp(1 - bits_per_byte / 8, 0, 1)``: higher is better and in [0, 1], as an accuracy is."""
    return min(1.0, max(0.0, 1.0 - bits_per_byte / BITS_PER_BYTE_SCALE))


def lm_precision(requested: str) -> str:
    """The LM trainer's precision for a worker's: ``mixed_float16`` trains in ``float32``.

    fp16 needs loss scaling, which the LM trainer does not do; a worker on a GPU older than
    bf16 (compute capability 7.x) is given ``mixed_float16`` for images and trains LMs in float32
    rather than failing. Anything the trainer does not know is refused by name.
    """
    if requested == "mixed_float16":
        return "float32"
    if requested not in PRECISIONS:
        raise AiperfError(
            f"LM worker: precision must be one of {', '.join(PRECISIONS)} or mixed_float16, got {excerpt(requested)}"
        )
    return requested


@dataclass(frozen=True)
class LMRunnerSettings:
    """How this worker trains language models: fixed for its lifetime."""

    precision: str  # the worker's trainer precision; see lm_precision
    jit_compile: bool | str  # "auto" | True | False, to Keras's compile
    steps_per_epoch: int | Literal["auto"]  # lm.steps_per_epoch; auto: sized by the ceiling (epoch_size.py)
    eval_windows: int
    compile_ahead: bool = False  # train.compile_ahead where the backend can (JAX: aiperf.training.compile_ahead)
    epoch_device_s: float = 10.0  # lm.epoch_device_s: with auto, an epoch's seconds at the ceiling below
    ceiling_flops_per_s: float | None = None  # the worker's measured ceiling (None: not measured)


class LanguageSource(Protocol):
    """What a worker is handed (:class:`~aiperf.families.language.data.LanguageData`): where its windows come from."""

    @property
    def streaming(self) -> bool: ...

    def windows(self) -> LMData: ...


def lm_step_shapes(plan: LMPlan) -> StepShapes:
    """A language trial's step inputs: sequences of token ids and their next tokens, training and evaluation batches
    (the evaluation's last one partial when the windows do not fill whole batches)."""
    windows, batch = plan.eval_windows, plan.batch_size
    evals = (min(batch, windows),) + ((windows % batch,) if windows > batch and windows % batch else ())
    return StepShapes(batch, evals, (plan.seq_len,), "int32", "int32", (plan.seq_len,), evaluate=True)


def lm_spec_of(spec: TrialSpec, graph: object, what: str) -> TransformerSpec:
    """A trial's architecture document as a :class:`TransformerSpec`; one line naming the trial if it is none."""
    try:
        return TransformerSpec.from_dict(graph)
    except NasError as exc:
        raise AiperfError(f"trial {spec.trial_id}: {what} is not a language model ({first_line(exc, 200)})") from None


def inherit_lm_weights(spec: TrialSpec, parent_weights: Mapping[Any, Any]) -> Weights:
    """The parent's trained weights replayed through the trial's morphs: function-preserving child weights.

    The replay's random draws come from the trial seed, so every retry starts identically; a
    replay that does not end at the trial's architecture (a corrupted lineage) raises.
    """
    if spec.parent_graph is None:
        raise AiperfError(f"trial {spec.trial_id}: inherits weights but carries no parent architecture")
    arch = lm_spec_of(spec, spec.parent_graph, "the parent architecture")
    target = lm_spec_of(spec, spec.graph, "the architecture")
    rng = np.random.default_rng(spec.seed)
    try:
        check_weights(arch, parent_weights)  # a set of another kind or shape fails here, by name
        weights: Weights = dict(parent_weights)
        for raw in spec.morphs:
            arch, weights = apply_morph(arch, LMMorph.from_dict(raw), weights, rng)
    except NasError as exc:
        raise AiperfError(f"trial {spec.trial_id}: replaying the lineage failed ({first_line(exc, 200)})") from None
    if arch.key() != target.key():
        raise AiperfError(f"trial {spec.trial_id}: replaying the lineage does not give the proposed architecture")
    return weights


class LMTrialRunner:
    """Trains language-model trials; one instance per worker, reused for every trial.

    ``dataset`` is the worker's :class:`LanguageSource`: its windows are opened once, here (a
    token-shard folder is mapped on this node), and every trial reads them.
    """

    def __init__(self, dataset: LanguageSource, settings: LMRunnerSettings) -> None:
        self.dataset = dataset
        self.settings = settings
        self.precision = lm_precision(settings.precision)
        self.data = dataset.windows()
        self.last_training: LMTraining | None = None  # the most recent trial, for inspection (tests)
        self._ahead: Prepared[Model] = Prepared()  # trials' models compiled ahead, by trial id

    def _plan(self, spec: TrialSpec, arch: TransformerSpec) -> LMPlan:
        def plan(steps: int) -> LMPlan:
            return check_lm_trial(
                arch,
                spec.hparams,
                epochs=None,
                steps_per_epoch=steps,
                eval_windows=self.settings.eval_windows,
                precision=self.precision,
                seed=spec.seed,
            )

        if spec.steps_per_epoch is not None:  # a later attempt keeps the steps its epochs were trained with
            return plan(spec.steps_per_epoch)
        if self.settings.steps_per_epoch != "auto":
            return plan(self.settings.steps_per_epoch)
        checked = plan(1)  # the hyperparameters checked before they size anything
        return plan(
            auto_steps_per_epoch(
                arch,
                checked.batch_size,
                checked.seq_len,
                checked.schedule_epochs,
                self.settings.ceiling_flops_per_s,
                self.settings.epoch_device_s,
            )
        )

    def prepare(self, spec: TrialSpec) -> bool:
        """Build ``spec``'s model, compile it for its plan and compile its train and evaluation steps, before
        its trial starts (the worker's compile thread, while the trial before trains; as TrialRunner.prepare).

        A language trial's model is its own (its optimizer's schedule is the trial's), so it is kept
        by trial id and only for that trial. Returns whether anything was compiled.
        """
        if not self.settings.compile_ahead:
            return False
        with self._ahead.state:
            if self._ahead.busy(spec.trial_id) or self._ahead.peek(spec.trial_id) is not None:
                return False
            self._ahead.begin(spec.trial_id)
        model = None
        try:
            arch = lm_spec_of(spec, spec.graph, "the architecture")
            plan = self._plan(spec, arch)
            with self._ahead.keras_lock:
                model = compiled_lm(arch, plan, self.settings.jit_compile)
                install(model)
            compile_ahead(model, lm_step_shapes(plan), self._ahead.keras_lock)
        finally:
            self._ahead.finish(spec.trial_id, model)
        return True

    def start_weights(
        self,
        spec: TrialSpec,
        parent_weights: Mapping[Any, Any] | None = None,
        resume_weights: Mapping[Any, Any] | None = None,
    ) -> Weights | None:
        """The trial's starting weights: its checkpoint, else its parent's replayed, else None (fresh).

        Typed as any mapping: the worker's weights arrive as whatever crossed the wire, and
        :class:`~aiperf.families.language.trainer.LMTraining` checks a checkpoint against the spec by name.
        """
        if resume_weights is not None:
            return dict(resume_weights)
        if parent_weights is not None:
            return inherit_lm_weights(spec, parent_weights)
        return None

    def run(
        self,
        spec: TrialSpec,
        parent_weights: Mapping[Any, Any] | None = None,
        resume_weights: Mapping[Any, Any] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Yield one ``{"type": "epoch", ...}`` per completed epoch, then ``{"type": "done", ...}``.

        The items' keys are :class:`~aiperf.cluster.messages.EpochReport`'s and
        :class:`~aiperf.cluster.messages.TrialDone`'s fields (plus ``type`` and the epoch's
        ``window``). An epoch carries its weights as a checkpoint when the spec asks for them,
        except the last: the ``done`` item carries those.
        """
        import keras

        t0 = time.perf_counter()
        self.last_training = None  # nothing may keep the previous trial's model
        with self._ahead.state:
            prepared, compile_wait_s = self._ahead.wait_and_take(spec.trial_id)
        arch = lm_spec_of(spec, spec.graph, "the architecture")
        start = self.start_weights(spec, parent_weights, resume_weights)
        with self._ahead.keras_lock:
            # A long-lived worker builds a model per trial: Keras's global state (layer-name counters,
            # TensorFlow's graph) would otherwise grow with every one.
            keras.backend.clear_session()
            training = LMTraining(
                arch,
                spec.hparams,
                self.data,
                weights=start,
                steps_per_epoch=self._plan(spec, arch).steps_per_epoch,
                eval_windows=self.settings.eval_windows,
                precision=self.precision,
                seed=spec.seed,
                jit_compile=self.settings.jit_compile,
                start_epoch=spec.start_epoch,
                model=prepared,
            )
            if self.settings.compile_ahead and prepared is None:
                install(training.model)
        startup_s = time.perf_counter() - t0  # lineage replay, windows, build and compile
        self.last_training = training
        plan = training.plan
        sequences = plan.steps_per_epoch * plan.batch_size
        windows = int(training.x_val.shape[0])
        compiles = CompileShares()  # the first step's and the first evaluation's excess, epoch by epoch
        best: float | None = None
        weights = start
        for record in training.train():
            assert training.window is not None
            first_step_excess = record.compile_seconds if training.first_step_seconds is not None else None
            compile_share = compiles.epoch(first_step_excess, record.eval_seconds)
            quality = lm_quality(record.bits_per_byte)
            best = quality if best is None else max(best, quality)
            weights = training.weights()
            item: dict[str, Any] = {
                "type": "epoch",
                "window": training.window,  # this process's perf_counter: fit start to evaluation end
                "epoch": record.epoch,
                "train_images": sequences,
                "eval_images": windows,
                "train_tokens": record.tokens,
                "eval_tokens": record.eval_tokens,
                "train_acc": None,
                "train_loss": record.train_loss,
                "val_acc": quality,
                "val_loss": record.val_loss,
                "bits_per_byte": record.bits_per_byte,
                "train_s": record.step_seconds + record.compile_seconds,
                "eval_s": record.eval_seconds,
                "batch_size": plan.batch_size,
                "precision": plan.precision,
                "steps": record.steps,
                "input": "stream" if self.dataset.streaming else "memory",
                "compile_s": compile_share,
                "compile_wait_s": compile_wait_s if record.epoch == spec.start_epoch + 1 else None,
            }
            if spec.checkpoint_every_epoch and record.epoch < plan.epochs:
                item["weights"] = weights
            yield item
        first_step_s = training.first_step_seconds
        yield {
            "type": "done",
            "weights": weights if weights is not None else training.weights(),
            "startup_s": startup_s,
            "first_step_s": first_step_s,
            "compile_s": None if first_step_s is None else compiles.total(),
            "step_reused": prepared is not None,
            "best_val_acc": best,
            "batch_size": plan.batch_size,
            "requested_batch_size": plan.batch_size,
            "precision": plan.precision,
        }
