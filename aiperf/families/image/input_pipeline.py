"""Feeding a resident dataset to Keras without stalls or recompiles.

Two measured problems shape this module (benchmarks/RESULTS.md):

* Given NumPy arrays, TensorFlow's ``fit`` builds a tf.data pipeline whose autotuner wakes
  at doubling intervals; ``fit`` often returns only at the next wake-up, which can cost a
  short epoch a large share of its time on a CPU. We build the pipeline ourselves, once per trial, with
  autotuning off.
* A ragged last batch is a second shape, so JAX compiles the train step twice (a longer
  first epoch). Every training step here sees a full batch: each epoch is a fresh shuffle
  truncated to a whole number of batches (different images are left out each epoch), and
  the images actually trained on are what gets counted. Evaluation pads the validation
  split to whole batches and ignores the padding's outputs (padding work is not counted).

The time the training loop waits for its next batch is measured here too (``stats``): on
TensorFlow by a tick dataset zipped in front of the pipeline's last prefetch (see
:mod:`aiperf.families.image.stream_input`, which streams files and shards the same way), on JAX
and torch by timing the gather of each batch in the generator ``fit`` pulls from.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, NotRequired, TypedDict

import numpy as np

if TYPE_CHECKING:
    import keras
    from tensorflow import Tensor, Variable
    from tensorflow.data import Dataset as TFDataset


class FitArgs(TypedDict):
    """The input arguments of one ``model.fit`` call: the pipeline on TensorFlow, else a batch generator."""

    x: TFDataset | Iterator[tuple[np.ndarray, np.ndarray]]
    shuffle: bool


class InputStats(TypedDict):
    """What an epoch's input delivered (``stats()`` of :class:`TrainInput` and of the streamed input)."""

    steps: int
    images: int
    data_wait_s: float
    skipped: np.ndarray  # indices of the training images that could not be decoded
    build_s: NotRequired[float]  # streamed input: seconds building the epoch's pipeline (part of data_wait_s)


class TrainInput:
    """Shuffled full batches of one trial's resident training split, epoch after epoch."""

    streaming = False

    def __init__(self, x: np.ndarray, y: np.ndarray, batch: int, seed: int, backend: str) -> None:
        self.x, self.y = x, y
        self.batch = max(1, min(int(batch), len(y)))  # a larger batch would never fill: one batch of the whole split
        self.steps = max(1, len(y) // self.batch)
        self.images = self.steps * self.batch
        self.seed = int(seed)
        self._wait_s, self._steps = 0.0, 0
        self._counters: tuple[Variable, Variable] | None = None  # TensorFlow: (seconds waited, batches delivered)
        self._dataset = self._tf_dataset() if backend == "tensorflow" else None

    def _tf_dataset(self) -> TFDataset:
        import tensorflow as tf

        wait_s = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        delivered = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._counters = (wait_s, delivered)
        xs, ys = tf.constant(self.x), tf.constant(self.y)
        index = tf.data.Dataset.range(len(self.y)).shuffle(len(self.y), seed=self.seed, reshuffle_each_iteration=True)
        # Whole batches only, but a batch dimension left unknown: one traced step serves every batch
        # size, so a worker reusing a compiled model for a trial with another batch size does not retrace.
        batches_of = index.take(self.images).batch(self.batch)
        pipeline = batches_of.map(lambda i: (tf.gather(xs, i), tf.gather(ys, i))).prefetch(1)

        def deliver(requested: Tensor, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
            with tf.control_dependencies([wait_s.assign_add(tf.timestamp() - requested), delivered.assign_add(1)]):
                return tf.identity(images), tf.identity(labels)

        ticks = tf.data.Dataset.from_tensors(0).repeat().map(lambda _: tf.timestamp())
        pipeline = tf.data.Dataset.zip((ticks, pipeline)).map(lambda t, xy: deliver(t, *xy))
        options = tf.data.Options()
        options.autotune.enabled = False
        options.experimental_optimization.inject_prefetch = False  # keep the tick in the consumer's thread
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        return pipeline.with_options(options)

    def _numpy_batches(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        order = np.random.default_rng((self.seed, epoch)).permutation(len(self.y))[: self.images]
        for k in range(self.steps):
            t0 = time.perf_counter()
            rows = order[k * self.batch : (k + 1) * self.batch]
            batch = self.x[rows], self.y[rows]
            self._wait_s += time.perf_counter() - t0
            self._steps += 1
            yield batch

    def on_train_begin(self) -> None:
        """Count from here: a batch Keras drew before, to build metrics, is not trained on."""
        for var in self._counters or ():
            var.assign(tf_zero(var))

    def fit_kwargs(self, epoch: int) -> FitArgs:
        """Arguments for one ``model.fit(..., epochs=1)`` call covering epoch ``epoch``."""
        self._wait_s, self._steps = 0.0, 0
        if self._dataset is not None:
            self.on_train_begin()
            return {"x": self._dataset, "shuffle": False}  # the pipeline reshuffles every epoch
        # A generator, as the streamed input on these backends: Keras peeks at its first batches and trains them.
        return {"x": self._numpy_batches(epoch), "shuffle": False}

    def surely_bad(self) -> np.ndarray:
        """Images the last epoch could not decode: none, the arrays are decoded already (as the streamed input's)."""
        return np.empty(0, np.int64)

    def stats(self) -> InputStats:
        """What the last epoch trained on: steps, images, seconds waiting for batches (nothing is skipped)."""
        if self._counters is not None:
            wait_s, steps = float(self._counters[0].numpy()), int(self._counters[1].numpy())
        else:
            wait_s, steps = self._wait_s, self._steps
        return {
            "steps": steps,
            "images": steps * self.batch,
            "data_wait_s": wait_s,
            "skipped": np.empty(0, np.int64),
        }


def tf_zero(var: Variable) -> float | int:
    """Zero of a TensorFlow variable's dtype."""
    return 0.0 if var.dtype.is_floating else 0


def eval_batch_size(n_images: int, preferred: int, multiple: int = 1) -> int:
    """One batch when the split fits in it, else the preferred size; a multiple of ``multiple``
    (the data-parallel replicas, which must each get an equal share of every batch)."""
    size = max(1, min(int(preferred), int(n_images)))
    return -(-size // multiple) * multiple


def padded(x: np.ndarray, batch: int) -> np.ndarray:
    """``x`` extended with zero images to a whole number of batches."""
    extra = (-len(x)) % batch
    if not extra:
        return x
    return np.concatenate([x, np.zeros((extra, *x.shape[1:]), dtype=x.dtype)])


def predict_all(model: keras.Model, x: np.ndarray, batch: int) -> np.ndarray:
    """Logits of every image of ``x``, computed in full batches only."""
    return np.asarray(model.predict(padded(x, batch), batch_size=batch, verbose=0))[: len(x)]
