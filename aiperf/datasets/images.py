"""Decoding image files into uint8 arrays, shared by the folder loader and streaming input.

Sizes are ``(height, width)`` like array shapes (Pillow itself speaks width x height).
Resizing stretches to the target size with bilinear filtering; JPEGs are first decoded at a
reduced scale where possible (``draft``), which makes large photos several times cheaper.
Every failure names the file, so one bad JPEG among a million is easy to find.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import IO

import numpy as np
from PIL import Image

from aiperf.errors import AiperfError, first_line

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"})
GRAYSCALE_MODES = frozenset({"1", "L", "LA", "I", "I;16", "F"})
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


def is_image_file(path: str | Path) -> bool:
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def _cannot_decode(path: str | Path, exc: BaseException) -> AiperfError:
    if isinstance(exc, FileNotFoundError):  # deleted since the folder was listed: not a damaged file
        return AiperfError(f"image_folder: {path}: missing (the file no longer exists)")
    return AiperfError(f"image_folder: {path}: cannot decode image ({first_line(exc)})")


def probe_image(path: str | Path) -> tuple[str, tuple[int, int]]:
    """(Pillow mode, (height, width)) from the file header, without decoding the pixels."""
    try:
        with Image.open(path) as img:
            return img.mode, (img.height, img.width)
    except _DECODE_ERRORS as exc:
        raise _cannot_decode(path, exc) from None


def decode_image(path: str | Path, size: tuple[int, int] | None = None, channels: int = 3) -> np.ndarray:
    """Decode one file to uint8 ``(height, width, channels)``; RGB for 3 channels, gray for 1.

    ``size`` resizes to ``(height, width)``; without it the stored size is kept.
    """
    return _decode(path, path, size, channels)


def decode_image_bytes(data: bytes, name: str, size: tuple[int, int] | None = None, channels: int = 3) -> np.ndarray:
    """:func:`decode_image` of an encoded image held in memory (a TFRecord's ``image/encoded``)."""
    return _decode(io.BytesIO(data), name, size, channels)


def _decode(
    source: str | Path | IO[bytes], name: str | Path, size: tuple[int, int] | None, channels: int
) -> np.ndarray:
    if channels not in (1, 3):
        raise AiperfError(f"image_folder: channels must be 1 or 3 (got {channels})")
    try:
        with Image.open(source) as img:
            if size is not None:
                img.draft(None, (size[1], size[0]))
            converted = img.convert("RGB" if channels == 3 else "L")
            if size is not None and converted.size != (size[1], size[0]):
                converted = converted.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            pixels = np.asarray(converted, dtype=np.uint8)
    except _DECODE_ERRORS as exc:
        raise _cannot_decode(name, exc) from None
    return pixels[..., None] if channels == 1 else pixels
