"""The long-lived worker: one per slot, alive for the whole run.

The framework import, the device set-up and the dataset happen once, in ``__init__``;
every trial after that only builds and trains a model, so no trial pays a process start.
A worker of a streamed dataset also checks there that it can read the files (a node that
does not see the dataset fails here, once, with its name, rather than in every trial).
The worker measures its own busy time (inside training and evaluation steps) and the
gaps between trials, which the master records per worker.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import zlib
from collections.abc import Iterator
from typing import Any

from aiperf.datasets.base import Dataset
from aiperf.training.trial import TrialSpec, Weights

logger = logging.getLogger(__name__)


class TrialWorker:
    """Plain class; the pool wraps it with ``ray.remote`` (so this module never needs Ray)."""

    def __init__(
        self,
        worker_id: str,
        dataset: Dataset,
        backend: str,
        precision: str,
        jit: str,
        threads: int,
        train: dict[str, Any],
        data_parallel: int = 1,
    ) -> None:
        t0 = time.monotonic()
        from aiperf.training.backend import choose_jit, choose_precision, configure_process, describe_device, versions

        configure_process(backend, threads)
        from aiperf.training.trainer import TrainerSettings, TrialRunner

        if dataset.streaming:
            from aiperf.datasets.census import check_readable

            check_readable(dataset, seed=zlib.crc32(worker_id.encode()))  # each worker samples other files

        self.worker_id = worker_id
        self.backend = backend
        self.device = describe_device(backend)
        self.precision = choose_precision(precision, self.device)
        settings = TrainerSettings(
            precision=self.precision,
            jit_compile=choose_jit(jit, backend, self.device),
            bn_momentum=float(train.get("bn_momentum", 0.9)),
            momentum=float(train.get("momentum", 0.9)),
            eval_batch_size=int(train.get("eval_batch_size", 512)),
            max_batch_size=int(train.get("max_batch_size", 4096)),
            device_memory_bytes=int(self.device.memory_bytes) if self.device.kind == "gpu" else 0,
            data_parallel=max(1, int(data_parallel)),
            decode_threads=_decode_threads(train.get("decode_threads", "auto"), threads),
            max_bad_fraction=float(train.get("max_bad_fraction", 0.001)),
            shuffle_buffer=int(train.get("shuffle_buffer", 8192)),
        )
        self.runner = TrialRunner(dataset, settings, backend)
        self.versions = versions(backend)
        self.threads = threads
        self.decode_threads = settings.decode_threads
        self.ready_at = time.monotonic()
        self.init_s = self.ready_at - t0
        self.busy_s = 0.0
        self.trials = 0
        self.last_step_end: float | None = None
        self.gaps: list[float] = []

    def info(self) -> dict[str, Any]:
        """Who and where this worker is; the first answer also tells the master it is ready."""
        node_id = ""
        try:
            import ray

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
        }

    def run_trial(
        self, spec: dict[str, Any], parent_weights: Weights | None = None, resume_weights: Weights | None = None
    ) -> Iterator[dict[str, Any]]:
        """Train one trial; yields a start marker, one record per epoch, then the final weights.

        The first epoch record carries ``idle_before_s``: the time between this worker's
        previous training/eval step and this trial's first step (build, compile, weight
        surgery, clean-up and Ray's hand-over), the idle time a long-lived worker cannot hide.
        """
        yield {"type": "start", "worker": self.worker_id}
        first = True
        for item in self.runner.run(TrialSpec.from_dict(spec), parent_weights, resume_weights):
            if item["type"] == "epoch":
                begin, end = item.pop("window")
                if first and self.last_step_end is not None:
                    item["idle_before_s"] = begin - self.last_step_end
                    self.gaps.append(item["idle_before_s"])
                first = False
                self.last_step_end = end
                self.busy_s += item["train_s"] + item["eval_s"]
            elif item["type"] == "done":
                self.trials += 1
                item["worker_stats"] = self.stats()
            yield item

    def stats(self) -> dict[str, Any]:
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


def _decode_threads(setting: int | str, threads: int) -> int:
    """``dataset.decode_threads``: a number, or ``auto`` -- the worker's CPU share (at least one)."""
    return max(1, threads) if setting == "auto" else max(1, int(setting))
