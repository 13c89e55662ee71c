"""Undecodable and missing images: skipped and counted, and a run with too many of them stops.

ImageNet-scale folders hold a few damaged files (a copy cut short, a stray non-image); one of
them must not end a 12-hour run, but a dataset that is mostly unreadable must not yield a
score either. Every loader and the streamed input skip what cannot be decoded and name it;
the share of skipped images is compared with ``dataset.max_bad_fraction`` of the dataset's
images (training plus validation split). The same limit applies wherever images are decoded:
at load time (in-memory storage), in a worker's epoch, and across the run in the master.

A file that is no longer there (deleted, or its class folder removed, after the dataset was
indexed) is skipped and counted the same way, but named as *missing*, not as undecodable:
the remedy differs (restore the files, rather than replace damaged ones).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiperf.datasets.base import Dataset

NAMES_SHOWN = 3
MISSING = "deleted since the run began"


def bad_image_limit(total_images: int, max_fraction: float) -> int:
    """The most skipped images a dataset of ``total_images`` may have: more is over the limit."""
    return max(0, math.floor(max_fraction * max(0, total_images) + 1e-9))


def over_limit(bad: int, total_images: int, max_fraction: float) -> bool:
    return bad > bad_image_limit(total_images, max_fraction)


def name_a_few(names: Sequence[str], count: int | None = None) -> str:
    """``a.JPEG, b.JPEG, c.JPEG (and 12 more)``."""
    count = len(names) if count is None else count
    shown = ", ".join(names[:NAMES_SHOWN])
    more = count - min(len(names), NAMES_SHOWN)
    return shown + (f" (and {more:,} more)" if more > 0 else "")


def largest_full_batch(dataset: Dataset, max_fraction: float) -> int:
    """The largest batch every training epoch fills while the run is within ``max_fraction``.

    Training batches are full (a ragged last batch is dropped), so a batch larger than the
    images an epoch delivers trains no step at all. Resident data was decoded at load time and
    skips nothing; a streamed epoch may skip up to :func:`bad_image_limit` images (undecodable
    or missing) and go on, so at least the rest of its training split reaches the loop.
    """
    train = dataset.train_size
    if not dataset.streaming:
        return max(1, train)
    return max(1, train - bad_image_limit(train + dataset.val_size, max_fraction))


def too_many_bad_images(
    bad: Sequence[str],
    total_images: int,
    max_fraction: float,
    count: int | None = None,
    missing: Sequence[str] = (),
    missing_count: int | None = None,
) -> str:
    """The one-line error when the skipped share passes ``max_fraction``; ``count`` when more than named.

    ``missing`` names those of ``bad`` that no longer exist (``missing_count`` of them when more
    than named); the rest could not be decoded.
    """
    count = len(bad) if count is None else count
    share = 100.0 * count / max(1, total_images)
    limit = f"more than dataset.max_bad_fraction={max_fraction:g}"
    if not (missing or missing_count):
        named = name_a_few(list(bad), count)
        return f"{count:,} of {total_images:,} images cannot be decoded ({share:.2f} %), {limit}: {named}"
    gone = set(missing)
    gone_count = max(len(gone), missing_count or 0)
    undecodable = [name for name in bad if name not in gone]
    spoiled = max(0, count - gone_count)
    text = f"{gone_count:,} of {total_images:,} images are missing ({MISSING}: {name_a_few(sorted(gone), gone_count)})"
    if spoiled:
        text += f", {spoiled:,} cannot be decoded" + (f" ({name_a_few(undecodable, spoiled)})" if undecodable else "")
    return f"{text}: {share:.2f} % skipped, {limit}"


def skipped_note(new: Sequence[str], missing: Sequence[str] = ()) -> str:
    """The progress line for images newly skipped within the limit: missing and undecodable told apart."""
    gone = [name for name in new if name in set(missing)]
    spoiled = [name for name in new if name not in set(missing)]
    parts = []
    if gone:
        parts.append(f"{len(gone)} image(s) are missing ({MISSING}) and are skipped, e.g. {gone[0]}")
    if spoiled:
        parts.append(f"{len(spoiled)} image(s) cannot be decoded and are skipped, e.g. {spoiled[0]}")
    return "; ".join(parts)
