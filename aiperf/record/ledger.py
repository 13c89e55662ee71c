"""The append-only, hash-chained run ledger (format in docs/ledger.md).

Each record is one JSON line, written with a single ``write`` of the whole line and flushed
before the call returns, so a process killed at any instant keeps every record it had
acknowledged; at worst the final line is torn, and readers drop a torn tail. Each record is
also fsync'ed before the call returns -- except inside :meth:`LedgerWriter.batch`, where the
records written while the master handles one batch of events share one fsync at the
batch's end (an fsync per record was a large share of the master's time with thousands of workers:
benchmarks/RESULTS.md, "Figures moved from code comments"). So
only an operating-system or machine crash can lose records, and only those of the batch
not yet synced; the master syncs before it acts on what it recorded.
Each record carries the SHA-256 of the previous one, so an edited, removed or reordered
record breaks the chain where it happened.

A write that fails (a full disk, a quota, an I/O error) never leaves half a record behind:
the file is cut back to its last complete record, the writer refuses further appends, and
the error names the file and says how to continue (``aiperf run --resume``). Readers are
just as careful with what they are given: ``NaN``/``Infinity`` tokens, records nested more
than ``MAX_RECORD_DEPTH`` levels deep and anything that is not a JSON object per line are
reported as unreadable input (:class:`~aiperf.errors.AiperfError`), never as a crash.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiperf.errors import AiperfError, os_error
from aiperf.record.files import LineTooLong, bounded_lines, open_regular
from aiperf.record.schema import HEADER, Record, RecordT, parse_records

logger = logging.getLogger(__name__)

LEDGER_NAME = "ledger.jsonl"
SLOW_SYNC_S = 1.0  # an fsync slower than this is storage the run should hear about (NFS under load, a dying disk)
MAX_RECORD_DEPTH = 32  # real records nest at most 6 levels (a trial's graph); JSON libraries recurse
# The longest line a reader accepts. The longest records are a run_start of 16,384 nodes (its plan,
# about 3 MB) and a trial_start of a graph at the layer limit (under 1 MB).
MAX_RECORD_BYTES = 16 << 20


class LedgerWriteError(AiperfError):
    """The ledger could not be written; what was recorded before is intact and resumable."""


def canonical(record: dict[str, Any]) -> bytes:
    """The exact bytes that are hashed: sorted keys, no whitespace, no NaN."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def record_hash(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(canonical(body)).hexdigest()


class LedgerWriter:
    """Appends records to a run's ledger; reopening an existing ledger continues its chain."""

    def __init__(self, run_dir: str | Path, clock_offset: float = 0.0) -> None:
        self.path = Path(run_dir) / LEDGER_NAME
        self._seq = 0
        self._prev = ""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                records = read_raw_ledger(self.path, repair=True)
                if records:
                    self._seq = records[-1]["seq"] + 1
                    self._prev = records[-1]["hash"]
            # Unbuffered: each record goes to the OS in whole-line writes we can account for.
            self._fh = open(self.path, "ab", buffering=0)  # noqa: SIM115 - held open for the run's lifetime
            self._size = os.fstat(self._fh.fileno()).st_size  # end of the last complete record
        except OSError as exc:
            raise os_error(exc, self.path, "open the ledger") from None
        self._t0 = time.monotonic() - clock_offset
        self._subscribers: list[Callable[[Record], None]] = []
        self._batch_depth = 0
        self._unsynced: list[Record] = []  # written and flushed, not yet fsync'ed
        self.broken: LedgerWriteError | None = None
        self._slow_sync_warned = -math.inf

    def subscribe(self, callback: Callable[[Record], None]) -> None:
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
        began = time.monotonic()
        try:
            os.fsync(self._fh.fileno())
        except OSError as exc:
            raise self._fail(exc, "sync the ledger") from None
        took = time.monotonic() - began
        if took > SLOW_SYNC_S and began - self._slow_sync_warned >= 60.0:  # at most once a minute
            self._slow_sync_warned = began
            logger.warning(
                f"{self.path}: an fsync of the ledger took {took:.1f} s; the master waits for each one "
                "(slow or overloaded storage under run.results_dir?)"
            )
        durable, self._unsynced = self._unsynced, []
        for record in durable:
            for callback in list(self._subscribers):
                self._notify(callback, record)

    def _notify(self, callback: Callable[[Record], None], record: Record) -> None:
        """A subscriber writes a view derived from the ledger: if it cannot write, it stops, not the run."""
        try:
            callback(record)
        except (OSError, AiperfError) as exc:
            self._subscribers.remove(callback)
            what = getattr(callback, "path", None) or getattr(callback, "__name__", "an observer")
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            logger.warning(f"{what} is no longer written ({reason}); it can be rebuilt from the ledger")

    def _fail(self, exc: OSError, doing: str) -> LedgerWriteError:
        run_dir = self.path.parent
        error = os_error(
            exc,
            self.path,
            doing,
            then=f"every record written before is kept: continue the run with `aiperf run --resume {run_dir}`",
            exit_code=1,
        )
        self.broken = LedgerWriteError(str(error), exit_code=1)
        return self.broken

    def elapsed(self) -> float:
        """Seconds since run start on this master's clock (including any resume offset)."""
        return time.monotonic() - self._t0

    def append(self, record: RecordT) -> RecordT:
        """Write ``record`` with its header filled in; returns it as a reader will read it back.

        Exactly the fields the writer set are written (``None`` included), so a record's
        bytes and hash depend on what its writer said, not on the model's defaults.
        """
        if self.broken is not None:
            raise self.broken
        fields = record.model_dump(exclude_unset=True, exclude=set(HEADER))
        t = record.t if "t" in record.model_fields_set else self.elapsed()
        header = {"seq": self._seq, "type": record.type, "t": round(t, 6), "wall": round(time.time(), 6)}
        raw = {**header, **fields, "prev": self._prev}
        raw["hash"] = record_hash(raw)
        line = canonical(raw) + b"\n"
        self._write_line(line)
        self._seq += 1
        self._prev = raw["hash"]
        written = record.model_copy(update={**header, "prev": raw["prev"], "hash": raw["hash"]})
        self._unsynced.append(written)
        if self._batch_depth == 0:
            self.sync()
        return written

    def _write_line(self, line: bytes) -> None:
        """Write one whole line, or nothing: a partial write is cut off again before the error is raised."""
        view = memoryview(line)
        try:
            while view:
                written = self._fh.write(view)
                if not written:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a 0-byte write: the device is full
                view = view[written:]
        except OSError as exc:
            with contextlib.suppress(OSError):  # shrinking a file needs no free space
                os.ftruncate(self._fh.fileno(), self._size)
            raise self._fail(exc, "write to the ledger") from None
        self._size += len(line)

    def close(self) -> None:
        if not self._fh.closed:
            try:
                if self.broken is None:
                    self.sync()
            finally:
                self._fh.close()

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class LedgerContents:
    """The complete records of a ledger file, and what a crash left after them."""

    records: list[dict[str, Any]]
    end: int  # byte offset just after the last complete record
    size: int  # the file's size
    torn_bytes: int  # bytes after the last record that are not one (a write cut short), 0 if none

    def torn_note(self, path: str | Path) -> str | None:
        """One line saying what a reader dropped, or None when the file ends cleanly."""
        if not self.torn_bytes:
            return None
        after = f"after seq {self.records[-1].get('seq')}" if self.records else "before any record"
        return (
            f"{path}: ignored a torn final record ({self.torn_bytes} byte(s) {after}, cut short by a crash); "
            "it is not counted"
        )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in a ledger")


_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # a backslash escape inside a JSON string
_NOT_STRUCTURE = bytes(set(range(256)) - set(b'[]{}"'))
_STRING = re.compile(rb'"[^"]*"')
_INNERMOST = re.compile(rb"\[\]|\{\}")


def _too_deep(line: bytes, limit: int = MAX_RECORD_DEPTH) -> bool:
    """Whether a line of valid JSON nests containers more than ``limit`` levels deep.

    Works on the text without recursion: escapes, then everything but brackets and quotes,
    then strings are dropped, and the innermost bracket pairs are peeled off once per level
    (far cheaper than walking the parsed object: benchmarks/RESULTS.md, "Figures moved from code comments").
    """
    if line.count(b"[") + line.count(b"{") <= limit:
        return False
    brackets = _STRING.sub(b"", _ESCAPE.sub(b"", line).translate(None, _NOT_STRUCTURE))
    for _ in range(limit):
        if not brackets:
            return False
        brackets = _INNERMOST.sub(b"", brackets)
    return bool(brackets)


def _ledger_path(path: str | Path) -> Path:
    path = Path(path)
    try:
        return path / LEDGER_NAME if path.is_dir() else path
    except OSError:  # a name too long, a loop: reported when it is read
        return path


def read_ledger_contents(path: str | Path) -> LedgerContents:
    """Parse a ledger file; a torn final line is left out and measured, anything else malformed is an error.

    Read line by line with at most ``MAX_RECORD_BYTES`` per line: a longer line (a sparse 1 GB
    tail, a forged record) is refused by its offset before it is held in memory.
    """
    path = _ledger_path(path)
    try:
        fh = open_regular(path)
    except FileNotFoundError:
        raise AiperfError(f"{path}: no ledger here (is this a run directory?)") from None
    except OSError as exc:
        raise os_error(exc, path, "read the ledger") from None
    records: list[dict[str, Any]] = []
    end = 0  # just after the last complete record
    size = 0  # bytes read so far: the file's size once the loop ends
    bad: tuple[int, AiperfError] | None = None  # a malformed line: torn only if nothing but blanks follows
    with fh:
        try:
            for number, start, line in bounded_lines(fh, MAX_RECORD_BYTES):
                size = start + len(line)
                if not line.strip():
                    continue
                if bad is not None:
                    raise bad[1]
                if not line.endswith(b"\n"):  # the last line, with no newline: cut short by a crash
                    return LedgerContents(records, end, size, size - start)
                try:
                    record = json.loads(line, parse_constant=_reject_constant)
                except RecursionError:
                    raise AiperfError(f"{path}: line {number} is nested too deeply to be a ledger record") from None
                except ValueError:  # not JSON, not UTF-8, NaN/Infinity, an integer of more than 4,300 digits
                    bad = (start, AiperfError(f"{path}: line {number} is not valid JSON"))
                    continue
                if not isinstance(record, dict):
                    raise AiperfError(f"{path}: line {number} is not a JSON object")
                if _too_deep(line):
                    raise AiperfError(f"{path}: line {number} nests more than {MAX_RECORD_DEPTH} levels deep")
                records.append(record)
                end = size
        except LineTooLong as exc:
            raise AiperfError(
                f"{path}: the line at byte {exc.offset:,} (after {len(records)} record(s)) is longer than "
                f"{exc.limit:,} bytes, the most a ledger record may hold: not a record aiperf writes"
            ) from None
        except OSError as exc:
            raise os_error(exc, path, "read the ledger") from None
    if bad is not None:
        return LedgerContents(records, end, size, size - bad[0])
    return LedgerContents(records, end, size, 0)


def read_raw_ledger(path: str | Path, repair: bool = False) -> list[dict[str, Any]]:
    """All complete records as JSON objects (``verify`` checks their hashes and shapes itself).

    With ``repair`` a torn tail is cut off so appends continue cleanly. Only the run's
    master may repair (it holds the run lock): a tail being written by a live master looks
    torn to anyone else.
    """
    path = _ledger_path(path)
    contents = read_ledger_contents(path)
    if repair and contents.torn_bytes:
        try:
            with open(path, "r+b") as fh:
                fh.truncate(contents.end)
        except OSError as exc:
            raise os_error(exc, path, "repair the torn end of the ledger") from None
    return contents.records


def read_ledger(path: str | Path, repair: bool = False) -> list[Record]:
    """Every complete record as its typed model; one line names the first malformed record.

    A ledger with no complete record, or one that does not begin with ``run_start``, is
    refused the same way: no reader can compute anything from it.
    """
    return parse_records(read_raw_ledger(path, repair), _ledger_path(path))
