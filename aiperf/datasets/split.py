"""Seeded, stratified index arithmetic for train/validation splits.

Pure functions over label arrays, so the same rules apply to in-memory arrays and to the
file lists of streamed datasets: every class keeps its share in both splits, a seed fixes
the outcome exactly, and the two index sets are checked to be disjoint, not assumed to be.
"""

from __future__ import annotations

import math

import numpy as np


def stratified_split(
    labels: np.ndarray, validation_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Split positions ``0..len(labels)-1`` into shuffled (train, val) index arrays.

    Each class with two or more examples puts ``round(fraction * count)`` of them (at least
    one, at most all but one) into validation; a class with a single example stays in train.
    """
    train_parts, val_parts = [], []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        n_val = 0
        if len(members) >= 2:
            n_val = min(max(math.floor(validation_fraction * len(members) + 0.5), 1), len(members) - 1)
        val_parts.append(members[:n_val])
        train_parts.append(members[n_val:])
    train = rng.permutation(np.concatenate(train_parts)) if train_parts else np.empty(0, np.int64)
    val = rng.permutation(np.concatenate(val_parts)) if val_parts else np.empty(0, np.int64)
    check_disjoint(train, val)
    return train, val


def stratified_prefix(labels: np.ndarray, limit: int) -> np.ndarray:
    """Positions of at most ``limit`` examples, keeping class shares and the existing order.

    ``labels`` is assumed to be in shuffled order already: from each class the first examples
    are kept, so the subset is random but determined by that order. Quotas are allotted by
    largest remainder, so the subset has exactly ``limit`` examples.
    """
    if limit >= len(labels):
        return np.arange(len(labels))
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * (limit / len(labels))
    quotas = np.floor(exact).astype(np.int64)
    short = limit - int(quotas.sum())
    # Stable sort: ties in the remainder go to the lower class id, deterministically.
    for i in np.argsort(-(exact - quotas), kind="stable")[:short]:
        quotas[i] += 1
    keep = np.zeros(len(labels), dtype=bool)
    for cls, quota in zip(classes, quotas, strict=True):
        keep[np.flatnonzero(labels == cls)[:quota]] = True
    return np.flatnonzero(keep)


def check_disjoint(train: np.ndarray, val: np.ndarray) -> None:
    """Raise if an index is in both splits or repeated within one: a bug, never user input."""
    both = np.concatenate([np.asarray(train), np.asarray(val)])
    if len(np.unique(both)) != len(both):
        raise AssertionError("internal error: train and validation index sets overlap or repeat an index")
