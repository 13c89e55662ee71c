"""Trained weights the master keeps so that children can inherit them.

Only the best ``capacity`` trials are kept (children are proposed from good parents);
each kept set is also written to the run directory so ``--resume`` can still hand them to
children after a master restart. Weights reach workers through the pool (Ray's object
store), never through a shared filesystem; on a Ray cluster they stay on the node that trained
them and the store holds references, collecting only the kept sets' files (docs/cluster.md,
"Weights stay on their nodes").

The files are a convenience for ``--resume`` and the evidence ``aiperf audit`` re-evaluates:
each file's SHA-256 and size are known the moment it is written (:meth:`WeightStore.saved`),
so the master can record them in the ledger and a file swapped afterwards is detected. When
one cannot be written (a full disk) the set stays in memory, no partial file is left, the run
goes on, and the problem is logged once per cause as a warning.

An image set's arrays are stored as ``node:index`` members, a language model's
(:mod:`nas.language.spec`) by their weight names; either kind goes through the same store.
A stored file is read back (``--resume``, ``aiperf audit``) from its headers first: the zip's
declared sizes and each ``.npy`` member's shape and dtype are checked against the architecture
(or, without one, against the absolute caps below) before any array is unpacked, so a small file
that declares a huge array fails by name instead of taking the machine's memory.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import logging
import math
import os
import stat
import zipfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import numpy as np

from aiperf.archives import open_zip
from aiperf.cluster.messages import StoredWeights
from aiperf.cluster.node_weights import WeightsLost, fetch_weights
from aiperf.errors import AiperfError, excerpt, first_line, os_error
from aiperf.ledger.files import write_atomic

if TYPE_CHECKING:
    from collections.abc import Callable

    from aiperf.cluster.node_weights import SentWeights, WeightSource
    from nas.graph import Graph
    from nas.language.spec import TransformerSpec

logger = logging.getLogger(__name__)

Weights = dict[int, list[np.ndarray]]
LMWeights = dict[str, np.ndarray]  # a language model's set (nas.language.spec.Weights)
AnyWeights = Weights | LMWeights

# Every array a weights file holds: get_weights() stores float32 whatever the precision policy.
WEIGHTS_DTYPE = np.dtype("<f4")
# Array bytes a weights file may hold whatever its architecture: 2.5x the float32 weights of the
# largest search space shipped (imagenet.yaml's max_params 100 M = 400 MB).
MAX_WEIGHTS_BYTES = 1 << 30
# Arrays a weights file may hold: 8x imagenet.yaml's 200 weighted layers with a 4-array BN beside each.
MAX_WEIGHTS_MEMBERS = 10_000
# Per array, on top of its data: a zip entry's local and central headers with their name and zip64
# extras (~150 bytes) plus the .npy header numpy pads to 64 bytes (at most numpy's 10,000 for a parse).
MEMBER_SLACK_BYTES = 10_240
# On top of the arrays: the zip's end-of-central-directory records.
FILE_SLACK_BYTES = 1 << 16
# A language model's array name ("blocks.1023.w_down" is 18): room to spare, still a bounded message.
MAX_LM_NAME_CHARS = 64

T = TypeVar("T")


class WeightsFileError(AiperfError):
    """A stored weights file that is not (or does not declare) the weights of its architecture."""


@dataclass(frozen=True)
class SavedFile:
    """A weights file as written: its path relative to the run directory, SHA-256 and size of its bytes."""

    file: str
    sha256: str
    size: int


def weights_bytes(weights: AnyWeights) -> bytes:
    """The ``.npz`` bytes of a weight set: an image set's arrays named ``node:index``, a language
    model's by their own names (:func:`nas.language.spec.init_weights`'s, which hold no ``:``, so
    the two kinds of file never read as each other)."""
    arrays: dict[str, Any]  # Any: numpy's savez stub types its ** arrays as its own keyword options
    if all(isinstance(k, str) for k in weights):
        bad = next((k for k in weights if not _is_lm_name(str(k))), None)
        if bad is not None:
            raise WeightsFileError(f"LM weights: array name {excerpt(bad)} is not letters, digits, '_' and '.'")
        arrays = {str(k): a for k, a in weights.items()}
    else:
        arrays = {f"{node}:{k}": a for node, arrs in weights.items() for k, a in enumerate(arrs)}
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


def save_weights(weights: AnyWeights, path: Path) -> tuple[str, int]:
    """Write atomically (unique temp file + rename) so a crash or a full disk never leaves a partial file.

    Returns the SHA-256 hex and size of the bytes written: hashed from the very bytes that go
    to disk, not re-read, so what the ledger records is what this process wrote.
    """
    data = weights_bytes(weights)
    write_atomic(path, data)
    return hashlib.sha256(data).hexdigest(), len(data)


def expected_arrays(graph: Graph) -> dict[str, tuple[int, ...]]:
    """The arrays a weights file of ``graph`` holds, by member name (``node:index``), with their shapes."""
    return {
        f"{n.id}:{k}": tuple(int(d) for d in shape)
        for n in graph.nodes
        for k, shape in enumerate(graph.weight_shapes(n.id))
    }


@dataclass(frozen=True)
class _Layout:
    """What a weights file must hold: how its members are named and, with an architecture, which arrays.

    ``want`` (None: any well-named arrays within the absolute caps) maps member names to shapes;
    ``cap`` is the most array bytes the file may hold, ``whose`` what that is (for a message).
    """

    want: dict[str, tuple[int, ...]] | None
    cap: int
    whose: str
    named: Callable[[str], bool]  # whether a member name (without .npy) is of this kind
    form: str  # the names' form, for a message

    @property
    def most_members(self) -> int:
        return len(self.want) if self.want is not None else MAX_WEIGHTS_MEMBERS

    @property
    def most_file_bytes(self) -> int:
        return self.cap + self.most_members * MEMBER_SLACK_BYTES + FILE_SLACK_BYTES


def _member_key(name: str) -> tuple[int, int] | None:
    """``(node, index)`` of a member named ``node:index`` (``np.savez``'s name less ``.npy``), else None."""
    node, sep, index = name.partition(":")
    if not sep or not (node.isdigit() and index.isdigit()) or len(name) > 40:
        return None
    return int(node), int(index)


def _is_lm_name(name: str) -> bool:
    """A language model's array name: ``tok_emb``, ``blocks.3.wq``, ... (ASCII letters, digits, ``_``, ``.``)."""
    return 0 < len(name) <= MAX_LM_NAME_CHARS and name.isascii() and name.replace("_", "a").replace(".", "a").isalnum()


def _npy_header(fh: IO[bytes]) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and data offset of the ``.npy`` stream ``fh`` (reads its header only; numpy caps it)."""
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
    else:
        raise ValueError(f".npy format version {version} is not one numpy writes for arrays like these")
    return tuple(shape), dtype, fh.tell()


def _image_layout(graph: Graph | None) -> _Layout:
    """An image set's file: ``node:index`` members, the graph's arrays (its float32 bytes at most)."""
    cap, whose = MAX_WEIGHTS_BYTES, f"the {MAX_WEIGHTS_BYTES:,} bytes a weights file may hold"
    if graph is not None:
        need = graph.param_count * WEIGHTS_DTYPE.itemsize
        if need <= MAX_WEIGHTS_BYTES:
            cap, whose = need, f"the {need:,} bytes the architecture's {graph.param_count:,} float32 parameters take"
    want = expected_arrays(graph) if graph is not None else None
    return _Layout(want, cap, whose, lambda name: _member_key(name) is not None, "node:index")


def _lm_layout(spec: TransformerSpec | None) -> _Layout:
    """A language model's file: members named as its weights, exactly the spec's arrays when given.

    With a spec the array bytes are the spec's own float32 parameters, whatever their number (the
    members must match its shapes one by one); without one, the absolute cap.
    """
    if spec is None:
        whose = f"the {MAX_WEIGHTS_BYTES:,} bytes a weights file may hold"
        return _Layout(None, MAX_WEIGHTS_BYTES, whose, _is_lm_name, "<weight name>")
    need = spec.params() * WEIGHTS_DTYPE.itemsize
    whose = f"the {need:,} bytes the architecture's {spec.params():,} float32 parameters take"
    return _Layout(spec.weight_shapes(), need, whose, _is_lm_name, "<weight name>")


def _check_members(zf: zipfile.ZipFile, label: str, layout: _Layout) -> dict[str, zipfile.ZipInfo]:
    """Every member checked from the zip's and the ``.npy`` headers, by name; nothing is unpacked.

    With an architecture (``layout.want``): the members are exactly its arrays, each of its shape,
    as float32. Without (``--resume``'s reload, which inherits through a replay that checks shapes
    itself): well-named float32 arrays within the absolute caps.
    """
    want, cap, whose = layout.want, layout.cap, layout.whose
    infos = zf.infolist()
    most = layout.most_members
    if len(infos) > most:
        needs = f"the architecture has {most:,} arrays" if want is not None else f"at most {most:,} are read"
        raise WeightsFileError(f"{label}: holds {len(infos):,} members, {needs}")
    declared = sum(i.file_size for i in infos)
    if declared > cap + MEMBER_SLACK_BYTES * len(infos):
        raise WeightsFileError(f"{label}: its members declare {declared:,} bytes unpacked, more than {whose}")
    members: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        stem = info.filename.removesuffix(".npy")
        if stem == info.filename or not layout.named(stem):
            raise WeightsFileError(f"{label}: member {excerpt(stem)} is not an array named {layout.form}.npy")
        if stem in members:
            raise WeightsFileError(f"{label}: member '{stem}' appears twice")
        if want is not None and stem not in want:
            raise WeightsFileError(f"{label}: member '{stem}' is not an array of the architecture")
        if info.flag_bits & 0x1 or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise WeightsFileError(f"{label}: member '{stem}' is encrypted or compressed in a way numpy never writes")
        with zf.open(info) as fh:
            shape, dtype, offset = _npy_header(fh)
        if dtype != WEIGHTS_DTYPE:
            raise WeightsFileError(f"{label}: member '{stem}' declares dtype {excerpt(str(dtype))}, not float32")
        if any(d < 0 for d in shape):
            raise WeightsFileError(f"{label}: member '{stem}' declares a negative dimension {shape}")
        count = math.prod(shape)
        if want is not None and shape != want[stem]:
            need = math.prod(want[stem])
            if count != need:
                raise WeightsFileError(
                    f"{label}: member '{stem}' declares {count:,} elements, the architecture needs {need:,}"
                )
            raise WeightsFileError(f"{label}: member '{stem}' has shape {shape}, the architecture needs {want[stem]}")
        nbytes = count * WEIGHTS_DTYPE.itemsize
        if nbytes > cap:
            raise WeightsFileError(f"{label}: member '{stem}' declares {count:,} elements, more than {whose}")
        if info.file_size != offset + nbytes:
            raise WeightsFileError(
                f"{label}: member '{stem}' declares {count:,} elements but {info.file_size:,} bytes unpacked,"
                f" not the {offset + nbytes:,} they take"
            )
        members[stem] = info
    if want is not None and len(members) != len(want):
        missing = next(k for k in want if k not in members)
        raise WeightsFileError(f"{label}: has no member '{missing}', an array of the architecture")
    return members


def _read_arrays(path: Path, label: str, layout: _Layout, finish: Callable[[dict[str, np.ndarray]], T]) -> T:
    """A weights file's arrays by member name, checked from its headers first, handed to ``finish``.

    The one reader of both kinds of file: a size bound before the zip is opened, every member's
    header before any array is unpacked, no pickles; every failure (``finish``'s too) is one
    :class:`WeightsFileError` naming the file, ``OSError`` when it cannot be read.
    """
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block the reads below
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        size, cap = info.st_size, layout.most_file_bytes
        if size > cap:
            raise WeightsFileError(f"{label}: {size:,} bytes, more than a weights file of at most {cap:,}")
        arrays: dict[str, np.ndarray] = {}
        with open_zip(path, label, MAX_WEIGHTS_MEMBERS, WeightsFileError) as zf:
            for stem, member in _check_members(zf, label, layout).items():
                with zf.open(member) as fh:  # unpacks at most the declared size checked above
                    arrays[stem] = np.lib.format.read_array(fh, allow_pickle=False)
        return finish(arrays)
    except MemoryError:
        raise WeightsFileError(f"{label}: ran out of memory reading the weights file") from None
    except (ValueError, KeyError, EOFError, RuntimeError, NotImplementedError, zipfile.BadZipFile) as exc:
        raise WeightsFileError(f"{label}: not a readable weights file ({first_line(exc, 160)})") from None


def load_weights(path: Path, graph: Graph | None = None, name: str | None = None) -> Weights:
    """Read a weights file back, checked from its headers first (see the module docstring).

    ``graph`` is the architecture the file must hold the weights of; ``name`` names the file in
    messages (its path by default). Raises :class:`WeightsFileError` for a file that is not such
    weights (or that runs out of memory anyway), ``OSError`` when it cannot be read.
    """
    label = name or str(path)

    def by_node(arrays: dict[str, np.ndarray]) -> Weights:
        out: Weights = {}
        keys = {stem: _member_key(stem) for stem in arrays}
        for stem in sorted(arrays, key=lambda s: keys[s] or (0, 0)):
            node, index = keys[stem] or (0, 0)
            # Without an architecture to compare with, the numbering at least has no gap.
            if index != len(out.setdefault(node, [])):
                raise WeightsFileError(f"{label}: node {node}'s arrays are not numbered 0, 1, 2, ...")
            out[node].append(arrays[stem])
        return out

    return _read_arrays(path, label, _image_layout(graph), by_node)


def load_lm_weights(path: Path, spec: TransformerSpec | None = None, name: str | None = None) -> LMWeights:
    """Read a language model's weights file back, checked as :func:`load_weights` checks an image set's.

    With ``spec`` the members are exactly ``spec.weight_shapes()`` (names and shapes); without
    (``--resume``'s reload: the child's replay and trainer check the shapes) well-named float32
    arrays within the absolute caps. Raises :class:`WeightsFileError` naming the file and the problem.
    """
    return _read_arrays(path, name or str(path), _lm_layout(spec), dict)


class WeightStore:
    """The best trials' weights (or references to them on their nodes) and their files; lookups by trial id.

    Image and language-model sets alike (``loader`` reads the run's kind of file back). A kept set
    that arrives as arrays (an in-process pool, a ``--resume`` reload) is written at
    once. One that arrives as a :class:`~aiperf.cluster.messages.StoredWeights` reference stays on
    its node for children to fetch; its file is *collected* on a thread of the store's own: fetched
    from the node and written while the master goes on. :meth:`drain_saved` gives the files
    written since its last call (the master records each in the ledger) and :meth:`finish` waits
    for the collections still running at the run's end, before the workers and keepers go.
    """

    def __init__(
        self,
        capacity: int,
        directory: str | Path | None = None,
        loader: Callable[[Path], AnyWeights] = load_weights,
    ) -> None:
        self.capacity = capacity
        self.loader = loader  # reads a kept file back (reload, lost): load_lm_weights for a language run
        self.directory = Path(directory) if directory else None
        if self.directory:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise os_error(exc, self.directory, "create the weights folder") from None
        self._warned: set[int | None] = set()  # the errnos already warned about
        self._weights: dict[str, AnyWeights | StoredWeights] = {}
        self._score: dict[str, float] = {}
        self._refs: dict[str, SentWeights] = {}
        self._saved: dict[str, SavedFile] = {}
        self._evicted: list[str] = []  # since the last drain_evicted()
        self._written: list[str] = []  # files written since the last drain_saved()
        self._collecting: dict[str, Future[SavedFile | None]] = {}
        self._collector: ThreadPoolExecutor | None = None

    def __contains__(self, trial: str) -> bool:
        return trial in self._weights

    def __len__(self) -> int:
        return len(self._weights)

    def put(self, trial: str, weights: AnyWeights | StoredWeights, score: float) -> bool:
        """Keep ``weights`` if they rank among the best; returns whether they were kept."""
        if len(self._weights) >= self.capacity:
            worst = min(self._score, key=lambda t: (self._score[t], t))
            if self._score[worst] >= score:
                return False
            self._evict(worst)
        self._weights[trial] = weights
        self._score[trial] = score
        if not self.directory:
            return True
        if isinstance(weights, StoredWeights):
            if self._collector is None:
                self._collector = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aiperf-weights")
            self._collecting[trial] = self._collector.submit(self._collect, trial, weights)
        else:
            saved = self._write(trial, weights)
            if saved is not None:
                self._saved[trial] = saved
                self._written.append(trial)
        return True

    def _write(self, trial: str, weights: AnyWeights) -> SavedFile | None:
        """Write ``trial``'s file; None (warned once per cause) when the disk refuses."""
        assert self.directory is not None
        path = self.directory / f"{trial}.npz"
        try:
            digest, size = save_weights(weights, path)
        except OSError as exc:
            if exc.errno not in self._warned:
                self._warned.add(exc.errno)
                note = "kept in memory or on its node; a --resume retrains children without them"
                logger.warning(str(os_error(exc, path, "save weights to", then=note)))
            return None
        return SavedFile(f"{self.directory.name}/{path.name}", digest, size)

    def _collect(self, trial: str, stored: StoredWeights) -> SavedFile | None:
        """On the collector's thread: fetch a kept set from its node and write its file."""
        try:
            weights = fetch_weights(stored)
        except WeightsLost as exc:
            logger.warning(f"the kept weights of {trial} could not be collected for its file ({exc}): not audited")
            return None
        return self._write(trial, weights) if weights is not None else None

    def drain_saved(self) -> list[tuple[str, SavedFile]]:
        """The files written since the last call, each with its trial (still kept): for the ledger."""
        for trial in [t for t, f in self._collecting.items() if f.done()]:
            saved = self._collecting.pop(trial).result()
            if saved is None:
                continue
            if trial in self._weights:
                self._saved[trial] = saved
                self._written.append(trial)
            elif self.directory:  # dropped for a better set while its file was written
                with contextlib.suppress(OSError):
                    (self.directory / f"{trial}.npz").unlink(missing_ok=True)
        written, self._written = self._written, []
        return [(t, self._saved[t]) for t in written if t in self._saved]

    def finish(self, wait_s: float) -> list[tuple[str, SavedFile]]:
        """At the run's end: wait up to ``wait_s`` for the collections still running; :meth:`drain_saved` after."""
        if self._collecting:
            wait(list(self._collecting.values()), timeout=wait_s)
            late = [t for t, f in self._collecting.items() if not f.done()]
            if late:
                logger.warning(f"the files of {len(late)} kept weight set(s) were not collected within {wait_s:g} s")
                for trial in late:
                    self._collecting.pop(trial).cancel()
        if self._collector is not None:
            self._collector.shutdown(wait=False, cancel_futures=True)
            self._collector = None
        return self.drain_saved()

    def drain_evicted(self) -> list[str]:
        """The trials whose weights were dropped since the last call (their graphs are no longer needed)."""
        evicted, self._evicted = self._evicted, []
        return evicted

    def _evict(self, trial: str) -> None:
        self._evicted.append(trial)
        self._weights.pop(trial, None)
        self._score.pop(trial, None)
        self._refs.pop(trial, None)
        self._saved.pop(trial, None)
        pending = self._collecting.get(trial)
        if pending is not None and pending.cancel():
            del self._collecting[trial]
        if self.directory:
            with contextlib.suppress(OSError):
                (self.directory / f"{trial}.npz").unlink(missing_ok=True)

    def lost(self, trial: str) -> None:
        """A child could not fetch ``trial``'s set from its node: children now get its file, or nothing.

        With the file collected, the set is read back from it (and handed out through the pool
        from then on); without one, the trial is dropped as if evicted, so no further child waits
        for weights that are gone.
        """
        held = self._weights.get(trial)
        if not isinstance(held, StoredWeights):
            return
        saved = self._saved.get(trial)
        if saved is not None and self.directory is not None:
            try:
                self._weights[trial] = self.loader(self.directory / f"{trial}.npz")
                self._refs.pop(trial, None)
                logger.warning(f"the weights of {trial} are gone with their node: children inherit its collected file")
                return
            except (OSError, WeightsFileError) as exc:
                logger.warning(f"the weights of {trial} are gone with their node and its file: {first_line(exc, 160)}")
        self._evict(trial)

    def saved(self, trial: str) -> SavedFile | None:
        """The file this store wrote for ``trial`` in this session (None: not kept, not written yet, or evicted)."""
        return self._saved.get(trial)

    def get(self, trial: str) -> AnyWeights | None:
        """The arrays of a kept set held in this process (None: not kept, or left on its node)."""
        held = self._weights.get(trial)
        return None if isinstance(held, StoredWeights) else held

    def shared(self, trial: str, put: Callable[[WeightSource], SentWeights]) -> SentWeights:
        """A handle to hand to workers: a set's reference on its node, or one ``put`` of arrays held here."""
        held = self._weights.get(trial)
        if held is None or isinstance(held, StoredWeights):
            return held
        if trial not in self._refs:
            self._refs[trial] = put(held)
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
                    self._weights[trial] = self.loader(path)
                except (OSError, WeightsFileError) as exc:
                    why = str(exc) if isinstance(exc, WeightsFileError) else f"{path}: {first_line(exc, 120)}"
                    logger.warning(
                        f"kept weights cannot be read back: {why}; trials inheriting from {trial} start from scratch"
                    )
                    skipped.append(f"{path.parent.name}/{path.name}")
                    continue
                self._score[trial] = scores[trial]
        return skipped
