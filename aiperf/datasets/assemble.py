"""Turn loaded examples into a :class:`Dataset`: validate labels, split, truncate, record how.

Every loader ends here so that all datasets obey the same rules: labels are int32 in
``[0, num_classes)``, the split is seeded (stratified unless the source defines one), the
training split is truncated only after the seeded shuffle, and ``meta["split"]`` states the
method, the seed and the checked disjointness.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from aiperf.config import DatasetConfig
from aiperf.datasets.base import Dataset, DatasetMeta, SplitMeta
from aiperf.datasets.split import check_disjoint, stratified_prefix, stratified_split
from aiperf.errors import AiperfError


@dataclass
class SplitPlan:
    """Which examples go where: ``train`` indexes the training pool, ``val`` the validation pool."""

    train: np.ndarray
    val: np.ndarray
    meta: DatasetMeta = field(default_factory=DatasetMeta)


def checked_labels(name: str, labels: ArrayLike, num_classes: int, count: int, what: str = "images") -> np.ndarray:
    """Labels as int32 after checking there is one per example and each is a class id."""
    y = np.asarray(labels)
    if y.ndim != 1:
        raise AiperfError(f"{name}: labels must be a flat list (got shape {y.shape})")
    if len(y) != count:
        raise AiperfError(f"{name}: {count} {what} but {len(y)} labels; the files do not belong together")
    if len(y) and not np.issubdtype(y.dtype, np.integer):
        raise AiperfError(f"{name}: labels must be integers (got {y.dtype})")
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        bad = int(y[(y < 0) | (y >= num_classes)][0])
        raise AiperfError(f"{name}: label {bad} is out of range for {num_classes} classes (0..{num_classes - 1})")
    return y.astype(np.int32)


def _require_classes(name: str, labels: np.ndarray) -> None:
    if len(labels) == 0:
        raise AiperfError(f"{name}: no images found")
    present = np.unique(labels)
    if len(present) < 2:
        raise AiperfError(
            f"{name}: all {len(labels)} training images have label {int(present[0])}; "
            "classification needs at least 2 classes"
        )


def _truncate(train: np.ndarray, labels: np.ndarray, cfg: DatasetConfig, meta: DatasetMeta) -> np.ndarray:
    if cfg.max_train_images is None or cfg.max_train_images >= len(train):
        return train
    meta["train_images_available"] = len(train)
    return train[stratified_prefix(labels[train], cfg.max_train_images)]


def plan_pool_split(name: str, labels: np.ndarray, cfg: DatasetConfig) -> SplitPlan:
    """Seeded stratified split of one pool of examples into train and validation."""
    _require_classes(name, labels)
    rng = np.random.default_rng(cfg.split_seed)
    train, val = stratified_split(labels, cfg.validation_fraction, rng)
    if len(val) == 0:
        raise AiperfError(f"{name}: too few images per class to hold out a validation split")
    meta: DatasetMeta = {}
    train = _truncate(train, labels, cfg, meta)
    check_disjoint(train, val)
    split: SplitMeta = {
        "method": "stratified",
        "seed": cfg.split_seed,
        "disjoint": True,
        "validation_fraction": cfg.validation_fraction,
    }
    return SplitPlan(train, val, {"split": split, **meta})


def plan_predefined_split(
    name: str, train_labels: np.ndarray, val_labels: np.ndarray, cfg: DatasetConfig, validation: str
) -> SplitPlan:
    """Keep the source's own split; shuffle the training order with the seed before truncating.

    The two pools are different files or folders, so no example can be drawn into both;
    ``validation`` says which part of the source serves as the held-out split.
    """
    _require_classes(name, train_labels)
    if len(val_labels) == 0:
        raise AiperfError(f"{name}: the validation split is empty")
    rng = np.random.default_rng(cfg.split_seed)
    meta: DatasetMeta = {}
    train = _truncate(rng.permutation(len(train_labels)), train_labels, cfg, meta)
    split: SplitMeta = {"method": "predefined", "seed": cfg.split_seed, "disjoint": True, "validation": validation}
    return SplitPlan(train, np.arange(len(val_labels)), {"split": split, **meta})


def in_memory_dataset(
    name: str,
    source: str,
    num_classes: int,
    train: tuple[np.ndarray, np.ndarray],
    val: tuple[np.ndarray, np.ndarray],
    plan: SplitPlan,
    *,
    pixel_scale: float = 1.0 / 255.0,
    meta: DatasetMeta | None = None,
) -> Dataset:
    """Select the planned examples from (images, labels) pools into a resident :class:`Dataset`.

    For a pool split pass the same pool as ``train`` and ``val``. The count of validation
    images that also occur byte-for-byte in training is recorded, since duplicates inflate
    measured accuracy even when the index sets are disjoint.
    """
    x_train, y_train = train[0][plan.train], train[1][plan.train]
    x_val, y_val = val[0][plan.val], val[1][plan.val]
    height, width, channels = (int(d) for d in x_train.shape[1:])  # (N, H, W, C) images
    dataset = Dataset(
        name=name,
        num_classes=num_classes,
        input_shape=(height, width, channels),
        x_train=np.ascontiguousarray(x_train, dtype=np.uint8),
        y_train=y_train.astype(np.int32),
        x_val=np.ascontiguousarray(x_val, dtype=np.uint8),
        y_val=y_val.astype(np.int32),
        pixel_scale=pixel_scale,
        source=source,
        meta={**(meta or {}), **plan.meta},
    )
    dataset.meta["split"] = {**plan.meta["split"], "val_images_also_in_train": dataset.overlap()}
    return dataset


def streaming_dataset(
    name: str,
    source: str,
    num_classes: int,
    input_shape: tuple[int, int, int],
    train_files: list[tuple[str, int]],
    val_files: list[tuple[str, int]],
    plan: SplitPlan,
    *,
    meta: DatasetMeta | None = None,
) -> Dataset:
    """Select the planned files into a streamed :class:`Dataset` (decoded by the trainer)."""
    dataset = Dataset(
        name=name,
        num_classes=num_classes,
        input_shape=input_shape,
        source=source,
        train_files=[train_files[i] for i in plan.train],
        val_files=[val_files[i] for i in plan.val],
        meta={**(meta or {}), **plan.meta},
    )
    if dataset.overlap():
        raise AssertionError("internal error: a file is in both the training and the validation split")
    return dataset
