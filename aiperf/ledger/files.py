"""Files that are replaced whole (summary, report, kept weights): complete or absent, never half.

Each write goes to a temporary file with a unique name next to its target, is fsync'ed and
renamed over the target, so readers see the old file or the new one. The unique name
matters: two processes writing the same file (a master and an ``aiperf summary``) must not
share a temporary file, or one renames away the other's (issue 13). When the write fails
(a full disk, a quota) the temporary file is removed before the error is raised; one left
by a process killed mid-write is removed by :func:`remove_temporaries` when a master
takes the run directory over.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

TEMP_SUFFIX = ".tmp"


def temporary_name(path: Path) -> Path:
    """``.summary.json.1a2b3c4d.tmp`` next to ``summary.json``: hidden, unique, recognisably ours."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def write_atomic(path: str | Path, data: bytes | Callable[[BinaryIO], None]) -> None:
    """Replace ``path`` with ``data`` (bytes, or a function writing to a binary file) atomically.

    Raises the ``OSError`` of a failed write (with ``filename`` set to ``path``) after
    removing the temporary file.
    """
    path = Path(path)
    tmp = temporary_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        with os.fdopen(fd, "wb") as fh:
            if isinstance(data, bytes):
                fh.write(data)
            else:
                data(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if exc.filename is None:
            exc.filename = str(path)
        raise
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def open_regular(path: str | Path) -> BinaryIO:
    """A regular file opened for reading; anything else raises ``OSError`` without reading.

    A run directory may come from someone else (a published result): a ``ledger.jsonl``
    that is a FIFO would block a reader for ever and a link to ``/dev/zero`` would fill its
    memory, so anything but a regular file raises ``OSError`` (``EINVAL``, "not a regular
    file"). Opened non-blocking, which a regular file ignores.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | Path, limit: int | None = None) -> bytes:
    """A regular file's bytes (:func:`open_regular`), at most ``limit + 1`` (so an oversize file can be told)."""
    with open_regular(path) as fh:
        return fh.read() if limit is None else fh.read(limit + 1)


class LineTooLong(ValueError):
    """A line of a record file is longer than its reader's limit: no writer of ours made it."""

    def __init__(self, offset: int, line: int, limit: int) -> None:
        super().__init__(f"line {line} (at byte {offset:,}) is longer than {limit:,} bytes")
        self.offset = offset
        self.line = line
        self.limit = limit


def bounded_lines(fh: BinaryIO, limit: int) -> Iterator[tuple[int, int, bytes]]:
    """``(line number, byte offset, line)`` for each line of ``fh``, newline kept; a line over ``limit`` bytes raises
    :class:`LineTooLong` after reading at most ``limit + 1`` bytes of it.

    So a reader's memory is bounded by its record size, not by what a file's tail claims
    (a 1 GB line of zeros after the last record is refused, not read).
    """
    offset = 0
    number = 0
    while True:
        line = fh.readline(limit + 1)
        if not line:
            return
        number += 1
        if len(line) > limit:
            raise LineTooLong(offset, number, limit)
        yield number, offset, line
        offset += len(line)


def remove_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporary files a killed writer left in ``folder`` (not recursive); returns them.

    Also the fixed names older versions used (``summary.json.tmp``, ``t00012.tmp.npz``).
    """
    folder = Path(folder)
    removed: list[Path] = []
    try:
        candidates = list(folder.iterdir())
    except OSError:
        return removed
    for path in candidates:
        name = path.name
        ours = name.startswith(".") and name.endswith(TEMP_SUFFIX)
        legacy = name.endswith((".json.tmp", ".html.tmp", ".tmp.npz"))
        if (ours or legacy) and path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
    return removed
