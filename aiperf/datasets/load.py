"""``load_dataset``: the one entry point that maps a ``dataset`` config section to a loader."""

from __future__ import annotations

from collections.abc import Callable

from aiperf.config import LANGUAGE_DATASETS, DatasetConfig
from aiperf.datasets.base import Dataset
from aiperf.datasets.bundled import load_digits, load_mnist
from aiperf.datasets.cifar10 import load_cifar10
from aiperf.datasets.fashion_mnist import load_fashion_mnist
from aiperf.datasets.image_folder import load_image_folder
from aiperf.datasets.synthetic import load_synthetic
from aiperf.datasets.tfrecord import load_tfrecord
from aiperf.errors import AiperfError

LOADERS: dict[str, Callable[[DatasetConfig], Dataset]] = {
    "mnist": load_mnist,
    "digits": load_digits,
    "fashion_mnist": load_fashion_mnist,
    "cifar10": load_cifar10,
    "image_folder": load_image_folder,
    "tfrecord": load_tfrecord,
    "synthetic": load_synthetic,
}
_TAKES_PATH = {"fashion_mnist", "cifar10", "image_folder", "tfrecord"}
_DECODES_FILES = {"image_folder", "tfrecord"}  # resize, store in memory or stream


def load_dataset(cfg: DatasetConfig) -> Dataset:
    """Load the configured dataset from local files only; errors are one-line :class:`AiperfError`."""
    loader = LOADERS.get(cfg.name)
    if cfg.name in LANGUAGE_DATASETS:
        raise AiperfError(
            f"dataset.name: {cfg.name} holds text for the language-model workload, which `aiperf run` trains"
            " (docs/llm.md); this command takes image datasets only"
        )
    if loader is None:
        raise AiperfError(f"dataset.name: unknown dataset {cfg.name!r} (known: {', '.join(LOADERS)})")
    # Settings a loader would silently ignore are rejected, so a run never uses other data than asked.
    if cfg.path is not None and cfg.name not in _TAKES_PATH:
        raise AiperfError(f"dataset.path: {cfg.name} is built in and reads no files; remove dataset.path")
    if cfg.image_size is not None and cfg.name not in _DECODES_FILES:
        raise AiperfError(f"dataset.image_size: only image_folder and tfrecord resize images; remove it for {cfg.name}")
    if cfg.storage != "auto" and cfg.name not in _DECODES_FILES:
        raise AiperfError(f"dataset.storage: {cfg.name} is always held in memory; remove dataset.storage")
    if cfg.name != "tfrecord":
        # Compared with the defaults, not with what was set: a recorded config (--resume) sets every field.
        for key in ("label_offset", "shuffle_buffer"):
            if getattr(cfg, key) != DatasetConfig.model_fields[key].default:
                raise AiperfError(f"dataset.{key}: only tfrecord uses it; remove it for {cfg.name}")
    return loader(cfg)
