"""Does this machine see the dataset the run started with? (Run on every node, and in every worker.)

A streamed dataset is read by the workers from ``dataset.path``, so every node must see the
same files there: a node with a stale copy trains on other data, and a node without the
mount fails every trial it gets. The head counts the files when it loads the dataset
(``meta["census"]``: file count and a digest of the names); :func:`census` repeats that count
where it runs. A worker additionally checks, when it starts, that a sample of the files it
will read opens -- cheap enough for every worker, and it covers nodes that join later.
"""

from __future__ import annotations

import os
import socket

import numpy as np

from aiperf.datasets.base import Census, Dataset
from aiperf.errors import AiperfError

SAMPLE_FILES = 16


def census(name: str, path: str) -> Census:
    """The file count and name digest of the dataset at ``path``, as this machine sees it."""
    if name == "image_folder":
        from aiperf.datasets.image_folder import census_of
    elif name == "tfrecord":
        from aiperf.datasets.tfrecord import census_of
    else:
        raise AiperfError(f"dataset {name} is not read from files by the workers")
    return census_of(path)


def census_on_this_node(name: str, path: str) -> dict[str, int | str]:
    """:func:`census` with this node's hostname, and any error as text (runs as a Ray task)."""
    out: dict[str, int | str] = {"hostname": socket.gethostname()}
    try:
        out.update(census(name, path))
    except AiperfError as exc:
        out["error"] = str(exc)
    except OSError as exc:
        out["error"] = f"{path}: {exc.strerror or exc}"
    return out


def _sample(items: list[str], rng: np.random.Generator) -> list[str]:
    if len(items) <= SAMPLE_FILES:
        return items
    return [items[int(k)] for k in rng.choice(len(items), size=SAMPLE_FILES, replace=False)]


def check_readable(dataset: Dataset, seed: int = 0) -> None:
    """Raise a one-line error naming this host when a sample of the dataset's files cannot be opened."""
    rng = np.random.default_rng(seed)
    if dataset.train_shards is not None and dataset.val_shards is not None:
        paths = _sample(dataset.train_shards.paths + dataset.val_shards.paths, rng)
    else:
        paths = _sample([p for p, _ in (dataset.train_files or []) + (dataset.val_files or [])], rng)
    for path in paths:
        try:
            with open(path, "rb") as fh:
                fh.read(1)
        except OSError as exc:
            raise AiperfError(
                f"node {socket.gethostname()} cannot read the dataset: {path}: {exc.strerror or exc} "
                f"(every node must see {dataset.source})"
            ) from None
    if not paths and not os.path.isdir(dataset.source):
        raise AiperfError(f"node {socket.gethostname()} does not see the dataset folder {dataset.source}")
