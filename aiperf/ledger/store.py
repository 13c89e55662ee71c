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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, cast

from aiperf.errors import AiperfError, os_error
from aiperf.ledger.files import LineTooLong, bounded_lines, open_regular
from aiperf.ledger.json_types import JSONObject, JSONValue
from aiperf.ledger.schema import HEADER, Record, RecordT, RecordType, parse_record, parse_records

logger = logging.getLogger(__name__)

LEDGER_NAME = "ledger.jsonl"
SLOW_SYNC_S = 1.0  # an fsync slower than this is storage the run should hear about (NFS under load, a dying disk)
MAX_RECORD_DEPTH = 32  # real records nest at most 6 levels (a trial's graph); JSON libraries recurse
# The longest line a reader accepts. The longest records are a run_start of 16,384 nodes (its plan,
# about 3 MB) and a trial_start of a graph at the layer limit (under 1 MB).
MAX_RECORD_BYTES = 16 << 20


class LedgerWriteError(AiperfError):
    """The ledger could not be written; what was recorded before is intact and resumable."""


def canonical(record: Mapping[str, object]) -> bytes:
    """The exact bytes that are hashed: sorted keys, no whitespace, no NaN."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def record_hash(record: Mapping[str, object]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(canonical(body)).hexdigest()


_encode = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False).encode


def hashed_line(body: Mapping[str, object]) -> tuple[str, bytes]:
    """``record_hash(body)`` and ``canonical(body + its hash)``, with every field encoded once.

    The writer used to encode each record twice, once to hash it and once to write it: at
    65,536 simulated workers the second encoding of every trial's graph was a twentieth of the
    master's start-up fill. Sorted ``"key":value`` pieces joined by commas are exactly what
    :func:`canonical` writes, so the pieces serve both.
    """
    if "hash" in body or not all(type(k) is str for k in body):
        raise ValueError("a record body has string keys and no hash yet")
    pieces = {k: f"{_encode(k)}:{_encode(v)}" for k, v in body.items()}
    digest = hashlib.sha256(("{" + ",".join(pieces[k] for k in sorted(pieces)) + "}").encode()).hexdigest()
    pieces["hash"] = f'"hash":"{digest}"'
    return digest, ("{" + ",".join(pieces[k] for k in sorted(pieces)) + "}").encode()


class LedgerWriter:
    """Appends records to a run's ledger; reopening an existing ledger continues its chain."""

    def __init__(self, run_dir: str | Path, clock_offset: float = 0.0) -> None:
        self.path = Path(run_dir) / LEDGER_NAME
        self._seq = 0
        self._prev = ""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                last = last_record(self.path, repair=True)  # one record in memory, not the whole ledger
                if last is not None:
                    # Whoever reopens a ledger has read it through first (``--resume``, ``aiperf audit``):
                    # its records, the last one's seq and hash included, are of their model's shape.
                    self._seq = cast(int, last["seq"]) + 1
                    self._prev = cast(str, last["hash"])
            # Unbuffered: each record goes to the OS in whole-line writes we can account for.
            self._fh = open(self.path, "ab", buffering=0)  # noqa: SIM115 - held open for the run's lifetime
            self._size = os.fstat(self._fh.fileno()).st_size  # end of the last complete record
        except OSError as exc:
            raise os_error(exc, self.path, "open the ledger") from None
        self._t0 = time.monotonic() - clock_offset
        self._subscribers: list[Callable[[Record], None]] = []
        self._batch_depth = 0
        self._unsynced: list[Record] = []  # written and flushed, not yet fsync'ed
        self._unsynced_since = math.inf  # monotonic time of the oldest of them
        self.broken: LedgerWriteError | None = None
        self._slow_sync_warned = -math.inf

    @property
    def next_seq(self) -> int:
        """The seq the next record gets: how many records the ledger holds."""
        return self._seq

    def subscribe(self, callback: Callable[[Record], None]) -> None:
        """Call ``callback(record)`` after each record is durably written (e.g. the MLPerf-style log)."""
        self._subscribers.append(callback)

    @contextlib.contextmanager
    def batch(self, durable: bool = True) -> Iterator[LedgerWriter]:
        """Records appended inside share one fsync when the (outermost) batch ends, even on an error.

        Each is still written and flushed at once, so a killed process loses none of them;
        subscribers see them after that fsync. ``durable=False`` leaves the fsync to the next
        :meth:`sync` or :meth:`sync_due` (group commit: the master syncs before it acts on the
        records, and at most ``MAX_UNSYNCED_S`` after they were written; docs/ledger.md).
        """
        self._batch_depth += 1
        try:
            yield self
        finally:
            self._batch_depth -= 1
            if self._batch_depth == 0 and durable:
                self.sync()

    def sync_due(self, max_age_s: float) -> None:
        """:meth:`sync` when the oldest record not yet durable was written ``max_age_s`` ago or more."""
        if self._unsynced and time.monotonic() - self._unsynced_since >= max_age_s:
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
        self._unsynced_since = math.inf
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
        raw["hash"], line = hashed_line(raw)
        line += b"\n"
        self._write_line(line)
        self._seq += 1
        self._prev = raw["hash"]
        written = record.model_copy(update={**header, "prev": raw["prev"], "hash": raw["hash"]})
        if not self._unsynced:
            self._unsynced_since = time.monotonic()
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

    records: list[JSONObject]
    end: int  # byte offset just after the last complete record
    size: int  # the file's size
    torn_bytes: int  # bytes after the last record that are not one (a write cut short), 0 if none

    def torn_note(self, path: str | Path) -> str | None:
        """One line saying what a reader dropped, or None when the file ends cleanly."""
        return _torn_note(path, self.torn_bytes, self.records[-1] if self.records else None)


def _torn_note(path: str | Path, torn_bytes: int, last: JSONObject | None) -> str | None:
    if not torn_bytes:
        return None
    after = f"after seq {last.get('seq')}" if last is not None else "before any record"
    return (
        f"{path}: ignored a torn final record ({torn_bytes} byte(s) {after}, cut short by a crash); it is not counted"
    )


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not allowed in a ledger")


# orjson parses a ledger line 2-3 times faster than the standard library (benchmarks/RESULTS.md, "The ledger
# at 10 million records"). It reads integers beyond 64 bits as floats, where the standard library keeps them
# exact, so a line with a run of 19 or more digits is left to the standard library, and so is every line
# orjson refuses: the standard library's verdict (and its refusals' wording) is the one that counts.
try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - a dependency; the standard library alone reads the same, slower
    _orjson = None  # type: ignore[assignment]
# Digits turned into NUL bytes, so a run of 19 is found by a substring search (a regular expression
# was eight times slower); a NUL in the line itself, which JSON does not allow, only sends it to the
# standard library.
_DIGITS_TO_NUL = bytes.maketrans(b"0123456789", bytes(10))
_LONG_NUMBER = bytes(19)


def parse_line(line: bytes) -> JSONValue:
    """One ledger line as JSON, exactly as ``json.loads`` reads it; ``NaN`` and ``Infinity`` are refused.

    Raises ``ValueError`` for anything that is not JSON (``RecursionError`` for nesting deep
    enough to exhaust the parser's stack).
    """
    if _orjson is not None and _LONG_NUMBER not in line.translate(_DIGITS_TO_NUL):
        try:
            return _orjson.loads(line)
        except _orjson.JSONDecodeError:
            pass  # the standard library decides, and words, the refusal
    return json.loads(line, parse_constant=_reject_constant)


def sorted_json(value: object) -> bytes:
    """``value`` as compact JSON with sorted keys: a key to tell documents apart by content (not for hashing)."""
    if _orjson is not None:
        try:
            return _orjson.dumps(value, option=_orjson.OPT_SORT_KEYS)
        except TypeError:  # an integer beyond 64 bits, a key that is not a string
            pass
    return json.dumps(value, sort_keys=True).encode()


_HASH_FIELD = b'"hash":"'


def line_hash_matches(line: bytes, claimed: object) -> bool:
    """Whether ``line`` is a record whose own bytes, less its ``hash`` field, hash to ``claimed``.

    A line the writer wrote is the canonical JSON it hashed with ``"hash":"..."`` put in its
    sorted place, so hashing the bytes around that field is the chain's hash without parsing
    and re-serialising the record (about as costly as parsing it). A line that is not in that
    form (re-indented by hand, written by another tool) does not match here and is hashed the
    long way (:func:`record_hash`), so it verifies exactly as before.
    """
    if not isinstance(claimed, str) or len(claimed) != 64:
        return False
    field = _HASH_FIELD + claimed.encode("ascii", "replace") + b'"'
    at = line.find(field)
    if at <= 0:
        return False
    stop = at + len(field)
    body = line.rstrip(b"\n")
    if body[stop : stop + 1] == b",":
        body = body[:at] + body[stop + 1 :]
    elif body[at - 1 : at] == b",":
        body = body[: at - 1] + body[stop:]
    else:
        return False
    return hashlib.sha256(body).hexdigest() == claimed


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


class LedgerStream:
    """A ledger file's complete records, read one line at a time: memory does not grow with the file.

    Iterating yields ``(line, record)``: the line's bytes as written (newline included) and its
    JSON object. The checks are those of every reader (docs/ledger.md, Reading a ledger): a
    torn final line is left out and measured (``end``, ``size``, ``torn_bytes`` once the
    iteration is over), anything else malformed raises :class:`~aiperf.errors.AiperfError`
    when the reader reaches it. ``count`` and ``last`` are the records yielded so far and the
    latest of them. Each line is read with at most ``MAX_RECORD_BYTES`` of it in memory: a
    longer line (a sparse 1 GB tail, a forged record) is refused by its offset before it is held.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = _ledger_path(path)
        self.end = 0  # byte offset just after the last complete record
        self.size = 0  # bytes read so far: the file's size once the iteration ends
        self.torn_bytes = 0
        self.count = 0
        self.last: JSONObject | None = None
        self.last_number = 0  # the line number of the latest record

    def torn_note(self, path: str | Path | None = None) -> str | None:
        """One line saying what a reader dropped, or None when the file ends cleanly."""
        return _torn_note(self.path if path is None else path, self.torn_bytes, self.last)

    def __iter__(self) -> Iterator[tuple[bytes, JSONObject]]:
        path = self.path
        try:
            fh = open_regular(path)
        except FileNotFoundError:
            raise AiperfError(f"{path}: no ledger here (is this a run directory?)") from None
        except OSError as exc:
            raise os_error(exc, path, "read the ledger") from None
        bad: tuple[int, AiperfError] | None = None  # a malformed line: torn only if nothing but blanks follows
        with fh:
            try:
                for number, start, line in bounded_lines(fh, MAX_RECORD_BYTES):
                    self.size = start + len(line)
                    if not line.strip():
                        continue
                    if bad is not None:
                        raise bad[1]
                    if not line.endswith(b"\n"):  # the last line, with no newline: cut short by a crash
                        self.torn_bytes = self.size - start
                        return
                    try:
                        record = parse_line(line)
                    except RecursionError:
                        raise AiperfError(f"{path}: line {number} is nested too deeply to be a ledger record") from None
                    except ValueError:  # not JSON, not UTF-8, NaN/Infinity, an integer of more than 4,300 digits
                        bad = (start, AiperfError(f"{path}: line {number} is not valid JSON"))
                        continue
                    if not isinstance(record, dict):
                        raise AiperfError(f"{path}: line {number} is not a JSON object")
                    if _too_deep(line):
                        raise AiperfError(f"{path}: line {number} nests more than {MAX_RECORD_DEPTH} levels deep")
                    self.end = self.size
                    self.count += 1
                    self.last = record
                    self.last_number = number
                    yield line, record
            except LineTooLong as exc:
                raise AiperfError(
                    f"{path}: the line at byte {exc.offset:,} (after {self.count} record(s)) is longer than "
                    f"{exc.limit:,} bytes, the most a ledger record may hold: not a record aiperf writes"
                ) from None
            except OSError as exc:
                raise os_error(exc, path, "read the ledger") from None
        if bad is not None:
            self.torn_bytes = self.size - bad[0]


def read_ledger_contents(path: str | Path) -> LedgerContents:
    """Parse a whole ledger file into memory (:class:`LedgerStream` reads it without holding it)."""
    stream = LedgerStream(path)
    records = [record for _, record in stream]
    return LedgerContents(records, stream.end, stream.size, stream.torn_bytes)


def _repair(path: Path, end: int) -> None:
    try:
        with open(path, "r+b") as fh:
            fh.truncate(end)
    except OSError as exc:
        raise os_error(exc, path, "repair the torn end of the ledger") from None


def cut_torn_tail(stream: LedgerStream) -> None:
    """Cut off the torn tail a finished read of ``stream`` found (only the run's master may: it holds the lock)."""
    if stream.torn_bytes:
        _repair(stream.path, stream.end)


def last_record(path: str | Path, repair: bool = False) -> JSONObject | None:
    """The ledger's last complete record (None for an empty one), every line checked on the way, in bounded memory.

    With ``repair`` a torn tail is cut off, as :func:`read_raw_ledger` does.
    """
    stream = LedgerStream(path)
    for _ in stream:
        pass
    if repair and stream.torn_bytes:
        _repair(stream.path, stream.end)
    return stream.last


def read_raw_ledger(path: str | Path, repair: bool = False) -> list[JSONObject]:
    """All complete records as JSON objects (``verify`` checks their hashes and shapes itself).

    With ``repair`` a torn tail is cut off so appends continue cleanly. Only the run's
    master may repair (it holds the run lock): a tail being written by a live master looks
    torn to anyone else.
    """
    path = _ledger_path(path)
    contents = read_ledger_contents(path)
    if repair and contents.torn_bytes:
        _repair(path, contents.end)
    return contents.records


def read_ledger(path: str | Path, repair: bool = False) -> list[Record]:
    """Every complete record as its typed model; one line names the first malformed record.

    A ledger with no complete record, or one that does not begin with ``run_start``, is
    refused the same way: no reader can compute anything from it. It holds every record:
    readers of ledgers of any length use :func:`iter_ledger`.
    """
    return parse_records(read_raw_ledger(path, repair), _ledger_path(path))


def iter_ledger(path: str | Path, stream: LedgerStream | None = None) -> Iterator[Record]:
    """Every complete record as its typed model, one at a time (the checks of :func:`read_ledger`).

    Pass a :class:`LedgerStream` to learn, after the iteration, how the file ended.
    """
    stream = LedgerStream(path) if stream is None else stream
    source = stream.path
    for index, (_, raw) in enumerate(stream):
        if index == 0 and raw.get("type") != RecordType.RUN_START:
            raise AiperfError(f"{source}: the ledger does not begin with a run_start record")
        yield parse_record(raw, index, source)
    if stream.count == 0:
        raise AiperfError(f"{source}: the ledger has no complete record")
