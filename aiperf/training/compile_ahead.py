"""A model's train and predict steps compiled ahead of time, so the device never waits for a compiler.

Under JAX, Keras compiles a model's train step inside its first ``fit`` step and its predict
step inside the first ``predict``: on an H200 that was 75 % of a worker's time
(benchmarks/RESULTS.md). Here the same steps are lowered and compiled for the batch shapes a
trial will use (``jax.jit(...).lower(...).compile()``) by whichever thread prepares the model
-- the worker's compile thread, while the device trains the trial before -- and installed on
the model: its ``train_function`` and ``predict_function`` call the compiled executable when
the arguments are the ones it was compiled for, and Keras's own jitted step otherwise (a
shape nobody prepared is compiled just in time, as before, and counted as such). Nothing
is re-traced on the training thread.

Under TensorFlow, Keras traces a model's train step (a ``tf.function``) inside the first ``fit``
step, and the runtime then optimises the traced graph and picks its kernels for the batch's
shape (oneDNN's, on a CPU) at its first run; the predict step likewise. There the model is
prepared by *running* each step once, on a batch of zeros of the trial's shapes, fed as the
trial will feed it (the train step from a ``tf.data`` iterator with the batch dimension
unknown, as :class:`aiperf.families.image.input_pipeline.TrainInput` builds it; predict on
whole batches of the evaluation size): the traces stay cached in the model's
``tf.function`` objects and the kernels in the runtime. Running a step moves the model's state
(weights, optimizer, statistics); a prepared model is handed to its trial as a kept one is,
which restores the weights and the optimizer's state a fresh build would start from.

This module holds the backend specifics (the Keras JAX trainer's step functions and
``_make_function``; checked by tests/training/test_compile_ahead.py against the installed
Keras), so the trainers above it talk to Keras only. torch compiles as before:
:func:`ahead_supported` says where this applies.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import numpy as np

if TYPE_CHECKING:
    import jax
    import keras
    from jax.stages import Compiled
    from numpy.typing import DTypeLike


class Shaped(Protocol):
    """An array a step takes, or its abstract stand-in (``jax.ShapeDtypeStruct``): its shape picks the executable."""

    @property
    def shape(self) -> tuple[int, ...]: ...


class Variable(Shaped, Protocol):
    """A model variable as :func:`_avals` reads it: shape and dtype only."""

    @property
    def dtype(self) -> DTypeLike: ...


StepData = Shaped | tuple[Shaped, ...]  # a step's batch: the examples alone (predict), or (examples, labels)
StepState = Sequence[object]  # a step's state: the model's variables by role (trainable, non-trainable, ...)


@dataclass(frozen=True)
class StepShapes:
    """One trial's step inputs: the training batch (examples, labels) and its evaluation batches.

    An image trial's label is one class per image (``label_shape`` empty) and it evaluates with
    ``predict``; a language trial's is a target token per input token and it evaluates with
    ``evaluate`` (``evaluate``: the test step, which takes the labels too), in batches of each
    size in ``eval_batches`` (a last partial batch is another shape).
    """

    batch: int
    eval_batches: tuple[int, ...]
    example_shape: tuple[int, ...]
    example_dtype: str
    label_dtype: str
    label_shape: tuple[int, ...] = ()
    evaluate: bool = False


AHEAD_BACKENDS = ("jax", "tensorflow")  # torch's Keras trainer runs eagerly: nothing to compile ahead


def ahead_supported(backend: str, data_parallel: int) -> bool:
    """Whether steps can be compiled ahead: JAX or TensorFlow on one device (a distribution shards the
    state differently)."""
    return backend in AHEAD_BACKENDS and data_parallel <= 1


class AheadStep:
    """A jitted step and the executables compiled ahead for it, by the shape of the data they take."""

    def __init__(self, fn: Callable[..., object]) -> None:
        import jax

        self.jitted = jax.jit(fn, donate_argnums=0)
        self._compiled: dict[tuple[int, ...], Compiled] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0  # calls for a shape nobody compiled ahead: Keras's jitted step compiled it in place

    def compile(self, state: StepState, data: StepData, tracing: AbstractContextManager[object]) -> None:
        """Compile for these abstract arguments (``jax.ShapeDtypeStruct`` trees), unless done already.

        The trace runs Keras's step code, so it holds ``tracing`` (the trainer's Keras lock); XLA's
        compilation, the long part, runs outside it.
        """
        key = _key(data)
        with self._lock:
            if key in self._compiled:
                return
        with tracing:
            lowered = self.jitted.lower(state, data)
        compiled = lowered.compile()
        with self._lock:
            self._compiled.setdefault(key, compiled)

    def shapes(self) -> set[tuple[int, ...]]:
        with self._lock:
            return set(self._compiled)

    def __call__(self, state: StepState, data: StepData) -> object:  # what Keras's step returns, to Keras
        with self._lock:
            compiled = self._compiled.get(_key(data))
        if compiled is not None:
            self.hits += 1
            return compiled(state, data)
        self.misses += 1
        return self.jitted(state, data)


def _key(data: StepData) -> tuple[int, ...]:
    """The data's first array's shape: the one thing that differs between a model's compiled steps."""
    first = data[0] if isinstance(data, (tuple, list)) else data
    return tuple(int(n) for n in first.shape)


@dataclass
class AheadSteps:
    """The steps installed on one model (:func:`install`)."""

    train: AheadStep
    predict: AheadStep
    test: AheadStep

    @property
    def misses(self) -> int:
        return self.train.misses + self.predict.misses + self.test.misses


def _avals(variables: Sequence[Variable]) -> list[jax.ShapeDtypeStruct]:
    import jax

    return [jax.ShapeDtypeStruct(tuple(v.shape), np.dtype(v.dtype)) for v in variables]


def install(model: keras.Model) -> AheadSteps | None:
    """Give a compiled Keras model (JAX backend, no distribution) train, predict and test steps that can be
    compiled ahead; None on another backend (TensorFlow's ``tf.function`` objects keep their traces themselves).

    Mirrors what the Keras JAX trainer's ``make_train_function``, ``make_predict_function`` and
    ``make_test_function`` build for a jit-compiled model (the step jitted with its state
    donated, wrapped by ``_make_function``), with :class:`AheadStep` as the jitted step.
    Idempotent per model.
    """
    if _backend() != "jax":
        return None
    existing = getattr(model, "_aiperf_ahead", None)
    if isinstance(existing, AheadSteps):
        return existing
    train = AheadStep(model.train_step)

    def predict_step(state: StepState, data: StepData) -> tuple[object, tuple[object, object]]:
        outputs, non_trainable_variables = model.predict_step(state, data)
        return outputs, (state[0], non_trainable_variables)

    predict = AheadStep(predict_step)
    test = AheadStep(model.test_step)
    model.train_function = model._make_function(train)
    predict_iterator = model._make_function(predict, concatenate_outputs=True)
    model.predict_function = lambda state, iterator: predict_iterator(state, iterator)
    model.test_function = model._make_function(test)
    steps = AheadSteps(train, predict, test)
    model._aiperf_ahead = steps
    return steps


def ahead_ready(model: keras.Model, shapes: StepShapes) -> bool:
    """Whether ``model``'s steps are compiled for ``shapes`` already."""
    if _backend() == "tensorflow":
        return _run_shapes(shapes) <= _ran(model)
    steps = getattr(model, "_aiperf_ahead", None)
    if not isinstance(steps, AheadSteps):
        return False
    example = tuple(shapes.example_shape)
    evaluation = steps.test if shapes.evaluate else steps.predict
    return (shapes.batch, *example) in steps.train.shapes() and all(
        (batch, *example) in evaluation.shapes() for batch in shapes.eval_batches
    )


def compile_ahead(
    model: keras.Model, shapes: StepShapes, tracing: AbstractContextManager[object] | None = None
) -> AheadSteps | None:
    """Install (:func:`install`) and compile the model's train step and its evaluation step for ``shapes``
    (TensorFlow: :func:`run_once`, and None).

    The abstract state is read from the model's variables (shapes and dtypes only, no values),
    the data from ``shapes`` as Keras hands it to the steps: ``(examples, labels)`` with labels in
    JAX's default integer width, and the examples alone for ``predict``.
    """
    if _backend() == "tensorflow":
        run_once(model, shapes, tracing)
        return None
    import jax

    steps = install(model)
    assert steps is not None  # a JAX model
    trainable, non_trainable = _avals(model.trainable_variables), _avals(model.non_trainable_variables)
    state = (trainable, non_trainable, _avals(model.optimizer.variables), _avals(model.metrics_variables))
    label = jax.dtypes.canonicalize_dtype(np.dtype(shapes.label_dtype))
    example = np.dtype(shapes.example_dtype)
    lock = tracing if tracing is not None else contextlib.nullcontext()

    def batch_of(size: int) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
        examples = jax.ShapeDtypeStruct((size, *shapes.example_shape), example)
        return examples, jax.ShapeDtypeStruct((size, *shapes.label_shape), label)

    steps.train.compile(state, batch_of(shapes.batch), lock)
    for size in shapes.eval_batches:
        if shapes.evaluate:
            steps.test.compile((trainable, non_trainable, _avals(model.metrics_variables)), batch_of(size), lock)
        else:
            steps.predict.compile((trainable, non_trainable), batch_of(size)[0], lock)
    return steps


def prepares_by_running(backend: str) -> bool:
    """Whether preparing a model runs its steps (TensorFlow), moving its state, rather than only compiling them.

    A model a trial may be training now (a kept one) is then not prepared, and a runner that
    trains a prepared model from its built state (the language family's) does not prepare.
    """
    return backend == "tensorflow"


def note_ran(model: keras.Model, shapes: StepShapes) -> None:
    """``model`` ran a trial of ``shapes``: its steps are ready for them (TensorFlow; see :func:`ahead_ready`)."""
    _ran(model).update(_run_shapes(shapes))


def _backend() -> str:
    import keras

    return str(keras.backend.backend())


def _run_shapes(shapes: StepShapes) -> set[tuple[str, int, tuple[int, ...]]]:
    """The steps a trial of ``shapes`` runs, by function and batch shape (what :func:`run_once` prepares)."""
    evaluation = "test" if shapes.evaluate else "predict"
    example = tuple(shapes.example_shape)
    return {("train", shapes.batch, example)} | {(evaluation, size, example) for size in shapes.eval_batches}


def _ran(model: keras.Model) -> set[tuple[str, int, tuple[int, ...]]]:
    ran = getattr(model, "_aiperf_ran", None)
    if not isinstance(ran, set):
        ran = set()
        model._aiperf_ran = ran
    return ran


def run_once(model: keras.Model, shapes: StepShapes, lock: AbstractContextManager[object] | None = None) -> None:
    """TensorFlow: trace the model's train and evaluation steps and run each once on zeros of ``shapes``.

    The runtime picks a step's kernels for the batch's shape at its first run, so the batch is
    the trial's own size, not a smaller one (a trace alone left a first step of 0.69 s against
    0.14 s for a kept model; benchmarks/RESULTS.md, "Compiling ahead on TensorFlow"). The whole
    call holds ``lock`` (the trainer's Keras lock): Keras traces and runs its step code in it.
    The model's state moves; its trial restores it (see the module's docstring).
    """
    import tensorflow as tf

    wanted = _run_shapes(shapes) - _ran(model)
    if not wanted:
        return
    label = np.dtype(shapes.label_dtype)

    def zeros(size: int) -> tuple[np.ndarray, np.ndarray]:
        examples = np.zeros((size, *shapes.example_shape), shapes.example_dtype)
        return examples, np.zeros((size, *shapes.label_shape), label)

    with lock if lock is not None else contextlib.nullcontext():
        for step, size, _ in sorted(wanted):
            if step == "train":
                model.make_train_function()
                # Batched, not sliced to a fixed size: the batch dimension unknown, as the trial's pipeline has it.
                model.train_function(iter(tf.data.Dataset.from_tensor_slices(zeros(size)).batch(size)))
            elif step == "predict":
                model.predict(zeros(size)[0], batch_size=size, verbose=0)
            else:
                model.evaluate(*zeros(size), batch_size=size, verbose=0)
        model.reset_metrics()
    _ran(model).update(wanted)


T = TypeVar("T")
PREPARED_LIMIT = 2  # models compiled ahead and not yet trained that a worker holds (its queued trials')


class Prepared(Generic[T]):
    """A worker's models compiled ahead, by key, and those being compiled now: a trial waits for its own.

    Both families' runners keep theirs here. ``keras_lock`` is held by whatever builds, compiles
    or traces a model (the training thread's fresh builds too): Keras keeps its global state per
    thread, but ``clear_session`` replaces it for every thread.
    """

    def __init__(self, limit: int = PREPARED_LIMIT) -> None:
        self.keras_lock = threading.Lock()
        self.state = threading.Condition()  # guards the two below (and what a runner keeps with them)
        self._ready: dict[str, T] = {}
        self._busy: set[str] = set()
        self._limit = limit

    def busy(self, key: str) -> bool:
        """Whether ``key`` is being compiled now (call holding ``state``)."""
        return key in self._busy

    def peek(self, key: str) -> T | None:
        """The model ready for ``key``, left there (call holding ``state``)."""
        return self._ready.get(key)

    def begin(self, key: str) -> None:
        """``key`` is being compiled from now (call holding ``state``)."""
        self._busy.add(key)

    def finish(self, key: str, value: T | None) -> None:
        """``key``'s compile ended, with its model (None: it failed); the oldest beyond the limit go."""
        with self.state:
            self._busy.discard(key)
            if value is not None:
                self._ready[key] = value
                while len(self._ready) > self._limit:  # trials that never came
                    self._ready.pop(next(iter(self._ready)))
            self.state.notify_all()

    def wait_and_take(self, key: str) -> tuple[T | None, float]:
        """``key``'s model (None: none was prepared) and the seconds waited for one still compiling
        (call holding ``state``: the caller may move it elsewhere before letting go)."""
        waited = 0.0
        if key in self._busy:  # being compiled ahead right now: the device waits for it, once
            t0 = time.perf_counter()
            while key in self._busy:
                self.state.wait()
            waited = time.perf_counter() - t0
        return self._ready.pop(key, None), waited
