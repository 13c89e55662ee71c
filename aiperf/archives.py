"""Zip archives from someone else (stored weights, ``.keras`` models), opened and read within stated bounds.

Both what ``zipfile`` trusts are headers the archive's author wrote: opening one reads its whole
central directory (one ``ZipInfo`` per entry, as large as its end record declares), and a
member's uncompressed size is only what it says. So the end record is read first and the
directory's size capped before :class:`zipfile.ZipFile` sees it, the entries are counted, and a
member is read only after its declared size is checked, by a read that stops one byte past the
cap whatever the headers said.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from aiperf.errors import AiperfError, excerpt, first_line

# One central-directory entry: 46 fixed bytes, its name and extra fields (the names numpy and Keras
# write are under 100 bytes, zip64 extras 28): four times that, for names of someone else's tools.
CENTRAL_ENTRY_BYTES = 1024
_EOCD = b"PK\x05\x06"  # end of central directory record (22 bytes and a comment of up to 65,535)
_EOCD64_LOCATOR = b"PK\x06\x07"  # zip64 end record locator (20 bytes, just before the end record)
_EOCD64 = b"PK\x06\x06"  # zip64 end record (56 bytes, just before its locator)


def central_directory_bytes(path: str | Path) -> int:
    """The central directory's size as the archive's end records declare it (the larger of the plain and
    the zip64 record): what :class:`zipfile.ZipFile` reads into memory on opening. 0 without an end
    record (``ZipFile`` then refuses the file)."""
    with open(path, "rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        start = max(0, end - (22 + 0xFFFF))
        fh.seek(start)
        tail = fh.read(end - start)
        at = tail.rfind(_EOCD, 0, max(0, len(tail) - 18))  # the last record with its 22 bytes in the file
        if at < 0:
            return 0
        size = int.from_bytes(tail[at + 12 : at + 16], "little")
        locator = start + at - 20
        if locator >= 56:
            fh.seek(locator)
            if fh.read(4) == _EOCD64_LOCATOR:
                fh.seek(locator - 56)
                record = fh.read(56)
                if record[:4] == _EOCD64:
                    size = max(size, int.from_bytes(record[40:48], "little"))
        return size


def open_zip(path: str | Path, label: str, max_members: int, error: type[AiperfError] = AiperfError) -> zipfile.ZipFile:
    """``path`` opened as a zip archive of at most ``max_members`` entries, its directory read only once
    its declared size fits them; raises ``error`` naming ``label`` otherwise (or when it is no zip)."""
    declared = central_directory_bytes(path)
    if declared > max_members * CENTRAL_ENTRY_BYTES:
        raise error(
            f"{label}: its zip directory declares {declared:,} bytes, more than {max_members:,} entries take"
            f" (at most {max_members * CENTRAL_ENTRY_BYTES:,})"
        )
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, ValueError, EOFError, NotImplementedError) as exc:
        raise error(f"{label}: not a readable zip archive ({first_line(exc, 120)})") from None
    if len(archive.infolist()) > max_members:
        count = len(archive.infolist())
        archive.close()
        raise error(f"{label}: holds {count:,} zip entries, at most {max_members:,} are read")
    return archive


def read_member(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, cap: int, label: str, error: type[AiperfError] = AiperfError
) -> bytes:
    """A member's bytes, checked against ``cap`` from its declared size first, then read ``cap + 1`` bytes
    at most: a member whose headers understate it still stops there."""
    name = excerpt(info.filename)
    if info.file_size > cap:
        raise error(f"{label}: member {name} declares {info.file_size:,} bytes unpacked, at most {cap:,} are read")
    try:
        with archive.open(info) as fh:
            data = fh.read(cap + 1)
    except (zipfile.BadZipFile, ValueError, EOFError, RuntimeError, NotImplementedError) as exc:
        raise error(f"{label}: member {name} cannot be read ({first_line(exc, 120)})") from None
    if len(data) > cap:
        raise error(f"{label}: member {name} unpacks to more than {cap:,} bytes")
    return data
