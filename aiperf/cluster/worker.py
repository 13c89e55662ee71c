"""The long-lived worker: one per slot, alive for the whole run.

The framework import, the device set-up and the dataset happen once, in ``__init__``;
every trial after that only builds and trains a model, so no trial pays a process start.
A worker of a streamed dataset also checks there that it can read the files (a node that
does not see the dataset fails here, once, with its name, rather than in every trial).
Weights travel as references to the node that holds them (:mod:`aiperf.cluster.node_weights`).
The worker measures its own busy time (inside training and evaluation steps) and the
gaps between trials, which the master records per worker. As a Ray actor it is wrapped in
:class:`RayTrialWorker`, which also answers the master's "are you alive?" while a trial trains.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import Generator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, cast

from aiperf.cluster.messages import (
    BadImagesReport,
    EpochReport,
    TrialDone,
    TrialMessage,
    TrialStarted,
    WorkerInfo,
    WorkerStats,
)
from aiperf.cluster.node_weights import NodeStore, WeightSource, resolve_start
from aiperf.datasets.base import Dataset
from aiperf.training.trial import TrialSpec, TrialSpecDict, Weights

if TYPE_CHECKING:
    from aiperf.cluster.plan import Plan, Slot
    from aiperf.cluster.remote import KeeperActor
    from aiperf.config import Config
    from aiperf.families.image.trainer import TrainerSettings
    from aiperf.families.language.data import LanguageData
    from aiperf.families.language.runner import LMTrialRunner
    from aiperf.system.ceiling import Ceiling
    from aiperf.training.backend import DeviceInfo

logger = logging.getLogger(__name__)

LIVENESS_GROUP = "liveness"  # the actor's concurrency group for RayTrialWorker.alive: a thread beside the trials'
WORKER_START_S = 600.0  # the longest a prepare request waits for the worker's start-up (framework, dataset, ceiling)
PREPARE_GROUP = "prepare"  # ... and for RayTrialWorker.prepare: the thread that compiles queued trials ahead


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    """Everything a worker needs from the run's config and its slot, in one picklable value.

    The pool computes the config's part once (:meth:`from_config`) and each slot's share of
    threads and devices (:meth:`for_slot`); the worker turns it into its trainer's settings
    once the device it runs on is known. No config-derived field has a default of its own:
    the config's defaults are the only ones.
    """

    backend: str
    precision: str  # model.precision: auto or a Keras dtype policy
    jit: str  # model.jit_compile: auto | on | off
    bn_momentum: float
    momentum: float
    eval_batch_size: int
    max_batch_size: int
    decode_threads: int | Literal["auto"]
    max_bad_fraction: float
    shuffle_buffer: int
    compiled_models: int
    compile_ahead: bool  # train.compile_ahead
    ceiling_s: float | Literal["auto"]  # cluster.ceiling_s: the matmul ceiling's time at start (0: none)
    lm_steps_per_epoch: int | Literal["auto"]  # lm.steps_per_epoch: a language trial's optimizer steps per epoch
    lm_epoch_device_s: float  # lm.epoch_device_s: with steps_per_epoch auto, an epoch's seconds at the ceiling
    lm_eval_windows: int  # lm.eval_windows: the validation sequences of every language evaluation
    compile_cache: str = ""  # the run's persistent compilation cache (each node uses a folder of its own)
    threads: int = 1  # CPU threads of this worker's slot
    data_parallel: int = 1  # devices one trial trains on (per_node placement)

    @classmethod
    def from_config(cls, cfg: Config, plan: Plan | None = None) -> WorkerSettings:
        """The run-wide part, the same for every worker (``plan``: the run's, which resolves compile_ahead "auto")."""
        return cls(
            backend=cfg.model.backend,
            precision=cfg.model.precision,
            jit=cfg.model.jit_compile,
            bn_momentum=cfg.model.bn_momentum,
            momentum=cfg.train.momentum,
            eval_batch_size=cfg.train.eval_batch_size,
            max_batch_size=cfg.train.max_batch_size,
            decode_threads=cfg.dataset.decode_threads,
            max_bad_fraction=cfg.dataset.max_bad_fraction,
            shuffle_buffer=cfg.dataset.shuffle_buffer,
            compiled_models=cfg.train.compiled_models,
            compile_ahead=plan.compile_ahead if plan is not None else cfg.train.compile_ahead is True,
            ceiling_s=cfg.cluster.ceiling_s,
            lm_steps_per_epoch=cfg.lm.steps_per_epoch,
            lm_epoch_device_s=cfg.lm.epoch_device_s,
            lm_eval_windows=cfg.lm.eval_windows,
        )

    def for_slot(self, slot: Slot) -> WorkerSettings:
        """These settings for a worker holding ``slot``: its CPU threads and data-parallel devices."""
        return replace(self, threads=max(1, round(slot.cpus)), data_parallel=int(slot.gpus) if slot.gpus >= 2 else 1)


class TrialWorker:
    """Plain class; the pool wraps it with ``ray.remote`` (so this module never needs Ray)."""

    def __init__(self, worker_id: str, dataset: Dataset | LanguageData, settings: WorkerSettings) -> None:
        t0 = time.monotonic()
        from aiperf.training.backend import configure_process, describe_device, node_compile_cache, versions

        backend, threads = settings.backend, settings.threads
        configure_process(backend, threads, node_compile_cache(settings.compile_cache))
        from aiperf.families.image.trainer import TrialRunner

        if isinstance(dataset, Dataset) and dataset.streaming:
            from aiperf.datasets.census import check_readable

            check_readable(dataset, seed=zlib.crc32(worker_id.encode()))  # each worker samples other files

        self.worker_id = worker_id
        self.backend = backend
        self.device = describe_device(backend)
        trainer = trainer_settings(settings, self.device)
        self.runner: TrialRunner | LMTrialRunner
        if isinstance(dataset, Dataset):
            self.precision = trainer.precision
            self.ceiling = _measure_ceiling(settings, self.device, self.precision)
            self.runner = TrialRunner(dataset, trainer, backend)
        else:  # a language run: its workers open the token shards here, once (a node that cannot read them fails now)
            from aiperf.families.language.runner import LMRunnerSettings, LMTrialRunner, lm_precision
            from aiperf.training.compile_ahead import ahead_supported, prepares_by_running

            self.precision = lm_precision(trainer.precision)
            self.ceiling = _measure_ceiling(settings, self.device, self.precision)  # it sizes epochs where asked
            lm = LMRunnerSettings(
                precision=trainer.precision,
                jit_compile=trainer.jit_compile,
                steps_per_epoch=settings.lm_steps_per_epoch,
                eval_windows=settings.lm_eval_windows,
                # It trains a prepared model from its built state: one run ahead would move it.
                compile_ahead=settings.compile_ahead
                and ahead_supported(backend, 1)
                and not prepares_by_running(backend),
                epoch_device_s=settings.lm_epoch_device_s,
                ceiling_flops_per_s=_ceiling_rate(self.ceiling),
            )
            self.runner = LMTrialRunner(dataset, lm)
        self.versions = versions(backend)
        self.threads = threads
        self.decode_threads = trainer.decode_threads
        self.ready_at = time.monotonic()
        self.init_s = self.ready_at - t0
        self.busy_s = 0.0
        self.trials = 0
        self.last_step_end: float | None = None
        self.gaps: list[float] = []
        # The framework's modules and the dataset stay for the worker's life: out of the cyclic collector's
        # view, the full collection each new architecture's clean-up runs (Keras's clear_session) scans only
        # what trials made since, which shortens a TensorFlow trial's start-up (figure: benchmarks/RESULTS.md).
        gc.collect()
        gc.freeze()

    def info(self) -> WorkerInfo:
        """Who and where this worker is; the first answer also tells the master it is ready."""
        node_id = ""
        try:
            import ray

            if ray.is_initialized():  # asking outside Ray would start a Ray instance in this process
                node_id = ray.get_runtime_context().get_node_id()
        except Exception as exc:  # outside Ray (tests, benchmarks): no node id to report
            logger.debug("no Ray node id: %s", exc)
        return {
            "worker": self.worker_id,
            "node": node_id,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "device": self.device.to_dict(),
            "precision": self.precision,
            "versions": self.versions,
            "threads": self.threads,
            "decode_threads": self.decode_threads if self.runner.dataset.streaming else None,
            "init_s": self.init_s,
            "ceiling": self.ceiling.to_dict() if self.ceiling is not None else None,
            "niceness": os.nice(0) if hasattr(os, "nice") else None,  # its scheduling priority (0: as the user's)
        }

    def run_trial(
        self, spec: TrialSpecDict, parent_weights: WeightSource = None, resume_weights: WeightSource = None
    ) -> Generator[TrialMessage, None, None]:
        """Train one trial; yields a start marker, one report per epoch, then the final weights.

        Weights the master sent as references are fetched first, from the node that holds them;
        what could not be fetched is named in the start marker, and the trial starts from what
        could (:func:`~aiperf.cluster.node_weights.resolve_start`).

        The first epoch report carries ``idle_before_s``: the time between this worker's
        previous training/eval step and this trial's first step (build, compile, weight
        surgery, clean-up and Ray's hand-over), the idle time a long-lived worker cannot hide.
        The trainer's items are dicts (its own interface, used alone by tests and benchmarks);
        here they become the typed messages the master reads, and an item the messages do not
        describe is an error rather than a field silently dropped.
        """
        start = resolve_start(TrialSpec.from_dict(spec), parent_weights, resume_weights)
        if start.fallback:
            logger.warning(f"worker {self.worker_id}, trial {start.spec.trial_id}: {start.fallback}")
        yield TrialStarted(
            worker=self.worker_id,
            start_epoch=start.spec.start_epoch,
            inherited=start.inherited,
            weights_lost=start.fallback,
        )
        first = True
        # The arrays are the run's family's (an image set or a language model's); the runner checks them against
        # the architecture it builds before it uses them. Typed as the image runner's: the language runner takes
        # any mapping.
        parent, resume = cast("Weights | None", start.parent), cast("Weights | None", start.resume)
        for item in self.runner.run(start.spec, parent, resume):
            kind = item.pop("type")
            if kind == "epoch":
                begin, end = item.pop("window")
                report = EpochReport(**item)
                if first and self.last_step_end is not None:
                    report.idle_before_s = begin - self.last_step_end
                    self.gaps.append(report.idle_before_s)
                first = False
                self.last_step_end = end
                self.busy_s += report.train_s + report.eval_s
                yield report
            elif kind == "done":
                self.trials += 1
                yield TrialDone(**item, worker_stats=self.stats())
            elif kind == "bad_images":
                yield BadImagesReport(**item)
            else:
                raise ValueError(f"the trainer yielded an item of unknown type {kind!r}")

    def prepare(self, spec: TrialSpecDict) -> bool:
        """Build and compile the model of a trial queued behind the running one (the runner's ``prepare``).

        Called on a thread of its own while a trial trains; never raises: a spec that cannot be
        prepared fails, if at all, when its trial runs, with the trial's own error.
        """
        prepare = getattr(self.runner, "prepare", None)
        if prepare is None:
            return False
        try:
            return bool(prepare(TrialSpec.from_dict(spec)))
        except Exception as exc:
            logger.debug(f"worker {self.worker_id}: could not compile trial {spec.get('trial_id')} ahead: {exc}")
            return False

    def stats(self) -> WorkerStats:
        alive = time.monotonic() - self.ready_at
        gaps = sorted(self.gaps)
        return {
            "worker": self.worker_id,
            "busy_s": self.busy_s,
            "alive_s": alive,
            "busy_fraction": self.busy_s / alive if alive > 0 else None,
            "trials": self.trials,
            "init_s": self.init_s,
            "idle_gaps": {
                "count": len(gaps),
                "mean_s": sum(gaps) / len(gaps) if gaps else None,
                "max_s": gaps[-1] if gaps else None,
                "median_s": gaps[len(gaps) // 2] if gaps else None,
            },
        }


class RayTrialWorker:
    """What the pool starts as a Ray actor: a :class:`TrialWorker`, and an answer to "alive?" while it trains.

    :meth:`alive` runs in a concurrency group of its own (``LIVENESS_GROUP``, one thread), so
    the master hears from a worker in the middle of a long epoch -- and not from one whose
    process is stopped or gone. With a concurrency group, Ray runs the actor's other methods
    on one thread of their own, not the one that ran ``__init__``; Keras keeps part of its
    state per thread, so the :class:`TrialWorker` is built on that thread by the first call
    (``info``, which the pool makes at once), and start-up and trials share one thread as
    they did without the group. A start-up that failed fails every later call the same way.
    """

    def __init__(
        self, worker_id: str, dataset: Dataset, settings: WorkerSettings, keeper: KeeperActor | None = None
    ) -> None:
        self._args: tuple[str, Dataset, WorkerSettings] | None = (worker_id, dataset, settings)
        self._worker: TrialWorker | None = None
        self._failed: Exception | None = None
        self._started = threading.Event()  # the worker was built (or failed to be), on its own thread
        self._store = NodeStore(keeper)  # the node's WeightKeeper: the weights this worker produces stay on its node

    def _built(self) -> TrialWorker:
        if self._worker is not None:
            return self._worker
        if self._failed is not None or self._args is None:
            raise self._failed or RuntimeError("the worker has no start-up arguments")
        try:
            self._worker = TrialWorker(*self._args)
        except Exception as exc:
            self._failed = exc
            raise
        finally:
            self._started.set()
        self._args = None
        return self._worker

    def info(self) -> WorkerInfo:
        info = self._built().info()
        self._store.reach()
        return info

    def run_trial(
        self, spec: TrialSpecDict, parent_weights: WeightSource = None, resume_weights: WeightSource = None
    ) -> Generator[TrialMessage, None, None]:
        """The trial's messages, each weight set in them left on this node (the master gets a reference)."""
        worker = self._built()
        for message in worker.run_trial(spec, parent_weights, resume_weights):
            if isinstance(message, (EpochReport, TrialDone)) and isinstance(message.weights, dict):
                if not self._store.node:
                    self._store.node = worker.info()["node"]
                message.weights = self._store.store(message.weights, worker.worker_id)
            yield message

    def stats(self) -> WorkerStats:
        return self._built().stats()

    def prepare(self, spec: TrialSpecDict) -> bool:
        """A queued trial compiled ahead (``PREPARE_GROUP``), once the worker is built on its own thread."""
        self._started.wait(WORKER_START_S)
        worker = self._worker
        return worker.prepare(spec) if worker is not None else False

    def alive(self) -> bool:
        """The master's liveness question (``LIVENESS_GROUP``): answered unless the process is stopped or gone."""
        return True


def trainer_settings(settings: WorkerSettings, device: DeviceInfo) -> TrainerSettings:
    """How a worker with ``settings`` trains on ``device``: the one translation, for the workers and the audit.

    ``aiperf audit`` re-evaluates and re-trains a run's trials with the settings this gives for
    the run's recorded config, so it trains as the run's workers did.
    """
    from aiperf.families.image.trainer import TrainerSettings
    from aiperf.training.backend import choose_jit, choose_precision

    return TrainerSettings(
        precision=choose_precision(settings.precision, device),
        jit_compile=choose_jit(settings.jit, settings.backend, device),
        bn_momentum=settings.bn_momentum,
        momentum=settings.momentum,
        eval_batch_size=settings.eval_batch_size,
        max_batch_size=settings.max_batch_size,
        device_memory_bytes=int(device.memory_bytes) if device.kind == "gpu" else 0,
        data_parallel=max(1, settings.data_parallel),
        decode_threads=_decode_threads(settings.decode_threads, settings.threads),
        max_bad_fraction=settings.max_bad_fraction,
        shuffle_buffer=settings.shuffle_buffer,
        compiled_models=settings.compiled_models,
        compile_ahead=settings.compile_ahead,
    )


def _ceiling_rate(ceiling: Ceiling | None) -> float | None:
    """The FLOP/s a worker's ceiling says it can reach on all its devices (None: not measured)."""
    if ceiling is None or ceiling.flops_per_s is None:
        return None
    return ceiling.flops_per_s * max(1, ceiling.devices)


def _measure_ceiling(settings: WorkerSettings, device: DeviceInfo, precision: str) -> Ceiling | None:
    """The worker's dense matmul ceiling at the run's precision (docs/system.md), inside its start-up time."""
    from aiperf.system.ceiling import SIZES, ceiling_seconds, measure_ceiling
    from aiperf.system.peak import arithmetic_of

    kind = "gpu" if device.kind == "gpu" else "cpu"
    devices = max(1, settings.data_parallel) if kind == "gpu" else 1
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "") if kind == "gpu" else ""
    seconds = ceiling_seconds(settings.ceiling_s, kind)
    return measure_ceiling(seconds, arithmetic_of(precision), settings.backend, SIZES[kind], devices, visible)


def _decode_threads(setting: int | Literal["auto"], threads: int) -> int:
    """``dataset.decode_threads``: a number, or ``auto`` -- the worker's CPU share (at least one)."""
    return max(1, threads) if setting == "auto" else max(1, int(setting))
