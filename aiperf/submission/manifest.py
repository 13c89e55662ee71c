"""``MANIFEST.sha256``: the SHA-256 of every file in a package, in ``sha256sum``'s own format.

``<64 hex digits>  <relative posix path>`` per line, sorted by path, every file but the manifest
itself, so ``cd DIR && sha256sum -c MANIFEST.sha256`` checks a package without aiperf. The manifest
catches a file changed, added or lost after packaging (a copy gone wrong, a hand edit); like the
ledger's chain it has no key, so it does not stop a forger who rewrites it -- that is what the
checker's other checks are for.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from aiperf.errors import excerpt
from aiperf.submission.layout import MANIFEST, MAX_MANIFEST_BYTES, inside, read_bounded

_LINE = re.compile(r"([0-9a-f]{64})  (.+)")
CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_text(hashes: dict[str, str]) -> str:
    """The manifest of ``{relative path: sha256}``, sorted by path."""
    return "".join(f"{hashes[p]}  {p}\n" for p in sorted(hashes))


def write_manifest(package: Path, files: Iterable[str]) -> None:
    """Hash ``files`` (relative posix paths inside ``package``) and write the manifest beside them."""
    text = manifest_text({p: file_sha256(package / p) for p in files if p != MANIFEST})
    (package / MANIFEST).write_text(text, encoding="ascii")


@dataclass
class Manifest:
    """A parsed manifest: the listed hashes and what was wrong with its lines."""

    hashes: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def read_manifest(package: Path) -> Manifest:
    """Parse ``MANIFEST.sha256``; a line that is not ``<sha256>  <portable path inside>`` is a problem, not an error."""
    out = Manifest()
    try:
        text = read_bounded(package / MANIFEST, MAX_MANIFEST_BYTES).decode("ascii")
    except FileNotFoundError:
        out.problems.append(f"{MANIFEST} is missing")
        return out
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not ASCII text"
        out.problems.append(f"{MANIFEST} cannot be read ({reason})")
        return out
    paths: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        match = _LINE.fullmatch(line)
        if match is None:
            out.problems.append(f"{MANIFEST} line {number} is not '<sha256>  <path>': {excerpt(line)}")
            continue
        digest, path = match.groups()
        if inside(package, path) is None or path == MANIFEST:
            out.problems.append(
                f"{MANIFEST} line {number} names {excerpt(path)}, which is not a portable path inside the package"
            )
            continue
        if path in out.hashes:
            out.problems.append(f"{MANIFEST} line {number} lists {path} a second time")
            continue
        out.hashes[path] = digest
        paths.append(path)
    if paths != sorted(paths):
        out.problems.append(f"{MANIFEST} is not sorted by path")
    return out


def compare_manifest(package: Path, manifest: Manifest, files: Iterable[str]) -> list[str]:
    """Every file listed and of its hash, nothing listed missing; ``files``: what is really there."""
    present = set(files) - {MANIFEST}
    problems = [f"{p}: in the package but not in {MANIFEST}" for p in sorted(present - set(manifest.hashes))]
    for path, digest in sorted(manifest.hashes.items()):
        if path not in present:
            problems.append(f"{path}: listed in {MANIFEST} but missing from the package")
            continue
        try:
            actual = file_sha256(package / path)
        except OSError as exc:
            problems.append(f"{path}: cannot be read ({exc.strerror or exc})")
            continue
        if actual != digest:
            problems.append(
                f"{path}: SHA-256 {actual[:16]}... does not match {MANIFEST} ({digest[:16]}...): "
                "changed after packaging"
            )
    return problems
