"""Trained weights the master keeps so that children can inherit them.

Only the best ``capacity`` trials are kept (children are proposed from good parents);
each kept set is also written to the run directory so ``--resume`` can still hand them to
children after a master restart. Weights reach workers through the pool (Ray's object
store), never through a shared filesystem.

The files are a convenience for ``--resume`` and the evidence ``aiperf audit`` re-evaluates:
each file's SHA-256 and size are known the moment it is written (:meth:`WeightStore.saved`),
so the master can record them in the ledger and a file swapped afterwards is detected. When
one cannot be written (a full disk) the set stays in memory, no partial file is left, the run
goes on, and the problem is logged once per cause as a warning.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import logging
import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aiperf.errors import first_line, os_error
from aiperf.record.files import write_atomic

logger = logging.getLogger(__name__)

Weights = dict[int, list[np.ndarray]]


@dataclass(frozen=True)
class SavedFile:
    """A weights file as written: its path relative to the run directory, SHA-256 and size of its bytes."""

    file: str
    sha256: str
    size: int


def weights_bytes(weights: Weights) -> bytes:
    """The ``.npz`` bytes of a weight set (arrays named ``node:index``)."""
    arrays: dict[str, Any] = {f"{node}:{k}": a for node, arrs in weights.items() for k, a in enumerate(arrs)}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def file_sha256(path: str | Path) -> tuple[str, int]:
    """SHA-256 hex and size of a regular file's bytes (read in chunks: weight files can be large).

    ``aiperf audit`` hashes the files of a run directory that may come from someone else: a
    FIFO or a device where a weights file belongs raises ``OSError`` (``EINVAL``, "not a
    regular file") instead of blocking or reading for ever. Opened non-blocking, which a
    regular file ignores.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        digest, size = hashlib.sha256(), 0
        with os.fdopen(fd, "rb", closefd=False) as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        return digest.hexdigest(), size
    finally:
        os.close(fd)


def save_weights(weights: Weights, path: Path) -> tuple[str, int]:
    """Write atomically (unique temp file + rename) so a crash or a full disk never leaves a partial file.

    Returns the SHA-256 hex and size of the bytes written: hashed from the very bytes that go
    to disk, not re-read, so what the ledger records is what this process wrote.
    """
    data = weights_bytes(weights)
    write_atomic(path, data)
    return hashlib.sha256(data).hexdigest(), len(data)


def load_weights(path: Path) -> Weights:
    out: Weights = {}
    with np.load(path) as data:
        keys = sorted(data.files, key=lambda k: (int(k.split(":")[0]), int(k.split(":")[1])))
        for key in keys:
            node = int(key.split(":")[0])
            out.setdefault(node, []).append(data[key])
    return out


class WeightStore:
    """The best trials' weights, in memory and on disk; lookups by trial id."""

    def __init__(self, capacity: int, directory: str | Path | None = None) -> None:
        self.capacity = capacity
        self.directory = Path(directory) if directory else None
        if self.directory:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise os_error(exc, self.directory, "create the weights folder") from None
        self._warned: set[Any] = set()
        self._weights: dict[str, Weights] = {}
        self._score: dict[str, float] = {}
        self._refs: dict[str, Any] = {}
        self._saved: dict[str, SavedFile] = {}

    def __contains__(self, trial: str) -> bool:
        return trial in self._weights

    def __len__(self) -> int:
        return len(self._weights)

    def put(self, trial: str, weights: Weights, score: float) -> bool:
        """Keep ``weights`` if they rank among the best; returns whether they were kept."""
        if len(self._weights) >= self.capacity:
            worst = min(self._score, key=lambda t: (self._score[t], t))
            if self._score[worst] >= score:
                return False
            self._evict(worst)
        self._weights[trial] = weights
        self._score[trial] = score
        if self.directory:
            path = self.directory / f"{trial}.npz"
            try:
                digest, size = save_weights(weights, path)
                self._saved[trial] = SavedFile(f"{self.directory.name}/{path.name}", digest, size)
            except OSError as exc:
                if exc.errno not in self._warned:
                    self._warned.add(exc.errno)
                    note = "kept in memory; a --resume retrains children without them"
                    logger.warning(str(os_error(exc, path, "save weights to", then=note)))
        return True

    def _evict(self, trial: str) -> None:
        self._weights.pop(trial, None)
        self._score.pop(trial, None)
        self._refs.pop(trial, None)
        self._saved.pop(trial, None)
        if self.directory:
            with contextlib.suppress(OSError):
                (self.directory / f"{trial}.npz").unlink(missing_ok=True)

    def saved(self, trial: str) -> SavedFile | None:
        """The file this store wrote for ``trial`` in this session (None: not kept, not written, or evicted)."""
        return self._saved.get(trial)

    def get(self, trial: str) -> Weights | None:
        return self._weights.get(trial)

    def shared(self, trial: str, put: Any) -> Any:
        """A handle to hand to workers (e.g. a Ray object ref), created once per trial."""
        if trial not in self._weights:
            return None
        if trial not in self._refs:
            self._refs[trial] = put(self._weights[trial])
        return self._refs[trial]

    def reload(self, scores: dict[str, float]) -> list[str]:
        """After a restart: load the kept sets still on disk for trials with known scores.

        A file that cannot be read back (cut short, corrupt, unreadable) is skipped with a
        warning naming it; its trial's children then start from scratch instead of inheriting.
        Returns the files skipped (relative to the run directory), for the ``resume`` record.
        """
        skipped: list[str] = []
        if not self.directory:
            return skipped
        for path in sorted(self.directory.glob("t*.npz")):
            trial = path.stem
            if trial in scores and trial not in self._weights:
                try:
                    self._weights[trial] = load_weights(path)
                except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
                    logger.warning(
                        f"{path}: kept weights cannot be read back ({first_line(exc, 120)}); "
                        f"trials that would inherit from {trial} start from scratch"
                    )
                    skipped.append(f"{path.parent.name}/{path.name}")
                    continue
                self._score[trial] = scores[trial]
        return skipped
