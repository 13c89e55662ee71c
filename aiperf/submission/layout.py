"""The package layout, in one place, so the writer, the checker and ``aiperf list`` agree on it.

::

    DIR/
      package.json                                  the index (:class:`PackageIndex`)
      systems/<system>.json                         the system description (``aiperf system``)
      results/<system>/<workload>/config.yaml       the config the entry's runs share
      results/<system>/<workload>/run_<i>/          one run: ledger, summary, mllog, telemetry, audit, weights
      MANIFEST.sha256                               ``<sha256>  <path>`` for every other file, sorted by path

docs/submission.md describes it; :func:`read_package_json` is the one reader of ``package.json``.
The bounds below are checked by ``aiperf package`` before it copies anything and by ``aiperf
check`` before it reads anything large: a package is something a list maintainer downloads from
strangers, so its size, its file count and its names are bounded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal, overload

from aiperf.errors import AiperfError, excerpt

PACKAGE_FORMAT = "aiperf-package/1"
PACKAGE_JSON = "package.json"
MANIFEST = "MANIFEST.sha256"
SYSTEMS = "systems"
RESULTS = "results"
CONFIG_NAME = "config.yaml"
RUN_PREFIX = "run_"

# What a packaged run holds besides the weights its audit needs (weights/<trial>.npz).
REQUIRED_RUN_FILES = ("ledger.jsonl", "summary.json", "mllog.txt", "audit.json")
OPTIONAL_RUN_FILES = ("telemetry.jsonl",)
# A run's report.html stays out: a page is not evidence (the check cannot vouch for what it shows);
# `aiperf report` makes one from the verified ledger.
REPORT_PAGE = "report.html"
WEIGHTS_DIR = "weights"

# Bounds (docs/submission.md). A ResNet-50 weights file is about 100 MB, and an audit keeps the
# best and four sampled trials' of each run: five runs of the official workload fit in 4 GiB.
MAX_PACKAGE_BYTES = 4 * 2**30
MAX_FILE_BYTES = 1 * 2**30
MAX_RUNS = 100
MAX_FILES = 20_000
MAX_DEPTH = 8  # results/<system>/<workload>/run_<i>/weights/<file> is 6 deep
MAX_NAME_CHARS = 64  # one path component (a system or workload name, a file name)
MAX_INDEX_BYTES = 1 * 2**20  # package.json
MAX_MANIFEST_BYTES = 4 * 2**20  # 20,000 lines of at most ~200 bytes
MAX_DESCRIPTION_BYTES = 4 * 2**20  # systems/<system>.json

_PORTABLE = re.compile(r"[A-Za-z0-9._-]+")


def is_portable(component: str) -> bool:
    """A path component every file system and archive tool keeps as it is: ``[A-Za-z0-9._-]``, not hidden."""
    return (
        0 < len(component) <= MAX_NAME_CHARS
        and _PORTABLE.fullmatch(component) is not None
        and not component.startswith((".", "-"))
    )


def portable_name(text: str) -> str:
    """``text`` as a path component: runs of other characters become ``-``, at most 64 characters.

    ``"Example Cluster (A100)"`` -> ``"Example-Cluster-A100"``; a name with nothing portable in it
    gives an empty string, which the caller refuses.
    """
    name = re.sub(r"[^A-Za-z0-9._]+", "-", text).strip("-.")
    return name[:MAX_NAME_CHARS].rstrip("-.")


def system_file(system: str) -> str:
    return f"{SYSTEMS}/{system}.json"


def entry_dir(system: str, workload: str) -> str:
    return f"{RESULTS}/{system}/{workload}"


def config_file(system: str, workload: str) -> str:
    return f"{entry_dir(system, workload)}/{CONFIG_NAME}"


def run_dir(system: str, workload: str, index: int) -> str:
    """``results/<system>/<workload>/run_<index>``, counted from 1."""
    return f"{entry_dir(system, workload)}/{RUN_PREFIX}{index}"


def inside(package: Path, relative: str) -> Path | None:
    """``package / relative`` when ``relative`` is a portable relative posix path that stays inside, else None.

    No ``..``, no absolute path, no empty or hidden component: a manifest or index entry that
    names anything else is a finding, never a file that is read.
    """
    if not isinstance(relative, str) or not relative or len(relative) > 1024 or "\\" in relative:
        return None
    parts = PurePosixPath(relative).parts
    if relative.startswith("/") or not parts or len(parts) > MAX_DEPTH or not all(is_portable(p) for p in parts):
        return None
    if "/".join(parts) != relative:  # "a//b", "a/./b", "a/" are not the path they seem
        return None
    return package.joinpath(*parts)


@dataclass(frozen=True)
class PackageEntry:
    """One system and workload: the resolved config its runs share and the runs, as package-relative posix paths."""

    system: str
    workload: str
    config: str
    runs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PackageIndex:
    """``package.json``, typed. ``commit`` is the source commit the runs were made with (None when they differ)."""

    format: str
    created: str
    aiperf_version: str
    commit: str | None
    entries: list[PackageEntry]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def system_names(self) -> list[str]:
        return sorted({e.system for e in self.entries})


def _strings(value: object, what: str, source: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AiperfError(f"{source}: {what} must be a list of strings")
    return list(value)


@overload
def _string(data: Mapping[str, object], key: str, source: str, *, optional: Literal[False] = False) -> str: ...


@overload
def _string(data: Mapping[str, object], key: str, source: str, *, optional: Literal[True]) -> str | None: ...


def _string(data: Mapping[str, object], key: str, source: str, *, optional: bool = False) -> str | None:
    value = data.get(key)
    if (value is None and optional) or isinstance(value, str):
        return value
    raise AiperfError(f"{source}: {key} must be a string{' or null' if optional else ''} (got {excerpt(value)})")


def parse_package_json(data: object, source: str = PACKAGE_JSON) -> PackageIndex:
    """A parsed ``package.json`` as a :class:`PackageIndex`; :class:`AiperfError` (exit 2) when it has another shape.

    Only the shape is checked here; whether the paths are portable and inside the package is
    ``aiperf check``'s business (:func:`inside`), so it can report them as findings.
    """
    if not isinstance(data, dict):
        raise AiperfError(f"{source}: not a JSON object")
    if data.get("format") != PACKAGE_FORMAT:
        raise AiperfError(f"{source}: format {excerpt(data.get('format'))} is not {PACKAGE_FORMAT!r}")
    entries_raw = data.get("entries")
    if not isinstance(entries_raw, list) or len(entries_raw) > MAX_RUNS:
        raise AiperfError(f"{source}: entries must be a list of at most {MAX_RUNS} entries")
    entries = []
    for k, raw in enumerate(entries_raw):
        where = f"{source}: entries[{k}]"
        if not isinstance(raw, dict):
            raise AiperfError(f"{where}: not a JSON object")
        runs = _strings(raw.get("runs"), "runs", where)
        if len(runs) > MAX_RUNS:
            raise AiperfError(f"{where}: more than {MAX_RUNS} runs")
        entries.append(
            PackageEntry(
                system=_string(raw, "system", where),
                workload=_string(raw, "workload", where),
                config=_string(raw, "config", where),
                runs=runs,
            )
        )
    return PackageIndex(
        format=PACKAGE_FORMAT,
        created=_string(data, "created", source),
        aiperf_version=_string(data, "aiperf_version", source),
        commit=_string(data, "commit", source, optional=True),
        entries=entries,
    )


def read_package_json(path: Path) -> PackageIndex:
    """Read ``DIR/package.json`` (``path`` is the package directory or the file itself).

    Raises :class:`AiperfError` (exit 2) when there is no such file, it is not a regular file
    of at most 1 MiB, not JSON, or not of the package's shape.
    """
    path = Path(path)
    file = path / PACKAGE_JSON if path.is_dir() else path
    shown = str(file) if str(file).isprintable() else excerpt(str(file), 200)
    try:
        raw = read_bounded(file, MAX_INDEX_BYTES)
    except FileNotFoundError:
        raise AiperfError(f"{shown}: no such file (not an aiperf package)") from None
    except OSError as exc:
        raise AiperfError(f"{shown}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise AiperfError(f"{shown}: not valid JSON") from None
    return parse_package_json(data, shown)


def read_bounded(path: Path, limit: int) -> bytes:
    """A regular file of at most ``limit`` bytes, not through a symbolic link; ``OSError`` otherwise.

    A package comes from someone else: a link could point anywhere on the checker's machine, a
    FIFO would block and a huge file would fill its memory (:func:`aiperf.ledger.files.read_regular`).
    """
    import errno
    import os
    import stat

    from aiperf.ledger.files import read_regular

    if stat.S_ISLNK(os.lstat(path).st_mode):
        raise OSError(errno.ELOOP, "a symbolic link (a package holds files only)", str(path))
    data = read_regular(path, limit)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit:,} bytes", str(path))
    return data
