"""Fashion-MNIST from local IDX files, as installed by Debian's ``dataset-fashion-mnist``.

That package puts ``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`` in
``/usr/share/datasets/fashion-mnist``; uncompressed copies with the same names minus
``.gz`` are accepted too. The official 10,000-image test set serves as the validation split
(``validation_fraction`` does not apply), so results compare with published numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aiperf.config import DatasetConfig
from aiperf.datasets.assemble import checked_labels, in_memory_dataset, plan_predefined_split
from aiperf.datasets.base import Dataset
from aiperf.datasets.idx import read_idx
from aiperf.errors import AiperfError

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
CLASS_NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def _locate(folder: Path, stem: str) -> Path:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise AiperfError(
        f"fashion_mnist: {folder / stem}.gz not found — install Debian's dataset-fashion-mnist package "
        "or set dataset.path to a folder with the Fashion-MNIST IDX files"
    )


def _read_part(folder: Path, part: str) -> tuple[np.ndarray, np.ndarray]:
    image_file = _locate(folder, f"{part}-images-idx3-ubyte")
    label_file = _locate(folder, f"{part}-labels-idx1-ubyte")
    images = read_idx(image_file, "fashion_mnist")
    labels = read_idx(label_file, "fashion_mnist")
    if images.ndim != 3 or images.dtype != np.uint8:
        raise AiperfError(f"fashion_mnist: {image_file}: expected uint8 images (N, rows, cols), got {images.shape}")
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise AiperfError(f"fashion_mnist: {label_file}: expected uint8 labels (N,), got {labels.shape}")
    if len(images) != len(labels):
        raise AiperfError(
            f"fashion_mnist: {image_file} has {len(images)} images but {label_file} has {len(labels)} labels"
        )
    return images[..., None], checked_labels(f"fashion_mnist: {label_file}", labels, 10, len(images))


def load_fashion_mnist(cfg: DatasetConfig) -> Dataset:
    folder = Path(cfg.path or DEFAULT_DIR).expanduser()
    if not folder.is_dir():
        raise AiperfError(
            f"fashion_mnist: folder {folder} not found — install Debian's dataset-fashion-mnist package "
            "or set dataset.path to a folder with the Fashion-MNIST IDX files"
        )
    x_train, y_train = _read_part(folder, "train")
    x_val, y_val = _read_part(folder, "t10k")
    if x_train.shape[1:] != x_val.shape[1:]:
        raise AiperfError(
            f"fashion_mnist: train images are {x_train.shape[1:3]} but t10k images are {x_val.shape[1:3]}"
        )
    plan = plan_predefined_split("fashion_mnist", y_train, y_val, cfg, "official test split (t10k)")
    return in_memory_dataset(
        "fashion_mnist",
        str(folder.resolve()),
        10,
        (x_train, y_train),
        (x_val, y_val),
        plan,
        meta={"class_names": CLASS_NAMES},
    )
