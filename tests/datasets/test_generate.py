"""`aiperf make-imagenet`: ImageNet-layout test data, as the tests and the input benchmark use it."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from helpers import REPO, aiperf_cmd, cli_env
from PIL import Image

from aiperf.config import DatasetConfig, config_from_dict, load_config
from aiperf.datasets import load_dataset
from aiperf.errors import AiperfError


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        aiperf_cmd("make-imagenet", *args), capture_output=True, text=True, env=cli_env(), cwd=REPO, timeout=300
    )


def test_default_images_look_like_imagenet_with_its_quirks(tmp_path):
    out = tmp_path / "imagenet"
    proc = make(str(out), "--classes", "3", "--train-per-class", "8", "--val-per-class", "2")
    assert proc.returncode == 0, proc.stderr
    assert "wrote 30 training and 8 validation images" in proc.stdout  # 24 + 6 quirks, 6 + 2 quirks
    manifest = json.loads((out / "aiperf-dataset.json").read_text())
    classes = sorted(p.name for p in (out / "train").iterdir())
    assert classes == manifest["classes"] == ["n00000001", "n00000002", "n00000003"]
    assert sorted(p.name for p in (out / "val").iterdir()) == classes
    plain = [p for p in (out / "train").rglob("*.JPEG") if not p.name.startswith("quirk_")]
    assert len(plain) == 24
    sizes = [p.stat().st_size for p in plain]
    assert 70_000 < np.mean(sizes) < 160_000, "around ImageNet's 110 KB mean"
    shapes = set()
    for p in plain:
        with Image.open(p) as img:
            assert img.format == "JPEG" and img.mode == "RGB"
            shapes.add(img.size)
    assert len({round(w / h, 2) for w, h in shapes}) > 5, "varied aspect ratios"
    modes = {}
    for key, rel in manifest["quirks"].items():
        with Image.open(out / rel) as img:
            modes[key] = (img.format, img.mode, img.size)
    assert modes["train/cmyk"][:2] == ("JPEG", "CMYK") and modes["val/cmyk"][:2] == ("JPEG", "CMYK")
    assert modes["train/grayscale"][:2] == ("JPEG", "L")
    assert modes["train/png_named_jpeg"][0] == "PNG" and manifest["quirks"]["train/png_named_jpeg"].endswith(".JPEG")
    assert modes["train/tiny_1x1"][2] == (1, 1) and modes["train/tiny_16x16"][2] == (16, 16)
    assert modes["train/large"][2] == (4032, 3024)
    assert manifest["bad"] == []


def test_undecodable_files_and_tfrecord_shards_on_request(tmp_path):
    out = tmp_path / "bad"
    proc = make(
        str(out), "--classes", "2", "--train-per-class", "5", "--val-per-class", "3", "--max-side", "24",
        "--no-quirks", "--bad", "3", "--to-tfrecord", "--train-shards", "2", "--val-shards", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "aiperf-dataset.json").read_text())
    assert manifest["quirks"] == {} and len(manifest["bad"]) == 3
    for rel in manifest["bad"]:
        with pytest.raises(OSError), Image.open(out / rel) as img:  # Pillow's decode errors are OSErrors
            img.load()
    assert manifest["tfrecord"]["train"] == ["train-00000-of-00002", "train-00001-of-00002"]
    assert manifest["tfrecord"]["validation"] == ["validation-00000-of-00001"]
    shards = load_dataset(
        DatasetConfig(name="tfrecord", path=str(out / "tfrecord"), image_size=[8, 8], storage="stream")
    )
    folder = load_dataset(DatasetConfig(name="image_folder", path=str(out), image_size=[8, 8], storage="stream"))
    assert (shards.train_size, shards.val_size) == (folder.train_size, folder.val_size) == (12, 7)
    assert shards.num_classes == folder.num_classes == 2


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--classes", "1"], "--classes must be from 2 to 100,000, got 1"),
        (["--min-side", "50", "--max-side", "10"], "--min-side"),
        (["--bad", "-1"], "--bad must be from 0 to 100,000, got -1"),
    ],
)
def test_bad_arguments_are_one_line_errors(tmp_path, args, fragment):
    proc = make(str(tmp_path / "x"), *args)
    assert proc.returncode == 2 and fragment in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_an_existing_folder_is_never_overwritten(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    proc = make(str(tmp_path), "--classes", "2")
    assert proc.returncode == 2 and "not an empty folder" in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_streaming_settings_are_checked(tmp_path):
    with pytest.raises(AiperfError, match=r"dataset\.storage: digits is always held in memory"):
        load_dataset(DatasetConfig(name="digits", storage="stream"))
    with pytest.raises(AiperfError, match=r"dataset\.label_offset: only tfrecord"):
        load_dataset(DatasetConfig(name="digits", label_offset=0))
    recorded = config_from_dict(load_config("smoke").to_dict())  # as --resume reads it: every field set
    assert load_dataset(recorded.dataset).name == "digits"
    proc = subprocess.run(
        aiperf_cmd("run", "--set", "dataset.decode_threads=0", "--set", f"run.results_dir={tmp_path}"),
        capture_output=True, text=True, env=cli_env(), cwd=REPO, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "dataset.decode_threads: must be 'auto' or an integer from 1 to 1024" in proc.stderr
    for name in ("a", "b"):
        (tmp_path / "f" / name).mkdir(parents=True)
        for k in range(2):
            Image.new("RGB", (4, 4)).save(tmp_path / "f" / name / f"{k}.png")
    with pytest.raises(AiperfError, match=r"dataset\.storage=stream decodes at a fixed size"):
        load_dataset(DatasetConfig(name="image_folder", path=str(tmp_path / "f"), storage="stream"))
    assert load_dataset(DatasetConfig(name="image_folder", path=str(tmp_path / "f"), image_size=[4, 4])).x_train.size
