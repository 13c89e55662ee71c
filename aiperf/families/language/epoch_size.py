"""A language epoch sized to the device that trains it (``lm.steps_per_epoch: auto``; issue 44, item 3).

A trial pays fixed costs once -- building its model, compiling its steps, its first evaluation,
its weights' hand-over -- and its epochs amortise them. A fixed number of steps per epoch sized
for a CPU is over in a fraction of a second on a GPU, where the fixed costs then dominate the
trial; sized for a GPU, it takes minutes per epoch on a CPU. ``auto`` states an epoch in seconds
of the device's own measured rate instead: a trial's worker sizes each of its epochs to
``lm.epoch_device_s`` seconds at the dense matmul ceiling it measured at its start
(:mod:`aiperf.system.ceiling`), from the trial's counted training operations per step. Real steps
reach a fraction of that ceiling, so an epoch lasts at least that long.

The steps a trial trained with are recorded in each of its epochs (``steps``), so everything that
must train or evaluate it again -- its next attempt from a checkpoint, a resumed run, an audit --
takes them from the ledger rather than measuring again.
"""

from __future__ import annotations

import math

from aiperf.errors import AiperfError
from aiperf.families.language.trainer import MAX_EPOCH_TOKENS, MAX_STEPS_PER_EPOCH, MAX_TOTAL_STEPS
from nas.language.flops import transformer_flops
from nas.language.spec import TransformerSpec

MIN_AUTO_STEPS = 10  # fewer, and one step's noise is a tenth of the epoch's time


def auto_steps_per_epoch(
    spec: TransformerSpec, batch_size: int, seq_len: int, epochs: int, flops_per_s: float | None, epoch_device_s: float
) -> int:
    """The steps of one epoch of ``spec`` at ``batch_size`` x ``seq_len`` that take ``epoch_device_s`` seconds at
    ``flops_per_s`` (a worker's measured ceiling), within the trainer's limits for a trial of ``epochs`` epochs."""
    if flops_per_s is None or not math.isfinite(flops_per_s) or flops_per_s <= 0:
        raise AiperfError(
            "lm.steps_per_epoch auto sizes epochs by the worker's measured ceiling, and this worker measured none "
            "(cluster.ceiling_s 0, or the measurement failed): give lm.steps_per_epoch a number"
        )
    tokens = batch_size * seq_len
    per_step = transformer_flops(spec, seq_len).train_per_token(tokens) * tokens
    cap = min(MAX_STEPS_PER_EPOCH, MAX_TOTAL_STEPS // max(1, epochs), MAX_EPOCH_TOKENS // (batch_size * (seq_len + 1)))
    wanted = math.ceil(epoch_device_s * flops_per_s / per_step)
    return max(1, min(cap, max(MIN_AUTO_STEPS, wanted)))
