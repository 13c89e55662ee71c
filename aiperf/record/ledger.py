"""The append-only, hash-chained run ledger (format in docs/ledger.md).

Each record is one JSON line, written with a single ``write`` of the whole line and flushed
before the call returns, so a process killed at any instant keeps every record it had
acknowledged; at worst the final line is torn, and readers drop a torn tail. Each record is
also fsync'ed before the call returns -- except inside :meth:`LedgerWriter.batch`, where the
records written while the master handles one batch of events share one fsync at the
batch's end (an fsync per record was a seventh of the master's time at 4,096 workers). So
only an operating-system or machine crash can lose records, and only those of the batch
not yet synced; the master syncs before it acts on what it recorded.
Each record carries the SHA-256 of the previous one, so an edited, removed or reordered
record breaks the chain where it happened.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from aiperf.errors import AiperfError

LEDGER_NAME = "ledger.jsonl"


def canonical(record: dict[str, Any]) -> bytes:
    """The exact bytes that are hashed: sorted keys, no whitespace, no NaN."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def record_hash(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(canonical(body)).hexdigest()


def _clean(value: Any) -> Any:
    """Make a value JSON-safe: NaN/inf become None, tuples lists, NumPy scalars Python numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # NumPy scalar
        return _clean(value.item())
    return value


class LedgerWriter:
    """Appends records to a run's ledger; reopening an existing ledger continues its chain."""

    def __init__(self, run_dir: str | Path, clock_offset: float = 0.0) -> None:
        self.path = Path(run_dir) / LEDGER_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._seq = 0
        self._prev = ""
        if self.path.exists():
            records = read_ledger(self.path, repair=True)
            if records:
                self._seq = records[-1]["seq"] + 1
                self._prev = records[-1]["hash"]
        self._fh = open(self.path, "ab")  # noqa: SIM115 - held open for the run's lifetime
        self._t0 = time.monotonic() - clock_offset
        self._subscribers: list[Callable[[dict[str, Any]], None]] = []
        self._batch_depth = 0
        self._unsynced: list[dict[str, Any]] = []  # written and flushed, not yet fsync'ed

    def subscribe(self, callback: Callable[[dict[str, Any]], None]) -> None:
        """Call ``callback(record)`` after each record is durably written (e.g. the MLPerf-style log)."""
        self._subscribers.append(callback)

    @contextlib.contextmanager
    def batch(self) -> Iterator[LedgerWriter]:
        """Records appended inside share one fsync when the (outermost) batch ends, even on an error.

        Each is still written and flushed at once, so a killed process loses none of them;
        subscribers see them after that fsync.
        """
        self._batch_depth += 1
        try:
            yield self
        finally:
            self._batch_depth -= 1
            if self._batch_depth == 0:
                self.sync()

    def sync(self) -> None:
        """Make every record written so far durable, then hand the newly durable ones to the subscribers."""
        if not self._unsynced:
            return
        os.fsync(self._fh.fileno())
        durable, self._unsynced = self._unsynced, []
        for record in durable:
            for callback in self._subscribers:
                callback(record)

    def elapsed(self) -> float:
        """Seconds since run start on this master's clock (including any resume offset)."""
        return time.monotonic() - self._t0

    def append(self, rtype: str, **fields: Any) -> dict[str, Any]:
        record = {
            "seq": self._seq,
            "type": rtype,
            "t": round(fields.pop("t", self.elapsed()), 6),
            "wall": round(time.time(), 6),
            **_clean(fields),
            "prev": self._prev,
        }
        record["hash"] = record_hash(record)
        line = canonical(record) + b"\n"
        self._fh.write(line)
        self._fh.flush()
        self._seq += 1
        self._prev = record["hash"]
        self._unsynced.append(record)
        if self._batch_depth == 0:
            self.sync()
        return record

    def close(self) -> None:
        if not self._fh.closed:
            self.sync()
            self._fh.close()

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_ledger(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records in file order; a torn (unterminated or unparsable) final line is skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / LEDGER_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise AiperfError(f"{path}: no ledger here (is this a run directory?)") from None
    except OSError as exc:
        raise AiperfError(f"{path}: cannot read ({exc.strerror})") from None
    lines = data.split(b"\n")
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        last = k == len(lines) - 1  # no newline after it: possibly torn by a crash
        try:
            record = json.loads(line)
        except ValueError:
            if last or all(not rest.strip() for rest in lines[k + 1 :]):
                return
            raise AiperfError(f"{path}: line {k + 1} is not valid JSON") from None
        if last and not data.endswith(b"\n"):
            return
        if not isinstance(record, dict):
            raise AiperfError(f"{path}: line {k + 1} is not a JSON object")
        yield record


def read_ledger(path: str | Path, repair: bool = False) -> list[dict[str, Any]]:
    """All complete records. With ``repair`` a torn tail is cut off so appends continue cleanly."""
    path = Path(path)
    if path.is_dir():
        path = path / LEDGER_NAME
    records = list(iter_ledger(path))
    if repair and path.exists():
        data = path.read_bytes()
        good = sum(len(canonical(r)) + 1 for r in records)
        if good < len(data) and data[:good].count(b"\n") == len(records):
            with open(path, "r+b") as fh:
                fh.truncate(good)
    return records
