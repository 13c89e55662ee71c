"""Images deleted since the run began are named as missing, not as undecodable; and no trial asks
for a batch larger than the training images an epoch surely delivers (docs/datasets.md)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from aiperf.config import DatasetConfig
from aiperf.datasets import image_folder, load_dataset
from aiperf.datasets.bad_images import largest_full_batch, skipped_note, too_many_bad_images
from aiperf.datasets.base import Dataset, RecordShards
from aiperf.datasets.generate import GenerateSpec, generate_imagenet
from aiperf.errors import AiperfError

TINY = dict(classes=2, train_per_class=6, val_per_class=2, min_side=8, max_side=16, quirks=False)
SCAN = image_folder.scan_folder


def test_the_message_tells_missing_files_from_undecodable_ones():
    bad = ["train/n01/a.JPEG", "train/n01/b.JPEG", "train/n02/bad_0_truncated.JPEG"]
    both = too_many_bad_images(bad, 140, 0.01, missing=bad[:2])
    assert both.startswith("2 of 140 images are missing (deleted since the run began: train/n01/a.JPEG, train/n01/b")
    assert "1 cannot be decoded (train/n02/bad_0_truncated.JPEG)" in both
    assert both.endswith("2.14 % skipped, more than dataset.max_bad_fraction=0.01")
    only_gone = too_many_bad_images(bad[:2], 140, 0.01, count=14, missing=bad[:2], missing_count=14)
    assert only_gone.startswith("14 of 140 images are missing") and "(and 12 more)" in only_gone
    assert "cannot be decoded" not in only_gone
    unchanged = too_many_bad_images(bad[2:], 140, 0.001)  # nothing missing: the message it always was
    assert unchanged.startswith("1 of 140 images cannot be decoded (0.71 %), more than dataset.max_bad_fraction")
    assert skipped_note(bad, bad[:2]) == (
        "2 image(s) are missing (deleted since the run began) and are skipped, e.g. train/n01/a.JPEG; "
        "1 image(s) cannot be decoded and are skipped, e.g. train/n02/bad_0_truncated.JPEG"
    )


def test_missing_items_are_files_or_shards_that_no_longer_exist(tmp_path):
    tree = tmp_path / "tree"
    generate_imagenet(tree, GenerateSpec(**TINY, bad=1))
    ds = load_dataset(DatasetConfig(name="image_folder", path=str(tree), image_size=[8, 8], storage="stream"))
    everything = np.arange(ds.train_size)
    assert len(ds.missing_items("train", everything)) == 0, "undecodable, not missing"
    shutil.rmtree(tree / "train" / "n00000002")  # a class folder deleted mid-run
    gone = ds.missing_items("train", everything)
    assert len(gone) == 6 and {ds.item_name("train", int(i)).split("/")[1] for i in gone} == {"n00000002"}
    shards = [tmp_path / "train-00000-of-00002", tmp_path / "train-00001-of-00002"]
    for shard in shards:
        shard.write_bytes(b"")
    ds = Dataset("tfrecord", 2, (8, 8, 3), train_shards=RecordShards([str(p) for p in shards], [3, 2]))
    shards[1].unlink()
    assert list(ds.missing_items("train", np.arange(5))) == [3, 4]


def _scan_then_delete(monkeypatch, *victims):
    """Files listed by the scan, then deleted before they are read (as during a run)."""

    def scanned(root):
        listing = SCAN(root)
        for victim in victims:
            shutil.rmtree(victim) if victim.is_dir() else victim.unlink()
        return listing

    monkeypatch.setattr(image_folder, "scan_folder", scanned)


def test_a_file_gone_before_it_is_decoded_is_missing_in_memory_storage(tmp_path, monkeypatch):
    tree = tmp_path / "tree"
    generate_imagenet(tree, GenerateSpec(**TINY, bad=1))
    cfg = dict(name="image_folder", path=str(tree), image_size=[8, 8], storage="memory")
    _scan_then_delete(monkeypatch, tree / "train" / "n00000002" / "n00000002_3.JPEG")
    data = load_dataset(DatasetConfig(**cfg, max_bad_fraction=0.2))
    bad = data.meta["bad_images"]
    assert bad["count"] == 2 and bad["missing_count"] == 1 and bad["missing"] == ["train/n00000002/n00000002_3.JPEG"]
    assert "train/n00000001/bad_0_truncated.JPEG" in bad["files"]

    tree = tmp_path / "again"
    generate_imagenet(tree, GenerateSpec(**TINY, bad=1))
    _scan_then_delete(monkeypatch, tree / "train" / "n00000002")  # a whole class folder
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(**{**cfg, "path": str(tree)}, max_bad_fraction=0.01))
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith(f"image_folder: {tree}: 6 of 17 images are missing")
    assert "(deleted since the run began: train/n00000002/" in message
    assert "1 cannot be decoded (train/n00000001/bad_0_truncated.JPEG)" in message


def test_an_undecodable_file_is_still_undecodable(tmp_path):
    tree = tmp_path / "tree"
    generate_imagenet(tree, GenerateSpec(**TINY, bad=2))
    cfg = DatasetConfig(name="image_folder", path=str(tree), image_size=[8, 8], max_bad_fraction=0.01)
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(cfg)
    assert "2 of 18 images cannot be decoded" in str(excinfo.value) and "missing" not in str(excinfo.value)


def test_the_largest_batch_is_what_every_epoch_surely_delivers(tmp_path):
    tree = tmp_path / "tree"
    generate_imagenet(tree, GenerateSpec(**TINY, bad=1))
    streamed = load_dataset(DatasetConfig(name="image_folder", path=str(tree), image_size=[8, 8], storage="stream"))
    assert (streamed.train_size, streamed.val_size) == (13, 4)
    assert largest_full_batch(streamed, 0.0) == 13
    assert largest_full_batch(streamed, 0.2) == 10  # 3 of the 17 images may be skipped and the run go on
    resident = load_dataset(
        DatasetConfig(name="image_folder", path=str(tree), image_size=[8, 8], storage="memory", max_bad_fraction=0.2)
    )
    assert largest_full_batch(resident, 0.2) == resident.train_size == 12  # skipped at load already
