"""Random uint8 images with random labels, for throughput runs on any input shape.

Nothing can be learned from them: accuracy stays at chance and says nothing about the
model, which ``meta`` states so that reports do not present it as a result. Generation is
seeded by ``split_seed`` so two runs see identical bytes.
"""

from __future__ import annotations

import numpy as np

from aiperf.config import DatasetConfig
from aiperf.datasets.assemble import in_memory_dataset, plan_predefined_split
from aiperf.datasets.base import Dataset
from aiperf.errors import AiperfError

MEMORY_LIMIT_BYTES = 4 * 1024**3
NOTE = "random images with random labels: accuracy is meaningless (chance level); for throughput runs only"


def load_synthetic(cfg: DatasetConfig) -> Dataset:
    spec = cfg.synthetic
    if any(d < 1 for d in spec.shape):
        raise AiperfError(
            f"synthetic: dataset.synthetic.shape must be positive (height, width, channels), got {spec.shape}"
        )
    total = spec.train_size + spec.val_size
    nbytes = total * int(np.prod(spec.shape))
    if nbytes > MEMORY_LIMIT_BYTES:
        raise AiperfError(
            f"synthetic: {total} images of shape {tuple(spec.shape)} need {nbytes / 1024**3:.1f} GiB "
            f"(limit {MEMORY_LIMIT_BYTES // 1024**3} GiB); lower dataset.synthetic.train_size/val_size"
        )
    rng = np.random.default_rng(cfg.split_seed)
    images = rng.integers(0, 256, size=(total, *spec.shape), dtype=np.uint8)
    labels = rng.integers(0, spec.classes, size=total, dtype=np.int32)
    train, val = slice(0, spec.train_size), slice(spec.train_size, total)
    plan = plan_predefined_split("synthetic", labels[train], labels[val], cfg, "independently drawn random images")
    return in_memory_dataset(
        "synthetic",
        f"numpy random images, seed {cfg.split_seed}",
        spec.classes,
        (images[train], labels[train]),
        (images[val], labels[val]),
        plan,
        meta={"labels": "random", "note": NOTE},
    )
