"""The dataset record every loader returns and the trainer consumes.

Images stay in their compact stored form (usually ``uint8``) and are mapped to floats by
the model's input layer with ``pixel_scale``/``pixel_offset``: a resident dataset then
costs a quarter of the memory on host and device. Small datasets are held as arrays
(``x_train`` ...); large ones (an ImageNet folder) are streamed from ``train_files``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Dataset:
    """A labelled image classification dataset, split into train and held-out validation."""

    name: str
    num_classes: int
    input_shape: tuple[int, int, int]
    x_train: np.ndarray | None = None  # (N, H, W, C)
    y_train: np.ndarray | None = None  # (N,) int32 in [0, num_classes)
    x_val: np.ndarray | None = None
    y_val: np.ndarray | None = None
    pixel_scale: float = 1.0 / 255.0
    pixel_offset: float = 0.0
    source: str = ""  # where the data came from (package, file or folder)
    # Streaming datasets: lists of (file path, label); decoded and resized on the fly.
    train_files: list[tuple[str, int]] | None = None
    val_files: list[tuple[str, int]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def streaming(self) -> bool:
        return self.x_train is None

    @property
    def train_size(self) -> int:
        return len(self.y_train) if self.y_train is not None else len(self.train_files or ())

    @property
    def val_size(self) -> int:
        return len(self.y_val) if self.y_val is not None else len(self.val_files or ())

    def fingerprint(self) -> str:
        """SHA-256 over the split's contents (or file lists): identifies the exact data used."""
        h = hashlib.sha256()
        h.update(f"{self.pixel_scale!r};{self.pixel_offset!r};".encode())
        if not self.streaming:
            for arr in (self.x_train, self.y_train, self.x_val, self.y_val):
                h.update(f"{arr.dtype}{arr.shape};".encode())
                h.update(np.ascontiguousarray(arr).tobytes())
        else:
            for path, label in (self.train_files or []) + [("|", -1)] + (self.val_files or []):
                h.update(f"{path}\t{label}\n".encode())
        return h.hexdigest()

    def overlap(self) -> int:
        """How many validation examples also occur (byte-identical) in the training split."""
        if self.streaming:
            train = {p for p, _ in self.train_files or []}
            return sum(1 for p, _ in self.val_files or [] if p in train)
        train = {hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in self.x_train}
        return sum(1 for row in self.x_val if hashlib.blake2b(row.tobytes(), digest_size=16).digest() in train)

    def describe(self) -> dict[str, Any]:
        """The facts about the data that go into the ledger's run header."""
        return {
            "name": self.name,
            "source": self.source,
            "num_classes": self.num_classes,
            "input_shape": list(self.input_shape),
            "train_images": self.train_size,
            "eval_images": self.val_size,
            "streaming": self.streaming,
            **self.meta,
        }
