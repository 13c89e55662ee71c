"""ImageNet-layout test data: random JPEGs in ``train/<class>/`` and ``val/<class>/``, quirks included.

ImageNet itself cannot be downloaded here, but the input pipeline, its tests and its benchmark
need files shaped like it: JPEGs of varied size and aspect ratio (ImageNet's training images
average about 400x350 pixels and 110 KB), classes in WordNet-id folders, and the oddities a
real copy holds -- CMYK and grayscale JPEGs, a PNG named ``.JPEG``, images a few pixels wide
and camera-sized ones (ImageNet has all of these). Undecodable files (cut-short JPEGs, random
bytes, empty files) are added only on request (``bad``). Every class has its own hue and
stripe pattern, so a small network learns the classes and accuracy means something.

With ``to_tfrecord`` the same images are also written as TFRecord shards as TensorFlow's
ImageNet tooling writes them (``tfrecord/train-00000-of-NNNNN``; ``image/encoded`` holds the
file's bytes unchanged, ``image/class/label`` is 1-based).

A manifest (``aiperf-dataset.json``) lists what was written, including each quirk's file.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

import numpy as np
from PIL import Image

from aiperf import cli_limits as limits
from aiperf.errors import AiperfError

MANIFEST = "aiperf-dataset.json"
IMAGENET_MEAN_SIDES = (400, 350)  # width, height of an average ImageNet training image
LARGE_SIZE = (4032, 3024)  # a phone camera's photo
# _Painter.size() draws an area 3 sigma above ImageNet's mean (400k pixels) at a 2:1 aspect as 894 px a side.
TYPICAL_SIDE_MAX = 900
QUIRKS = ("cmyk", "grayscale", "png_named_jpeg", "tiny_1x1", "tiny_16x16", "large")
BAD_KINDS = ("truncated", "garbage", "empty")
JPEG_QUALITY = 90


class TFRecordManifest(TypedDict):
    """The TFRecord copy: its folder and the shard names of each split."""

    path: str
    train: list[str]
    validation: list[str]


class Manifest(TypedDict):
    """What was written (also saved as ``aiperf-dataset.json`` in the tree)."""

    layout: str
    spec: dict[str, int | float | bool]  # the GenerateSpec's fields
    classes: list[str]  # synsets, by label
    train_images: int
    val_images: int
    mean_bytes: float
    quirks: dict[str, str]  # "split/kind" -> the file
    bad: list[str]  # the undecodable files
    tfrecord: NotRequired[TFRecordManifest]


@dataclass
class GenerateSpec:
    """What to write; the defaults give ImageNet-like files (use small ``max_side`` in tests)."""

    classes: int = 10
    train_per_class: int = 50
    val_per_class: int = 10
    min_side: int = 64
    max_side: int = 1024
    mean_kb: float = 110.0
    quirks: bool = True
    bad: int = 0
    seed: int = 0
    to_tfrecord: bool = False
    train_shards: int = 4
    val_shards: int = 2

    def check(self) -> None:
        """Every field in its CLI range (:mod:`aiperf.cli_limits`), and the tree as a whole bounded, before any work."""
        where = "make-imagenet: "
        for bound, value in (
            (limits.CLASSES, self.classes),
            (limits.TRAIN_PER_CLASS, self.train_per_class),
            (limits.VAL_PER_CLASS, self.val_per_class),
            (limits.MIN_SIDE, self.min_side),
            (limits.MAX_SIDE, self.max_side),
            (limits.BAD, self.bad),
            (limits.TRAIN_SHARDS, self.train_shards),
            (limits.VAL_SHARDS, self.val_shards),
            (limits.MAKE_SEED, self.seed),
        ):
            bound.check(value, where)
        limits.MEAN_KB.check(self.mean_kb, where)
        if self.min_side > self.max_side:
            raise AiperfError(f"{where}need --min-side <= --max-side, got {self.min_side} > {self.max_side}")
        images = self.images()
        if images > limits.MAKE_IMAGES_MAX:
            raise AiperfError(
                f"{where}--classes x (--train-per-class + --val-per-class) + --bad makes {images:,} images; "
                f"at most {limits.MAKE_IMAGES_MAX:,}"
            )
        side = self.largest_side()
        raw = images * side * side * 3  # the one large quirk (36 MB) left out
        if raw > limits.MAKE_RAW_BYTES_MAX:
            raise AiperfError(
                f"{where}{images:,} images of up to {side:,} x {side:,} pixels are {raw / 2**40:,.1f} TiB as raw RGB; "
                f"at most {limits.MAKE_RAW_BYTES_MAX / 2**40:g} TiB (fewer images, or a smaller --max-side/--min-side)"
            )

    def images(self) -> int:
        """The files of the tree: plain images, quirks and undecodable files."""
        quirks = len(QUIRKS) + 2 if self.quirks else 0  # cmyk and png_named_jpeg go to both splits
        return self.classes * (self.train_per_class + self.val_per_class) + quirks + self.bad

    def largest_side(self) -> int:
        """The largest side a painted image gets: ``size()`` draws sides below :data:`TYPICAL_SIDE_MAX` unless
        ``min_side`` is larger, and never above ``max_side`` (the large quirk's fixed size aside)."""
        return min(self.max_side, max(self.min_side, TYPICAL_SIDE_MAX))


def _class_style(k: int, classes: int) -> tuple[np.ndarray, float, float]:
    """A class's colour (RGB 0..255), stripe angle and stripe frequency: what makes it learnable."""
    hue = k / classes
    rgb = np.array([0.5 + 0.5 * math.cos(2 * math.pi * (hue + s / 3)) for s in range(3)])
    return 40 + 175 * rgb, math.pi * ((k * 0.381966) % 1.0), 2.0 + 5.0 * ((k * 0.618034) % 1.0)


class _Painter:
    """Draws class images whose JPEG size follows the requested bytes per pixel."""

    def __init__(self, spec: GenerateSpec, rng: np.random.Generator) -> None:
        self.spec, self.rng = spec, rng
        self.noise = 0.0
        self.noise = self._calibrate(spec.mean_kb * 1024 / self._mean_pixels())

    def _mean_pixels(self) -> float:
        sizes = [self.size() for _ in range(256)]
        return float(np.mean([w * h for w, h in sizes]))

    def size(self) -> tuple[int, int]:
        """(width, height) around ImageNet's average, aspect ratio 1:2 .. 2:1, clipped to the sides asked for."""
        area = math.prod(IMAGENET_MEAN_SIDES) * math.exp(self.rng.normal(0.0, 0.35))
        aspect = math.exp(self.rng.uniform(math.log(0.5), math.log(2.0)))
        w, h = math.sqrt(area * aspect), math.sqrt(area / aspect)
        lo, hi = self.spec.min_side, self.spec.max_side
        return int(np.clip(round(w), lo, hi)), int(np.clip(round(h), lo, hi))

    def _calibrate(self, target_bpp: float) -> float:
        """The pixel-noise level whose JPEGs have ``target_bpp`` bytes per pixel (photos: about 0.8)."""
        probe = np.random.default_rng(12345)
        levels = [0.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
        bpp = []
        for level in levels:
            self.noise = level
            pixels = self.pixels(0, (256, 192), probe)
            bpp.append(len(encode(Image.fromarray(pixels), "JPEG")) / (256 * 192))
        return float(np.interp(target_bpp, bpp, levels))

    def pixels(self, label: int, size: tuple[int, int], rng: np.random.Generator | None = None) -> np.ndarray:
        rng = rng or self.rng
        w, h = size
        colour, angle, freq = _class_style(label, self.spec.classes)
        scale = 2 * math.pi * freq / max(w, h)
        xs = np.arange(w, dtype=np.float32)[None, :] * np.float32(math.cos(angle) * scale)
        ys = np.arange(h, dtype=np.float32)[:, None] * np.float32(math.sin(angle) * scale)
        stripes = np.sin(xs + ys + np.float32(rng.uniform(0, 2 * math.pi)))
        blotch = np.asarray(
            Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)).resize((w, h), Image.Resampling.BICUBIC),
            dtype=np.float32,
        )
        # Brightness and tint vary per image, so neighbouring classes' colours overlap and the stripes matter.
        colour = (colour * rng.uniform(0.6, 1.2) + rng.normal(0.0, 30.0, 3)).astype(np.float32)
        base = colour * (0.75 + 0.25 * stripes[..., None]) + 0.3 * (blotch - 128)
        if self.noise > 0:
            base += rng.standard_normal((h, w, 3), dtype=np.float32) * np.float32(self.noise)
        return np.clip(base, 0, 255).astype(np.uint8)


def encode(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **({"quality": JPEG_QUALITY} if fmt == "JPEG" else {}))
    return out.getvalue()


def _quirk_bytes(kind: str, painter: _Painter, label: int) -> bytes:
    if kind == "large":  # a smooth camera photo (1-2 MB), painted at 1/8 size and enlarged: seconds cheaper
        small = painter.pixels(label, (LARGE_SIZE[0] // 8, LARGE_SIZE[1] // 8))
        return encode(Image.fromarray(small).resize(LARGE_SIZE, Image.Resampling.BICUBIC), "JPEG")
    size = {"tiny_1x1": (1, 1), "tiny_16x16": (16, 16)}.get(kind, painter.size())
    image = Image.fromarray(painter.pixels(label, size))
    if kind == "cmyk":
        return encode(image.convert("CMYK"), "JPEG")
    if kind == "grayscale":
        return encode(image.convert("L"), "JPEG")
    if kind == "png_named_jpeg":
        return encode(image, "PNG")
    return encode(image, "JPEG")


def _bad_bytes(kind: str, painter: _Painter, rng: np.random.Generator) -> bytes:
    if kind == "truncated":
        whole = encode(Image.fromarray(painter.pixels(0, painter.size())), "JPEG")
        return whole[: len(whole) * 2 // 5]
    if kind == "garbage":
        return rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
    return b""


def _synset(k: int) -> str:
    return f"n{k + 1:08d}"


def generate_imagenet(out: str | Path, spec: GenerateSpec) -> Manifest:
    """Write the tree under ``out`` (which must not exist or be empty); returns the manifest."""
    spec.check()
    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise AiperfError(f"make-imagenet: {root} exists and is not an empty folder; choose a new one")
    rng = np.random.default_rng(spec.seed)
    painter = _Painter(spec, rng)
    files: dict[str, list[tuple[str, int]]] = {"train": [], "val": []}
    quirks: dict[str, str] = {}
    bad: list[str] = []
    sizes: list[int] = []

    def write(split: str, label: int, name: str, data: bytes) -> str:
        folder = root / split / _synset(label)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
        rel = f"{split}/{_synset(label)}/{name}"
        files[split].append((rel, label))
        return rel

    counts = {"train": spec.train_per_class, "val": spec.val_per_class}
    for split, per_class in counts.items():
        for label in range(spec.classes):
            for i in range(per_class):
                data = encode(Image.fromarray(painter.pixels(label, painter.size())), "JPEG")
                sizes.append(len(data))
                stem = f"{_synset(label)}_{i}" if split == "train" else f"ILSVRC2012_val_{label * per_class + i:08d}"
                write(split, label, f"{stem}.JPEG", data)
    if spec.quirks:
        for k, kind in enumerate(QUIRKS):
            for split in ("train", "val") if kind in ("cmyk", "png_named_jpeg") else ("train",):
                label = k % spec.classes
                data = _quirk_bytes(kind, painter, label)
                quirks[f"{split}/{kind}"] = write(split, label, f"quirk_{kind}.JPEG", data)
    for k in range(spec.bad):
        split = "train" if k % 2 == 0 else "val"
        kind = BAD_KINDS[k % len(BAD_KINDS)]
        bad.append(write(split, k % spec.classes, f"bad_{k}_{kind}.JPEG", _bad_bytes(kind, painter, rng)))
    manifest: Manifest = {
        "layout": "imagenet",
        "spec": asdict(spec),
        "classes": [_synset(k) for k in range(spec.classes)],
        "train_images": len(files["train"]),
        "val_images": len(files["val"]),
        "mean_bytes": float(np.mean(sizes)),
        "quirks": quirks,
        "bad": bad,
    }
    if spec.to_tfrecord:
        manifest["tfrecord"] = write_tfrecords(root, files, spec, rng)
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def write_tfrecords(
    root: Path, files: dict[str, list[tuple[str, int]]], spec: GenerateSpec, rng: np.random.Generator
) -> TFRecordManifest:
    """The same images as ``tfrecord/{train,validation}-KKKKK-of-NNNNN``, records shuffled across shards."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf  # the writer only; it starts no device

    folder = root / "tfrecord"
    folder.mkdir()

    def feature(value: bytes | int) -> tf.train.Feature:
        if isinstance(value, bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    shard_names: dict[str, list[str]] = {}
    for split, prefix, shards in (("train", "train", spec.train_shards), ("val", "validation", spec.val_shards)):
        entries = [files[split][k] for k in rng.permutation(len(files[split]))]
        names = []
        for s, part in enumerate(np.array_split(np.arange(len(entries)), shards)):
            name = f"{prefix}-{s:05d}-of-{shards:05d}"
            names.append(name)
            with tf.io.TFRecordWriter(str(folder / name)) as writer:
                for k in part:
                    rel, label = entries[int(k)]
                    data = (root / rel).read_bytes()
                    height, width = _stored_size(data)
                    example = tf.train.Example(
                        features=tf.train.Features(
                            feature={
                                "image/encoded": feature(data),
                                "image/format": feature(b"JPEG"),
                                "image/class/label": feature(label + 1),
                                "image/class/synset": feature(_synset(label).encode()),
                                "image/height": feature(height),
                                "image/width": feature(width),
                                "image/colorspace": feature(b"RGB"),
                                "image/channels": feature(3),
                                "image/filename": feature(Path(rel).name.encode()),
                            }
                        )
                    )
                    writer.write(example.SerializeToString())
        shard_names[prefix] = names
    return {"path": str(folder), "train": shard_names["train"], "validation": shard_names["validation"]}


def _stored_size(data: bytes) -> tuple[int, int]:
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.height, img.width
    except Exception:  # a deliberately bad file: its record says 0 x 0
        return 0, 0
