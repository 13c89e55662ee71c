"""A folder of images, one sub-folder per class: ``path/<class>/*.png`` (or ``.jpg`` ...).

With ``path/train/<class>/`` and ``path/val/<class>/`` the folders define the split (as in
an ImageNet tree); otherwise a seeded stratified split is drawn. Class ids follow the sorted
class folder names. A folder that decodes to at most ``IN_MEMORY_LIMIT_BYTES`` is decoded
once into memory (grayscale if every image is, RGB otherwise); a larger one becomes a
streaming dataset of (file, label) lists that the trainer decodes with
:func:`aiperf.datasets.images.decode_image` at ``image_size`` in RGB.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from aiperf.config import DatasetConfig
from aiperf.datasets.assemble import (
    SplitPlan,
    in_memory_dataset,
    plan_pool_split,
    plan_predefined_split,
    streaming_dataset,
)
from aiperf.datasets.base import Dataset
from aiperf.datasets.images import GRAYSCALE_MODES, decode_image, is_image_file, probe_image
from aiperf.errors import AiperfError

IN_MEMORY_LIMIT_BYTES = 2 * 1024**3
SPLIT_FOLDERS = ("train", "val")

Files = list[tuple[str, int]]


def _visible_entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as entries:
            return sorted((e for e in entries if not e.name.startswith(".")), key=lambda e: e.name)
    except OSError as exc:
        raise AiperfError(f"image_folder: {folder}: cannot list folder ({exc.strerror or exc})") from None


def _is(entry: os.DirEntry, kind: str) -> bool:
    """``entry.is_dir()``/``is_file()``, with a symlink loop or an unreadable link as one line naming it."""
    try:
        return entry.is_dir() if kind == "dir" else entry.is_file()
    except OSError as exc:
        raise AiperfError(
            f"image_folder: {entry.path}: cannot follow ({exc.strerror or exc}); remove or fix that link"
        ) from None


def _class_folders(root: Path) -> dict[str, list[str]]:
    """Class name -> sorted image paths, for every class sub-folder of ``root``."""
    classes = {}
    for entry in _visible_entries(root):
        if not _is(entry, "dir"):
            continue
        images = [e.path for e in _visible_entries(Path(entry.path)) if _is(e, "file") and is_image_file(e.name)]
        if not images:
            raise AiperfError(f"image_folder: {entry.path}: class folder has no image files (.png, .jpg, ...)")
        classes[entry.name] = images
    if not classes:
        raise AiperfError(f"image_folder: {root}: no class folders; expected {root}/<class_name>/<image files>")
    return classes


def _labelled(classes: dict[str, list[str]], class_ids: dict[str, int]) -> Files:
    return [(path, class_ids[name]) for name, paths in classes.items() for path in paths]


def scan_folder(root: Path) -> tuple[list[str], Files, Files | None]:
    """(class names, training files, validation files or None when the split is to be drawn)."""
    if not root.is_dir():
        raise AiperfError(f"image_folder: folder {root} not found — set dataset.path to a folder of class folders")
    predefined = all((root / name).is_dir() for name in SPLIT_FOLDERS)
    train_classes = _class_folders(root / "train" if predefined else root)
    names = sorted(train_classes)
    if len(names) < 2:
        raise AiperfError(f"image_folder: {root}: only one class folder ({names[0]}); classification needs at least 2")
    class_ids = {name: i for i, name in enumerate(names)}
    if not predefined:
        return names, _labelled(train_classes, class_ids), None
    val_classes = _class_folders(root / "val")
    for name in val_classes:
        if name not in class_ids:
            raise AiperfError(f"image_folder: {root / 'val' / name}: class not present in {root / 'train'}")
    return names, _labelled(train_classes, class_ids), _labelled(val_classes, class_ids)


def _plan(root: Path, train: Files, val: Files | None, cfg: DatasetConfig) -> SplitPlan:
    train_labels = np.array([label for _, label in train], dtype=np.int32)
    if val is None:
        return plan_pool_split("image_folder", train_labels, cfg)
    val_labels = np.array([label for _, label in val], dtype=np.int32)
    return plan_predefined_split("image_folder", train_labels, val_labels, cfg, f"{root / 'val'} folder")


def _common_size(files: Files, probes: list[tuple[str, tuple[int, int]]]) -> tuple[int, int]:
    first_size = probes[0][1]
    for (path, _), (_, size) in zip(files, probes, strict=True):
        if size != first_size:
            raise AiperfError(
                f"image_folder: images differ in size ({files[0][0]} is {first_size[0]}x{first_size[1]}, "
                f"{path} is {size[0]}x{size[1]}); set dataset.image_size to resize them"
            )
    return first_size


def _decode_all(files: Files, size: tuple[int, int] | None, channels: int, shape: tuple[int, int]) -> np.ndarray:
    images = np.empty((len(files), shape[0], shape[1], channels), dtype=np.uint8)

    def decode_into(i: int) -> None:
        images[i] = decode_image(files[i][0], size, channels)

    # Pillow releases the GIL while decoding, so threads use all cores.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(decode_into, range(len(files))))
    return images


def _in_memory(root: Path, names: list[str], train: Files, val: Files | None, cfg: DatasetConfig) -> Dataset:
    every_file = train + (val or [])
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        probes = list(pool.map(probe_image, [path for path, _ in every_file]))
    shape = cfg.image_size or _common_size(every_file, probes)
    channels = 1 if all(mode in GRAYSCALE_MODES for mode, _ in probes) else 3
    x_train = _decode_all(train, cfg.image_size, channels, shape)
    y_train = np.array([label for _, label in train], dtype=np.int32)
    if val is None:
        x_val, y_val = x_train, y_train
    else:
        x_val = _decode_all(val, cfg.image_size, channels, shape)
        y_val = np.array([label for _, label in val], dtype=np.int32)
    return in_memory_dataset(
        "image_folder",
        str(root),
        len(names),
        (x_train, y_train),
        (x_val, y_val),
        _plan(root, train, val, cfg),
        meta={"class_names": names},
    )


def _streaming(root: Path, names: list[str], train: Files, val: Files | None, cfg: DatasetConfig) -> Dataset:
    if cfg.image_size is None:
        raise AiperfError(
            f"image_folder: {root} is too large to hold in memory; set dataset.image_size so it can be streamed"
        )
    plan = _plan(root, train, val, cfg)
    if val is None:
        val = train
    shape = (cfg.image_size[0], cfg.image_size[1], 3)
    meta = {"class_names": names, "decoded": "per batch by the trainer, as RGB at image_size"}
    return streaming_dataset("image_folder", str(root), len(names), shape, train, val, plan, meta=meta)


def load_image_folder(cfg: DatasetConfig, memory_limit_bytes: int = IN_MEMORY_LIMIT_BYTES) -> Dataset:
    """Load (or index, when larger than ``memory_limit_bytes`` decoded) a folder of class folders."""
    if cfg.path is None:
        raise AiperfError("image_folder: set dataset.path to a folder with one sub-folder of images per class")
    if cfg.image_size is not None and min(cfg.image_size) < 1:
        raise AiperfError(f"dataset.image_size: height and width must be >= 1 (got {list(cfg.image_size)})")
    # Absolute paths: streamed file lists are read by workers whose working folder may differ.
    try:
        root = Path(cfg.path).expanduser().resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: Python 3.11's "Symlink loop from ..."
        raise AiperfError(f"image_folder: {cfg.path}: cannot resolve the path ({exc}); fix the link") from None
    names, train, val = scan_folder(root)
    height, width = cfg.image_size or probe_image(train[0][0])[1]
    decoded_bytes = (len(train) + len(val or [])) * height * width * 3
    if decoded_bytes > memory_limit_bytes:
        return _streaming(root, names, train, val, cfg)
    return _in_memory(root, names, train, val, cfg)
