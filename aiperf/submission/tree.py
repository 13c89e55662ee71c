"""What is really in a package directory, found without following a single link.

A package comes from someone else. A symbolic link inside it could make the checker (or a list
maintainer's web server) read any file on its machine, a FIFO would block a reader, and a tree
of a million files or one huge file would exhaust it; names that only some file systems keep
(``:``, spaces, a leading dot, non-ASCII) would make the package differ between machines. So
the walk never follows a link, stops counting past the bounds, and reports each of these by
path; the other checks read only the regular files it found.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from aiperf.errors import excerpt
from aiperf.submission.layout import MAX_DEPTH, MAX_FILE_BYTES, MAX_FILES, MAX_PACKAGE_BYTES, is_portable


@dataclass
class Tree:
    """Regular files (relative posix path -> bytes) and every problem met on the way."""

    files: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    unsafe: set[str] = field(default_factory=set)  # links and special files: nothing under their folder is read

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())


def _shown(relative: str) -> str:
    return relative if relative.isprintable() and len(relative) <= 200 else excerpt(relative, 120)


def walk(package: Path) -> Tree:
    """Walk ``package`` (never following links) within the bounds of docs/submission.md."""
    tree = Tree()
    entries = 0
    stack: list[tuple[Path, str, int]] = [(package, "", 0)]
    while stack:
        folder, prefix, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                children = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            tree.problems.append(f"{_shown(prefix or '.')}: cannot list ({exc.strerror or exc})")
            continue
        for child in children:
            entries += 1
            if entries > MAX_FILES:
                tree.problems.append(f"more than {MAX_FILES:,} files and folders: the package is too large to check")
                return tree
            relative = f"{prefix}{child.name}"
            shown = _shown(relative)
            if not is_portable(child.name):
                tree.problems.append(f"{shown}: not a portable name (letters, digits, '.', '_', '-'; not hidden)")
            try:
                info = child.stat(follow_symlinks=False)
            except OSError as exc:
                tree.problems.append(f"{shown}: cannot be read ({exc.strerror or exc})")
                continue
            if stat.S_ISLNK(info.st_mode):
                tree.problems.append(f"{shown}: a symbolic link (a package holds copies of files, never links)")
                tree.unsafe.add(relative)
            elif stat.S_ISDIR(info.st_mode):
                if depth + 1 >= MAX_DEPTH:
                    tree.problems.append(f"{shown}: folders nested deeper than {MAX_DEPTH} levels")
                else:
                    stack.append((Path(child.path), relative + "/", depth + 1))
            elif not stat.S_ISREG(info.st_mode):
                tree.problems.append(f"{shown}: not a regular file (a FIFO, socket or device)")
                tree.unsafe.add(relative)
            elif info.st_size > MAX_FILE_BYTES:
                tree.problems.append(f"{shown}: {info.st_size:,} bytes, over the limit of {MAX_FILE_BYTES:,} per file")
            else:
                tree.files[relative] = info.st_size
    if tree.total_bytes > MAX_PACKAGE_BYTES:
        tree.problems.append(f"the package holds {tree.total_bytes:,} bytes, over the limit of {MAX_PACKAGE_BYTES:,}")
    return tree
