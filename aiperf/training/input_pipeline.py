"""Feeding a resident dataset to Keras without stalls or recompiles.

Two measured problems shape this module (benchmarks/RESULTS.md):

* Given NumPy arrays, TensorFlow's ``fit`` builds a tf.data pipeline whose autotuner wakes
  at 2.5, 5, 10, 20, 41 s...; ``fit`` often returns only at the next wake-up, which cost
  35-50 % of short epochs on a CPU. We build the pipeline ourselves, once per trial, with
  autotuning off.
* A ragged last batch is a second shape, so JAX compiles the train step twice (+38 % on a
  first epoch). Every training step here sees a full batch: each epoch is a fresh shuffle
  truncated to a whole number of batches (different images are left out each epoch), and
  the images actually trained on are what gets counted. Evaluation pads the validation
  split to whole batches and ignores the padding's outputs (padding work is not counted).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class TrainInput:
    """Shuffled full batches of one trial's training split, epoch after epoch."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch: int, seed: int, backend: str) -> None:
        self.x, self.y, self.batch = x, y, int(batch)
        self.steps = max(1, len(y) // self.batch)
        self.images = self.steps * self.batch
        self.seed = int(seed)
        self._dataset = self._tf_dataset() if backend == "tensorflow" else None

    def _tf_dataset(self) -> Any:
        import tensorflow as tf

        xs, ys = tf.constant(self.x), tf.constant(self.y)
        index = tf.data.Dataset.range(len(self.y)).shuffle(len(self.y), seed=self.seed, reshuffle_each_iteration=True)
        batches = index.batch(self.batch, drop_remainder=True).take(self.steps)
        pipeline = batches.map(lambda i: (tf.gather(xs, i), tf.gather(ys, i))).prefetch(1)
        options = tf.data.Options()
        options.autotune.enabled = False
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        return pipeline.with_options(options)

    def fit_kwargs(self, epoch: int) -> dict[str, Any]:
        """Arguments for one ``model.fit(..., epochs=1)`` call covering epoch ``epoch``."""
        if self._dataset is not None:
            return {"x": self._dataset, "shuffle": False}  # the pipeline reshuffles every epoch
        order = np.random.default_rng((self.seed, epoch)).permutation(len(self.y))[: self.images]
        return {"x": self.x[order], "y": self.y[order], "batch_size": self.batch, "shuffle": False}


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


def predict_all(model: Any, x: np.ndarray, batch: int) -> np.ndarray:
    """Logits of every image of ``x``, computed in full batches only."""
    return np.asarray(model.predict(padded(x, batch), batch_size=batch, verbose=0))[: len(x)]
