"""Reader for the IDX format of (Fashion-)MNIST, plain or gzip-compressed.

Layout: two zero bytes, a type code, the number of dimensions, then one big-endian uint32
per dimension and the data in row-major order. Everything is checked against the file's
actual length before the bytes are interpreted, so a truncated or padded file is reported
instead of silently reshaped.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from aiperf.errors import AiperfError

_TYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path, what: str) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as handle:
                return handle.read()
        return path.read_bytes()
    except FileNotFoundError:
        raise AiperfError(f"{what}: {path} not found") from None
    except (gzip.BadGzipFile, zlib.error, EOFError) as exc:
        raise AiperfError(f"{what}: {path}: corrupt gzip file ({exc}); re-download or reinstall it") from None
    except OSError as exc:
        raise AiperfError(f"{what}: {path}: cannot read ({exc.strerror or exc})") from None


def read_idx(path: str | Path, what: str = "idx") -> np.ndarray:
    """The array stored in an IDX file; ``what`` prefixes error messages (e.g. the dataset name)."""
    path = Path(path)
    raw = _read_bytes(path, what)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _TYPES:
        raise AiperfError(f"{what}: {path}: not an IDX file (bad magic number {raw[:4].hex() or 'missing'})")
    dtype, ndim = _TYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise AiperfError(f"{what}: {path}: truncated IDX header ({ndim} dimensions, {len(raw)} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = header + int(np.prod(shape, dtype=object)) * dtype.itemsize
    if len(raw) != expected:
        state = "truncated" if len(raw) < expected else "has trailing bytes"
        raise AiperfError(f"{what}: {path}: IDX file {state}: shape {shape} needs {expected} bytes, found {len(raw)}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
