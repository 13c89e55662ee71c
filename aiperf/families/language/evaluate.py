"""Evaluate a language model's stored weights as its trial's worker evaluated them: what ``aiperf audit`` re-runs.

A language epoch records ``val_loss`` (mean next-token cross-entropy, nats per token) on the
run's fixed validation windows, its ``bits_per_byte`` and, as ``val_acc``, the quality
``1 - bits_per_byte / 8`` (:func:`~aiperf.families.language.runner.lm_quality`). Re-computing them
from a weights file must go through the trainer's own path, not a second implementation that
could agree with a forgery: the trial is set up as :class:`~aiperf.families.language.trainer.LMTraining`
(its checks of the spec, hyperparameters, weights and windows; its model builder, dtype policy,
compiled loss and evaluation batch) and only evaluated, never trained.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiperf.families.language.model import LOG2E

if TYPE_CHECKING:
    import numpy as np

    from aiperf.families.language.trainer import LMData
    from nas.language.spec import TransformerSpec


@dataclass(frozen=True)
class LMEvaluation:
    """One evaluation of a weight set on the validation windows, in the epoch record's terms."""

    val_loss: float  # nats per token
    bits_per_byte: float
    quality: float  # what the epoch records as val_acc
    windows: int  # validation windows used (the data may hold fewer than asked for)
    tokens: int  # validation tokens (targets) scored
    val_fingerprint: str  # SHA-256 of the windows (LMTrialResult.val_fingerprint)
    seconds: float


def evaluate_lm_weights(
    spec: TransformerSpec,
    hparams: Mapping[str, object],
    weights: Mapping[str, np.ndarray],
    data: LMData,
    *,
    steps_per_epoch: int,
    eval_windows: int,
    precision: str | None = None,
    jit_compile: bool | str = "auto",
) -> LMEvaluation:
    """``weights`` of ``spec`` evaluated on ``data.val_windows(hparams["seq_len"], eval_windows)``.

    ``hparams`` are the trial's (its ``seq_len`` picks the windows, its ``batch_size`` the
    evaluation batch, as in training); ``steps_per_epoch`` (the run's) only passes the trainer's
    checks: nothing is drawn or trained. ``precision`` is the trial's dtype policy (``float32``
    or ``mixed_bfloat16``). Anything that does not fit -- a bad hyperparameter, weights of
    another shape, windows outside the vocabulary, a non-finite loss -- raises one
    :class:`~aiperf.errors.AiperfError` naming it.
    """
    from aiperf.families.language.runner import lm_quality
    from aiperf.families.language.trainer import LMTraining

    trial = LMTraining(
        spec,
        hparams,
        data,
        weights=weights,
        steps_per_epoch=steps_per_epoch,
        eval_windows=eval_windows,
        precision=precision,
        seed=0,  # the evaluation draws nothing
        jit_compile=jit_compile,
    )
    loss, seconds = trial.evaluate()
    bits = loss * LOG2E / trial.bytes_per_token
    return LMEvaluation(
        val_loss=loss,
        bits_per_byte=bits,
        quality=lm_quality(bits),
        windows=int(trial.x_val.shape[0]),
        tokens=trial.eval_tokens,
        val_fingerprint=trial.val_fingerprint,
        seconds=seconds,
    )
