"""A folder of images, one sub-folder per class: ``path/<class>/*.png`` (or ``.jpg`` ...).

With ``path/train/<class>/`` and ``path/val/<class>/`` the folders define the split (as in
an ImageNet tree); otherwise a seeded stratified split is drawn. Class ids follow the sorted
class folder names. ``dataset.storage`` decides how the images reach the trainer: ``memory``
decodes them once (grayscale if every image is, RGB otherwise, stretched to ``image_size``),
``stream`` hands the workers (file, label) lists that they decode per batch with the
standard augmentation (:mod:`aiperf.families.image.stream_input`), and ``auto`` streams a folder
whose decoded images would exceed ``IN_MEMORY_LIMIT_BYTES``. Files that cannot be decoded,
or are gone by the time they are read, are skipped and counted (:mod:`aiperf.datasets.bad_images`);
in memory this happens here, streamed it happens on the workers.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar, TypeVarTuple

import numpy as np
import psutil

from aiperf.config import DatasetConfig
from aiperf.datasets.assemble import (
    SplitPlan,
    in_memory_dataset,
    plan_pool_split,
    plan_predefined_split,
    streaming_dataset,
)
from aiperf.datasets.bad_images import over_limit, too_many_bad_images
from aiperf.datasets.base import BadImagesMeta, Census, Dataset, DatasetMeta
from aiperf.datasets.images import GRAYSCALE_MODES, decode_image, is_image_file, probe_image
from aiperf.errors import AiperfError

IN_MEMORY_LIMIT_BYTES = 2 * 1024**3
MEMORY_SHARE = 0.8  # storage=memory may use at most this share of the head's available memory
SPLIT_FOLDERS = ("train", "val")

Files = list[tuple[str, int]]
T = TypeVar("T")
Args = TypeVarTuple("Args")


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


def _attempt(fn: Callable[[*Args], T], *args: *Args) -> T | AiperfError:
    """``fn(*args)``, or the :class:`AiperfError` it raised (a file that cannot be decoded)."""
    try:
        return fn(*args)
    except AiperfError as exc:
        return exc


def _decode_all(files: Files, size: tuple[int, int] | None, channels: int, shape: tuple[int, int]) -> tuple:
    """Decoded images of ``files`` and the positions of those that could not be decoded."""
    images = np.empty((len(files), shape[0], shape[1], channels), dtype=np.uint8)

    def decode_into(i: int) -> bool:
        pixels = _attempt(decode_image, files[i][0], size, channels)
        if isinstance(pixels, AiperfError):
            return False
        images[i] = pixels
        return True

    # Pillow releases the GIL while decoding, so threads use all cores.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        ok = np.fromiter(pool.map(decode_into, range(len(files))), dtype=bool, count=len(files))
    return images, np.flatnonzero(~ok)


def _relative(root: Path, path: str) -> str:
    return os.path.relpath(path, root)


def _check_bad(root: Path, bad: list[str], total: int, cfg: DatasetConfig) -> BadImagesMeta:
    """The ``bad_images`` entry of the dataset's meta; an error when they are too many.

    A file listed when the folder was scanned but gone when it was read is named as missing.
    """
    missing = [name for name in bad if not (root / name).exists()]
    if over_limit(len(bad), total, cfg.max_bad_fraction):
        message = too_many_bad_images(bad, total, cfg.max_bad_fraction, missing=missing)
        raise AiperfError(f"image_folder: {root}: {message}")
    meta: BadImagesMeta = {"count": len(bad), "files": bad[:100], "max_fraction": cfg.max_bad_fraction}
    if missing:
        meta["missing_count"] = len(missing)
        meta["missing"] = missing[:100]
    return meta


def _in_memory(root: Path, names: list[str], train: Files, val: Files | None, cfg: DatasetConfig) -> Dataset:
    every_file = train + (val or [])
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        probes = list(pool.map(lambda path: _attempt(probe_image, path), [path for path, _ in every_file]))
    bad = [
        _relative(root, path)
        for (path, _), probe in zip(every_file, probes, strict=True)
        if isinstance(probe, AiperfError)
    ]
    good = [(f, probe) for f, probe in zip(every_file, probes, strict=True) if not isinstance(probe, AiperfError)]
    _check_bad(root, bad, len(every_file), cfg)
    if not good:
        raise AiperfError(f"image_folder: {root}: no image could be decoded")
    shape = cfg.image_size or _common_size([f for f, _ in good], [probe for _, probe in good])
    channels = 1 if all(mode in GRAYSCALE_MODES for _, (mode, _) in good) else 3
    decodable = {f[0] for f, _ in good}
    train = [f for f in train if f[0] in decodable]
    val = None if val is None else [f for f in val if f[0] in decodable]

    def decoded(files: Files) -> tuple[Files, np.ndarray, np.ndarray]:
        images, failed = _decode_all(files, cfg.image_size, channels, shape)
        bad.extend(_relative(root, files[i][0]) for i in failed)
        keep = np.setdiff1d(np.arange(len(files)), failed)
        kept = [files[i] for i in keep]
        return kept, images[keep], np.array([label for _, label in kept], dtype=np.int32)

    train, x_train, y_train = decoded(train)
    if val is None:
        x_val, y_val = x_train, y_train
    else:
        val, x_val, y_val = decoded(val)
    meta: DatasetMeta = {
        "class_names": names,
        "storage": "memory",
        "bad_images": _check_bad(root, bad, len(every_file), cfg),
    }
    return in_memory_dataset(
        "image_folder",
        str(root),
        len(names),
        (x_train, y_train),
        (x_val, y_val),
        _plan(root, train, val, cfg),
        meta=meta,
    )


def folder_census(train: Files, val: Files | None, root: Path) -> Census:
    """How many image files the folder holds and a digest of their names: what every node must see too."""
    h = hashlib.sha256()
    paths = sorted(_relative(root, path) for path, _ in train + (val or []))
    for path in paths:
        h.update(path.encode() + b"\n")
    return {"files": len(paths), "digest": h.hexdigest()}


def census_of(path: str) -> Census:
    """:func:`folder_census` of the folder at ``path`` as this machine sees it (run on every node)."""
    root = Path(path)
    _, train, val = scan_folder(root)
    return folder_census(train, val, root)


def _streaming(root: Path, names: list[str], train: Files, val: Files | None, cfg: DatasetConfig) -> Dataset:
    plan = _plan(root, train, val, cfg)
    census = folder_census(train, val, root)
    if val is None:
        val = train
    assert cfg.image_size is not None
    shape = (cfg.image_size[0], cfg.image_size[1], 3)
    meta: DatasetMeta = {
        "class_names": names,
        "storage": "stream",
        "root": str(root),
        "census": census,
        "decoded": "per batch on the workers, as RGB at image_size (random-resized crop + flip; centre crop)",
    }
    return streaming_dataset("image_folder", str(root), len(names), shape, train, val, plan, meta=meta)


def _first_size(root: Path, train: Files) -> tuple[int, int]:
    """The stored size of the first training image that can be read (for the memory estimate)."""
    for path, _ in train[:64]:
        probe = _attempt(probe_image, path)
        if not isinstance(probe, AiperfError):
            return probe[1]
    raise AiperfError(f"image_folder: {root}: none of the first training images can be decoded")


def choose_storage(
    source: str, cfg: DatasetConfig, images: int, memory_limit_bytes: int, size: tuple[int, int] | None = None
) -> str:
    """``memory`` or ``stream`` for ``images`` images decoded at ``cfg.image_size`` (else ``size``), RGB."""
    height, width = cfg.image_size or size or (0, 0)
    decoded = images * height * width * 3
    storage = cfg.storage
    if storage == "auto":
        storage = "stream" if decoded > memory_limit_bytes else "memory"
        if storage == "stream" and cfg.image_size is None:
            raise AiperfError(f"{source} is too large to hold in memory; set dataset.image_size so it can be streamed")
    if storage == "stream" and cfg.image_size is None:
        raise AiperfError(f"{source}: dataset.storage=stream decodes at a fixed size; set dataset.image_size")
    if storage == "memory" and cfg.storage == "memory":
        available = psutil.virtual_memory().available
        if decoded > MEMORY_SHARE * available:
            raise AiperfError(
                f"{source}: dataset.storage=memory needs {decoded / 1024**3:.1f} GiB for {images:,} decoded images, "
                f"this machine has {available / 1024**3:.1f} GiB available; use dataset.storage=stream"
            )
    return storage


def load_image_folder(cfg: DatasetConfig, memory_limit_bytes: int = IN_MEMORY_LIMIT_BYTES) -> Dataset:
    """Load (decode into memory, or index for streaming) a folder of class folders; see ``dataset.storage``."""
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
    count = len(train) + len(val or [])
    size = None if cfg.image_size is not None or cfg.storage == "stream" else _first_size(root, train)
    storage = choose_storage(f"image_folder: {root}", cfg, count, memory_limit_bytes, size)
    if storage == "stream":
        return _streaming(root, names, train, val, cfg)
    return _in_memory(root, names, train, val, cfg)
