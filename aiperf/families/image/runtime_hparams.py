"""Hyperparameters as runtime values of the compiled training step, not constants traced into it.

Keras bakes a Python float learning rate schedule, weight decay, momentum or dropout rate
into the train function it traces (and, on JAX or with XLA, compiles). A worker that trains
the same architecture again with other hyperparameters -- a re-tune, a re-queued trial --
would then have to trace and compile again: a real share of a CPU worker's time, and much
more per trial for a large net under XLA (figures: benchmarks/RESULTS.md). Here each of them
is a variable the step reads:

* :func:`trial_sgd` -- SGD with Nesterov momentum and decoupled weight decay (the update
  Keras's ``SGD(nesterov=True, weight_decay=...)`` makes), under a cosine learning-rate
  schedule; base rate, decay length, weight decay and momentum are optimizer variables, so
  every backend (JAX's stateless step included) passes them into the step as state.
* :func:`runtime_dropout` -- ``Dropout`` whose rate is a non-trainable layer variable and
  whose random stream is reseeded per trial.

:func:`set_trial_hparams` writes a trial's values into a compiled model; a fresh model and
a reused one given the same values train identically.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from nas.graph import Graph

if TYPE_CHECKING:
    from keras import KerasTensor, Model, Variable

COSINE_ALPHA = 0.01  # the schedule ends at 1 % of the base rate
NO_DECAY = ("bias", "gamma", "beta")  # variables weight decay leaves alone


@functools.cache
def trial_sgd(keras: Any) -> type:  # keras: the module, untyped (mypy cannot subclass a module's attribute)
    """The optimizer class (made once per process: Keras is imported by then)."""
    ops = keras.ops

    class TrialSGD(keras.optimizers.Optimizer):
        """Nesterov SGD, decoupled weight decay, cosine decay -- all four numbers runtime variables."""

        def __init__(self, name: str = "trial_sgd") -> None:
            super().__init__(learning_rate=self._scheduled_rate, name=name)
            self.base_rate = self.add_variable((), initializer="zeros", dtype="float32", name="base_rate")
            self.decay_steps = self.add_variable((), initializer="ones", dtype="float32", name="decay_steps")
            self.decay = self.add_variable((), initializer="zeros", dtype="float32", name="weight_decay_rate")
            self.momentum_rate = self.add_variable((), initializer="zeros", dtype="float32", name="momentum_rate")
            self.momentums: list[Variable] = []
            self._decays: list[bool] = []

        def _scheduled_rate(self) -> KerasTensor:  # a scalar tensor of the backend's own type
            """Cosine decay from ``base_rate`` to ``COSINE_ALPHA`` of it over ``decay_steps`` steps."""
            step = ops.minimum(ops.cast(self.iterations, "float32"), self.decay_steps)
            cosine = 0.5 * (1.0 + ops.cos(math.pi * step / self.decay_steps))
            return self.base_rate * ((1.0 - COSINE_ALPHA) * cosine + COSINE_ALPHA)

        def build(self, variables: list[Variable]) -> None:
            if self.built:
                return
            super().build(variables)
            self.momentums = self.add_optimizer_variables(variables, "momentum")
            self._decays = [not any(part in v.name for part in NO_DECAY) for v in variables]

        def update_step(self, gradient: KerasTensor, variable: Variable, learning_rate: KerasTensor) -> None:
            index = self._get_variable_index(variable)
            rate = ops.cast(learning_rate, variable.dtype)
            gradient = ops.cast(gradient, variable.dtype)
            m = self.momentums[index]
            momentum = ops.cast(self.momentum_rate, variable.dtype)
            velocity = m * momentum - gradient * rate
            self.assign(m, velocity)
            # One write per variable: decoupled decay, then the Nesterov look-ahead along the new velocity
            # (Keras's SGD writes the decayed variable first; the sums round the same way).
            decayed = (
                variable - variable * ops.cast(self.decay, variable.dtype) * rate if self._decays[index] else variable
            )
            self.assign(variable, decayed + (velocity * momentum - gradient * rate))

    return TrialSGD


@functools.cache
def runtime_dropout(keras: Any) -> type:  # keras: the module (see trial_sgd)
    """The dropout layer class; a subclass of ``keras.layers.Dropout``, so it reads as one."""
    ops = keras.ops

    class RuntimeDropout(keras.layers.Dropout):
        """Dropout whose rate the compiled step reads from a variable (``rate`` mirrors it)."""

        def build(self, input_shape: tuple[int | None, ...]) -> None:
            self.rate_value = self.add_weight(
                shape=(), initializer=keras.initializers.Constant(self.rate), trainable=False, name="rate"
            )
            if not hasattr(self, "seed_generator"):  # Keras's Dropout makes one only for a rate above 0
                self.seed_generator = keras.random.SeedGenerator(self.seed)
            self.built = True

        def call(self, inputs: KerasTensor, training: bool = False) -> KerasTensor:
            if not training:
                return inputs
            noise = keras.random.uniform(ops.shape(inputs), seed=self.seed_generator, dtype="float32")
            kept = ops.cast(1.0 - self.rate_value, inputs.dtype)
            return ops.where(noise >= self.rate_value, inputs / kept, ops.zeros_like(inputs))

        def set_rate(self, rate: float, seed: int) -> None:
            self.rate = float(rate)
            self.rate_value.assign(float(rate))
            state = self.seed_generator.state
            state.assign(np.asarray([seed, 0], dtype=keras.backend.standardize_dtype(state.dtype)))

    return RuntimeDropout


def set_trial_hparams(
    model: Model, graph: Graph, hparams: Mapping[str, float], momentum: float, steps: tuple[int, int], seed: int
) -> None:
    """Write one trial's hyperparameters into a compiled model's variables.

    ``steps`` is (steps the schedule spans, steps already done by a resumed trial); the
    dropout rates are the trial's graph's (its hyperparameter already applied), and each
    dropout layer's random stream restarts from the trial seed.
    """
    steps_total, steps_done = steps
    optimizer = model.optimizer
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # under a LossScaleOptimizer
    inner.base_rate.assign(float(hparams["learning_rate"]))
    inner.decay_steps.assign(float(max(1, steps_total)))
    inner.decay.assign(float(hparams["weight_decay"]))
    inner.momentum_rate.assign(float(momentum))
    inner.iterations.assign(int(steps_done))
    for node in graph.nodes:
        if node.op == "dropout":
            model.get_layer(node.label).set_rate(node.attrs["rate"], dropout_seed(seed, node.id))


def dropout_seed(trial_seed: int, node_id: int) -> int:
    """A dropout layer's stream seed: fixed by the trial seed and the layer's node."""
    return (int(trial_seed) * 7919 + node_id * 104_729 + 1) % (2**31 - 1)
