"""CIFAR-10 from its "python version" folder (``data_batch_1..5``, ``test_batch``, ``batches.meta``).

The batches are pickles, and a pickle can run arbitrary code when loaded. They are read
with an unpickler that resolves only the few numpy names an array needs, so a tampered
file fails with a message instead of executing anything. ``test_batch`` is the validation
split; ``data`` rows are stored channel-first (3x32x32) and are returned as NHWC.
"""

from __future__ import annotations

import codecs
import importlib
import pickle
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import NoReturn

import numpy as np

from aiperf.config import DatasetConfig
from aiperf.datasets.assemble import checked_labels, in_memory_dataset, plan_predefined_split
from aiperf.datasets.base import Dataset
from aiperf.errors import AiperfError

TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_BATCH = "test_batch"
META_FILE = "batches.meta"
SUBFOLDER = "cifar-10-batches-py"
CLASS_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
ROW_BYTES = 3 * 32 * 32


def _numpy_core(module: str, name: str) -> Callable[..., object]:
    for candidate in (f"numpy._core.{module}", f"numpy.core.{module}"):
        try:
            return getattr(importlib.import_module(candidate), name)
        except (ImportError, AttributeError):
            continue
    raise pickle.UnpicklingError(f"this numpy has no {module}.{name}")


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """Protocol-2 pickles written by Python 3 store bytes as ``_codecs.encode(text, 'latin1')``."""
    if codecs.lookup(encoding).name != "iso8859-1":
        raise pickle.UnpicklingError(f"refuses _codecs.encode with encoding {encoding!r}")
    return codecs.encode(text, "latin1")


@lru_cache(maxsize=1)
def _allowed_globals() -> dict[tuple[str, str], Callable[..., object]]:
    reconstruct = _numpy_core("multiarray", "_reconstruct")
    scalar = _numpy_core("multiarray", "scalar")
    frombuffer = _numpy_core("numeric", "_frombuffer")
    allowed: dict[tuple[str, str], Callable[..., object]] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1_encode,
    }
    for prefix in ("numpy.core", "numpy._core"):
        allowed[(f"{prefix}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{prefix}.multiarray", "scalar")] = scalar
        allowed[(f"{prefix}.numeric", "_frombuffer")] = frombuffer
    return allowed


class _ArrayOnlyUnpickler(pickle.Unpickler):
    """Resolves numpy array constructors and nothing else (no ``os.system``, no ``eval``)."""

    def find_class(self, module: str, name: str) -> Callable[..., object]:
        allowed = _allowed_globals()
        if (module, name) not in allowed:
            raise pickle.UnpicklingError(f"refuses to load {module}.{name}: only numpy arrays and plain data")
        return allowed[(module, name)]

    def persistent_load(self, pid: object) -> NoReturn:
        raise pickle.UnpicklingError("refuses persistent references")


def _unpickle(path: Path) -> dict[str, object]:  # untrusted content: every reader checks its types
    try:
        with path.open("rb") as handle:
            content = _ArrayOnlyUnpickler(handle, encoding="bytes").load()
    except FileNotFoundError:
        raise AiperfError(
            f"cifar10: {path} not found — set dataset.path to the extracted cifar-10-batches-py folder"
        ) from None
    except IsADirectoryError:
        raise AiperfError(f"cifar10: {path} is a folder, expected a pickled CIFAR-10 batch") from None
    except EOFError:
        raise AiperfError(f"cifar10: {path}: not a CIFAR-10 python batch (truncated pickle)") from None
    except Exception as exc:  # a damaged pickle can fail in many ways; each is a bad file, not a bug
        reason = str(exc) or type(exc).__name__
        if "truncated" in reason:
            reason = "truncated pickle"
        raise AiperfError(f"cifar10: {path}: not a CIFAR-10 python batch ({reason})") from None
    if not isinstance(content, dict):
        raise AiperfError(f"cifar10: {path}: not a CIFAR-10 python batch (holds a {type(content).__name__})")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in content.items()}


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = _unpickle(path)
    data, labels = batch.get("data"), batch.get("labels")
    if not isinstance(data, np.ndarray) or labels is None:
        raise AiperfError(f"cifar10: {path}: not a CIFAR-10 python batch (needs 'data' array and 'labels')")
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != ROW_BYTES:
        raise AiperfError(
            f"cifar10: {path}: 'data' must be uint8 of shape (N, {ROW_BYTES}), got {data.dtype} {data.shape}"
        )
    try:
        label_array = np.asarray(labels)
    except (TypeError, ValueError):
        raise AiperfError(f"cifar10: {path}: 'labels' is not a list of integers") from None
    y = checked_labels(f"cifar10: {path}", label_array, 10, len(data))
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), y


def _class_names(folder: Path) -> list[str]:
    path = folder / META_FILE
    if not path.is_file():
        return CLASS_NAMES
    names = _unpickle(path).get("label_names")
    if not isinstance(names, list) or len(names) != 10:
        raise AiperfError(f"cifar10: {path}: 'label_names' must list 10 class names")
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names]


def _batch_folder(cfg: DatasetConfig) -> Path:
    if cfg.path is None:
        raise AiperfError("cifar10: set dataset.path to the extracted cifar-10-batches-py folder")
    folder = Path(cfg.path).expanduser()
    if folder.is_file() and folder.name.endswith((".tar.gz", ".tgz")):
        raise AiperfError(f"cifar10: {folder} is an archive; extract it (tar xzf) and point dataset.path at it")
    if not folder.is_dir():
        raise AiperfError(f"cifar10: folder {folder} not found — set dataset.path to the cifar-10-batches-py folder")
    if not (folder / TRAIN_BATCHES[0]).exists() and (folder / SUBFOLDER).is_dir():
        folder = folder / SUBFOLDER
    return folder


def load_cifar10(cfg: DatasetConfig) -> Dataset:
    folder = _batch_folder(cfg)
    parts = [_read_batch(folder / name) for name in TRAIN_BATCHES]
    x_train = np.concatenate([x for x, _ in parts])
    y_train = np.concatenate([y for _, y in parts])
    x_val, y_val = _read_batch(folder / TEST_BATCH)
    plan = plan_predefined_split("cifar10", y_train, y_val, cfg, "official test split (test_batch)")
    return in_memory_dataset(
        "cifar10",
        str(folder.resolve()),
        10,
        (x_train, y_train),
        (x_val, y_val),
        plan,
        meta={"class_names": _class_names(folder)},
    )
