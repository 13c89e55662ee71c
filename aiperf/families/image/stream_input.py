"""Streamed input: a worker decodes, augments and batches its trial's images as it trains.

One tf.data pipeline serves every Keras backend: TensorFlow runs it natively inside ``fit``;
JAX and torch receive its batches as NumPy arrays (tensorflow is a dependency anyway, and a
backend-neutral loader such as grain decodes with Pillow in Python worker processes). Its decode
threads are C++ threads (no GIL), sized from the worker's CPU share (``dataset.decode_threads``)
and private to the pipeline, which runs with tf.data's autotuner off (it stalls short epochs,
see :mod:`aiperf.families.image.input_pipeline`) and one op thread per element. ``PREFETCH_BATCHES``
batches are kept ready, so the next batch exists before the current step ends.

Per epoch, each trial reads its own order: a permutation of the files seeded by (trial seed,
epoch) -- or, for TFRecord shards, which are read in sequence, a seeded shard order with
interleaved reading and a shuffle buffer. Every training batch is full (a ragged last batch
would make JAX compile the step again), so a batch is never larger than the split; evaluation
reads every validation image once and the caller pads the last batch.

What the pipeline records, in TensorFlow variables it updates as it runs (so it costs no
Python per batch):

* **data wait**: on TensorFlow, which runs the pipeline inside ``fit``, each batch's request
  time is taken by a tiny dataset zipped *in front of* the prefetch buffer (zip pulls its
  inputs in order, in the consumer's thread) and the delivery time after it; their
  difference summed over the epoch is the time the training loop waited for input. JAX and
  torch pull batches in Python, through a generator that times each ``next``. (A generator,
  not the dataset: Keras's dataset adapter would start a second pass of the pipeline just to
  build the model's metrics.) Building the epoch's pipeline counts as waiting too (mostly
  tracing the decode functions); starting its iterator inside ``fit`` on TensorFlow (much
  shorter: benchmarks/RESULTS.md) is the one part not counted.
* **skipped images**: an image that cannot be decoded, or read (a file deleted since the run
  began: :meth:`~aiperf.datasets.base.Dataset.missing_items` tells those apart afterwards), or
  a record whose label is out of range, raises inside the pipeline and ``ignore_errors`` drops
  it. Each element carries its index, and every index that reaches a batch is marked, so after
  the epoch the unmarked indices are exactly the skipped images. A conservative bound (elements
  attempted minus marked minus what can be in flight) stops the epoch early once more images
  than ``bad_limit`` surely failed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from aiperf.datasets.base import Dataset, RecordShards
from aiperf.families.image.input_pipeline import FitArgs, InputStats

if TYPE_CHECKING:
    import keras
    from tensorflow import Tensor
    from tensorflow.data import Dataset as TFDataset
    from tensorflow.data import Options

PREFETCH_BATCHES = 2
TOO_MANY_BAD = "aiperf: too many images cannot be decoded"
SHARDS_INTERLEAVED = 16  # shards read at once; fixed, so a trial's record order does not depend on the threads
ENCODED = "image/encoded"
LABEL = "image/class/label"


def import_tensorflow(backend: str) -> ModuleType:
    """TensorFlow for tf.data; in a JAX or torch worker it must not claim the GPUs (it would take
    their memory) nor start a full-size thread pool next to the framework's."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    if backend != "tensorflow":
        try:
            tf.config.set_visible_devices([], "GPU")
            tf.config.threading.set_inter_op_parallelism_threads(1)
            tf.config.threading.set_intra_op_parallelism_threads(1)
        except RuntimeError:  # already initialised in this process: it keeps what it has
            pass
    return tf


def _options(tf: ModuleType, threads: int) -> Options:
    options = tf.data.Options()
    options.autotune.enabled = False
    options.deterministic = True
    options.threading.private_threadpool_size = max(1, threads)
    options.threading.max_intra_op_parallelism = 1
    # The timing zip must stay in the consumer's thread: no prefetch injected after it, no map made parallel.
    options.experimental_optimization.inject_prefetch = False
    options.experimental_optimization.map_parallelization = False
    options.experimental_optimization.apply_default_optimizations = False
    return options


class _Source:
    """Where one split's encoded images come from.

    ``elements`` is the epoch's order of items; ``load(*item)`` turns one item into (encoded
    bytes, label, index) and runs inside the parallel decode map, so reads overlap too.
    """

    size: int  # images in the split
    capacity: int  # bound on indices (the seen-mask length)

    def planned(self) -> np.ndarray:
        """Every index the split holds (an epoch reads each once)."""
        raise NotImplementedError

    def elements(self, tf: ModuleType, threads: int, order_seed: int | None) -> TFDataset:
        """The items of one pass, shuffled with ``order_seed`` (None: in order)."""
        raise NotImplementedError

    def load(self, tf: ModuleType, *item: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError


class FileSource(_Source):
    """One image file per element: shuffling is a full permutation of the split's files.

    The paths become one string tensor per trial (about 90 MB for ImageNet's 1.28 million);
    each epoch only passes its order of indices (10 MB) and gathers paths in the pipeline.
    """

    def __init__(self, files: list[tuple[str, int]]) -> None:
        self.paths = np.array([p.encode() for p, _ in files], dtype=bytes)
        self.labels = np.array([label for _, label in files], dtype=np.int32)
        self.size = self.capacity = len(files)
        self._tensors: tuple[Tensor, Tensor] | None = None

    def planned(self) -> np.ndarray:
        return np.arange(self.size, dtype=np.int64)

    def elements(self, tf: ModuleType, threads: int, order_seed: int | None) -> TFDataset:
        if self._tensors is None:
            self._tensors = (tf.constant(self.paths), tf.constant(self.labels))
        order = self.planned() if order_seed is None else np.random.default_rng(order_seed).permutation(self.size)
        return tf.data.Dataset.from_tensor_slices((order.astype(np.int64),))

    def load(self, tf: ModuleType, *item: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        (index,) = item
        assert self._tensors is not None
        paths, labels = self._tensors
        return tf.io.read_file(tf.gather(paths, index)), tf.gather(labels, index), index


class ShardSource(_Source):
    """TFRecord shards read in sequence: a seeded shard order, interleaved, then a shuffle buffer."""

    def __init__(self, shards: RecordShards, num_classes: int, shuffle_buffer: int) -> None:
        self.shards = shards
        self.num_classes = num_classes
        self.shuffle_buffer = shuffle_buffer
        self.size = shards.size
        self.capacity = shards.total

    def planned(self) -> np.ndarray:
        return self.shards.indices()

    def elements(self, tf: ModuleType, threads: int, order_seed: int | None) -> TFDataset:
        paths = np.array(self.shards.paths, dtype=str)
        starts = self.shards.starts()
        order = (
            np.arange(len(paths)) if order_seed is None else np.random.default_rng(order_seed).permutation(len(paths))
        )
        shards = tf.data.Dataset.from_tensor_slices((paths[order], starts[order]))
        cycle = min(SHARDS_INTERLEAVED, len(paths))

        def records(path: Tensor, start: Tensor) -> TFDataset:
            return tf.data.TFRecordDataset(path).enumerate().map(lambda k, record: (record, start + k))

        items = shards.interleave(
            records, cycle_length=cycle, block_length=1, num_parallel_calls=min(cycle, threads), deterministic=True
        )
        if self.shards.keep is not None:
            keep = np.zeros(self.capacity, dtype=bool)
            keep[self.shards.keep] = True
            mask = tf.constant(keep)
            items = items.filter(lambda record, index: tf.gather(mask, index))
        if order_seed is not None:
            items = items.shuffle(self.shuffle_buffer, seed=order_seed % 2**63, reshuffle_each_iteration=False)
        return items

    def load(self, tf: ModuleType, *item: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        record, index = item
        features = {ENCODED: tf.io.FixedLenFeature([], tf.string), LABEL: tf.io.FixedLenFeature([], tf.int64)}
        example = tf.io.parse_single_example(record, features)
        label = example[LABEL] - self.shards.label_offset
        check = tf.debugging.assert_less(label, tf.constant(self.num_classes, tf.int64), message="label out of range")
        with tf.control_dependencies([check, tf.debugging.assert_non_negative(label)]):
            return example[ENCODED], tf.cast(label, tf.int32), index


def source_for(dataset: Dataset, split: str, shuffle_buffer: int) -> _Source:
    shards = dataset.train_shards if split == "train" else dataset.val_shards
    if shards is not None:
        return ShardSource(shards, dataset.num_classes, shuffle_buffer)
    files = dataset.train_files if split == "train" else dataset.val_files
    return FileSource(files or [])


class _Counters:
    """The pipeline's running totals, as TensorFlow variables its functions update."""

    def __init__(self, tf: ModuleType, capacity: int) -> None:
        self.tf = tf
        self.wait_s = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.delivered = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.attempted = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.marked = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.seen = tf.Variable(tf.zeros([capacity], tf.bool), trainable=False)
        self.tried = tf.Variable(tf.zeros([capacity], tf.int64), trainable=False)  # attempt number, 0: not yet
        self.capacity = capacity

    def reset(self) -> None:
        for var in (self.wait_s, self.delivered, self.attempted, self.marked, self.seen, self.tried):
            var.assign(self.tf.zeros_like(var))


class TrainStream:
    """Full, augmented batches of a streamed training split, reshuffled every epoch."""

    streaming = True

    def __init__(
        self,
        dataset: Dataset,
        batch: int,
        seed: int,
        backend: str,
        threads: int,
        bad_limit: int,
        shuffle_buffer: int = 8192,
    ) -> None:
        self.tf = import_tensorflow(backend)
        self.native = backend == "tensorflow"  # fit runs the pipeline itself
        self.dataset = dataset
        self.source = source_for(dataset, "train", shuffle_buffer)
        # A batch larger than the split would never fill: it is clamped (the trainer clamps further,
        # to what an epoch surely decodes: aiperf.datasets.bad_images.largest_full_batch).
        self.batch = max(1, min(int(batch), self.source.size))
        self.seed, self.threads, self.bad_limit = int(seed), max(1, threads), bad_limit
        self.size = (int(dataset.input_shape[0]), int(dataset.input_shape[1]))  # (height, width)
        self.steps = max(1, self.source.size // self.batch)  # planned: skipped images can make it fewer
        self.images = self.steps * self.batch
        self.counters = _Counters(self.tf, self.source.capacity)
        self._python_wait_s, self._python_steps = 0.0, 0
        self._build_s = 0.0

    def _pipeline(self, epoch: int) -> TFDataset:
        from aiperf.families.image.image_ops import train_image

        tf, c, batch = self.tf, self.counters, self.batch
        order_seed = int(np.random.default_rng((self.seed, epoch)).integers(2**62))
        elements = self.source.elements(tf, self.threads, order_seed)
        seed0 = tf.constant(self.seed % 2**62, tf.int64)
        base = tf.constant(epoch * 2**32, tf.int64)

        def decode(*item: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            attempt = c.attempted.assign_add(1)
            tried = c.tried.scatter_nd_update(tf.reshape(item[-1], [1, 1]), [attempt])  # item[-1]: the index
            with tf.control_dependencies([tried]):  # recorded before reading, which may fail
                data, label, index = self.source.load(tf, *item)
                seed = tf.stack([seed0, base + index])
                return train_image(data, self.size, seed), label, index

        in_flight = tf.constant(self._in_flight(), tf.int64)

        def mark(images: Tensor, labels: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
            marked = c.marked.assign_add(tf.size(index, out_type=tf.int64))
            update = c.seen.scatter_nd_update(tf.expand_dims(index, 1), tf.ones_like(index, tf.bool))
            surely_bad = c.attempted.read_value() - marked - in_flight
            check = tf.debugging.assert_less_equal(
                surely_bad, tf.constant(self.bad_limit, tf.int64), message=TOO_MANY_BAD
            )
            with tf.control_dependencies([update, check]):
                return tf.identity(images), tf.identity(labels)

        def strip(requested: Tensor, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
            with tf.control_dependencies([c.wait_s.assign_add(tf.timestamp() - requested), c.delivered.assign_add(1)]):
                return tf.ensure_shape(images, [batch, *self.size, 3]), tf.identity(labels)

        ds = elements.map(decode, num_parallel_calls=self.threads, deterministic=True)
        ds = ds.ignore_errors()
        ds = ds.batch(batch).map(mark).filter(lambda images, labels: tf.shape(labels)[0] == batch)
        ds = ds.prefetch(PREFETCH_BATCHES)
        if self.native:
            ticks = tf.data.Dataset.from_tensors(0).repeat().map(lambda _: tf.timestamp())
            ds = tf.data.Dataset.zip((ticks, ds)).map(lambda t, xy: strip(t, *xy))
        return ds.with_options(_options(tf, self.threads))

    def _in_flight(self) -> int:
        """Elements attempted but not yet marked that need not have failed: a partial batch and the
        decode threads' work and output buffer, twice over (Keras may start a second pass to build
        a model's metrics on TensorFlow with a distribution strategy)."""
        return 2 * (self.batch + 2 * self.threads)

    def _python_batches(self, pipeline: TFDataset) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        t0 = time.perf_counter()
        iterator = iter(pipeline)
        self._python_wait_s += time.perf_counter() - t0
        while True:
            t0 = time.perf_counter()
            try:
                images, labels = next(iterator)
            except StopIteration:
                return
            self._python_wait_s += time.perf_counter() - t0
            self._python_steps += 1
            yield images.numpy(), labels.numpy()

    def on_train_begin(self) -> None:
        """Count from here: a batch Keras drew before, to build metrics, is not trained on."""
        if self.native:
            self.counters.wait_s.assign(0.0)
            self.counters.delivered.assign(0)

    def fit_kwargs(self, epoch: int) -> FitArgs:
        """Arguments for one ``model.fit(..., epochs=1)`` call covering epoch ``epoch``."""
        self.counters.reset()
        self._python_wait_s, self._python_steps = 0.0, 0
        t0 = time.perf_counter()
        pipeline = self._pipeline(epoch)
        self._build_s = time.perf_counter() - t0
        return {"x": pipeline if self.native else self._python_batches(pipeline), "shuffle": False}

    def stats(self) -> InputStats:
        """What the last epoch trained on: steps, images, data wait, and the indices it skipped."""
        c = self.counters
        seen = c.seen.numpy()
        planned = self.source.planned()
        if self.native:
            wait, steps = float(c.wait_s.numpy()), int(c.delivered.numpy())
        else:
            wait, steps = self._python_wait_s, self._python_steps
        return {
            "steps": steps,
            "images": steps * self.batch,
            "data_wait_s": self._build_s + wait,
            "build_s": self._build_s,
            "skipped": planned[~seen[planned]],
        }

    def surely_bad(self) -> np.ndarray:
        """Indices the last epoch certainly failed to decode so far (for an epoch stopped early).

        Attempted and not marked, leaving out the latest attempts, which may still be in flight.
        """
        tried, seen = self.counters.tried.numpy(), self.counters.seen.numpy()
        last_sure = int(self.counters.attempted.numpy()) - self._in_flight()
        failed = np.flatnonzero((tried > 0) & ~seen)
        return failed[tried[failed] <= last_sure]


class EvalStream:
    """Every image of a streamed validation split once, centre-cropped, in batches of ``batch``."""

    def __init__(self, dataset: Dataset, batch: int, backend: str, threads: int) -> None:
        self.tf = import_tensorflow(backend)
        self.source = source_for(dataset, "val", 1)
        self.batch, self.threads = int(batch), max(1, threads)
        self.size = (int(dataset.input_shape[0]), int(dataset.input_shape[1]))  # (height, width)

    def _pipeline(self) -> TFDataset:
        from aiperf.families.image.image_ops import eval_image

        tf = self.tf
        source = self.source

        def decode(*item: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            data, label, index = source.load(tf, *item)
            return eval_image(data, self.size), label, index

        ds = source.elements(tf, self.threads, None).map(decode, num_parallel_calls=self.threads, deterministic=True)
        ds = ds.ignore_errors().batch(self.batch).prefetch(PREFETCH_BATCHES)
        return ds.with_options(_options(tf, self.threads))

    def predict(self, model: keras.Model) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """(logits, labels, skipped indices, seconds waited for input) over the whole split.

        Every batch the model sees is full: the last one is padded with zero images whose
        outputs are dropped (one compiled shape on JAX).
        """
        logits, labels, seen = [], [], []
        waited = 0.0
        iterator = iter(self._pipeline())
        while True:
            t0 = time.perf_counter()
            try:
                images, label, index = next(iterator)
            except StopIteration:
                break
            waited += time.perf_counter() - t0
            images = np.asarray(images)
            n = len(images)
            if n < self.batch:
                images = np.concatenate([images, np.zeros((self.batch - n, *images.shape[1:]), images.dtype)])
            logits.append(np.asarray(model.predict_on_batch(images))[:n])
            labels.append(np.asarray(label))
            seen.append(np.asarray(index))
        marked = np.zeros(self.source.capacity, dtype=bool)
        if seen:
            marked[np.concatenate(seen)] = True
        planned = self.source.planned()
        if not logits:
            return np.empty((0, 0)), np.empty(0, np.int32), planned, waited
        return np.concatenate(logits), np.concatenate(labels), planned[~marked[planned]], waited


def name_bad(dataset: Dataset, split: str, indices: np.ndarray, limit: int = 100) -> list[str]:
    """The names of (at most ``limit``) skipped images of a split."""
    return [dataset.item_name(split, int(i)) for i in np.asarray(indices)[:limit]]
