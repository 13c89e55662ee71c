"""Hyperparameter tuning with Optuna's TPE through its ask/tell interface.

The master owns the loop, so Optuna never runs an objective: :meth:`HyperparameterTuner.ask`
returns a full hyperparameter dict (exactly :data:`nas.proposer.HPARAM_KEYS`) for a trial id
and :meth:`HyperparameterTuner.tell` reports its outcome. ``constant_liar=True`` makes TPE
treat running trials as if they had a poor result, so many asks in a row spread out.

Optuna's TPE re-reads every trial of its study on each ask, so an unbounded study makes
each ask slower as a run goes on; the tuner keeps the study bounded instead (the best and
the latest results and the latest running trials, rebuilt periodically), so a long run's
master does not slow down.

Until the study holds ``N_STARTUP`` results TPE samples every parameter independently and
uniformly (Optuna's ``RandomSampler``); the tuner draws those samples itself, outside the
study, because an Optuna ask cost 0.33 ms of bookkeeping for them -- a fifth of the start-up
fill at 65,536 workers, where tens of thousands of re-tunes are asked before any trial ends
(benchmarks/RESULTS.md, "Start-up re-tunes sampled outside Optuna"). Their results are added
to the study when told, and the first TPE ask after them rebuilds the study so that the latest
of them that still run are in it as constant-liar lies.
"""

from __future__ import annotations

import heapq
import math
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from nas.defaults import HPARAM_RANGES
from nas.errors import NasError
from nas.proposer import HPARAM_KEYS

# The bounded TPE history (see HyperparameterTuner): kept results, kept running trials, and how
# many trials the study may gain before it is rebuilt from them.
KEEP_BEST = 32  # TPE's default split puts at most 25 trials in its "good" group
KEEP_RECENT = 224
KEEP_RUNNING = 128
REBUILD_EVERY = 128
N_STARTUP = 10  # results before TPE models anything (Optuna's default, passed explicitly)
N = TypeVar("N", int, float)


def _pair(name: str, value: object, kind: type[N]) -> tuple[N, N]:
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        raise NasError(f"hyperparameter space: {name} must be a (low, high) pair, got {value!r}")
    lo, hi = value
    for v in (lo, hi):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise NasError(f"hyperparameter space: {name} bounds must be finite numbers, got {value!r}")
        if kind is int and int(v) != v:
            raise NasError(f"hyperparameter space: {name} bounds must be integers, got {value!r}")
    if lo > hi:
        raise NasError(f"hyperparameter space: {name} low {lo} exceeds high {hi}")
    return kind(lo), kind(hi)


def _choices(name: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise NasError(f"hyperparameter space: {name} must be a non-empty list of integers, got {value!r}")
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
        raise NasError(f"hyperparameter space: {name} must hold positive integers, got {value!r}")
    return tuple(sorted(set(value)))


@dataclass(frozen=True)
class HyperparameterSpace:
    """What TPE samples from; field names match ``aiperf.config.HpoConfig`` (pass its dump)."""

    learning_rate: tuple[float, float] = HPARAM_RANGES.learning_rate
    weight_decay: tuple[float, float] = HPARAM_RANGES.weight_decay
    dropout: tuple[float, float] = HPARAM_RANGES.dropout
    batch_sizes: tuple[int, ...] = HPARAM_RANGES.batch_sizes
    kernel_sizes: tuple[int, ...] = HPARAM_RANGES.kernel_sizes
    epochs: tuple[int, int] = HPARAM_RANGES.epochs

    def __post_init__(self) -> None:
        clean = {
            "learning_rate": _pair("learning_rate", self.learning_rate, float),
            "weight_decay": _pair("weight_decay", self.weight_decay, float),
            "dropout": _pair("dropout", self.dropout, float),
            "batch_sizes": _choices("batch_sizes", self.batch_sizes),
            "kernel_sizes": _choices("kernel_sizes", self.kernel_sizes),
            "epochs": _pair("epochs", self.epochs, int),
        }
        if clean["learning_rate"][0] <= 0 or clean["weight_decay"][0] <= 0:
            raise NasError("hyperparameter space: learning_rate and weight_decay must be positive (log scale)")
        if not (clean["dropout"][0] >= 0.0 and clean["dropout"][1] < 1.0):
            raise NasError(f"hyperparameter space: dropout must lie in [0, 1), got {self.dropout!r}")
        if any(k % 2 == 0 for k in clean["kernel_sizes"]):
            raise NasError(
                f"hyperparameter space: kernel sizes must be odd (identity-initialised layers), "
                f"got {list(clean['kernel_sizes'])}"
            )
        if clean["epochs"][0] < 1:
            raise NasError(f"hyperparameter space: epochs must start at 1 or more, got {self.epochs!r}")
        for name, value in clean.items():
            object.__setattr__(self, name, value)

    def normalise(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return normalise_hparams(values)

    def fit(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """What is trained for sampled ``params``: the same here (a language model's space bounds tokens)."""
        return dict(params)

    def admits(self, params: Mapping[str, Any]) -> bool:
        """Beyond the distributions' own bounds (checked by Optuna), nothing."""
        return True

    def distributions(self) -> dict[str, BaseDistribution]:
        """One Optuna distribution per key of HPARAM_KEYS."""
        return {
            "learning_rate": FloatDistribution(*self.learning_rate, log=True),
            "batch_size": CategoricalDistribution(self.batch_sizes),
            "weight_decay": FloatDistribution(*self.weight_decay, log=True),
            "dropout": FloatDistribution(*self.dropout),
            "kernel_size": CategoricalDistribution(self.kernel_sizes),
            "epochs": IntDistribution(*self.epochs),
        }


def normalise_hparams(values: Mapping[str, Any]) -> dict[str, Any]:
    """The proposal form of a hyperparameter set: exactly HPARAM_KEYS, in order, as plain Python types."""
    missing = [k for k in HPARAM_KEYS if k not in values]
    extra = sorted(set(values) - set(HPARAM_KEYS))
    if missing or extra:
        raise NasError(
            f"hyperparameters must have exactly the keys {', '.join(HPARAM_KEYS)} "
            f"(missing: {missing or 'none'}, unknown: {extra or 'none'})"
        )
    out = {
        "learning_rate": float(values["learning_rate"]),
        "batch_size": int(values["batch_size"]),
        "weight_decay": float(values["weight_decay"]),
        "dropout": float(values["dropout"]),
        "kernel_size": int(values["kernel_size"]),
        "epochs": int(values["epochs"]),
    }
    if out["learning_rate"] <= 0 or out["batch_size"] < 1 or out["weight_decay"] < 0 or out["epochs"] < 1:
        raise NasError(f"hyperparameters out of range: {out}")
    if not 0.0 <= out["dropout"] < 1.0:
        raise NasError(f"hyperparameters: dropout must be in [0, 1), got {out['dropout']}")
    if out["kernel_size"] < 1 or out["kernel_size"] % 2 == 0:
        raise NasError(f"hyperparameters: kernel_size must be a positive odd integer, got {out['kernel_size']}")
    return out


class TunedSpace(Protocol):
    """What the tuner samples from: the image networks' space, or a language model's (nas.language.hpo)."""

    def distributions(self) -> dict[str, BaseDistribution]: ...

    def normalise(self, values: Mapping[str, Any]) -> dict[str, Any]: ...  # the proposal form

    def fit(self, params: Mapping[str, Any]) -> dict[str, Any]: ...  # sampled -> trained values

    def admits(self, params: Mapping[str, Any]) -> bool: ...  # bounds beyond the distributions'


class KeptResults:
    """The results a bounded TPE study is rebuilt from: the ``keep_best`` best and the ``keep_recent`` latest.

    Also the best over the whole history. Kept by the tuner, and by the master beside a tuner
    in another process (:mod:`nas.tuner_ahead`), to rebuild one from if that process is lost.
    """

    def __init__(self, keep_best: int, keep_recent: int) -> None:
        self._keep_best = keep_best
        self._recent: deque[tuple[int, dict[str, Any], float]] = deque(maxlen=keep_recent)
        self._best_kept: list[tuple[float, int, dict[str, Any]]] = []  # min-heap of (value, -order, params)
        self.completed = 0
        self.best: tuple[dict[str, Any], float] | None = None

    def record(self, params: dict[str, Any], value: float) -> None:
        order = self.completed
        self.completed += 1
        if self.best is None or value > self.best[1]:
            self.best = (params, value)
        self._recent.append((order, params, value))
        entry = (value, -order, params)
        if len(self._best_kept) < self._keep_best:
            heapq.heappush(self._best_kept, entry)
        elif entry[:2] > self._best_kept[0][:2]:  # better, or as good and older: an earlier best stays
            heapq.heapreplace(self._best_kept, entry)

    def kept(self) -> list[tuple[dict[str, Any], float]]:
        """The kept results, oldest first."""
        kept = {order: (params, value) for order, params, value in self._recent}
        kept.update({-neg: (params, value) for value, neg, params in self._best_kept})
        return [kept[order] for order in sorted(kept)]


@dataclass
class _Running:
    params: dict[str, Any]  # Optuna's (external) values
    number: int | None  # its trial number in the current study; None once a rebuild left it out


class HyperparameterTuner:
    """TPE over a :class:`TunedSpace`, one Optuna trial per tune trial of the search.

    The study's history is bounded, so an ask costs the same after 100 or 100,000 tune
    trials: once the study holds ``rebuild_every`` trials more than it keeps, it is rebuilt
    from the ``keep_best`` best results, the ``keep_recent`` latest ones and the
    ``keep_running`` latest running trials (the constant liar's lies), under a sampler
    seeded from ``(seed, rebuild count)``. ``keep_best`` above 25 keeps every trial TPE's
    default split can put in its "good" group.
    """

    def __init__(
        self,
        space: TunedSpace,
        seed: int,
        *,
        keep_best: int = KEEP_BEST,
        keep_recent: int = KEEP_RECENT,
        keep_running: int = KEEP_RUNNING,
        rebuild_every: int = REBUILD_EVERY,
    ) -> None:
        for name, value, low in (
            ("keep_best", keep_best, 1),
            ("keep_recent", keep_recent, 0),
            ("keep_running", keep_running, 0),
            ("rebuild_every", rebuild_every, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise NasError(f"TPE history: {name} must be an integer >= {low}, got {value!r}")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.space = space
        self._distributions = space.distributions()
        self._seed = seed
        self._keep_running = keep_running
        self._capacity = keep_best + keep_recent + keep_running
        self._rebuild_every = rebuild_every
        self._running: dict[str, _Running] = {}  # insertion order = ask order
        self._kept = KeptResults(keep_best, keep_recent)
        self.rebuilds = 0
        self._study = self._new_study()
        self._study_trials = 0
        self._study_results = 0  # completed trials in the current study: TPE models once there are N_STARTUP
        self._random = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED]))
        self._lies_missing = False  # running trials asked outside the study since the last rebuild

    def _new_study(self) -> optuna.Study:
        seed = (
            self._seed
            if self.rebuilds == 0
            else int(np.random.SeedSequence([self._seed, self.rebuilds]).generate_state(1)[0])
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=seed, constant_liar=True, multivariate=True, n_startup_trials=N_STARTUP
            )
        return optuna.create_study(direction="maximize", sampler=sampler)

    def ask(self, trial_id: str) -> dict[str, Any]:
        """Sample hyperparameters for ``trial_id`` (it stays running in TPE until told or failed)."""
        if trial_id in self._running:
            raise NasError(f"trial {trial_id} already has hyperparameters")
        if self._study_results < N_STARTUP:  # what TPE would do, without Optuna's bookkeeping
            drawn = {name: self._uniform(dist) for name, dist in self._distributions.items()}
            params = self.space.fit(drawn)
            self._running[trial_id] = _Running(params, None)
            self._lies_missing = True
            return self.space.normalise(params)
        if self._lies_missing:
            self._rebuild()  # the latest of the trials asked outside the study join it as lies
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            trial = self._study.ask(self._distributions)
        asked = dict(trial.params)
        params = self.space.fit(asked)
        number: int | None = trial.number
        if params != asked:  # TPE must learn what is trained: the asked trial is swapped for the fitted values
            self._study.tell(trial.number, state=TrialState.FAIL)
            self._study.add_trial(
                create_trial(params=params, distributions=self._distributions, state=TrialState.RUNNING)
            )
            number = trial.number + 1
            self._study_trials += 1  # the swapped-in trial; _grew below counts the asked one
        self._running[trial_id] = _Running(params, number)
        self._grew()
        return self.space.normalise(params)

    def running_params(self, trial_id: str) -> dict[str, Any]:
        """The values ``trial_id`` was asked with, as sampled (before :meth:`TunedSpace.normalise`)."""
        return dict(self._running[trial_id].params)

    def rename(self, old: str, new: str) -> None:
        """A running trial asked under ``old`` goes on as ``new`` (a trial asked ahead, nas.tuner_ahead)."""
        if new in self._running:
            raise NasError(f"trial {new} already has hyperparameters")
        self._running[new] = self._running.pop(old)

    def adopt_running(self, trial_id: str, params: Mapping[str, Any]) -> None:
        """A trial asked by another tuner, now running here (a lie in the study from the next rebuild on)."""
        if trial_id in self._running:
            raise NasError(f"trial {trial_id} already has hyperparameters")
        self._running[trial_id] = _Running(dict(params), None)
        self._lies_missing = True

    def _uniform(self, dist: BaseDistribution) -> Any:
        """One independent uniform draw, as Optuna's RandomSampler makes it (log scale where the distribution is)."""
        rng = self._random
        if isinstance(dist, CategoricalDistribution):
            return dist.choices[int(rng.integers(len(dist.choices)))]
        if isinstance(dist, IntDistribution):
            return int(rng.integers(dist.low, dist.high + 1))
        assert isinstance(dist, FloatDistribution)
        if dist.log:
            return float(math.exp(rng.uniform(math.log(dist.low), math.log(dist.high))))
        return float(rng.uniform(dist.low, dist.high))

    def is_running(self, trial_id: str) -> bool:
        return trial_id in self._running

    def tell(self, trial_id: str, value: float) -> None:
        running = self._running.pop(trial_id, None)
        if running is None:
            raise NasError(f"trial {trial_id} is not running in TPE")
        value = float(value)
        if running.number is not None:
            self._study.tell(running.number, value)
        else:  # asked outside the study, or before the last rebuild, which left it out: its result still counts
            self._study.add_trial(create_trial(params=running.params, distributions=self._distributions, value=value))
            self._grew()
        self._study_results += 1
        self._record(running.params, value)

    def fail(self, trial_id: str) -> None:
        running = self._running.pop(trial_id, None)
        if running is not None and running.number is not None:
            self._study.tell(running.number, state=TrialState.FAIL)

    def add_completed(self, hparams: Mapping[str, Any], value: float) -> bool:
        """Add a finished trial read back on resume; False when it lies outside today's space."""
        params = {k: hparams[k] for k in self._distributions}
        if not self.space.admits(params):
            return False
        try:
            frozen = create_trial(params=params, distributions=self._distributions, value=float(value))
            self._study.add_trial(frozen)
        except ValueError:
            return False
        self._study_results += 1
        self._grew()
        self._record(params, float(value))
        return True

    @property
    def completed(self) -> int:
        return self._kept.completed

    @property
    def study_trials(self) -> int:
        """Trials in the current (bounded) study, of every state: what one ask reads."""
        return self._study_trials

    def best(self) -> tuple[dict[str, Any], float] | None:
        """The best told hyperparameters and their value (over the whole history), or None before any result."""
        if self._kept.best is None:
            return None
        params, value = self._kept.best
        return self.space.normalise(params), value

    # --- the bounded history ---------------------------------------------------------------------
    def _record(self, params: dict[str, Any], value: float) -> None:
        self._kept.record(params, value)

    def _grew(self) -> None:
        self._study_trials += 1
        if self._study_trials >= self._capacity + self._rebuild_every:
            self._rebuild()

    def _rebuild(self) -> None:
        """A fresh study holding only what the bounded history keeps (see the class docstring)."""
        kept = self._kept.kept()
        self.rebuilds += 1
        study = self._new_study()
        study.add_trials(
            create_trial(params=params, distributions=self._distributions, value=value) for params, value in kept
        )
        carried = list(self._running.values())[len(self._running) - self._keep_running :] if self._keep_running else []
        for running in self._running.values():
            running.number = None
        for number, running in enumerate(carried, start=len(kept)):
            study.add_trial(
                create_trial(params=running.params, distributions=self._distributions, state=TrialState.RUNNING)
            )
            running.number = number
        self._study = study
        self._study_trials = len(kept) + len(carried)
        self._study_results = len(kept)
        self._lies_missing = False
