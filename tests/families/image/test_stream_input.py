"""The streamed input pipeline: ImageNet's quirks decode, bad images are skipped and named, each
epoch reads every image once in its own order, evaluation covers every image once, data wait."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from PIL import Image

from aiperf.config import DatasetConfig
from aiperf.datasets import decode_image, load_dataset
from aiperf.datasets.generate import GenerateSpec, generate_imagenet
from aiperf.errors import AiperfError
from aiperf.families.image.input_pipeline import TrainInput
from aiperf.families.image.stream_input import TOO_MANY_BAD, EvalStream, TrainStream

tf = pytest.importorskip("tensorflow")

SIZE = (16, 16)


def manifest(tree):
    return json.loads((tree / "aiperf-dataset.json").read_text())


def streamed(tree, name="image_folder", **overrides):
    path = tree / "tfrecord" if name == "tfrecord" else tree
    cfg = dict(name=name, path=str(path), image_size=SIZE, storage="stream", max_bad_fraction=0.2)
    return load_dataset(DatasetConfig(**{**cfg, **overrides}))


def run_epoch(feed, epoch):
    """Iterate one epoch as fit would: (list of (images, labels) batches as arrays, the feed's stats)."""
    batches = [(x.numpy(), y.numpy()) for x, y in feed.fit_kwargs(epoch)["x"]]
    return batches, feed.stats()


# --------------------------------------------------------------------------- decoding


def test_every_imagenet_quirk_decodes_for_training_evaluation_and_memory(imagenet_tree):
    from aiperf.families.image.image_ops import eval_image, train_image

    quirks = manifest(imagenet_tree)["quirks"]
    assert {q.split("/")[1] for q in quirks} == {
        "cmyk", "grayscale", "png_named_jpeg", "tiny_1x1", "tiny_16x16", "large"
    }  # fmt: skip
    for key, rel in quirks.items():
        data = tf.constant((imagenet_tree / rel).read_bytes())
        train = train_image(data, SIZE, tf.constant([3, 7], tf.int64))
        evaluated = eval_image(data, (12, 20))
        assert train.shape == (*SIZE, 3) and train.dtype == tf.uint8, key
        assert evaluated.shape == (12, 20, 3) and evaluated.dtype == tf.uint8, key
        assert decode_image(imagenet_tree / rel, SIZE).shape == (*SIZE, 3), key  # storage=memory (Pillow)
    png = (imagenet_tree / quirks["train/png_named_jpeg"]).read_bytes()
    assert png[:4] == b"\x89PNG" and quirks["train/png_named_jpeg"].endswith(".JPEG")
    with Image.open(imagenet_tree / quirks["train/cmyk"]) as img:
        assert img.mode == "CMYK"
    with Image.open(imagenet_tree / quirks["train/large"]) as img:
        assert img.size == (4032, 3024)
    # TensorFlow's CMYK and grayscale conversions agree with Pillow's: the colours are right.
    for key in ("train/cmyk", "train/grayscale"):
        path = imagenet_tree / quirks[key]
        ours = tf.io.decode_jpeg(path.read_bytes(), channels=3).numpy().astype(float)
        with Image.open(path) as img:
            pillow = np.asarray(img.convert("RGB"), dtype=float)
        assert np.abs(ours - pillow).mean() < 3.0, key
    # Centre crop of a 1x1 image: the pixel itself, everywhere.
    tiny = eval_image(tf.constant((imagenet_tree / quirks["train/tiny_1x1"]).read_bytes()), (5, 5)).numpy()
    assert (tiny == tiny[0, 0]).all()


def test_undecodable_files_fail_in_every_decoder(imagenet_tree):
    from aiperf.families.image.image_ops import eval_image, train_image

    bad = manifest(imagenet_tree)["bad"]
    assert len(bad) == 2
    for rel in bad:
        data = tf.constant((imagenet_tree / rel).read_bytes())
        for decode in (lambda d: train_image(d, SIZE, tf.constant([1, 2], tf.int64)), lambda d: eval_image(d, SIZE)):
            with pytest.raises(tf.errors.InvalidArgumentError):
                decode(data)
        with pytest.raises(AiperfError, match="cannot decode image"):
            decode_image(imagenet_tree / rel, SIZE)


# --------------------------------------------------------------------------- training epochs


@pytest.mark.parametrize("source", ["image_folder", "tfrecord"])
def test_each_epoch_reads_every_decodable_image_once_in_its_own_order(imagenet_tree, source):
    ds = streamed(imagenet_tree, source)
    bad_train = [b for b in manifest(imagenet_tree)["bad"] if b.startswith("train/")]
    good = ds.train_size - len(bad_train)
    feed = TrainStream(ds, batch=8, seed=5, backend="tensorflow", threads=2, bad_limit=10, shuffle_buffer=32)
    first, stats = run_epoch(feed, 1)
    assert [x.shape for x, _ in first] == [(8, *SIZE, 3)] * (good // 8), "full, fixed-shape batches only"
    assert all(x.dtype == np.uint8 for x, _ in first)
    assert stats["steps"] == good // 8 and stats["images"] == 8 * (good // 8)
    names = [ds.item_name("train", i) for i in stats["skipped"]]
    if source == "image_folder":
        assert sorted(names) == sorted(bad_train)
    else:  # the same files, as records of the shards
        assert len(names) == len(bad_train) and all(" record " in n for n in names)
    labels = np.concatenate([y for _, y in first])
    assert set(labels) <= set(range(ds.num_classes))
    second, _ = run_epoch(feed, 2)
    assert not np.array_equal(first[0][0], second[0][0]), "epoch 2 must read another order"
    again, _ = run_epoch(TrainStream(ds, 8, 5, "tensorflow", 1, 10, shuffle_buffer=32), 1)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(first, again, strict=True)), (
        "the same trial seed and epoch give the same images, crops and flips"
    )
    other, _ = run_epoch(TrainStream(ds, 8, 6, "tensorflow", 2, 10, shuffle_buffer=32), 1)
    assert not np.array_equal(first[0][0], other[0][0]), "another trial reads its own order"


def test_the_file_order_is_a_full_permutation_with_every_image_once(imagenet_tree):
    ds = streamed(imagenet_tree)
    feed = TrainStream(ds, batch=1, seed=9, backend="tensorflow", threads=2, bad_limit=10)
    batches, _ = run_epoch(feed, 3)
    good = [label for (path, label) in ds.train_files if "/bad_" not in path]
    assert len(batches) == len(good) and sorted(int(y[0]) for _, y in batches) == sorted(good)


def test_too_many_bad_images_stop_the_epoch_early_and_are_named(tmp_path):
    tree = tmp_path / "tree"
    spec = GenerateSpec(classes=2, train_per_class=10, val_per_class=2, min_side=8, max_side=16, quirks=False, bad=60)
    generate_imagenet(tree, spec)
    ds = streamed(tree, max_bad_fraction=0.01)
    feed = TrainStream(ds, batch=2, seed=1, backend="tensorflow", threads=1, bad_limit=3)
    seen = 0
    with pytest.raises(tf.errors.InvalidArgumentError, match=TOO_MANY_BAD):
        for _ in feed.fit_kwargs(1)["x"]:
            seen += 1
    assert seen < ds.train_size // 2, "the epoch stopped before reading the whole split"
    surely = [ds.item_name("train", i) for i in feed.surely_bad()]
    assert len(surely) > 3 and all("/bad_" in name for name in surely), surely


# --------------------------------------------------------------------------- evaluation


class _Recorder:
    """A stand-in model: logits that encode the batch position, and the shapes it was given."""

    def __init__(self, classes):
        self.classes, self.shapes = classes, []

    def predict_on_batch(self, x):
        self.shapes.append(x.shape)
        return np.eye(self.classes)[np.arange(len(x)) % self.classes]


@pytest.mark.parametrize("source", ["image_folder", "tfrecord"])
def test_evaluation_covers_every_validation_image_once_in_full_batches(imagenet_tree, source):
    ds = streamed(imagenet_tree, source)
    bad_val = [b for b in manifest(imagenet_tree)["bad"] if b.startswith("val/")]
    model = _Recorder(ds.num_classes)
    logits, labels, skipped, waited = EvalStream(ds, 7, "tensorflow", 2).predict(model)
    good = ds.val_size - len(bad_val)
    assert len(logits) == len(labels) == good and waited >= 0
    assert all(shape == (7, *SIZE, 3) for shape in model.shapes), "the last batch is padded to the same shape"
    assert len(model.shapes) == -(-good // 7)
    assert len(skipped) == len(bad_val)
    if source == "image_folder":
        assert [ds.item_name("val", i) for i in skipped] == bad_val
        assert sorted(labels.tolist()) == sorted(y for p, y in ds.val_files if "/bad_" not in p)


# --------------------------------------------------------------------------- data wait


def _timed_epoch(feed, step_s):
    """One epoch pulled by a loop whose steps take ``step_s``; returns (seconds inside each next(), waited)."""
    iterator = iter(feed.fit_kwargs(1)["x"])
    calls = []
    while True:
        t0 = time.perf_counter()
        try:
            next(iterator)
        except StopIteration:
            break
        calls.append(time.perf_counter() - t0)
        time.sleep(step_s)
    stats = feed.stats()
    return calls, stats["data_wait_s"] - stats["build_s"]


def test_data_wait_is_the_time_the_loop_waited_for_input(tmp_path):
    tree = tmp_path / "photos"  # photo-sized images: decoding, not Python, takes the time
    generate_imagenet(tree, GenerateSpec(classes=2, train_per_class=100, val_per_class=2, quirks=False, max_side=640))
    ds = load_dataset(DatasetConfig(name="image_folder", path=str(tree), image_size=(96, 96), storage="stream"))
    # A loop that does nothing but ask for batches waits for (almost) every one of them.
    calls, waited = _timed_epoch(TrainStream(ds, 16, seed=1, backend="tensorflow", threads=1, bad_limit=0), 0.0)
    assert 0.6 * sum(calls) < waited <= sum(calls)
    # A loop much slower than the input waits for its first batch only: then the next one is always ready.
    # (Its first batch is compared with nothing: on a loaded box it alone can take a third of the fast epoch.)
    slow, slow_waited = _timed_epoch(TrainStream(ds, 16, seed=1, backend="tensorflow", threads=1, bad_limit=0), 0.1)
    assert slow_waited <= sum(slow) + 0.005
    assert slow_waited - slow[0] < 0.3 * (waited - calls[0])


def test_resident_input_measures_its_wait_and_counts_full_batches():
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 255, (100, 8, 8, 3), dtype=np.uint8), rng.integers(0, 3, 100).astype(np.int32)
    feed = TrainInput(x, y, 16, seed=1, backend="tensorflow")
    batches = [b for b in feed.fit_kwargs(1)["x"]]
    stats = feed.stats()
    assert len(batches) == stats["steps"] == 6 and stats["images"] == 96 and len(stats["skipped"]) == 0
    assert stats["data_wait_s"] > 0
    numpy_feed = TrainInput(x, y, 16, seed=1, backend="jax")  # the generator JAX and torch are fed from
    assert [len(b[0]) for b in numpy_feed.fit_kwargs(1)["x"]] == [16] * 6
    assert numpy_feed.stats()["steps"] == 6 and numpy_feed.stats()["data_wait_s"] > 0


@pytest.mark.slow
def test_a_trial_on_mostly_undecodable_images_reports_them_and_stops(tmp_path):
    from aiperf.families.image.trainer import TrainerSettings, TrialRunner
    from aiperf.training.trial import TrialSpec
    from nas import zoo

    tree = tmp_path / "tree"
    spec = GenerateSpec(classes=2, train_per_class=10, val_per_class=2, min_side=8, max_side=16, quirks=False, bad=60)
    generate_imagenet(tree, spec)
    ds = streamed(tree, max_bad_fraction=0.01)
    runner = TrialRunner(ds, TrainerSettings(decode_threads=1, max_bad_fraction=0.01), "tensorflow")
    hp = {"learning_rate": 0.05, "batch_size": 2, "weight_decay": 0.0, "dropout": 0.0, "kernel_size": 3, "epochs": 1}
    graph = zoo.small_resnet((*SIZE, 3), 2, width=4)
    items = []
    with pytest.raises(AiperfError) as excinfo:
        for item in runner.run(TrialSpec("t0", "seed", graph.to_dict(), hp, seed=1)):
            items.append(item)
    assert [i["type"] for i in items] == ["bad_images"] and items[0]["over_limit"]
    assert items[0]["files"] and all("/bad_" in f for f in items[0]["files"])
    message = str(excinfo.value)
    assert message.startswith("image_folder: ") and "images cannot be decoded" in message and "bad_" in message
