"""Undecodable images: skipped and counted, and a run with too many of them stops.

ImageNet-scale folders hold a few damaged files (a copy cut short, a stray non-image); one of
them must not end a 12-hour run, but a dataset that is mostly unreadable must not yield a
score either. Every loader and the streamed input skip what cannot be decoded and name it;
the share of skipped images is compared with ``dataset.max_bad_fraction`` of the dataset's
images (training plus validation split). The same limit applies wherever images are decoded:
at load time (in-memory storage), in a worker's epoch, and across the run in the master.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

NAMES_SHOWN = 3


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


def too_many_bad_images(bad: Sequence[str], total_images: int, max_fraction: float, count: int | None = None) -> str:
    """The one-line error when the skipped share passes ``max_fraction``; ``count`` when more than named."""
    count = len(bad) if count is None else count
    share = 100.0 * count / max(1, total_images)
    return (
        f"{count:,} of {total_images:,} images cannot be decoded ({share:.2f} %), more than "
        f"dataset.max_bad_fraction={max_fraction:g}: {name_a_few(list(bad), count)}"
    )
