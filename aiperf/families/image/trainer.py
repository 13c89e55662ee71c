"""Train one trial, epoch by epoch, reporting as each epoch completes.

Runs inside a long-lived worker process that already holds the dataset and an imported
framework. Every hyperparameter of the trial is applied here and nowhere else: the
learning rate and weight decay go into the optimizer, the batch size into ``fit``, the
dropout rate into the built graph, the epoch count into the loop, and the kernel size
already shaped the architecture the worker received.

Resident datasets are fed from memory (:mod:`aiperf.families.image.input_pipeline`), streamed ones
are decoded as they train (:mod:`aiperf.families.image.stream_input`); either way each epoch record
says how many images were trained on, how long the loop waited for input, and how many
images were skipped because they could not be decoded or were missing (deleted since the run
began); their names go to the master in a ``bad_images`` item, and too many of them end the
trial with a one-line error that tells missing files from undecodable ones. Every epoch trains
full batches, so a trial's batch is never larger than the training images an epoch surely
delivers (:func:`~aiperf.datasets.bad_images.largest_full_batch`).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from aiperf.config import DatasetConfig, ModelConfig, TrainConfig
from aiperf.datasets.bad_images import bad_image_limit, largest_full_batch, too_many_bad_images
from aiperf.datasets.base import Dataset
from aiperf.errors import AiperfError
from aiperf.families.image.compiled_models import CompiledModel, CompiledModels, compile_key
from aiperf.families.image.input_pipeline import TrainInput, eval_batch_size, predict_all
from aiperf.families.image.model import build_model, get_weights, initial_weights, set_weights
from aiperf.families.image.runtime_hparams import set_trial_hparams
from aiperf.families.image.stream_input import TOO_MANY_BAD
from aiperf.training.backend import is_out_of_memory, seed_trial
from aiperf.training.compile_ahead import (
    Prepared,
    StepShapes,
    ahead_ready,
    ahead_supported,
    compile_ahead,
    install,
    note_ran,
    prepares_by_running,
)
from aiperf.training.step_timing import CompileShares, compile_overhead
from aiperf.training.trial import TrialSpec, Weights, apply_hparams, inherit_weights
from nas.graph import Graph

if TYPE_CHECKING:
    import keras

    from aiperf.families.image.stream_input import TrainStream

ACTIVATION_MEMORY_FRACTION = 0.6


# The config's defaults: a trainer made without a config (tests, benchmarks) trains as a default run's workers do.
_TRAIN, _MODEL, _DATASET = TrainConfig(), ModelConfig(), DatasetConfig()


@dataclass(frozen=True)
class TrainerSettings:
    """How this worker trains: fixed for its lifetime, chosen from the device it runs on.

    A run's workers fill every field from the run's config (:func:`aiperf.cluster.worker.trainer_settings`);
    the defaults of the fields a config sets are the config's own, so the two cannot drift apart.
    """

    precision: str = "float32"  # the worker's resolved dtype policy (model.precision "auto" on a CPU)
    jit_compile: bool | str = False  # resolved from model.jit_compile for the worker's backend and device
    bn_momentum: float = _MODEL.bn_momentum
    momentum: float = _TRAIN.momentum
    eval_batch_size: int = _TRAIN.eval_batch_size
    max_batch_size: int = _TRAIN.max_batch_size
    device_memory_bytes: int = 0  # 0: no device memory bound (CPU)
    data_parallel: int = 1  # devices one trial trains on (per_node placement); batch sizes are per device
    decode_threads: int = 1  # streamed input: tf.data decode threads (dataset.decode_threads "auto": the slot's)
    max_bad_fraction: float = _DATASET.max_bad_fraction  # undecodable images allowed, as a share of the dataset
    shuffle_buffer: int = _DATASET.shuffle_buffer  # streamed TFRecord shards: records in the shuffle buffer
    compiled_models: int = _TRAIN.compiled_models  # architectures kept compiled for later trials (0: none)
    compile_ahead: bool = _TRAIN.compile_ahead is True  # "auto" (the default) is resolved by a run's plan; bare: off


def batch_limit(activation_bytes_per_image: float, device_memory_bytes: int, max_batch: int) -> int:
    """Largest power-of-two batch whose training activations fit in a share of device memory."""
    if device_memory_bytes <= 0 or activation_bytes_per_image <= 0:
        return max_batch
    fit = int(device_memory_bytes * ACTIVATION_MEMORY_FRACTION // activation_bytes_per_image)
    if fit < 1:
        return 1
    return max(1, min(max_batch, 2 ** int(math.log2(fit))))


def activation_bytes(graph: Graph, precision: str) -> float:
    """Bytes of activations kept for the backward pass per image (every node's output, x2 for grads)."""
    width = 2 if "16" in precision else 4
    return 2.0 * width * sum(math.prod(graph.shape(n.id)) for n in graph.nodes)


def build_step_state(model: keras.Model) -> None:
    """Create the compiled metrics' and loss's variables now, not inside the first trace of the train step.

    Keras's TensorFlow trainer leaves them to the first trace when no distribution strategy
    is set; a ``tf.function`` whose first trace creates variables is traced a second time, so
    every new architecture paid for two traces of its train step (their cost:
    benchmarks/RESULTS.md). One eager update on a one-image batch creates them (the metrics
    and the loss need only the output's shape; Keras's own symbolic build would also pass the
    whole model, which costs more), and the metrics are reset, as ``fit`` resets them at
    every epoch anyway. Under a distribution strategy Keras builds them itself before tracing.
    """
    y = np.zeros((1,), dtype="int32")
    y_pred = np.zeros((1, *model.outputs[0].shape[1:]), dtype=model.outputs[0].dtype)
    model.compute_metrics(None, y, y_pred)
    model.compute_loss(None, y, y_pred, training=False)
    model.reset_metrics()


class _FirstStepTimer:
    """Keras callback that records when the first training step of a fit call ends (compile cost).

    It listens for the *second* step's start rather than the first step's end: overriding
    ``on_train_batch_end`` makes Keras synchronise with the device after every step. At the
    start of training proper it tells the input to start counting (``on_train_begin``): Keras
    may have drawn a batch before, from an iterator it then drops, to build the model's metrics.
    """

    def __init__(self, keras: Any, on_train_begin: Callable[[], None]) -> None:  # keras: the module (see trial_sgd)
        outer = self

        class _Callback(keras.callbacks.Callback):
            def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
                on_train_begin()

            def on_train_batch_begin(self, batch: int, logs: dict[str, float] | None = None) -> None:
                if batch == 1 and outer.first_end is None:
                    outer.first_end = time.perf_counter()

        self.first_end: float | None = None
        self.callback = _Callback()


class TrialRunner:
    """Trains trials on an in-memory dataset; one instance per worker, reused for every trial."""

    def __init__(self, dataset: Dataset, settings: TrainerSettings, backend: str | None = None) -> None:
        import keras

        from aiperf.training.backend import DataParallel

        self.dataset = dataset
        self.settings = settings
        self.last_model: keras.Model | None = None  # the most recent trial's model, for inspection (tests)
        self.backend = backend or keras.backend.backend()
        self._parallel = DataParallel(self.backend, settings.data_parallel)
        self.bad_limit = bad_image_limit(dataset.train_size + dataset.val_size, settings.max_bad_fraction)
        self.reported_bad: set[str] = set()  # names already sent to the master by this worker
        self.compiled = CompiledModels(settings.compiled_models)
        # Compiling ahead (prepare, on the worker's compile thread): JAX or TensorFlow on one device, resident data.
        self.ahead = (
            settings.compile_ahead and ahead_supported(self.backend, settings.data_parallel) and not dataset.streaming
        )
        self._ahead: Prepared[CompiledModel] = Prepared()  # models compiled ahead; its state guards self.compiled too

    # -- input ---------------------------------------------------------------------------------
    def _train_feed(self, batch: int, seed: int) -> TrainInput | TrainStream:
        ds, s = self.dataset, self.settings
        if not ds.streaming:
            x_train, y_train, _, _ = ds.resident()
            return TrainInput(x_train, y_train, batch, seed, self.backend)
        from aiperf.families.image.stream_input import TrainStream

        return TrainStream(ds, batch, seed, self.backend, s.decode_threads, self.bad_limit, s.shuffle_buffer)

    def _evaluate(self, model: keras.Model, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(logits, labels, skipped validation indices) over the whole validation split."""
        ds = self.dataset
        if not ds.streaming:
            _, _, x_val, y_val = ds.resident()
            return predict_all(model, x_val, batch), y_val, np.empty(0, np.int64)
        from aiperf.families.image.stream_input import EvalStream

        logits, labels, skipped, _ = EvalStream(ds, batch, self.backend, self.settings.decode_threads).predict(model)
        return logits, labels, skipped

    def _bad_images(self, train: np.ndarray, val: np.ndarray, over: bool) -> dict[str, object] | None:
        """A ``bad_images`` item with the names this worker has not reported yet (None if nothing new)."""
        from aiperf.families.image.stream_input import name_bad

        names = name_bad(self.dataset, "train", train) + name_bad(self.dataset, "val", val)
        new = [n for n in names if n not in self.reported_bad]
        self.reported_bad.update(new)
        if not new and not over:
            return None
        gone = set(self._missing(train, val)[0])
        missing = [n for n in new if n in gone]
        return {
            "type": "bad_images",
            "files": new,
            "epoch_count": len(train) + len(val),
            "over_limit": over,
            "missing": missing,
        }

    def _missing(self, train: np.ndarray, val: np.ndarray) -> tuple[list[str], int]:
        """(names of at most 100, how many) of the skipped images whose file no longer exists."""
        from aiperf.families.image.stream_input import name_bad

        ds = self.dataset
        if not ds.streaming:
            return [], 0
        gone_train, gone_val = ds.missing_items("train", train), ds.missing_items("val", val)
        return name_bad(ds, "train", gone_train) + name_bad(ds, "val", gone_val), len(gone_train) + len(gone_val)

    def _too_many(self, train: np.ndarray, val: np.ndarray, count: int | None = None) -> AiperfError:
        from aiperf.families.image.stream_input import name_bad

        ds = self.dataset
        names = name_bad(ds, "train", train) + name_bad(ds, "val", val)
        missing, missing_count = self._missing(train, val)
        message = too_many_bad_images(
            names, ds.train_size + ds.val_size, self.settings.max_bad_fraction, count, missing, missing_count
        )
        return AiperfError(f"{ds.name}: {message}")

    # -- pieces --------------------------------------------------------------------------------
    def _compile(self, model: keras.Model) -> None:
        """Compile once per model: every trial's hyperparameters are variables the step reads."""
        import keras

        from aiperf.families.image.runtime_hparams import trial_sgd

        with self._parallel.scope():
            optimizer = trial_sgd(keras)()
            if self.settings.precision == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            model.compile(
                optimizer=optimizer,
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
                jit_compile=self.settings.jit_compile,
            )
            optimizer.build(model.trainable_variables)
            if self.settings.data_parallel <= 1:
                build_step_state(model)

    def _build(self, graph: Graph, weights: Weights | None) -> keras.Model:
        with self._parallel.scope():
            return self._build_in_scope(graph, weights)

    def _build_in_scope(self, graph: Graph, weights: Weights | None) -> keras.Model:
        model = build_model(
            graph,
            dtype_policy=self.settings.precision,
            bn_momentum=self.settings.bn_momentum,
            pixel_scale=self.dataset.pixel_scale,
            pixel_offset=self.dataset.pixel_offset,
        )
        if weights is not None:
            set_weights(model, graph, weights)
        return model

    def _model_for(self, graph: Graph, weights: Weights | None) -> tuple[CompiledModel, bool, float]:
        """A compiled model of ``graph`` holding ``weights`` (a fresh start if None), whether it was reused,
        and the seconds spent waiting for it to finish compiling ahead.

        Either way the model starts from the same state: the kept (or prepared) model gets the
        weights a fresh build would have drawn (:func:`initial_weights`, same RNG order) and its
        optimizer's freshly built state back.
        """
        import keras

        key = compile_key(graph)
        with self._ahead.state:
            entry, waited = self._ahead.wait_and_take(key)
            if entry is not None:
                self.compiled.keep(entry)
            else:
                entry = self.compiled.take(key)
        if entry is not None:
            set_weights(entry.model, graph, weights if weights is not None else initial_weights(graph))
            entry.restart_optimizer()
            return entry, True, waited
        with self._ahead.keras_lock:
            with self._ahead.state:
                self.compiled.make_room()
            keras.backend.clear_session()  # Keras's global state only: models kept in the cache stay usable
            self._parallel.activate()  # clear_session also dropped a process-wide distribution
            model = self._build(graph, weights)
            self._compile(model)
            if self.ahead:
                install(model)  # later trials of this architecture can have their shapes compiled ahead
        entry = CompiledModel.capture(key, model)
        with self._ahead.state:
            self.compiled.keep(entry)
        return entry, False, waited

    def step_shapes(self, graph: Graph, spec: TrialSpec) -> StepShapes:
        """The shapes of the steps ``spec`` will run on a resident dataset (as :meth:`run` and its input pick them)."""
        y_train = self.dataset.resident()[1]
        return self._shapes_of(max(1, min(self._batch_for(graph, spec), len(y_train))))  # TrainInput's clamp

    def _shapes_of(self, batch: int) -> StepShapes:
        """The steps a trial training with global batch ``batch`` runs on the resident dataset."""
        x_train, y_train, _, _ = self.dataset.resident()
        replicas = max(1, self.settings.data_parallel)
        eval_batch = eval_batch_size(self.dataset.val_size, max(batch, self.settings.eval_batch_size), replicas)
        return StepShapes(batch, (eval_batch,), tuple(x_train.shape[1:]), str(x_train.dtype), str(y_train.dtype))

    def prepare(self, spec: TrialSpec) -> bool:
        """Build ``spec``'s model and compile its steps for its shapes now, before its trial starts.

        Runs on the worker's compile thread while the device trains the trial before (the
        master hands each worker its next trial early: cluster.queue_depth). The prepared
        model waits for its trial (at most a few are held); a trial that arrives while its
        model is still compiling waits for it (``compile_wait_s``) rather than compiling it
        twice. Returns whether anything was compiled.
        """
        if not self.ahead:
            return False
        graph = apply_hparams(spec.architecture(), spec.hparams)
        key = compile_key(graph)
        shapes = self.step_shapes(graph, spec)
        with self._ahead.state:
            entry = self._ahead.peek(key) or self.compiled.peek(key)
            if self._ahead.busy(key) or (entry is not None and ahead_ready(entry.model, shapes)):
                return False
            kept = entry is not None and key in self.compiled  # a kept model gains a shape; it stays where it is
            if kept and prepares_by_running(self.backend):
                return False  # a trial may be training it now; the first step of another batch size picks kernels
            self._ahead.begin(key)
        try:
            if entry is None:
                with self._ahead.keras_lock:
                    model = self._build(graph, None)
                    self._compile(model)
                    install(model)
                entry = CompiledModel.capture(key, model)
            compile_ahead(entry.model, shapes, self._ahead.keras_lock)
        except BaseException:
            self._ahead.finish(key, None)
            raise
        self._ahead.finish(key, None if kept else entry)
        return True

    def _batch_for(self, graph: Graph, spec: TrialSpec) -> int:
        """The global batch a trial trains with: as asked, within device memory and what an epoch surely fills."""
        requested = int(spec.hparams["batch_size"])
        limit = batch_limit(
            activation_bytes(graph, self.settings.precision),
            self.settings.device_memory_bytes,
            self.settings.max_batch_size,
        )
        replicas = max(1, self.settings.data_parallel)  # batch sizes are per device; the global batch scales
        # Never more than an epoch surely delivers: a larger batch would train no full batch at all.
        fillable = largest_full_batch(self.dataset, self.settings.max_bad_fraction)
        return max(replicas, min(requested, limit, max(1, fillable // replicas)) * replicas)

    def _prepare(self, entry: CompiledModel, graph: Graph, spec: TrialSpec, steps: tuple[int, int]) -> None:
        """Write this trial's hyperparameters and restart point into the compiled model."""
        set_trial_hparams(entry.model, graph, spec.hparams, self.settings.momentum, steps, spec.seed)
        entry.trials += 1

    # -- the trial -----------------------------------------------------------------------------
    def run(
        self, spec: TrialSpec, parent_weights: Weights | None = None, resume_weights: Weights | None = None
    ) -> Iterator[dict[str, Any]]:
        """Yield one ``{"type": "epoch", ...}`` per completed epoch, then ``{"type": "done", ...}``.

        ``parent_weights`` are the inherited parent's trained weights (transformed here by
        replaying the morphs); ``resume_weights`` are this trial's own last checkpoint when
        a re-queued trial continues after ``spec.start_epoch`` epochs.
        """
        import keras

        t0 = time.perf_counter()
        self.last_model = None
        ds = self.dataset
        graph = apply_hparams(spec.architecture(), spec.hparams)
        seed_trial(int(spec.seed) % (2**31))
        if resume_weights is not None:
            weights: Weights | None = resume_weights
        elif parent_weights is not None:
            weights = inherit_weights(spec, parent_weights)
        else:
            weights = None
        requested = int(spec.hparams["batch_size"])
        replicas = max(1, self.settings.data_parallel)  # batch sizes are per device; the global batch scales
        batch = self._batch_for(graph, spec)
        feed = self._train_feed(batch, spec.seed)
        batch = feed.batch
        steps_per_epoch = feed.steps
        epochs = spec.epochs
        entry, reused, compile_wait_s = self._model_for(graph, weights)
        model = entry.model
        self._prepare(entry, graph, spec, (steps_per_epoch * epochs, steps_per_epoch * spec.start_epoch))
        self.last_model = model
        startup_s = time.perf_counter() - t0
        precision = model.get_layer(graph.nodes[1].label).dtype_policy.name
        oom_retries = 0
        first_step_s = None
        compiles = CompileShares()  # the first step's and the first evaluation's excess, epoch by epoch
        best = None
        for epoch in range(spec.start_epoch + 1, epochs + 1):
            while True:
                timer = _FirstStepTimer(keras, feed.on_train_begin)
                t_fit = time.perf_counter()
                try:
                    with warnings.catch_warnings():  # streamed epochs end when the data does, by design
                        warnings.filterwarnings("ignore", message="Your input ran out of data")
                        hist = model.fit(**feed.fit_kwargs(epoch), epochs=1, verbose=0, callbacks=[timer.callback])
                    break
                except Exception as exc:
                    failed = feed.surely_bad()
                    if len(failed) > self.bad_limit or TOO_MANY_BAD in str(exc):
                        # The pipeline stopped the epoch: more images than allowed surely failed to decode.
                        count = max(len(failed), self.bad_limit + 1)
                        report = self._bad_images(failed, np.empty(0, np.int64), over=True)
                        if report is not None:
                            report["epoch_count"] = count
                            yield report
                        raise self._too_many(failed, np.empty(0, np.int64), count) from None
                    if not is_out_of_memory(exc) or batch <= replicas:
                        raise
                    # Shrink and retry the epoch from its starting weights; the lost partial epoch is not reported.
                    oom_retries += 1
                    batch = max(replicas, batch // 2 // replicas * replicas)
                    feed = self._train_feed(batch, spec.seed)
                    batch = feed.batch
                    steps_per_epoch = feed.steps
                    del model
                    self.last_model = None  # nothing may keep the old model's device memory
                    self.compiled.clear()  # device memory ran out: kept models give theirs back, this one is built anew
                    entry, _, _ = self._model_for(graph, weights)
                    model = entry.model
                    self._prepare(entry, graph, spec, (steps_per_epoch * epochs, steps_per_epoch * (epoch - 1)))
                    self.last_model = model
            train_s = time.perf_counter() - t_fit
            fed = feed.stats()
            first_step_excess = None
            if first_step_s is None and timer.first_end is not None:
                first_step_s = timer.first_end - t_fit
                first_step_excess = compile_overhead(first_step_s, train_s, fed["steps"])
            t_eval = time.perf_counter()
            eval_batch = eval_batch_size(ds.val_size, max(batch, self.settings.eval_batch_size), replicas)
            logits, labels, val_skipped = self._evaluate(model, eval_batch)
            eval_s = time.perf_counter() - t_eval
            compile_share = compiles.epoch(first_step_excess, eval_s)
            skipped = len(fed["skipped"]) + len(val_skipped)
            missing_images = self._missing(fed["skipped"], val_skipped)[1] if skipped else 0
            if skipped:
                report = self._bad_images(fed["skipped"], val_skipped, over=skipped > self.bad_limit)
                if report is not None:
                    yield report
                if skipped > self.bad_limit:
                    raise self._too_many(fed["skipped"], val_skipped)
            if fed["steps"] == 0 or len(labels) == 0:
                raise AiperfError(
                    f"{ds.name}: an epoch found no decodable {'training' if not fed['steps'] else 'validation'} images"
                )
            val_loss, val_acc = classification_metrics(logits, labels)
            best = val_acc if best is None else max(best, val_acc)
            last = epoch == epochs
            record: dict[str, Any] = {
                "type": "epoch",
                "epoch": epoch,
                "train_images": fed["images"],
                "eval_images": len(labels),
                "train_acc": float(hist.history["accuracy"][-1]),
                "train_loss": float(hist.history["loss"][-1]),
                "val_acc": val_acc,
                "val_loss": val_loss,
                "steps": fed["steps"],
                "train_s": train_s,
                "eval_s": eval_s,
                "data_wait_s": fed["data_wait_s"],
                "input": "stream" if feed.streaming else "memory",
                "skipped_images": skipped,
                "missing_images": missing_images,
                "batch_size": batch,
                "precision": precision,
                "oom_retries": oom_retries,
                "compile_s": compile_share,
                "compile_wait_s": compile_wait_s if epoch == spec.start_epoch + 1 else None,
                "window": (t_fit, t_eval + eval_s),  # this process's perf_counter: first step to last step
            }
            weights = get_weights(model, graph)  # also the restart point should the next epoch run out of memory
            if spec.checkpoint_every_epoch and not last:
                record["weights"] = weights
            yield record
        if self.ahead:
            note_ran(model, self._shapes_of(batch))  # a later trial of these shapes needs nothing prepared
        yield {
            "type": "done",
            "weights": weights,
            "startup_s": startup_s,
            "first_step_s": first_step_s,
            "compile_s": compiles.total(),
            "step_reused": reused,
            "best_val_acc": best,
            "batch_size": batch,
            "requested_batch_size": requested,
            "precision": precision,
        }
        del model


def classification_metrics(logits: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Mean cross-entropy and top-1 accuracy of logits against integer labels.

    Evaluation runs ``predict`` and scores on the host: the same numbers as Keras's
    ``evaluate``, but it also works under data-parallel strategies that cannot evaluate
    a final batch that does not split evenly across replicas.
    """
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(z).sum(axis=1))
    labels = np.asarray(labels).astype(np.int64)
    loss = float(np.mean(log_norm - z[np.arange(len(labels)), labels]))
    acc = float(np.mean(np.argmax(z, axis=1) == labels))
    return loss, acc


def evaluate_weights(dataset: Dataset, graph: Graph, weights: Weights, settings: TrainerSettings) -> float:
    """Validation accuracy of given weights (the tests' check that inherited weights keep the parent's function)."""
    runner = TrialRunner(dataset, settings)
    model = runner._build(graph, weights)
    _, _, x_val, y_val = dataset.resident()
    logits = predict_all(model, x_val, eval_batch_size(dataset.val_size, settings.eval_batch_size))
    return float(np.mean(np.argmax(logits, axis=-1) == y_val))
