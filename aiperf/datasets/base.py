"""The dataset record every loader returns and the trainer consumes.

Images stay in their compact stored form (usually ``uint8``) and are mapped to floats by
the model's input layer with ``pixel_scale``/``pixel_offset``: a resident dataset then
costs a quarter of the memory on host and device. Small datasets are held as arrays
(``x_train`` ...); large ones are streamed: an ImageNet folder from ``train_files`` (one
image per file), TFRecord shards from ``train_shards`` (records addressed by a global index).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import numpy as np

# A dataset's file census: {"files": count, "digest": SHA-256 of the names} (every node must see the same).
Census = dict[str, int | str]


class SplitMeta(TypedDict, total=False):
    """How the examples were split into training and validation (``meta["split"]``)."""

    method: str  # stratified | predefined
    seed: int
    disjoint: bool
    validation_fraction: float  # stratified: the share held out
    validation: str  # predefined: what serves as the held-out split
    train_subset: str  # tfrecord with max_train_images: how the subset was drawn
    val_images_also_in_train: int  # byte-identical (or same-file) duplicates across the split


class BadImagesMeta(TypedDict):
    """Images found undecodable while loading (``meta["bad_images"]``)."""

    count: int
    files: list[str]  # the first 100
    max_fraction: float
    missing_count: NotRequired[int]  # of ``count``, files that no longer existed when they were read
    missing: NotRequired[list[str]]  # the first 100 of them


class DatasetMeta(TypedDict, total=False):
    """Facts about the data beyond the :class:`Dataset` fields; they go into the ledger's dataset header."""

    split: SplitMeta
    class_names: list[str]
    storage: str  # memory | stream
    root: str  # streamed: the folder item names are relative to
    census: Census  # streamed: what the head saw, checked on every node
    decoded: str  # streamed: how and where images are decoded
    bad_images: BadImagesMeta
    train_images_available: int  # before max_train_images truncated the training split
    label_offset: int  # tfrecord: subtracted from the stored labels
    shards: dict[str, int]  # tfrecord: shards per split
    labels: str  # synthetic: how labels were drawn
    note: str  # synthetic: why its accuracy means nothing


@dataclass
class RecordShards:
    """One split stored as TFRecord shards: record ``i`` is the ``i``-th record of the shards in order.

    ``keep`` (sorted global record indices) selects a subset, e.g. after ``max_train_images``;
    labels live inside the records and are decoded with ``label - label_offset``.
    """

    paths: list[str]
    counts: list[int]
    keep: np.ndarray | None = None
    label_offset: int = 1

    @property
    def total(self) -> int:
        """Records in the shards (selected or not)."""
        return int(sum(self.counts))

    @property
    def size(self) -> int:
        """Records in the split."""
        return self.total if self.keep is None else len(self.keep)

    def indices(self) -> np.ndarray:
        """Global indices of the split's records, ascending."""
        return np.arange(self.total, dtype=np.int64) if self.keep is None else np.asarray(self.keep, np.int64)

    def starts(self) -> np.ndarray:
        """Global index of each shard's first record."""
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    def name_of(self, index: int) -> str:
        """``train-00003-of-01024 record 17``: where a record lives, for messages and the ledger."""
        shard = int(np.searchsorted(np.cumsum(self.counts), index, side="right"))
        return f"{os.path.basename(self.paths[shard])} record {index - int(self.starts()[shard])}"


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
    # Streaming datasets: lists of (file path, label), or TFRecord shards; decoded on the workers.
    train_files: list[tuple[str, int]] | None = None
    val_files: list[tuple[str, int]] | None = None
    train_shards: RecordShards | None = None
    val_shards: RecordShards | None = None
    meta: DatasetMeta = field(default_factory=DatasetMeta)

    @property
    def streaming(self) -> bool:
        return self.x_train is None

    def resident(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(x_train, y_train, x_val, y_val)`` of a dataset held in memory; a streamed one has none."""
        if self.x_train is None or self.y_train is None or self.x_val is None or self.y_val is None:
            raise ValueError(f"{self.name}: a streamed dataset has no arrays in memory")
        return self.x_train, self.y_train, self.x_val, self.y_val

    @property
    def train_size(self) -> int:
        if self.y_train is not None:
            return len(self.y_train)
        return self.train_shards.size if self.train_shards is not None else len(self.train_files or ())

    @property
    def val_size(self) -> int:
        if self.y_val is not None:
            return len(self.y_val)
        return self.val_shards.size if self.val_shards is not None else len(self.val_files or ())

    def item_name(self, split: str, index: int) -> str:
        """A streamed image's name as messages and the ledger show it (relative to the dataset's folder)."""
        shards = self.train_shards if split == "train" else self.val_shards
        if shards is not None:
            return shards.name_of(index)
        files = self.train_files if split == "train" else self.val_files
        path = (files or [])[index][0]
        root = self.meta.get("root")
        return os.path.relpath(path, root) if root and path.startswith(str(root) + os.sep) else path

    def missing_items(self, split: str, indices: np.ndarray) -> np.ndarray:
        """Those of a split's ``indices`` whose file (or TFRecord shard) no longer exists.

        A skipped image is either missing (deleted after the dataset was indexed) or present but
        undecodable; the file system tells them apart once the image has been skipped.
        """
        indices = np.asarray(indices, dtype=np.int64)
        shards = self.train_shards if split == "train" else self.val_shards
        if shards is not None:
            shard = np.searchsorted(np.cumsum(shards.counts), indices, side="right")
            gone = np.array([not os.path.exists(path) for path in shards.paths], dtype=bool)
            return indices[gone[shard]] if len(indices) else indices
        files = self.train_files if split == "train" else self.val_files
        return np.array([i for i in indices if not os.path.exists((files or [])[int(i)][0])], dtype=np.int64)

    def fingerprint(self) -> str:
        """SHA-256 over the split's contents (or file lists): identifies the exact data used."""
        h = hashlib.sha256()
        h.update(f"{self.pixel_scale!r};{self.pixel_offset!r};".encode())
        if not self.streaming:
            for arr in self.resident():
                h.update(f"{arr.dtype}{arr.shape};".encode())
                h.update(np.ascontiguousarray(arr).tobytes())
        elif self.train_shards is not None:
            for shards in (self.train_shards, self.val_shards):
                assert shards is not None
                h.update(f"{shards.paths}{shards.counts}{shards.label_offset};".encode())
                h.update(shards.indices().tobytes())
        else:
            for path, label in (self.train_files or []) + [("|", -1)] + (self.val_files or []):
                h.update(f"{path}\t{label}\n".encode())
        return h.hexdigest()

    def overlap(self) -> int:
        """How many validation examples also occur (byte-identical) in the training split."""
        if self.train_shards is not None and self.val_shards is not None:
            shared = set(self.train_shards.paths) & set(self.val_shards.paths)
            counts = dict(zip(self.val_shards.paths, self.val_shards.counts, strict=True))
            return sum(counts[p] for p in shared)
        if self.streaming:
            train = {p for p, _ in self.train_files or []}
            return sum(1 for p, _ in self.val_files or [] if p in train)
        x_train, _, x_val, _ = self.resident()
        seen = {hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in x_train}
        return sum(1 for row in x_val if hashlib.blake2b(row.tobytes(), digest_size=16).digest() in seen)

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
