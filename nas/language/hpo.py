"""The language-model hyperparameter space and a TPE tuner over it (Optuna ask/tell, bounded history).

:class:`nas.hpo.HyperparameterTuner` is tied to the image keys (its asks go through
:func:`nas.hpo.normalise_hparams`, which demands exactly ``HPARAM_KEYS``), so it cannot take
another space without an edit there; :class:`LMTuner` is a small tuner of its own with the
same ideas: ``constant_liar`` TPE so many asks in a row spread out, and a study bounded to
the best and latest results plus the latest running trials, rebuilt every ``rebuild_every``
trials, so an ask costs the same late in a run as early.

The space: ``learning_rate`` and ``weight_decay`` on a log scale, ``warmup_fraction`` (of a
trial's optimizer steps) linear, ``batch_size`` (sequences per step) and ``seq_len``
(tokens per sequence, each at most the model's context) categorical, ``epochs`` an integer
range. ``max_batch_tokens`` is a bound from outside (what a device holds): a sampled batch
that would exceed it with the sampled ``seq_len`` is cut to the largest batch choice that
fits, and TPE learns from the values actually trained.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from nas.errors import NasError
from nas.graph import short_repr
from nas.hpo import HyperparameterTuner

LM_HPARAM_KEYS = ("learning_rate", "warmup_fraction", "weight_decay", "batch_size", "seq_len", "epochs")
DEFAULT_LM_HPARAMS: dict[str, Any] = {
    "learning_rate": 3e-3,
    "warmup_fraction": 0.05,
    "weight_decay": 0.01,
    "batch_size": 32,
    "seq_len": 128,
    "epochs": 1,
}


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise NasError(f"lm hyperparameter space: {name} bounds must be finite numbers, got {short_repr(value)}")
    return value


def _pair(name: str, value: object, integer: bool = False) -> tuple[Any, Any]:
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        raise NasError(f"lm hyperparameter space: {name} must be a (low, high) pair, got {short_repr(value)}")
    lo, hi = (_number(name, v) for v in value)
    if integer and (int(lo) != lo or int(hi) != hi):
        raise NasError(f"lm hyperparameter space: {name} bounds must be integers, got {short_repr(value)}")
    if lo > hi:
        raise NasError(f"lm hyperparameter space: {name} low {lo} exceeds high {hi}")
    return (int(lo), int(hi)) if integer else (float(lo), float(hi))


def _choices(name: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not 1 <= len(value) <= 64:
        raise NasError(f"lm hyperparameter space: {name} must be a list of 1 to 64 integers, got {short_repr(value)}")
    if any(isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 24 for v in value):
        raise NasError(f"lm hyperparameter space: {name} must hold integers in [1, 2^24], got {short_repr(value)}")
    return tuple(sorted(set(value)))


@dataclass(frozen=True)
class LMHyperparameterSpace:
    """What TPE samples for a language-model trial (see the module docstring)."""

    learning_rate: tuple[float, float] = (3e-4, 3e-2)
    warmup_fraction: tuple[float, float] = (0.0, 0.2)
    weight_decay: tuple[float, float] = (1e-4, 0.3)
    batch_sizes: tuple[int, ...] = (16, 32, 64)
    seq_lens: tuple[int, ...] = (64, 128)
    epochs: tuple[int, int] = (1, 3)
    max_batch_tokens: int | None = None

    def __post_init__(self) -> None:
        clean: dict[str, Any] = {
            "learning_rate": _pair("learning_rate", self.learning_rate),
            "warmup_fraction": _pair("warmup_fraction", self.warmup_fraction),
            "weight_decay": _pair("weight_decay", self.weight_decay),
            "batch_sizes": _choices("batch_sizes", self.batch_sizes),
            "seq_lens": _choices("seq_lens", self.seq_lens),
            "epochs": _pair("epochs", self.epochs, integer=True),
        }
        for name in ("learning_rate", "weight_decay"):
            if clean[name][0] <= 0:
                raise NasError(
                    f"lm hyperparameter space: {name} must be positive (log scale), got {getattr(self, name)!r}"
                )
        if not (clean["warmup_fraction"][0] >= 0.0 and clean["warmup_fraction"][1] < 1.0):
            raise NasError(f"lm hyperparameter space: warmup_fraction must lie in [0, 1), got {self.warmup_fraction!r}")
        if clean["epochs"][0] < 1:
            raise NasError(f"lm hyperparameter space: epochs must start at 1 or more, got {self.epochs!r}")
        cap = self.max_batch_tokens
        if cap is not None:
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                raise NasError(f"lm hyperparameter space: max_batch_tokens must be a positive integer, got {cap!r}")
            need = clean["batch_sizes"][0] * clean["seq_lens"][-1]
            if need > cap:
                raise NasError(
                    f"lm hyperparameter space: max_batch_tokens {cap} is below the smallest batch "
                    f"times the longest seq_len ({need})"
                )
        for name, value in clean.items():
            object.__setattr__(self, name, value)

    def check_context(self, seq_len: int) -> None:
        """Every ``seq_lens`` choice must fit the model's context ``seq_len``."""
        over = [s for s in self.seq_lens if s > seq_len]
        if over:
            raise NasError(f"lm hyperparameter space: seq_lens {over} exceed the model's seq_len {seq_len}")

    def distributions(self) -> dict[str, BaseDistribution]:
        return {
            "learning_rate": FloatDistribution(*self.learning_rate, log=True),
            "warmup_fraction": FloatDistribution(*self.warmup_fraction),
            "weight_decay": FloatDistribution(*self.weight_decay, log=True),
            "batch_size": CategoricalDistribution(self.batch_sizes),
            "seq_len": CategoricalDistribution(self.seq_lens),
            "epochs": IntDistribution(*self.epochs),
        }

    def normalise(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return normalise_lm_hparams(values)

    def fit(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return self.fit_tokens(params)

    def admits(self, params: Mapping[str, Any]) -> bool:
        return self.contains(params)

    def fit_tokens(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with the batch cut to the largest choice within ``max_batch_tokens`` (if over)."""
        out = dict(params)
        cap = self.max_batch_tokens
        if cap is not None and out["batch_size"] * out["seq_len"] > cap:
            out["batch_size"] = max(b for b in self.batch_sizes if b * out["seq_len"] <= cap)
        return out

    def contains(self, hparams: Mapping[str, Any]) -> bool:
        """Whether normalised ``hparams`` lie inside the space (the token bound included)."""
        h = hparams
        return (
            self.learning_rate[0] <= h["learning_rate"] <= self.learning_rate[1]
            and self.warmup_fraction[0] <= h["warmup_fraction"] <= self.warmup_fraction[1]
            and self.weight_decay[0] <= h["weight_decay"] <= self.weight_decay[1]
            and h["batch_size"] in self.batch_sizes
            and h["seq_len"] in self.seq_lens
            and self.epochs[0] <= h["epochs"] <= self.epochs[1]
            and (self.max_batch_tokens is None or h["batch_size"] * h["seq_len"] <= self.max_batch_tokens)
        )


def normalise_lm_hparams(values: Any) -> dict[str, Any]:
    """Exactly LM_HPARAM_KEYS, in order, as plain Python numbers; one NasError naming the field otherwise."""
    if not isinstance(values, Mapping):
        raise NasError(f"lm hyperparameters must be a mapping, got {type(values).__name__}")
    missing = [k for k in LM_HPARAM_KEYS if k not in values]
    extra = sorted(str(k) for k in set(values) - set(LM_HPARAM_KEYS))
    if missing or extra:
        raise NasError(
            f"lm hyperparameters must have exactly the keys {', '.join(LM_HPARAM_KEYS)} "
            f"(missing: {missing or 'none'}, unknown: {extra or 'none'})"
        )
    out: dict[str, Any] = {}
    for key in LM_HPARAM_KEYS:
        value = values[key]
        integer = key in ("batch_size", "seq_len", "epochs")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and int(value) != value):
            kind = "an integer" if integer else "a number"
            raise NasError(f"lm hyperparameters: {key} must be {kind}, got {short_repr(value)}")
        out[key] = int(value) if integer else float(value)
    for key, ok in (
        ("learning_rate", 0 < out["learning_rate"] < math.inf),
        ("warmup_fraction", 0.0 <= out["warmup_fraction"] < 1.0),
        ("weight_decay", 0.0 <= out["weight_decay"] < math.inf),
        ("batch_size", out["batch_size"] >= 1),
        ("seq_len", out["seq_len"] >= 1),
        ("epochs", out["epochs"] >= 1),
    ):
        if not ok:
            raise NasError(f"lm hyperparameters: {key} out of range, got {short_repr(out[key])}")
    return out


class LMTuner(HyperparameterTuner):
    """TPE over an :class:`LMHyperparameterSpace`: the image search's bounded-history tuner (nas.hpo)."""

    def __init__(self, space: LMHyperparameterSpace, seed: int, **history: int) -> None:
        if not isinstance(space, LMHyperparameterSpace):
            raise NasError(f"lm tuner: space must be an LMHyperparameterSpace, got {type(space).__name__}")
        super().__init__(space, seed, **history)
