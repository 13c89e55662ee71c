"""A trial's batch never exceeds what its epochs can fill, streamed or resident; images deleted
while a trial trains are named as missing, damaged ones as undecodable (docs/datasets.md)."""

from __future__ import annotations

import shutil

import pytest

from aiperf.config import DatasetConfig
from aiperf.datasets import load_dataset
from aiperf.datasets.generate import GenerateSpec, generate_imagenet
from aiperf.errors import AiperfError

pytest.importorskip("tensorflow")

SIZE = (8, 8)
TINY = dict(classes=2, train_per_class=6, val_per_class=2, min_side=8, max_side=16, quirks=False)


def _trial(runner, batch_size, epochs=1):
    from aiperf.training.trial import TrialSpec
    from nas import zoo

    hp = {"learning_rate": 0.05, "batch_size": batch_size, "weight_decay": 0.0, "dropout": 0.0, "kernel_size": 3,
          "epochs": epochs}  # fmt: skip
    graph = zoo.small_resnet((*SIZE, 3), 2, width=4)
    return runner.run(TrialSpec("t0", "seed", graph.to_dict(), hp, seed=1))


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """13 training images (one of them truncated) and 4 validation images in 2 classes."""
    root = tmp_path_factory.mktemp("split") / "tree"
    generate_imagenet(root, GenerateSpec(**TINY, bad=1))
    return root


@pytest.mark.parametrize("storage", ["stream", "memory"])
def test_a_batch_larger_than_the_training_split_is_clamped_and_trains(tree, storage):
    from aiperf.families.image.trainer import TrainerSettings, TrialRunner

    ds = load_dataset(
        DatasetConfig(name="image_folder", path=str(tree), image_size=SIZE, storage=storage, max_bad_fraction=0.2)
    )
    runner = TrialRunner(ds, TrainerSettings(decode_threads=1, max_bad_fraction=0.2), "tensorflow")
    items = list(_trial(runner, 512))
    epoch = next(i for i in items if i["type"] == "epoch")
    done = items[-1]
    # Streamed: 13 files, of which up to 3 may be skipped (0.2 of 17): a batch of 10 always fills.
    # In memory: the truncated file was left out at load; 12 decoded images, one batch of all of them.
    expected = 10 if storage == "stream" else 12
    assert epoch["batch_size"] == done["batch_size"] == expected and done["requested_batch_size"] == 512
    assert epoch["steps"] == 1 and epoch["train_images"] == expected


def test_a_class_folder_deleted_while_training_is_missing_not_undecodable(tree, tmp_path):
    from aiperf.families.image.trainer import TrainerSettings, TrialRunner

    copy = tmp_path / "tree"
    shutil.copytree(tree, copy)
    ds = load_dataset(
        DatasetConfig(name="image_folder", path=str(copy), image_size=SIZE, storage="stream", max_bad_fraction=0.1)
    )
    runner = TrialRunner(ds, TrainerSettings(decode_threads=1, max_bad_fraction=0.1), "tensorflow")
    shutil.rmtree(copy / "train" / "n00000002")  # after the dataset was indexed: 6 training images gone
    with pytest.raises(AiperfError) as excinfo:
        list(_trial(runner, 2))
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith("image_folder: 6 of 17 images are missing (deleted since")
    assert "train/n00000002/n00000002_" in message
    assert "1 cannot be decoded (train/n00000001/bad_0_truncated.JPEG)" in message
    assert "more than dataset.max_bad_fraction=0.1" in message
