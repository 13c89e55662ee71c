"""The measured ceiling: how fast this worker's device multiplies dense matrices, timed at start.

Rpeak is what the vendor's book says; the ceiling is what the run's own framework reaches
on the run's own device at the run's precision, in the simplest kernel there is. A run's
OPS over its ceiling says how much of the reachable rate the search's training kept;
OPS over Rpeak, how much of the hardware. Each worker times a few square sizes for a
few seconds while it starts (inside the run's wall time) and keeps the best rate. Only
Keras's portable ops are used, so the same code times TensorFlow, JAX and torch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

from aiperf.errors import first_line

if TYPE_CHECKING:
    from keras import KerasTensor

logger = logging.getLogger(__name__)

AUTO_SECONDS = {"cpu": 1.0, "gpu": 3.0}  # CI runs many tiny runs on 2 cores: keep CPU workers' start short
SIZES = {"cpu": (256, 512, 1024), "gpu": (2048, 4096, 8192)}


@dataclass
class SizeRate:
    n: int  # the matrices are n x n
    flops_per_s: float
    reps: int


@dataclass
class Ceiling:
    """The best dense matmul rate one worker measured (per device), and how it was measured."""

    flops_per_s: float | None
    dtype: str
    backend: str
    seconds: float  # wall time the measurement took, warm-ups included
    rates: list[SizeRate] = field(default_factory=list)
    devices: int = 1  # devices the worker trains on (data parallel): its ceiling is flops_per_s x devices
    device_ids: str = ""  # CUDA_VISIBLE_DEVICES of the worker: workers sharing a GPU share its ceiling
    error: str | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def ceiling_seconds(setting: float | str, device_kind: str) -> float:
    """``cluster.ceiling_s`` for a worker on ``device_kind`` (``auto``: :data:`AUTO_SECONDS`)."""
    if setting == "auto":
        return AUTO_SECONDS.get(device_kind, AUTO_SECONDS["gpu"])
    return max(0.0, float(setting))


def _sync(ops: ModuleType, value: KerasTensor) -> None:
    """Wait for ``value`` (accelerators run asynchronously): fetch one element of it."""
    ops.convert_to_numpy(ops.cast(value[0, 0], "float32"))


def _rate_at(
    ops: ModuleType, a: KerasTensor, b: KerasTensor, n: int, budget_s: float, first: bool = False
) -> SizeRate | None:
    """The best rate of ``a @ b`` in batches that double over about ``budget_s`` seconds; None when out of time.

    The ``first`` size is timed whatever its warm-up took: a ceiling without a single rate says
    nothing, and on a busy box the warm-up alone can take half a small budget (seen in CI).
    """
    start = time.perf_counter()
    _sync(ops, ops.matmul(a, b))  # compilation, allocation, library autotuning: not timed
    if not first and time.perf_counter() - start > budget_s / 2:
        return None
    reps, best, batch = 0, 0.0, 1
    deadline = start + budget_s
    while True:
        t0 = time.perf_counter()
        done = 0
        while done < batch:  # a batch that outlives the deadline (a box that got busy) stops where it is
            c = ops.matmul(a, b)
            done += 1
            if time.perf_counter() > deadline:
                break
        _sync(ops, c)
        now = time.perf_counter()
        reps += done
        if now > t0:  # the best batch counts: the first ones are mostly the sync's latency
            best = max(best, 2.0 * n**3 * done / (now - t0))
        if done < batch or now >= deadline or now + 2 * (now - t0) > deadline:
            break
        batch *= 2
    return SizeRate(n, best, reps) if best > 0 else None


def measure_ceiling(
    seconds: float, dtype: str, backend: str, sizes: Sequence[int], devices: int = 1, device_ids: str = ""
) -> Ceiling | None:
    """Time n x n matmuls in ``dtype`` for about ``seconds`` in all, sizes in order; None when ``seconds`` is 0.

    Never raises: a device that cannot run it (out of memory, a dtype it lacks) gives a
    ceiling with ``error`` set and no rate, and the worker goes on.
    """
    if seconds <= 0:
        return None
    import keras
    import numpy as np

    ops = keras.ops
    begin = time.perf_counter()
    rates: list[SizeRate] = []
    error = None
    try:
        rng = np.random.default_rng(0)
        for k, n in enumerate(sizes):
            remaining = seconds - (time.perf_counter() - begin)
            if remaining <= 0:
                break
            a, b = (ops.cast(ops.convert_to_tensor(rng.standard_normal((n, n), dtype=np.float32)), dtype) for _ in "ab")
            rate = _rate_at(ops, a, b, n, remaining / (len(sizes) - k), first=not rates)
            del a, b
            if rate is None:
                break
            rates.append(rate)
    except Exception as exc:  # the measurement is a figure beside the score; it never stops a worker
        error = first_line(exc)
        logger.debug("matmul ceiling failed: %s", exc)
    best = max((r.flops_per_s for r in rates), default=None)
    return Ceiling(best, dtype, backend, time.perf_counter() - begin, rates, devices, device_ids, error)
