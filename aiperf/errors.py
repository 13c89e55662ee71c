"""The project's one user-facing exception type, and the two ways its messages stay one line.

Anything a user can get wrong (config, dataset, architecture file, flags, a run directory)
raises :class:`AiperfError` with a message they can act on. Only the CLI turns it into an
exit code (``exit_code``, 2 by default); library code never calls ``sys.exit``.

Messages quote user input only through :func:`excerpt` (a hostile value -- a billion-laughs
document, a 50 MB string, an integer of a million digits -- is shown as a short, escaped
excerpt, never in full), and turn operating-system errors into a line naming the path and
what to do through :func:`os_error`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

EXCERPT_CHARS = 40


class AiperfError(Exception):
    """A problem the user can fix; ``str(err)`` is a one-line explanation."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one line of a message: its first line (its type's name if it says nothing), cut to ``limit``."""
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """A short, single-line, escaped description of ``value`` that costs O(limit) to build.

    Scalars are shown as ``repr`` cut to ``limit`` characters; containers by their type and
    size (their contents may be huge or deeply nested); anything else by its type name.
    """
    if value is None or isinstance(value, (bool, float)):
        text = repr(value)
    elif isinstance(value, int):
        text = repr(value) if -(10**30) < value < 10**30 else f"an integer of about {_digits(value)} digits"
    elif isinstance(value, (str, bytes)):
        text = repr(value[: limit + 1])
    elif isinstance(value, dict):
        return f"a mapping of {len(value)} key(s)"
    elif isinstance(value, (list, tuple, set)):
        return f"a list of {len(value)} item(s)"
    else:
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _digits(value: int) -> int:
    return max(1, int(value.bit_length() * 0.30103) + 1)


# errno -> (what happened, what to do about it)
_OS_ADVICE = {
    errno.ENOSPC: ("no space left on the device", "free space"),
    errno.EDQUOT: ("disk quota exceeded", "free space or raise the quota"),
    errno.EACCES: ("permission denied", "fix the permissions or choose another folder"),
    errno.EPERM: ("operation not permitted", "fix the permissions or choose another folder"),
    errno.EROFS: ("read-only file system", "choose a writable folder"),
    errno.ELOOP: ("a symbolic link loop", "fix or remove the looping link"),
    errno.ENAMETOOLONG: ("name too long", "use a shorter path"),
    errno.ENOTDIR: ("a component of the path is not a folder", "fix the path"),
    errno.EISDIR: ("it is a folder", "give a file"),
    errno.ENOENT: ("no such file or folder", "fix the path"),
    errno.EEXIST: ("it already exists and is not a folder", "choose another path"),
    errno.EIO: ("input/output error (a failing disk or network file system)", "check the storage"),
    errno.EFBIG: ("file too large for this file system or the file-size limit", "raise the limit or free space"),
    errno.EMFILE: ("too many open files", "raise the open-file limit (ulimit -n)"),
    errno.ENOLCK: ("no locks available on this file system", "use a local folder or mount with locking"),
}


def os_error(exc: OSError, path: str | Path, doing: str, then: str = "", exit_code: int = 2) -> AiperfError:
    """``cannot <doing> <path>: <reason> (<ERRNO>); <advice>[; <then>]`` as an :class:`AiperfError`."""
    code = exc.errno
    unknown = (exc.strerror or type(exc).__name__, "")
    reason, advice = _OS_ADVICE.get(code, unknown) if code is not None else unknown
    name = errno.errorcode.get(code, "") if code is not None else ""
    tail = "; ".join(part for part in (advice, then) if part)
    return AiperfError(
        f"cannot {doing} {os.fspath(path)}: {reason}{f' ({name})' if name else ''}{f'; {tail}' if tail else ''}",
        exit_code,
    )
