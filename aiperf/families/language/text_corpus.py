"""A real text corpus that every CPython installation carries, read as bytes for a byte-level LM.

The embedded LM workload needs text that is there offline on a fresh machine, without a
download or a tokenizer. Two sources qualify, and both are used by default:

* ``pydoc``: the English help topics in ``pydoc_data.topics`` (what ``help("if")`` shows),
  one document per topic: 79 documents, 0.47 MB (Python 3.11) of reference prose (with code samples).
* ``stdlib``: the standard library's own ``.py`` files under ``sysconfig``'s ``stdlib`` path,
  one document per file: 503 files, 9.0 MB (Python 3.11) of real code, comments and docstrings. Skipped:
  ``site-packages``/``dist-packages``, test folders (``test``, ``tests``, ``idle_test``),
  ``__pycache__``, empty files, files over :data:`MAX_DOCUMENT_BYTES`, the build-specific
  ``_sysconfigdata*`` and what Linux distributions split out or patch (:data:`SKIPPED_DIRS`,
  :data:`SKIPPED_FILES`), so the set is the same on more machines. ``pydoc_data`` is skipped
  too: its ``topics.py`` is the ``pydoc`` source again.
* ``python`` (the default): both, 582 documents, 9.5 MB, read in under 0.1 s: a few minutes of
  CPU training at tens of thousands of tokens a second see no byte twice.

The bytes follow the Python version, not the machine: the same ``python_version`` on two
installations usually gives the same corpus, but a distribution may patch a file; the
fingerprint, not the version, says whether two runs trained on the same data.

Tokens are bytes (vocabulary 256). Byte 0 never occurs in these texts (a document that holds
one is skipped and counted), so it is the end-of-document token: each split is its
documents' bytes, each followed by 0, concatenated; ``offsets`` records where each starts.
Documents are split into train and validation whole, by a seeded draw
(:func:`~aiperf.families.language.token_shards.split_documents`): no document straddles the split.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypedDict

import numpy as np

from aiperf.errors import AiperfError, excerpt, os_error
from aiperf.families.language.token_shards import (
    BYTE_EOD,
    BYTE_TOKENIZER,
    BYTE_VOCAB,
    SplitCounts,
    check_count,
    check_seq_len,
    check_split_args,
    gather_windows,
    random_starts,
    split_documents,
    tiled_starts,
)

CORPORA = ("python", "pydoc", "stdlib")
DEFAULT_CORPUS = "python"
DEFAULT_VAL_FRACTION = 0.05
MAX_DOCUMENT_BYTES = 256 << 10  # a stdlib file larger than this is skipped (none outside tests in 3.11)
MAX_CORPUS_BYTES = 1 << 30  # the largest max_bytes accepted
MAX_DOCUMENTS = 1 << 16
SKIPPED_DIRS = frozenset(
    {
        "site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test", "lib-dynload",
        "pydoc_data",  # the pydoc corpus again
        # Split into packages of their own or patched by Linux distributions (Debian: python3-tk, idle,
        # python3-lib2to3, python3-distutils, python3-venv): present on some installations only.
        "idlelib", "tkinter", "turtledemo", "lib2to3", "distutils", "ensurepip", "venv",
    }
)  # fmt: skip
SKIPPED_FILES = frozenset({"turtle.py", "site.py", "sysconfig.py"})  # top level: split out or patched by distributions


@dataclass(frozen=True)
class _Source:
    """A document before it is read: its name, size and how to get its bytes."""

    name: str
    size: int
    read: Callable[[], bytes]


def _pydoc_sources() -> list[_Source]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise AiperfError(
            "text corpus: this Python has no pydoc_data (a trimmed installation); use name='stdlib'"
        ) from None
    out = []
    for topic in sorted(topics):
        data = topics[topic].encode("utf-8")
        out.append(_Source(f"pydoc/{topic}", len(data), partial(bytes, data)))
    return out


def stdlib_root() -> Path:
    """The folder of the standard library's source, as this interpreter reports it."""
    return Path(sysconfig.get_paths()["stdlib"])


def _read_file(path: Path, size: int) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise os_error(exc, path, "read the text corpus file") from None
    if len(data) != size:
        raise AiperfError(f"text corpus: {path}: changed while being read ({size:,} then {len(data):,} bytes)")
    return data


def _stdlib_sources(root: Path) -> list[_Source]:
    if not root.is_dir():
        raise AiperfError(f"text corpus: {root}: the standard library's source folder is missing (an installation "
                          "without .py files?); use name='pydoc'")  # fmt: skip
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS and not d.startswith((".", "config-")))
        top = Path(dirpath) == root
        for name in sorted(filenames):
            if not name.endswith(".py") or name.startswith("_sysconfigdata") or (top and name in SKIPPED_FILES):
                continue
            path = Path(dirpath) / name
            try:
                size = path.stat().st_size
            except OSError:
                continue  # a dangling link: not part of the library
            if 0 < size <= MAX_DOCUMENT_BYTES and path.is_file():
                out.append(
                    _Source(f"stdlib/{path.relative_to(root).as_posix()}", size, partial(_read_file, path, size))
                )
    return sorted(out, key=lambda s: s.name)


def _sources(name: str) -> tuple[list[_Source], str]:
    if name == "pydoc":
        return _pydoc_sources(), "pydoc_data.topics (the English help topics)"
    root = stdlib_root()
    where = f"the standard library's .py files under {root}"
    if name == "stdlib":
        return _stdlib_sources(root), where
    return _pydoc_sources() + _stdlib_sources(root), f"pydoc_data.topics and {where}"


def _select(sources: list[_Source], max_bytes: int | None) -> list[_Source]:
    """Sources whose tokens (bytes + end-of-document) fit ``max_bytes``, taken in a fixed pseudo-random
    order (SHA-256 of the name) so that a cap samples both kinds of text, the same for every seed."""
    if max_bytes is None:
        return sources
    chosen, total = [], 0
    for src in sorted(sources, key=lambda s: hashlib.sha256(s.name.encode()).digest()):
        if total + src.size + 1 <= max_bytes:
            chosen.append(src)
            total += src.size + 1
    return sorted(chosen, key=lambda s: s.name)


def _pack(docs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Documents as one token stream (each followed by the end-of-document byte) and their start offsets."""
    lengths = np.array([len(d) + 1 for d in docs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    stream = b"".join(d + bytes([BYTE_EOD]) for d in docs)
    return np.frombuffer(stream, dtype=np.uint8), offsets


class CorpusFacts(TypedDict):
    """:meth:`TextCorpus.describe`: the run header's dataset facts of the embedded corpus."""

    name: str
    source: str
    python_version: str
    tokenizer: str
    vocab_size: int
    eod_token: int
    documents: SplitCounts
    bytes: SplitCounts  # text bytes, without the end-of-document tokens
    tokens: SplitCounts
    split: dict[str, object]
    max_bytes: int | None
    skipped_documents: int
    fingerprint: str


@dataclass
class TextCorpus:
    """A corpus split by document; ``*_tokens`` are uint8 byte streams, 0 ends each document."""

    name: str
    source: str
    seed: int
    val_fraction: float
    max_bytes: int | None
    train_names: list[str]
    val_names: list[str]
    train_tokens: np.ndarray
    val_tokens: np.ndarray
    train_offsets: np.ndarray  # int64, documents + 1: document i is tokens[o[i]:o[i+1]] (its 0 included)
    val_offsets: np.ndarray
    skipped: list[str] = field(default_factory=list)  # documents that held byte 0
    python_version: str = field(default_factory=platform.python_version)
    vocab_size: int = BYTE_VOCAB
    eod_token: int = BYTE_EOD

    def tokens(self, split: str) -> np.ndarray:
        if split not in ("train", "val"):
            raise AiperfError(f"text corpus: split must be 'train' or 'val', got {excerpt(split)}")
        return self.train_tokens if split == "train" else self.val_tokens

    def document(self, split: str, index: int) -> bytes:
        """Document ``index`` of a split as its original bytes (without the end-of-document byte)."""
        offsets = self.train_offsets if split == "train" else self.val_offsets
        return self.tokens(split)[offsets[index] : offsets[index + 1] - 1].tobytes()

    def fingerprint(self) -> str:
        """SHA-256 over the ordered names and bytes of each split's documents: identifies the data exactly."""
        h = hashlib.sha256(f"aiperf-text-corpus;{self.tokenizer};".encode())
        for split, names in (("train", self.train_names), ("val", self.val_names)):
            h.update(f"{split}:{len(names)};".encode())
            offsets = self.train_offsets if split == "train" else self.val_offsets
            for k, doc in enumerate(names):
                h.update(f"{doc}\t{int(offsets[k + 1] - offsets[k]) - 1}\n".encode())
            h.update(self.tokens(split).data)
        return h.hexdigest()

    @property
    def tokenizer(self) -> str:
        return BYTE_TOKENIZER

    def describe(self) -> CorpusFacts:
        """The facts a ledger records about the data."""
        return {
            "name": f"text_corpus:{self.name}",
            "source": self.source,
            "python_version": self.python_version,
            "tokenizer": self.tokenizer,
            "vocab_size": self.vocab_size,
            "eod_token": self.eod_token,
            "documents": {"train": len(self.train_names), "val": len(self.val_names)},
            "bytes": {  # text bytes, without the end-of-document tokens
                "train": len(self.train_tokens) - len(self.train_names),
                "val": len(self.val_tokens) - len(self.val_names),
            },
            "tokens": {"train": len(self.train_tokens), "val": len(self.val_tokens)},
            "split": {"method": "by document", "seed": self.seed, "val_fraction": self.val_fraction, "disjoint": True},
            "max_bytes": self.max_bytes,
            "skipped_documents": len(self.skipped),
            "fingerprint": self.fingerprint(),
        }

    def train_windows(
        self, seq_len: int, epoch: int, count: int | None = None, seed: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """An epoch's random ``(inputs, targets)`` windows, shape ``(count, seq_len)``, targets shifted by one.

        Drawn from ``(seed or the corpus seed, epoch)``: the same call gives the same windows, the
        next epoch other ones. ``count`` defaults to one pass's worth (train tokens // seq_len).
        """
        check_seq_len(seq_len)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise AiperfError(f"text corpus: epoch must be a non-negative integer, got {excerpt(epoch)}")
        if count is None:
            count = len(self.train_tokens) // seq_len
        check_count(count, seq_len, "count")
        rng = np.random.default_rng([self.seed if seed is None else seed, epoch])
        stream, starts = random_starts([len(self.train_tokens)], seq_len, count, rng, f"text corpus {self.name}: train")
        return gather_windows([self.train_tokens], stream, starts, seq_len)

    def val_windows(self, seq_len: int, max_windows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The validation split's fixed non-overlapping windows (an evenly spaced subset with ``max_windows``)."""
        stream, starts = tiled_starts([len(self.val_tokens)], seq_len, max_windows, f"text corpus {self.name}: val")
        return gather_windows([self.val_tokens], stream, starts, seq_len)


def load_text_corpus(
    name: str = DEFAULT_CORPUS, seed: int = 0, val_fraction: float = DEFAULT_VAL_FRACTION, max_bytes: int | None = None
) -> TextCorpus:
    """Read corpus ``name`` (see :data:`CORPORA`), at most ``max_bytes`` tokens, split by document with ``seed``."""
    if name not in CORPORA:
        raise AiperfError(f"text corpus: unknown corpus {excerpt(name)} (known: {', '.join(CORPORA)})")
    if max_bytes is not None and (
        isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 2 <= max_bytes <= MAX_CORPUS_BYTES
    ):
        raise AiperfError(
            f"text corpus: max_bytes must be an integer from 2 to {MAX_CORPUS_BYTES:,}, got {excerpt(max_bytes)}"
        )
    check_split_args(val_fraction, seed)
    sources, where = _sources(name)
    if len(sources) > MAX_DOCUMENTS:
        raise AiperfError(f"text corpus {name}: {len(sources):,} documents, over the {MAX_DOCUMENTS:,} limit")
    chosen = _select(sources, max_bytes)
    names, docs, skipped = [], [], []
    for src in chosen:
        data = src.read()
        if BYTE_EOD in data:
            skipped.append(src.name)
            continue
        names.append(src.name)
        docs.append(data)
    train, val = split_documents(len(docs), val_fraction, seed)
    train_tokens, train_offsets = _pack([docs[int(i)] for i in train])
    val_tokens, val_offsets = _pack([docs[int(i)] for i in val])
    return TextCorpus(
        name=name,
        source=where,
        seed=seed,
        val_fraction=val_fraction,
        max_bytes=max_bytes,
        train_names=[names[int(i)] for i in train],
        val_names=[names[int(i)] for i in val],
        train_tokens=train_tokens,
        val_tokens=val_tokens,
        train_offsets=train_offsets,
        val_offsets=val_offsets,
        skipped=skipped,
    )
