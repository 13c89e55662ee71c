"""The range of every number the command line takes, checked while the arguments are parsed.

Each range is an argparse ``type=``: a value outside it ends the command before any work as
one line naming the flag, the range and the value (``--nodes must be from 1 to 16,384, got
99999999999999999999``; exit 2), never as a process that fills the machine's memory first. The
library checks the same ranges (:meth:`IntRange.check`) where a caller other than the CLI can
pass the number. Each maximum is what a large real use needs, with the reason beside it.

Importing this module costs nothing: no NumPy, no pydantic (the CLI imports it for every command).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from aiperf.errors import AiperfError, excerpt

MAX_NUMBER_CHARS = 64  # longer than any number in range: refused before int()/float() reads it


def _shown(value: int | float) -> str:
    return f"{int(value):,}" if isinstance(value, int) or value.is_integer() else f"{value:g}"


@dataclass(frozen=True)
class IntRange:
    """An integer flag's range, both ends included."""

    flag: str
    low: int
    high: int

    @property
    def text(self) -> str:
        return f"from {self.low:,} to {self.high:,}"

    def check(self, value: int, where: str = "") -> int:
        """``value`` if in range, else an :class:`AiperfError` naming the flag (``where`` prefixes the message)."""
        if not self.low <= value <= self.high:
            raise AiperfError(f"{where}{self.flag} must be {self.text}, got {excerpt(value)}")
        return value

    def __call__(self, text: str) -> int:
        """The argparse ``type=``: the flag's text as an int in range."""
        if len(text) > MAX_NUMBER_CHARS:
            raise AiperfError(f"{self.flag} must be {self.text}, got {excerpt(text)}")
        try:
            value = int(text)
        except ValueError:
            raise AiperfError(f"{self.flag} must be an integer {self.text}, got {excerpt(text)}") from None
        return self.check(value)


@dataclass(frozen=True)
class FloatRange:
    """A number flag's range, both ends included; NaN and infinities are never in it."""

    flag: str
    low: float
    high: float

    @property
    def text(self) -> str:
        return f"from {_shown(self.low)} to {_shown(self.high)}"

    def check(self, value: float, where: str = "") -> float:
        if not (math.isfinite(value) and self.low <= value <= self.high):
            raise AiperfError(f"{where}{self.flag} must be a number {self.text}, got {excerpt(value)}")
        return value

    def __call__(self, text: str) -> float:
        if len(text) > MAX_NUMBER_CHARS:
            raise AiperfError(f"{self.flag} must be a number {self.text}, got {excerpt(text)}")
        try:
            value = float(text)
        except ValueError:
            raise AiperfError(f"{self.flag} must be a number {self.text}, got {excerpt(text)}") from None
        return self.check(value)


SEED_MAX = 2**32 - 1  # as aiperf.config.MAX_SEED (NumPy's RandomState takes 32 bits); not imported: pydantic

# --- aiperf scaling ----------------------------------------------------------------------------
# The simulator is sized for the largest study we mean to run: 16,384 nodes x 8 workers = 131,072
# workers (SimulatedWorkerPool allocates per worker and per node; its master proposes queue_depth x
# workers trials before the first one ends). Real clusters are further bounded by their alive nodes.
NODES = IntRange("--nodes", 1, 16_384)
SIMULATED_WORKERS_MAX = 16_384 * 8
# A study is a whole run per size: 1, 2, 4, ... 16,384 is 15 sizes; 32 leaves room for odd sizes.
NODE_SIZES_MAX = 32


def node_counts(text: str) -> list[int]:
    """``--nodes 1,2,4``: at most :data:`NODE_SIZES_MAX` counts, each in :data:`NODES`' range."""
    parts = [p for p in text.split(",", NODE_SIZES_MAX) if p.strip()]
    if not parts:
        raise AiperfError(f"--nodes takes comma-separated node counts {NODES.text}, such as 1,2,4; got {excerpt(text)}")
    if len(parts) > NODE_SIZES_MAX:
        raise AiperfError(f"--nodes takes from 1 to {NODE_SIZES_MAX} node counts, got more: {excerpt(text)}")
    return [NODES(p.strip()) for p in parts]


# --- aiperf run --------------------------------------------------------------------------------
# Every repeat is a whole run (an official one lasts an hour); 100 pins a median and CV to a few percent.
REPEAT = IntRange("--repeat", 1, 100)
# A Unix time: up to the year 5138, past any batch job's end.
MUST_END_BY = FloatRange("--must-end-by", 0.0, 1e11)
# The nodes of a batch job, as cluster.planned_nodes (aiperf.config.MAX_NODES; not imported: pydantic).
PLANNED_NODES = IntRange("--planned-nodes", 1, 16_384)

# --- aiperf audit / aiperf check ---------------------------------------------------------------
# Re-evaluating loads a trial's weights and runs its validation pass: a million covers every
# completed trial of a long run at 131,072 workers; the sample is cut to the run's trials anyway.
AUDIT_SAMPLE = IntRange("--sample", 0, 1_000_000)
# Every re-training is a whole trial on the auditor's machine (minutes to hours): a thousand is days.
AUDIT_RETRAIN = IntRange("--retrain", 0, 1_000)
AUDIT_SEED = IntRange("--seed", 0, SEED_MAX)
# A cluster's epoch against an auditor's CPU core: 10^3..10^4 times faster; past 10^6 the check checks nothing.
SPEED_FACTOR = FloatRange("--speed-factor", 1.0, 1e6)

# --- aiperf flops ------------------------------------------------------------------------------
# The largest published data-parallel ImageNet batches are 64k..128k images; 2^20 is eight times that.
BATCH_SIZE = IntRange("--batch-size", 1, 1 << 20)

# --- aiperf make-imagenet ----------------------------------------------------------------------
# As the config's dataset.classes (ImageNet-21k has 21,841 classes).
CLASSES = IntRange("--classes", 2, 100_000)
# ImageNet-1k has at most 1,300 training and 50 validation images a class.
TRAIN_PER_CLASS = IntRange("--train-per-class", 1, 100_000)
VAL_PER_CLASS = IntRange("--val-per-class", 1, 100_000)
# ImageNet's largest images are a few thousand pixels a side (the "large" quirk is 4,032 x 3,024).
# Painting one holds about four float32 RGB arrays, 48 bytes a pixel: 0.8 GB at 4,096 x 4,096.
MIN_SIDE = IntRange("--min-side", 1, 4_096)
MAX_SIDE = IntRange("--max-side", 1, 4_096)
# A phone camera's JPEG is a few MB; the painter's noise tops out well below 10 MB per image anyway.
MEAN_KB = FloatRange("--mean-kb", 1.0, 10_240.0)
BAD = IntRange("--bad", 0, 100_000)
# TensorFlow's ImageNet tooling writes 1,024 training and 128 validation shards.
TRAIN_SHARDS = IntRange("--train-shards", 1, 16_384)
VAL_SHARDS = IntRange("--val-shards", 1, 16_384)
MAKE_SEED = IntRange("--seed", 0, SEED_MAX)
# All the files of one tree, quirks and --bad included: three ImageNet-1k's (1.33 M images). The
# generator keeps about 0.2 KB of bookkeeping per image, under 1 GB at this count.
MAKE_IMAGES_MAX = 4_000_000
# The tree's pixels as raw RGB (3 bytes a pixel) at the largest side an image can get: 4 M images
# at the default sides come to about 10 TB, and 16 TiB allows 349k images of 4,096 x 4,096.
MAKE_RAW_BYTES_MAX = 16 << 40


def document(parser: argparse.ArgumentParser) -> None:
    """Append each ranged flag's range to its ``--help`` line, in ``parser`` and its sub-commands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                document(sub)
        elif isinstance(action.type, (IntRange, FloatRange)) and action.help != argparse.SUPPRESS:
            action.help = f"{action.help or ''} [{action.type.text}]".lstrip()
        elif action.type is node_counts:
            action.help = f"{action.help or ''} [each {NODES.text}; at most {NODE_SIZES_MAX} counts]".lstrip()
