"""ImageNet as TensorFlow's tooling writes it: TFRecord shards of ``tf.train.Example`` records.

``dataset.path`` is a folder holding ``train-00000-of-01024`` ... and ``validation-00000-of-00128``
... (tensorflow/models ``build_imagenet_data.py`` and its successors). Each record carries
``image/encoded`` (the image file's bytes) and ``image/class/label``, 1-based in that tooling
(0 is "background"): the class id is ``label - dataset.label_offset``. The validation shards
are the held-out split.

Loading decodes no image: record counts come from the shards' framing (seeks only), the
number of classes from the validation labels (max + 1). Streamed -- the usual case -- the
workers read the shards (:mod:`aiperf.families.image.stream_input`); ``dataset.storage=memory``
decodes every record here, once, with Pillow (skipping and counting what cannot be decoded).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np

from aiperf.config import DatasetConfig
from aiperf.datasets.assemble import in_memory_dataset, plan_predefined_split
from aiperf.datasets.bad_images import over_limit, too_many_bad_images
from aiperf.datasets.base import Census, Dataset, DatasetMeta, RecordShards
from aiperf.datasets.example_proto import FeatureValue, parse_features, record_spans
from aiperf.datasets.image_folder import IN_MEMORY_LIMIT_BYTES, choose_storage
from aiperf.datasets.images import decode_image_bytes
from aiperf.errors import AiperfError

SPLITS = ("train", "validation")
SHARD_NAME = re.compile(r"^(train|validation)-(\d+)-of-(\d+)$")
ENCODED = "image/encoded"
LABEL = "image/class/label"
SYNSET = "image/class/synset"

Spans = list[tuple[int, int]]
T = TypeVar("T")
R = TypeVar("R")


def find_shards(root: Path) -> dict[str, list[Path]]:
    """``{"train": [...], "validation": [...]}``: every shard of each split, in order, all present."""
    if not root.is_dir():
        raise AiperfError(f"tfrecord: folder {root} not found — set dataset.path to the folder of TFRecord shards")
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        raise AiperfError(f"tfrecord: {root}: cannot list folder ({exc.strerror or exc})") from None
    found: dict[str, dict[int, dict[int, Path]]] = {split: {} for split in SPLITS}
    for name in names:
        match = SHARD_NAME.match(name)
        if match:
            split, k, total = match.group(1), int(match.group(2)), int(match.group(3))
            found[split].setdefault(total, {})[k] = root / name
    out = {}
    for split in SPLITS:
        groups = found[split]
        if not groups:
            raise AiperfError(
                f"tfrecord: {root}: no {split} shards; expected {split}-00000-of-NNNNN ... as TensorFlow's "
                "ImageNet tooling writes them"
            )
        if len(groups) > 1:
            totals = ", ".join(f"-of-{t:05d}" for t in sorted(groups))
            raise AiperfError(f"tfrecord: {root}: {split} shards of different sets ({totals}); keep one set")
        total, shards = next(iter(groups.items()))
        missing = [k for k in range(total) if k not in shards]
        if missing:
            raise AiperfError(f"tfrecord: {root}: shard {split}-{missing[0]:05d}-of-{total:05d} is missing")
        out[split] = [shards[k] for k in range(total)]
    return out


def shard_spans(path: Path) -> Spans:
    """The records of one shard (see :func:`record_spans`); a damaged shard is a one-line error."""
    try:
        with open(path, "rb") as fh:
            return record_spans(fh, os.fstat(fh.fileno()).st_size)
    except OSError as exc:
        raise AiperfError(f"tfrecord: {path}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise AiperfError(f"tfrecord: {path}: not a complete TFRecord file ({exc})") from None


def _read_record(fh: BinaryIO, span: tuple[int, int]) -> bytes:
    fh.seek(span[0])
    return fh.read(span[1])


def _label(features: dict[str, FeatureValue], where: str, offset: int) -> int:
    value = features.get(LABEL)
    if not isinstance(value, int):
        raise AiperfError(f"tfrecord: {where}: no {LABEL} feature (one int64 per record)")
    if value - offset < 0:
        raise AiperfError(
            f"tfrecord: {where}: label {value} is below dataset.label_offset={offset}; "
            "for 0-based labels set dataset.label_offset=0"
        )
    return value - offset


def shard_labels(path: Path, spans: Spans, offset: int) -> tuple[np.ndarray, dict[int, str]]:
    """Class ids of a shard's records and the synsets seen for them (reads every record)."""
    labels = np.empty(len(spans), dtype=np.int64)
    synsets: dict[int, str] = {}
    with open(path, "rb") as fh:
        for k, span in enumerate(spans):
            where = f"{path.name} record {k}"
            try:
                features = parse_features(_read_record(fh, span))
            except Exception as exc:  # protobuf's DecodeError and friends
                raise AiperfError(f"tfrecord: {where}: not a tf.train.Example ({type(exc).__name__})") from None
            labels[k] = _label(features, where, offset)
            synset = features.get(SYNSET)
            if isinstance(synset, bytes):
                synsets.setdefault(int(labels[k]), synset.decode(errors="replace"))
    return labels, synsets


def tfrecord_census(shards: dict[str, list[Path]]) -> Census:
    """The shard files and their sizes: what every node must see the same."""
    h = hashlib.sha256()
    files = [p for split in SPLITS for p in shards[split]]
    for p in files:
        h.update(f"{p.name}\t{p.stat().st_size}\n".encode())
    return {"files": len(files), "digest": h.hexdigest()}


def census_of(path: str) -> Census:
    """:func:`tfrecord_census` of the shards at ``path`` as this machine sees them (run on every node)."""
    return tfrecord_census(find_shards(Path(path)))


def _map(fn: Callable[[T], R], items: list[T]) -> list[R]:
    with ThreadPoolExecutor(max_workers=min(16, (os.cpu_count() or 1) * 2)) as pool:
        return list(pool.map(fn, items))


def _train_subset(total: int, cfg: DatasetConfig, meta: DatasetMeta) -> np.ndarray | None:
    """A seeded random subset for ``max_train_images`` (labels are inside the records: not stratified)."""
    if cfg.max_train_images is None or cfg.max_train_images >= total:
        return None
    meta["train_images_available"] = total
    rng = np.random.default_rng(cfg.split_seed)
    return np.sort(rng.choice(total, size=cfg.max_train_images, replace=False)).astype(np.int64)


def _decode_split(
    paths: list[Path], spans: list[Spans], size: tuple[int, int], offset: int, num_classes: int
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Every record of a split decoded with Pillow at ``size``: (images, labels, names of bad records)."""

    def decode_shard(k: int) -> tuple[list[np.ndarray], list[int], list[str]]:
        images, labels, bad = [], [], []
        with open(paths[k], "rb") as fh:
            for j, span in enumerate(spans[k]):
                where = f"{paths[k].name} record {j}"
                try:
                    features = parse_features(_read_record(fh, span))
                    label = _label(features, where, offset)
                    if label >= num_classes:
                        raise AiperfError(f"{where}: label out of range")
                    encoded = features.get(ENCODED, b"")
                    if not isinstance(encoded, bytes):
                        raise AiperfError(f"{where}: {ENCODED} is not one bytes value")
                    images.append(decode_image_bytes(encoded, where, size))
                    labels.append(label)
                except Exception:  # undecodable record, image or label: skipped and counted
                    bad.append(where)
        return images, labels, bad

    parts = _map(decode_shard, list(range(len(paths))))
    images = [img for part in parts for img in part[0]]
    labels = np.array([label for part in parts for label in part[1]], dtype=np.int32)
    bad = [name for part in parts for name in part[2]]
    stacked = np.stack(images) if images else np.empty((0, size[0], size[1], 3), np.uint8)
    return stacked, labels, bad


def _in_memory(
    root: Path,
    shards: dict[str, list[Path]],
    spans: dict[str, list[Spans]],
    cfg: DatasetConfig,
    meta: DatasetMeta,
    num_classes: int,
) -> Dataset:
    assert cfg.image_size is not None
    x_train, y_train, bad = _decode_split(
        shards["train"], spans["train"], cfg.image_size, cfg.label_offset, num_classes
    )
    x_val, y_val, bad_val = _decode_split(
        shards["validation"], spans["validation"], cfg.image_size, cfg.label_offset, num_classes
    )
    bad += bad_val
    total = sum(len(s) for split in SPLITS for s in spans[split])
    if over_limit(len(bad), total, cfg.max_bad_fraction):
        raise AiperfError(f"tfrecord: {root}: {too_many_bad_images(bad, total, cfg.max_bad_fraction)}")
    plan = plan_predefined_split("tfrecord", y_train, y_val, cfg, f"{root} validation-* shards")
    meta = {
        **meta,
        "storage": "memory",
        "bad_images": {"count": len(bad), "files": bad[:100], "max_fraction": cfg.max_bad_fraction},
    }
    return in_memory_dataset("tfrecord", str(root), num_classes, (x_train, y_train), (x_val, y_val), plan, meta=meta)


def load_tfrecord(cfg: DatasetConfig, memory_limit_bytes: int = IN_MEMORY_LIMIT_BYTES) -> Dataset:
    """Index (or, with ``storage=memory``, decode) the train and validation shards in ``dataset.path``."""
    if cfg.path is None:
        raise AiperfError("tfrecord: set dataset.path to the folder of train-*-of-* and validation-*-of-* shards")
    if cfg.image_size is None:
        raise AiperfError("tfrecord: set dataset.image_size (the records hold images of any size)")
    root = Path(cfg.path).expanduser().resolve()
    shards = find_shards(root)
    spans = {split: _map(shard_spans, shards[split]) for split in SPLITS}
    counts = {split: [len(s) for s in spans[split]] for split in SPLITS}
    if sum(counts["train"]) == 0 or sum(counts["validation"]) == 0:
        empty = "train" if sum(counts["train"]) == 0 else "validation"
        raise AiperfError(f"tfrecord: {root}: the {empty} shards hold no records")
    read = _map(lambda k: shard_labels(shards["validation"][k], spans["validation"][k], cfg.label_offset),
                list(range(len(shards["validation"]))))  # fmt: skip
    val_labels = np.concatenate([labels for labels, _ in read])
    synsets: dict[int, str] = {}
    for _, seen in read:
        synsets.update(seen)
    num_classes = int(val_labels.max()) + 1
    if len(np.unique(val_labels)) < 2:
        raise AiperfError(f"tfrecord: {root}: the validation shards hold only one class; classification needs 2")
    meta: DatasetMeta = {
        "root": str(root),
        "census": tfrecord_census(shards),
        "label_offset": cfg.label_offset,
        "shards": {split: len(shards[split]) for split in SPLITS},
    }
    if synsets:
        meta["class_names"] = [synsets.get(c, str(c)) for c in range(num_classes)]
    train_total = sum(counts["train"])
    keep = _train_subset(train_total, cfg, meta)
    train_size = train_total if keep is None else len(keep)
    storage = choose_storage(f"tfrecord: {root}", cfg, train_size + len(val_labels), memory_limit_bytes)
    if storage == "memory":
        return _in_memory(root, shards, spans, cfg, meta, num_classes)
    meta["split"] = {
        "method": "predefined",
        "seed": cfg.split_seed,
        "disjoint": True,
        "validation": f"{root} validation-* shards",
        **({"train_subset": "seeded random records"} if keep is not None else {}),
    }
    meta["storage"] = "stream"
    meta["decoded"] = "per batch on the workers, as RGB at image_size (random-resized crop + flip; centre crop)"
    dataset = Dataset(
        name="tfrecord",
        num_classes=num_classes,
        input_shape=(cfg.image_size[0], cfg.image_size[1], 3),
        source=str(root),
        train_shards=RecordShards([str(p) for p in shards["train"]], counts["train"], keep, cfg.label_offset),
        val_shards=RecordShards([str(p) for p in shards["validation"]], counts["validation"], None, cfg.label_offset),
        meta=meta,
    )
    dataset.meta["split"]["val_images_also_in_train"] = dataset.overlap()
    return dataset
