"""Pre-tokenized shards for the language-model workload: format, writer, memory-mapped reader, CLI.

A folder of shards is what the official LM workload trains on; the converter writes one from a
folder of text files with the byte-level tokenizer ("bytes": token id = byte value, vocabulary
256, id 0 ends every document -- a text file never holds byte 0, so the id is free).

Folder layout::

    OUT/manifest.json          written last: its presence means the folder is complete
    OUT/train/00000.tokens     the training split's shards, in order
    OUT/val/00000.tokens       the validation split's shards (whole documents held out)

Shard file (``*.tokens``), all integers little-endian::

    offset  size  field
         0     8  magic b"AIPERFTK"
         8     4  version (1)
        12     4  token width in bytes: 1, 2 or 4 (uint8 / uint16 / uint32), the smallest that
                  holds vocab_size ids -- 1 for vocab_size <= 256, 2 for <= 65536, else 4
        16     4  vocab_size: every token id is below it (1 .. 2**20)
        20     4  end-of-document token id, or 0xFFFFFFFF for none; when set, every document's
                  last token is this id
        24     8  documents D (1 .. 2**24)
        32     8  tokens T (1 .. 2**32)
        40    32  SHA-256 of bytes 0..39 followed by every byte from offset 72 to the end
        72  8(D+1) document offset table: uint64, 0 = o[0] < o[1] < ... < o[D] = T; document
                  i is tokens o[i] .. o[i+1]-1 (its end-of-document token included)
    72+8(D+1) T*w tokens (starts 8-byte aligned); the file ends here, exactly

Documents never straddle a shard or the train/validation split; training windows are cut from
a shard's token stream and may cross documents (the end-of-document token marks the seam).

Reading checks the header against the hard caps (``MAX_*``) and the file size against the
header's counts before anything is mapped or allocated, then the offset table; with
``verify`` (the default) one streaming pass over the mapped file checks the checksum and that
every token id is below ``vocab_size``. Each problem is one :class:`AiperfError` line naming
the shard. Nothing is loaded whole: windows are gathered from the memory map.

CLI::

    python -m aiperf.families.language.token_shards convert SRC_FOLDER OUT_FOLDER [--val-fraction 0.01]
        [--shard-tokens N] [--seed S]     every regular file under SRC (hidden names skipped) is one document
    python -m aiperf.families.language.token_shards check OUT_FOLDER   verify every shard; prints one line

``docs/lm-data.md`` describes the same format for people writing shards with other tools.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import stat
import struct
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NotRequired, TextIO, TypedDict, cast

import numpy as np

from aiperf.errors import AiperfError, excerpt, first_line, os_error

MAGIC = b"AIPERFTK"
VERSION = 1
SUPPORTED_VERSIONS = (1,)
HEADER = struct.Struct("<8sIIIIQQ32s")  # magic, version, width, vocab, eod, documents, tokens, sha256
HEADER_BYTES = HEADER.size  # 72
HASHED_HEADER_BYTES = 40  # the header before the checksum field
NO_EOD = 0xFFFFFFFF
FORMAT = "aiperf-tokens"
MANIFEST = "manifest.json"
SPLITS = ("train", "val")
BYTE_TOKENIZER = "bytes"
BYTE_VOCAB = 256
BYTE_EOD = 0

# Hard caps, checked against the header (or the manifest, or the command line) before any work.
MAX_VOCAB = 1 << 20  # nas.language.spec's MAX_VOCAB
MAX_SHARD_TOKENS = 1 << 32
MAX_SHARD_DOCUMENTS = 1 << 24  # the offset table is at most 128 MiB
MAX_SHARDS = 1 << 16  # per split
MAX_MANIFEST_BYTES = 32 << 20
MAX_SOURCE_DOCUMENTS = 1 << 24  # files a conversion reads
MAX_SEQ_LEN = 1 << 17  # nas.language.spec's MAX_SEQ_LEN
MAX_WINDOW_TOKENS = 1 << 30  # tokens one call to the window functions may gather
DEFAULT_SHARD_TOKENS = 1 << 28
CHUNK_TOKENS = 1 << 23  # streamed verification step
SHARD_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\.tokens$")


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest little-endian unsigned dtype that holds ids ``0 .. vocab_size - 1``."""
    if vocab_size <= 1 << 8:
        return np.dtype("u1")
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file; else ``OSError`` without a read.

    A shard or manifest that is a FIFO would block a reader for ever, a link to ``/dev/zero``
    fill its memory (the same rule as ``aiperf.ledger.files.open_regular``, a layer above).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _printable(text: str) -> str:
    """``text`` with control characters (a file name's escape sequence, a newline) shown as escapes: one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _fail(path: str | Path, problem: str) -> AiperfError:
    return AiperfError(f"token shards: {_printable(os.fspath(path))}: {problem}")


# --------------------------------------------------------------------------- windows


def check_seq_len(seq_len: int) -> None:
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= MAX_SEQ_LEN:
        raise AiperfError(f"seq_len must be an integer from 1 to {MAX_SEQ_LEN}, got {excerpt(seq_len)}")


def check_count(count: int, seq_len: int, what: str) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise AiperfError(f"{what} must be a non-negative integer, got {excerpt(count)}")
    if count * (seq_len + 1) > MAX_WINDOW_TOKENS:
        raise AiperfError(
            f"{what}={count} windows of seq_len={seq_len} exceed {MAX_WINDOW_TOKENS:,} tokens per call; ask in batches"
        )


def random_starts(
    lengths: Sequence[int], seq_len: int, count: int, rng: np.random.Generator, where: str
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` uniformly random windows over token streams of ``lengths``: (stream index, start) arrays.

    A window needs ``seq_len + 1`` tokens (inputs and the targets one further) and never
    crosses from one stream (shard) into the next; every valid start is equally likely.
    """
    check_seq_len(seq_len)
    check_count(count, seq_len, "count")
    valid = np.array([max(0, n - seq_len) for n in lengths], dtype=np.int64)
    total = int(valid.sum())
    if total == 0:
        raise AiperfError(f"{where}: no stream holds seq_len + 1 = {seq_len + 1} tokens; use a shorter seq_len")
    draws = rng.integers(0, total, size=count, dtype=np.int64)
    ends = np.cumsum(valid)
    stream = np.searchsorted(ends, draws, side="right")
    return stream, draws - (ends - valid)[stream]


def tiled_starts(
    lengths: Sequence[int], seq_len: int, max_windows: int | None, where: str
) -> tuple[np.ndarray, np.ndarray]:
    """The fixed, non-overlapping windows of every stream in order (their inputs never overlap).

    With ``max_windows`` an evenly spaced subset of them, the same on every call: validation
    loss over these windows is comparable between trials.
    """
    check_seq_len(seq_len)
    per = [np.arange(0, max(0, n - seq_len), seq_len, dtype=np.int64) for n in lengths]
    stream = np.concatenate([np.full(len(p), k, np.int64) for k, p in enumerate(per)] or [np.empty(0, np.int64)])
    starts = np.concatenate(per or [np.empty(0, np.int64)])
    if len(starts) == 0:
        raise AiperfError(f"{where}: no stream holds seq_len + 1 = {seq_len + 1} tokens; use a shorter seq_len")
    if max_windows is not None:
        check_count(max_windows, seq_len, "max_windows")
        if max_windows < len(starts):
            pick = np.arange(max_windows, dtype=np.int64) * len(starts) // max(max_windows, 1)
            stream, starts = stream[pick], starts[pick]
    else:
        check_count(len(starts), seq_len, "the validation windows")
    return stream, starts


def gather_windows(
    streams: Sequence[np.ndarray], stream: np.ndarray, starts: np.ndarray, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs, targets)`` of shape ``(len(starts), seq_len)``: targets are the inputs shifted by one.

    Both are views of one ``(len(starts), seq_len + 1)`` array in the streams' dtype. Reads
    only the windows' pages when the streams are memory maps.
    """
    dtype = streams[0].dtype if streams else np.dtype("u1")
    out = np.empty((len(starts), seq_len + 1), dtype=dtype)
    span = np.arange(seq_len + 1, dtype=np.int64)
    for k in np.unique(stream):
        rows = np.flatnonzero(stream == k)
        out[rows] = streams[int(k)][starts[rows, None] + span]
    return out[:, :-1], out[:, 1:]


def check_split_args(val_fraction: float, seed: int) -> None:
    """Raise unless ``val_fraction`` is in (0, 1) and ``seed`` a 63-bit integer: checked before any reading."""
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
        raise AiperfError(f"val_fraction must be above 0 and below 1, got {excerpt(val_fraction)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 63:
        raise AiperfError(f"seed must be an integer from 0 to 2**63 - 1, got {excerpt(seed)}")


def split_documents(count: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Document indices ``(train, val)``, each ascending: a seeded draw of whole documents.

    Validation gets ``round(val_fraction * count)`` documents, at least one and at most all but
    one; which ones depends only on ``count`` and ``seed``. Disjointness is checked.
    """
    check_split_args(val_fraction, seed)
    if count < 2:
        raise AiperfError(f"a train/validation split by document needs at least 2 documents, got {count}")
    n_val = min(max(math.floor(val_fraction * count + 0.5), 1), count - 1)
    order = np.random.default_rng(seed).permutation(count)
    val, train = np.sort(order[:n_val]), np.sort(order[n_val:])
    if len(np.intersect1d(train, val)) or len(train) + len(val) != count:
        raise AssertionError("internal error: the document split is not a partition")
    return train, val


# --------------------------------------------------------------------------- one shard


@dataclass(frozen=True)
class ShardHeader:
    """A shard's header fields, checked against the caps."""

    version: int
    token_bytes: int
    vocab_size: int
    eod_token: int | None
    documents: int
    tokens: int
    checksum: str  # hex SHA-256 as recorded

    @property
    def dtype(self) -> np.dtype:
        return token_dtype(self.vocab_size)

    @property
    def file_bytes(self) -> int:
        """The exact size a shard with these counts has."""
        return HEADER_BYTES + 8 * (self.documents + 1) + self.tokens * self.token_bytes


def parse_header(raw: bytes, path: str | Path) -> ShardHeader:
    """The header's fields after every cap and consistency check that needs nothing else."""
    if len(raw) < HEADER_BYTES:
        raise _fail(path, f"truncated: {len(raw)} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, version, width, vocab, eod, documents, tokens, digest = HEADER.unpack(raw[:HEADER_BYTES])
    if magic != MAGIC:
        raise _fail(path, f"not a token shard (wrong magic bytes {magic!r}, expected {MAGIC!r})")
    if version not in SUPPORTED_VERSIONS:
        raise _fail(path, f"format version {version} is not supported (this aiperf reads {SUPPORTED_VERSIONS})")
    if not 1 <= vocab <= MAX_VOCAB:
        raise _fail(path, f"vocab_size {vocab:,} is outside 1 .. {MAX_VOCAB:,}")
    if width != token_dtype(vocab).itemsize:
        raise _fail(
            path, f"token width {width} bytes does not fit vocab_size {vocab} (expects {token_dtype(vocab).itemsize})"
        )
    if eod != NO_EOD and eod >= vocab:
        raise _fail(path, f"end-of-document token {eod} is not below vocab_size {vocab}")
    if not 1 <= documents <= MAX_SHARD_DOCUMENTS:
        raise _fail(path, f"header claims {documents:,} documents; a shard holds 1 .. {MAX_SHARD_DOCUMENTS:,}")
    if not 1 <= tokens <= MAX_SHARD_TOKENS:
        raise _fail(path, f"header claims {tokens:,} tokens; a shard holds 1 .. {MAX_SHARD_TOKENS:,}")
    if documents > tokens:
        raise _fail(path, f"header claims {documents:,} documents in {tokens:,} tokens (documents are never empty)")
    return ShardHeader(version, width, vocab, None if eod == NO_EOD else eod, documents, tokens, digest.hex())


class TokenShard:
    """One memory-mapped shard: documents and windows are read from the map, never the whole file."""

    def __init__(
        self, path: Path, header: ShardHeader, offsets: np.ndarray, tokens: np.ndarray, hashed_header: bytes
    ) -> None:
        self.path = path
        self.hashed_header = hashed_header  # the header bytes the checksum covers
        self.header = header
        self.offsets = offsets  # uint64 memory map, documents + 1 entries
        self.tokens = tokens  # memory map of `header.tokens` ids

    @classmethod
    def open(cls, path: str | Path, verify: bool = True) -> TokenShard:
        """Map ``path`` after the header, size and offset checks; ``verify`` also checks checksum and ids."""
        path = Path(path)
        try:
            with _open_regular(path) as fh:
                size = os.fstat(fh.fileno()).st_size
                raw = fh.read(HEADER_BYTES)
                header = parse_header(raw, path)
                if size != header.file_bytes:
                    how = "truncated" if size < header.file_bytes else "has trailing bytes"
                    raise _fail(
                        path,
                        f"{how}: {size:,} bytes, but a header of {header.documents:,} documents and "
                        f"{header.tokens:,} tokens means {header.file_bytes:,}",
                    )
                # Mapped through the descriptor already checked (the map keeps its own): no second lookup by name.
                table = HEADER_BYTES + 8 * (header.documents + 1)
                offsets = np.memmap(fh, dtype="<u8", mode="r", offset=HEADER_BYTES, shape=(header.documents + 1,))
                tokens = np.memmap(fh, dtype=header.dtype, mode="r", offset=table, shape=(header.tokens,))
        except OSError as exc:
            raise os_error(exc, path, "read token shard") from None
        shard = cls(path, header, offsets, tokens, raw[:HASHED_HEADER_BYTES])
        shard._check_offsets()
        if verify:
            shard.verify()
        return shard

    def _check_offsets(self) -> None:
        o, h = self.offsets, self.header
        if int(o[0]) != 0:
            raise _fail(self.path, f"the document offset table starts at {int(o[0]):,}, not 0")
        bad = np.flatnonzero(o[1:] <= o[:-1])
        if len(bad):
            i = int(bad[0]) + 1
            raise _fail(
                self.path,
                f"document offsets are not increasing: offset {i} ({int(o[i]):,}) is not above offset {i - 1} "
                f"({int(o[i - 1]):,})",
            )
        if int(o[-1]) != h.tokens:
            where = "past the end of" if int(o[-1]) > h.tokens else "short of"
            raise _fail(self.path, f"the last document offset {int(o[-1]):,} is {where} the {h.tokens:,} tokens")
        if h.eod_token is not None:
            ends = self.tokens[o[1:].astype(np.int64) - 1]
            wrong = np.flatnonzero(ends != h.eod_token)
            if len(wrong):
                k = int(wrong[0])
                raise _fail(self.path, f"document {k} does not end with the end-of-document token {h.eod_token}")

    def verify(self) -> None:
        """Check the recorded SHA-256 and every token id against ``vocab_size``: one pass over the map."""
        h = self.header
        digest = hashlib.sha256()
        digest.update(self.hashed_header)
        digest.update(_raw(self.offsets))
        full_range = h.vocab_size == 1 << (8 * h.token_bytes)
        first_bad: tuple[int, int] | None = None
        for begin in range(0, h.tokens, CHUNK_TOKENS):
            chunk = self.tokens[begin : begin + CHUNK_TOKENS]
            digest.update(_raw(chunk))
            if not full_range and first_bad is None and int(chunk.max()) >= h.vocab_size:
                k = int(np.argmax(chunk >= h.vocab_size))
                first_bad = (begin + k, int(chunk[k]))
        if digest.hexdigest() != h.checksum:
            raise _fail(
                self.path,
                f"checksum mismatch: the header records sha256 {h.checksum[:16]}..., the contents hash to "
                f"{digest.hexdigest()[:16]}... (a damaged or edited shard; write it again)",
            )
        if first_bad is not None:
            raise _fail(self.path, f"token {first_bad[0]:,} has id {first_bad[1]}, not below vocab_size {h.vocab_size}")

    def document(self, index: int) -> np.ndarray:
        """Document ``index``'s tokens (its end-of-document token included)."""
        return np.asarray(self.tokens[int(self.offsets[index]) : int(self.offsets[index + 1])])


def _raw(array: np.ndarray) -> memoryview:
    """An array's bytes as stored (little-endian), without a copy when it is contiguous."""
    return np.ascontiguousarray(array).view(np.uint8).data


def _checksum(header_prefix: bytes, payload: Iterable[bytes | memoryview]) -> bytes:
    digest = hashlib.sha256(header_prefix)
    for part in payload:
        digest.update(part)
    return digest.digest()


def write_shard(
    path: str | Path, documents: Sequence[np.ndarray | bytes], vocab_size: int, eod_token: int | None
) -> ShardHeader:
    """Write ``documents`` (token arrays or bytes, each holding its end-of-document token) as one shard."""
    path = Path(path)
    if not 1 <= vocab_size <= MAX_VOCAB:
        raise AiperfError(f"vocab_size must be from 1 to {MAX_VOCAB:,}, got {vocab_size}")
    dtype = token_dtype(vocab_size)
    arrays = [np.frombuffer(d, np.uint8) if isinstance(d, bytes) else np.asarray(d) for d in documents]
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    total = int(lengths.sum())
    if not 1 <= len(arrays) <= MAX_SHARD_DOCUMENTS or total > MAX_SHARD_TOKENS or (lengths == 0).any():
        raise _fail(
            path, f"cannot write {len(arrays):,} documents of {total:,} tokens (empty documents or over the caps)"
        )
    tokens = np.concatenate(arrays) if arrays else np.empty(0, dtype)
    if tokens.dtype.kind not in "ui" or (len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size)):
        raise _fail(path, f"token ids must be integers in 0 .. {vocab_size - 1}")
    tokens = np.ascontiguousarray(tokens.astype(dtype, copy=False))
    if eod_token is not None and not (tokens[np.cumsum(lengths) - 1] == eod_token).all():
        raise _fail(path, f"every document must end with the end-of-document token {eod_token}")
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype("<u8")
    eod = NO_EOD if eod_token is None else eod_token
    prefix = HEADER.pack(MAGIC, VERSION, dtype.itemsize, vocab_size, eod, len(arrays), total, b"")[:HASHED_HEADER_BYTES]
    digest = _checksum(prefix, [offsets.tobytes(), _raw(tokens)])
    try:
        with open(path, "wb") as fh:
            fh.write(prefix + digest)
            fh.write(offsets.tobytes())
            fh.write(_raw(tokens))
    except OSError as exc:
        raise os_error(exc, path, "write token shard") from None
    return ShardHeader(VERSION, dtype.itemsize, vocab_size, eod_token, len(arrays), total, digest.hex())


# --------------------------------------------------------------------------- a folder of shards


@dataclass
class ShardSet:
    """One split's shards in order; windows never cross from one shard into the next."""

    split: str
    shards: list[TokenShard]

    @property
    def tokens(self) -> int:
        return sum(s.header.tokens for s in self.shards)

    @property
    def documents(self) -> int:
        return sum(s.header.documents for s in self.shards)

    def _windows(self, stream: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = gather_windows([s.tokens for s in self.shards], stream, starts, seq_len)
        vocab = self.shards[0].header.vocab_size
        # Cheap insurance for shards opened without `verify`: an id past the vocabulary never reaches a model.
        if len(x) and vocab < 1 << (8 * x.dtype.itemsize) and max(int(x.max()), int(y.max())) >= vocab:
            row = int(np.argmax((x >= vocab).any(axis=1) | (y >= vocab).any(axis=1)))
            raise _fail(self.shards[int(stream[row])].path, f"a token id is not below vocab_size {vocab}")
        return x, y

    def random_windows(self, seq_len: int, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``count`` seeded random ``(inputs, targets)`` windows: a training epoch's draws."""
        lengths = [s.header.tokens for s in self.shards]
        stream, starts = random_starts(lengths, seq_len, count, rng, f"token shards: {self.split}")
        return self._windows(stream, starts, seq_len)

    def fixed_windows(self, seq_len: int, max_windows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The deterministic non-overlapping windows (see :func:`tiled_starts`): validation."""
        lengths = [s.header.tokens for s in self.shards]
        stream, starts = tiled_starts(lengths, seq_len, max_windows, f"token shards: {self.split}")
        return self._windows(stream, starts, seq_len)


class SplitCounts(TypedDict):
    """A count per split."""

    train: int
    val: int


class ShardEntry(TypedDict):
    """One shard as the manifest lists it."""

    name: str  # NNNNN.tokens, in its split's folder
    tokens: int
    documents: int
    sha256: str  # the shard header's checksum, hex


class Manifest(TypedDict):
    """``manifest.json``: what :func:`convert_folder` writes; :func:`read_manifest` checks what a reader needs."""

    format: str
    version: int
    tokenizer: str
    vocab_size: int
    dtype: NotRequired[str]
    eod_token: NotRequired[int | None]
    split: NotRequired[dict[str, object]]  # how the documents were split (method, seed, val_fraction, disjoint)
    source: NotRequired[dict[str, object]]  # the converted folder, its document count, bytes and names' SHA-256
    shards: dict[str, list[ShardEntry]]  # split -> its shards, in order


class TokenFolderFacts(TypedDict):
    """:meth:`TokenFolder.describe`: the run header's dataset facts of a converted folder."""

    name: str
    source: str
    format: str
    tokenizer: str
    vocab_size: int
    eod_token: int | None
    documents: SplitCounts
    tokens: SplitCounts
    shards: SplitCounts
    split: dict[str, object]
    fingerprint: str


@dataclass
class TokenFolder:
    """A converted folder: its manifest and the memory-mapped shards of each split."""

    root: Path
    manifest: Manifest
    train: ShardSet
    val: ShardSet

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    def describe(self) -> TokenFolderFacts:
        """The facts a ledger records about the data (the manifest's SHA-256 identifies it exactly)."""
        return {
            "name": "token_shards",
            "source": str(self.root),
            "format": f"{FORMAT} v{VERSION}",
            "tokenizer": self.manifest["tokenizer"],
            "vocab_size": self.vocab_size,
            "eod_token": self.manifest.get("eod_token"),
            "documents": {"train": self.train.documents, "val": self.val.documents},
            "tokens": {"train": self.train.tokens, "val": self.val.tokens},
            "shards": {"train": len(self.train.shards), "val": len(self.val.shards)},
            "split": self.manifest.get("split", {}),
            "fingerprint": manifest_digest(self.manifest),
        }


def manifest_digest(manifest: Manifest) -> str:
    """SHA-256 of the manifest's shard list and vocabulary: names, counts and checksums identify the data."""
    core = {key: manifest.get(key) for key in ("format", "version", "tokenizer", "vocab_size", "eod_token", "shards")}
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()


def _int_field(where: Path, entry: Mapping[str, object], key: str, low: int, high: int) -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise AiperfError(
            f"token shards: {where}: {key} must be an integer from {low} to {high:,}, got {excerpt(value)}"
        )
    return value


def read_manifest(root: Path) -> Manifest:
    """``root/manifest.json`` after its size, type and cap checks."""
    path = root / MANIFEST
    try:
        with _open_regular(path) as fh:
            raw = fh.read(MAX_MANIFEST_BYTES + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            raise AiperfError(f"token shards: {path}: over the {MAX_MANIFEST_BYTES:,}-byte limit of a manifest")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise AiperfError(
            f"token shards: {root}: no {MANIFEST} (not a converted folder, or its conversion did not finish)"
        ) from None
    except OSError as exc:
        raise os_error(exc, path, "read") from None
    except UnicodeDecodeError:
        raise AiperfError(f"token shards: {path}: not UTF-8 text") from None
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise AiperfError(f"token shards: {path}: not valid JSON ({first_line(exc)})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise AiperfError(f"token shards: {path}: not an {FORMAT} manifest (format is not {FORMAT!r})")
    _int_field(path, manifest, "version", 1, VERSION)
    _int_field(path, manifest, "vocab_size", 1, MAX_VOCAB)
    if not isinstance(manifest.get("tokenizer"), str):
        raise AiperfError(f"token shards: {path}: tokenizer must be a name")
    if manifest.get("eod_token") is not None:
        _int_field(path, manifest, "eod_token", 0, manifest["vocab_size"] - 1)
    shards = manifest.get("shards")
    if not isinstance(shards, dict):
        raise AiperfError(f"token shards: {path}: shards must map train and val to lists of shards")
    for split in SPLITS:
        entries = shards.get(split)
        if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_SHARDS:
            raise AiperfError(f"token shards: {path}: shards.{split} must list 1 to {MAX_SHARDS:,} shards")
        for entry in entries:
            if (
                not isinstance(entry, dict)
                or not isinstance(entry.get("name"), str)
                or not SHARD_NAME.match(entry["name"])
            ):
                raise AiperfError(f"token shards: {path}: shards.{split}: each shard is {{name: NNNNN.tokens, ...}}")
            _int_field(path, entry, "tokens", 1, MAX_SHARD_TOKENS)
            _int_field(path, entry, "documents", 1, MAX_SHARD_DOCUMENTS)
            if not isinstance(entry.get("sha256"), str) or not re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]):
                raise AiperfError(
                    f"token shards: {path}: shards.{split}: {entry['name']} has no sha256 (64 hex digits)"
                )
    return cast(Manifest, manifest)  # its shape checked above


def open_token_folder(root: str | Path, verify: bool = True) -> TokenFolder:
    """Open a converted folder: manifest, every shard mapped and matched against it (``verify``: checksums too)."""
    root = Path(root)
    if not root.is_dir():
        raise AiperfError(f"token shards: {root}: folder not found")
    manifest = read_manifest(root)
    sets = {}
    for split in SPLITS:
        entries = manifest["shards"][split]
        folder = root / split
        try:
            present = {p.name for p in folder.iterdir() if p.name.endswith(".tokens")} if folder.is_dir() else set()
        except OSError as exc:
            raise os_error(exc, folder, "list") from None
        listed = [e["name"] for e in entries]
        missing = [n for n in listed if n not in present]
        if missing:
            raise _fail(folder / missing[0], f"listed in {MANIFEST} but missing")
        extra = sorted(present - set(listed))
        if extra:
            raise _fail(folder / extra[0], f"not listed in {MANIFEST} (a shard of another conversion?)")
        shards = []
        for entry in entries:
            shard = TokenShard.open(folder / entry["name"], verify=verify)
            h = shard.header
            recorded = (
                manifest["vocab_size"],
                manifest.get("eod_token"),
                entry["tokens"],
                entry["documents"],
                entry["sha256"],
            )
            if (h.vocab_size, h.eod_token, h.tokens, h.documents, h.checksum) != recorded:
                raise _fail(
                    shard.path,
                    f"does not match {MANIFEST} (vocab, end-of-document token, tokens, documents, sha256: "
                    f"{h.vocab_size}, {h.eod_token}, {h.tokens}, {h.documents}, {h.checksum[:12]}... vs "
                    f"{recorded[0]}, {recorded[1]}, {recorded[2]}, {recorded[3]}, {recorded[4][:12]}...)",
                )
            shards.append(shard)
        sets[split] = ShardSet(split, shards)
    return TokenFolder(root, manifest, sets["train"], sets["val"])


def check_folder(root: str | Path) -> str:
    """Verify every shard of a converted folder (checksums included); a one-line summary."""
    folder = open_token_folder(root, verify=True)
    parts = [
        f"{s.split} {len(s.shards)} shard(s), {s.documents:,} documents, {s.tokens:,} tokens"
        for s in (folder.train, folder.val)
    ]
    return (
        f"{folder.root}: ok: {'; '.join(parts)}; vocab {folder.vocab_size} ({folder.manifest['tokenizer']}); "
        f"every checksum verified; fingerprint {manifest_digest(folder.manifest)[:16]}"
    )


# --------------------------------------------------------------------------- conversion


def list_text_files(src: Path) -> list[tuple[str, Path, int]]:
    """``(relative name, path, size)`` of every regular file under ``src``, sorted by name; hidden names skipped."""
    found: list[tuple[str, Path, int]] = []

    def walk_error(exc: OSError) -> None:
        raise os_error(exc, exc.filename or src, "list")

    for dirpath, dirnames, filenames in os.walk(src, onerror=walk_error):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            try:
                st = path.stat()
            except OSError as exc:
                raise os_error(exc, path, "read") from None
            if not path.is_file():
                continue
            if len(found) >= MAX_SOURCE_DOCUMENTS:
                raise AiperfError(f"token shards: {src}: more than {MAX_SOURCE_DOCUMENTS:,} files; convert it in parts")
            if st.st_size >= MAX_SHARD_TOKENS:
                raise AiperfError(f"token shards: {path}: {st.st_size:,} bytes; one document must fit one shard")
            found.append((path.relative_to(src).as_posix(), path, st.st_size))
    found.sort(key=lambda item: item[0])
    return found


def read_text_document(path: Path, expected: int) -> bytes:
    """A text file's bytes for the byte tokenizer: byte 0 is reserved for end-of-document."""
    try:
        with _open_regular(path) as fh:
            data = fh.read(expected + 1)
    except OSError as exc:
        raise os_error(exc, path, "read") from None
    if len(data) != expected:
        raise AiperfError(
            f"token shards: {path}: changed while being converted ({expected:,} then {len(data):,} bytes)"
        )
    if b"\0" in data:
        raise AiperfError(
            f"token shards: {path}: holds byte 0 at offset {data.index(0):,}; not a text file (the byte "
            "tokenizer reserves 0 for end-of-document)"
        )
    return data


def _write_split(
    out: Path, split: str, docs: list[tuple[str, Path, int]], shard_tokens: int
) -> tuple[list[ShardEntry], str]:
    folder = out / split
    try:
        folder.mkdir(parents=True, exist_ok=False)
    except OSError as exc:
        raise os_error(exc, folder, "create") from None
    entries: list[ShardEntry] = []
    names = hashlib.sha256()
    pending: list[bytes] = []
    pending_tokens = 0

    def flush() -> None:
        if len(entries) >= MAX_SHARDS:
            raise AiperfError(f"token shards: {split}: more than {MAX_SHARDS:,} shards; raise --shard-tokens")
        name = f"{len(entries):05d}.tokens"
        header = write_shard(folder / name, pending, BYTE_VOCAB, BYTE_EOD)
        entries.append(
            {"name": name, "tokens": header.tokens, "documents": header.documents, "sha256": header.checksum}
        )

    for rel, path, size in docs:
        need = size + 1
        if pending and (pending_tokens + need > shard_tokens or len(pending) >= MAX_SHARD_DOCUMENTS):
            flush()
            pending, pending_tokens = [], 0
        pending.append(read_text_document(path, size) + bytes([BYTE_EOD]))
        pending_tokens += need
        names.update(f"{rel}\t{size}\n".encode())
    if pending:
        flush()
    return entries, names.hexdigest()


def convert_folder(src: str | Path, out: str | Path, val_fraction: float, shard_tokens: int, seed: int = 0) -> Manifest:
    """Byte-tokenize every text file under ``src`` (one document each) into ``out``; the manifest."""
    src, out = Path(src), Path(out)
    if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or not 1 <= shard_tokens <= MAX_SHARD_TOKENS:
        raise AiperfError(f"--shard-tokens must be from 1 to {MAX_SHARD_TOKENS:,}, got {excerpt(shard_tokens)}")
    check_split_args(val_fraction, seed)
    if not src.is_dir():
        raise AiperfError(f"token shards: {src}: folder of text files not found")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise AiperfError(f"token shards: {out}: exists and is not an empty folder; choose a new output folder")
    docs = list_text_files(src)
    train, val = split_documents(len(docs), val_fraction, seed)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(exc, out, "create") from None
    shards: dict[str, list[ShardEntry]] = {}
    digest = hashlib.sha256()
    try:
        for split, index in (("train", train), ("val", val)):
            shards[split], names = _write_split(out, split, [docs[int(i)] for i in index], shard_tokens)
            digest.update(f"{split}:{names};".encode())
    except BaseException:
        # A failed conversion leaves no half-written folder behind (only what it created is removed).
        for split in SPLITS:
            shutil.rmtree(out / split, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    manifest: Manifest = {
        "format": FORMAT,
        "version": VERSION,
        "tokenizer": BYTE_TOKENIZER,
        "vocab_size": BYTE_VOCAB,
        "dtype": str(token_dtype(BYTE_VOCAB)),
        "eod_token": BYTE_EOD,
        "split": {"method": "by document", "seed": seed, "val_fraction": val_fraction, "disjoint": True},
        "source": {
            "folder": str(src),
            "documents": len(docs),
            "bytes": sum(size for _, _, size in docs),
            "names_sha256": digest.hexdigest(),  # names and sizes of each split's documents, in order
        },
        "shards": shards,
    }
    try:
        (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        raise os_error(exc, out / MANIFEST, "write") from None
    return manifest


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m aiperf.families.language.token_shards",
        description="Byte-level token shards for the LM workload.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    convert = sub.add_parser(
        "convert", help="write byte-level shards from a folder of text files (one file, one document)"
    )
    convert.add_argument("src", type=Path)
    convert.add_argument("out", type=Path)
    convert.add_argument("--val-fraction", type=float, default=0.01)
    convert.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS)
    convert.add_argument("--seed", type=int, default=0)
    check = sub.add_parser("check", help="verify every shard's checksum and the manifest; one line")
    check.add_argument("folder", type=Path)
    return parser


def _say(line: str, stream: TextIO) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(_printable(line)[:2000], file=stream, flush=True)


def _convert(args: argparse.Namespace) -> str:
    manifest = convert_folder(args.src, args.out, args.val_fraction, args.shard_tokens, args.seed)
    counts = {
        s: (len(e), sum(x["documents"] for x in e), sum(x["tokens"] for x in e)) for s, e in manifest["shards"].items()
    }
    return f"{args.out}: wrote " + "; ".join(
        f"{s} {n} shard(s), {d:,} documents, {t:,} tokens" for s, (n, d, t) in counts.items()
    )


COMMANDS: dict[str, Callable[[argparse.Namespace], str]] = {
    "convert": _convert,
    "check": lambda args: check_folder(args.folder),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every failure is one line on stderr and a non-zero exit code."""
    try:
        args = build_parser().parse_args(argv)
        _say(COMMANDS[args.command](args), sys.stdout)
        return 0
    except AiperfError as exc:
        _say(f"aiperf: error: {exc}", sys.stderr)
        return exc.exit_code
    except SystemExit as exc:  # argparse's usage errors (already printed)
        return int(exc.code) if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        _say("aiperf: interrupted", sys.stderr)
        return 130
    except MemoryError:
        _say("aiperf: error: out of memory (docs/lm-data.md lists the limits)", sys.stderr)
        return 1
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        _say(f"aiperf: error: {where}{exc.strerror or first_line(exc)}", sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
