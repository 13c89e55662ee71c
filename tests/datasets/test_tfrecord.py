"""TFRecord shards as TensorFlow's ImageNet tooling writes them: found, counted, labelled, checked."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from aiperf.config import DatasetConfig
from aiperf.datasets import load_dataset
from aiperf.datasets.example_proto import example_class, parse_features
from aiperf.datasets.tfrecord import find_shards, shard_spans
from aiperf.errors import AiperfError

SIZE = [16, 16]


def shards_of(tree, tmp_path):
    """A private copy of the fixture's shards (tests may damage it)."""
    out = tmp_path / "shards"
    shutil.copytree(tree / "tfrecord", out)
    return out


def load(path, **kw):
    return load_dataset(DatasetConfig(name="tfrecord", path=str(path), image_size=SIZE, **kw))


def one_line(excinfo, *fragments):
    message = str(excinfo.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_shards_are_indexed_without_decoding_and_match_the_folder(imagenet_tree):
    manifest = json.loads((imagenet_tree / "aiperf-dataset.json").read_text())
    ds = load(imagenet_tree / "tfrecord", storage="stream")
    assert ds.streaming and ds.train_shards is not None and ds.val_shards is not None
    assert ds.train_size == manifest["train_images"] and ds.val_size == manifest["val_images"]
    assert ds.num_classes == len(manifest["classes"]) and ds.meta["class_names"] == manifest["classes"]
    assert [p.rsplit("/", 1)[1] for p in ds.train_shards.paths] == manifest["tfrecord"]["train"]
    assert ds.overlap() == 0 and ds.meta["split"]["method"] == "predefined"
    assert ds.meta["census"]["files"] == 5  # 3 train + 2 validation shards
    # Record k of the dataset is record k - start of its shard.
    assert ds.train_shards.name_of(0) == "train-00000-of-00003 record 0"
    last = ds.train_shards.total - 1
    assert ds.train_shards.name_of(last) == f"train-00002-of-00003 record {ds.train_shards.counts[-1] - 1}"
    assert load(imagenet_tree / "tfrecord", storage="stream").fingerprint() == ds.fingerprint()


def test_labels_are_read_as_tensorflow_parses_them(imagenet_tree):
    tf = pytest.importorskip("tensorflow")
    path = imagenet_tree / "tfrecord" / "validation-00000-of-00002"
    spans = shard_spans(path)
    raw = path.read_bytes()
    ours = [parse_features(raw[offset : offset + length]) for offset, length in spans]
    theirs = [
        tf.io.parse_single_example(r, {"image/class/label": tf.io.FixedLenFeature([], tf.int64)})["image/class/label"]
        for r in tf.data.TFRecordDataset(str(path))
    ]
    assert [f["image/class/label"] for f in ours] == [int(t) for t in theirs]
    assert all(1 <= f["image/class/label"] <= 4 for f in ours)  # the tooling's 1-based labels
    assert all(f["image/format"] == b"JPEG" and f["image/class/synset"].startswith(b"n") for f in ours)
    assert example_class()().ParseFromString(raw[spans[0][0] : spans[0][0] + spans[0][1]]) > 0


def test_memory_storage_decodes_every_record_and_counts_the_bad_ones(imagenet_tree):
    ds = load(imagenet_tree / "tfrecord", storage="memory", max_bad_fraction=0.1)
    assert not ds.streaming and ds.x_train.shape[1:] == (16, 16, 3)
    manifest = json.loads((imagenet_tree / "aiperf-dataset.json").read_text())
    bad = ds.meta["bad_images"]
    assert bad["count"] == len(manifest["bad"]) and all(" record " in name for name in bad["files"])
    assert ds.train_size + ds.val_size == manifest["train_images"] + manifest["val_images"] - bad["count"]
    total = manifest["train_images"] + manifest["val_images"]
    with pytest.raises(AiperfError) as excinfo:
        load(imagenet_tree / "tfrecord", storage="memory")  # 2 bad images are over 0.1 %
    one_line(excinfo, f"2 of {total} images cannot be decoded", "max_bad_fraction=0.001", " record ")


def test_label_offset_and_max_train_images(imagenet_tree, tmp_path):
    train_images = json.loads((imagenet_tree / "aiperf-dataset.json").read_text())["train_images"]
    with pytest.raises(AiperfError) as excinfo:
        load(imagenet_tree / "tfrecord", label_offset=2)
    one_line(excinfo, "label 1 is below dataset.label_offset=2", "validation-0000")
    zero_based = load(imagenet_tree / "tfrecord", label_offset=0, storage="stream")
    assert zero_based.num_classes == 5  # class ids 1..4 with offset 0: 0 is never used
    subset = load(imagenet_tree / "tfrecord", storage="stream", max_train_images=10, split_seed=3)
    assert subset.train_size == 10 and subset.meta["train_images_available"] == train_images
    keep = subset.train_shards.keep
    assert len(np.unique(keep)) == 10 and keep.max() < train_images
    again = load(imagenet_tree / "tfrecord", storage="stream", max_train_images=10, split_seed=3)
    assert np.array_equal(again.train_shards.keep, keep) and again.fingerprint() == subset.fingerprint()


def test_damaged_or_incomplete_shard_sets_are_one_line_errors(imagenet_tree, tmp_path):
    shards = shards_of(imagenet_tree, tmp_path)
    (shards / "train-00001-of-00003").unlink()
    with pytest.raises(AiperfError) as excinfo:
        load(shards)
    one_line(excinfo, "shard train-00001-of-00003 is missing")

    shards = shards_of(imagenet_tree, tmp_path / "b")
    for name in list(shards.glob("validation-*")):
        name.unlink()
    with pytest.raises(AiperfError) as excinfo:
        load(shards)
    one_line(excinfo, "no validation shards", "validation-00000-of-NNNNN")

    shards = shards_of(imagenet_tree, tmp_path / "c")
    (shards / "train-00000-of-00007").write_bytes(b"")
    with pytest.raises(AiperfError) as excinfo:
        load(shards)
    one_line(excinfo, "train shards of different sets", "-of-00003", "-of-00007")

    shards = shards_of(imagenet_tree, tmp_path / "d")
    victim = shards / "train-00002-of-00003"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) - 100])  # cut short: the last record's length points past the end
    with pytest.raises(AiperfError) as excinfo:
        load(shards)
    one_line(excinfo, str(victim), "not a complete TFRecord file", "past the end")

    shards = shards_of(imagenet_tree, tmp_path / "e")
    victim = shards / "validation-00001-of-00002"
    raw = bytearray(victim.read_bytes())
    (length,) = struct.unpack("<Q", raw[:8])
    raw[12 : 12 + length] = b"\xff" * length  # the framing holds, the record is no Example
    victim.write_bytes(bytes(raw))
    with pytest.raises(AiperfError) as excinfo:
        load(shards)
    one_line(excinfo, "validation-00001-of-00002 record 0", "not a tf.train.Example")

    with pytest.raises(AiperfError) as excinfo:
        load(tmp_path / "nowhere")
    one_line(excinfo, "not found", "dataset.path")
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="tfrecord", path=str(imagenet_tree / "tfrecord")))
    one_line(excinfo, "set dataset.image_size")
    assert sorted(find_shards(imagenet_tree / "tfrecord")) == ["train", "validation"]
