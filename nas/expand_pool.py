"""Start-up and tree-search expansions in other processes of the head node.

At 65,536 workers the start-up fill builds about 100,000 child graphs, their keys and FLOPs
counts, which is four fifths of the time before every worker has its first trial
(benchmarks/RESULTS.md, "The start-up fill at 65,536 workers, profiled"). A node's expansion
depends on nothing but the node (:func:`nas.startup.expand`), so the nodes queued next are
expanded here, ``processes`` at a time, while the master hands out the children of the
current one. After the start-up the same processes answer the Bayesian search's tree-search
tasks (:mod:`nas.tree_expand`), embedding the children with the search's landmarks, which
they are given when they start. Processes are spawned, not forked: the master runs threads (Ray's, the
ledger's) that a fork would copy in whatever state they were. The limits travel once, when a
process starts; each task carries one graph there and its children back.

Each process has a pipe of its own, read in the master by one thread. Not
``concurrent.futures.ProcessPoolExecutor``: its processes share one result pipe, so a process
killed half way through writing a large result (the OOM killer, an operator) leaves the
executor's reader waiting for the rest of a message that never comes, and every future
unresolved; CI hung there. Here a process's death closes its own pipe, its reader sees the
end at once, and every pending expansion fails: the start-up goes on in the master
(:class:`nas.startup.StartupChildren`). A process alive but stuck (stopped, swapping) is
waited for ``patience_s`` at most, then treated the same.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import multiprocessing
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from nas.distance import ArchitectureDistance
from nas.gp import LandmarkEmbedding
from nas.graph import Graph
from nas.limits import Limits
from nas.morph import Morph
from nas.startup import LOOKAHEAD_PER_PROCESS, Expanded, Packed, expand, refused
from nas.tree_expand import GrowTask, Growth, grow

logger = logging.getLogger(__name__)
MAX_PROCESSES = 256
PATIENCE_S = 120.0  # the longest wait for one node's expansion before the master expands it itself
MAX_EMBEDDED = 50_000  # embeddings a process keeps before it starts afresh (a long run meets millions of children)


class PoolUnavailable(RuntimeError):
    """The expansion processes could not be started (the master expands everything itself)."""


class PoolBroken(RuntimeError):
    """An expansion process died, or the pool was closed, before the expansion came back."""


Work = Callable[[Graph, int, int, Limits, float], Any]
_SENT: set[str] = set()  # in an expansion process: the keys of the children it has sent the master


def expand_unsent(graph: Graph, kernel: int, seed: int, limits: Limits, ceiling: float) -> list[Expanded | Packed]:
    """:func:`~nas.startup.expand` less the children this process has sent before; those refused at ``ceiling`` packed.

    A process takes nodes in the master's queue order, and the master goes through every child
    of a node before the next node's, so a child sent before was seen there already: the master
    would skip it by its key (about one child in six at 16,384 workers), after unpickling it.
    A child over the limits or above the FLOPs ceiling is sent pickled inside its message
    (:class:`~nas.startup.Packed`): the master unpickles it only if the ceiling rises past it.
    """

    def sent_before(key: str) -> bool:  # asked once a child, before the child is judged
        if key in _SENT:
            return True
        _SENT.add(key)
        return False

    children = expand(graph, kernel, seed, limits, skip=sent_before)
    return [Packed.of(item) if refused(item.verdict, item.flops, ceiling) else item for item in children]


class _Grower:
    """An expansion process's side of the steady state's tree search (:func:`nas.tree_expand.grow`)."""

    def __init__(self, limits: Limits, landmarks: Sequence[Graph]) -> None:
        self._limits = limits
        self._orders: dict[tuple[str, int, int], list[Morph]] = {}
        self._embed = LandmarkEmbedding(landmarks, ArchitectureDistance()) if landmarks else None

    def __call__(self, task: GrowTask) -> Growth:
        if self._embed is None:
            raise RuntimeError("this expansion pool was started without the search's landmarks")
        if len(self._embed) > MAX_EMBEDDED:
            self._embed.forget(set())
        return grow(task, self._limits.admits_structure, self._orders, self._limits, self._embed)


def _serve(conn: Connection, limits: Limits, work: Work, landmarks: Sequence[Graph] = ()) -> None:
    """An expansion process: a task at a time from its pipe, its answer back on the same pipe.

    A task is a start-up node to expand (``work``), or a tree-search :class:`GrowTask`.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the master's to handle; it closes the pool
    grower = _Grower(limits, landmarks)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the master closed the pipe or is gone
            return
        if task is None:
            return
        task_id, args = task
        reply: tuple[int, Any, str]
        try:
            if isinstance(args, GrowTask):
                reply = (task_id, grower(args), "")
            else:
                graph, kernel, seed, ceiling = args
                reply = (task_id, work(graph, kernel, seed, limits, ceiling), "")
        except Exception as exc:  # a failed expansion fails its future, not the process
            reply = (task_id, None, f"{type(exc).__name__}: {str(exc)[:200]}")
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return


class _Expansion:
    """A node's expansion in another process; ``result()`` waits at most the pool's patience, then breaks it."""

    def __init__(self, future: Future[Any], pool: ExpandPool) -> None:
        self.future = future
        self._pool = pool

    def done(self) -> bool:
        return self.future.done()

    def result(self) -> list[Expanded | Packed]:
        try:
            return self.future.result(timeout=self._pool.patience_s)
        except TimeoutError:
            self._pool._break(f"no expansion came back within {self._pool.patience_s:g} s")
            raise


class _Process:
    def __init__(self, process: BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.pending: dict[int, Future[Any]] = {}


class ExpandPool:
    """``processes`` spawned processes expanding start-up nodes ahead of the master (see the module docstring)."""

    def __init__(
        self,
        processes: int,
        limits: Limits,
        patience_s: float = PATIENCE_S,
        work: Work = expand_unsent,
        landmarks: Sequence[Graph] = (),
    ) -> None:
        """``work`` is what the processes run on each start-up node: :func:`expand_unsent` but in tests.

        ``landmarks`` are the Bayesian search's; with them the processes also answer its
        tree-search tasks (:meth:`grow`), children embedded as the search embeds them.
        """
        if isinstance(processes, bool) or not isinstance(processes, int) or not 1 <= processes <= MAX_PROCESSES:
            raise ValueError(f"expansion processes must be an integer in [1, {MAX_PROCESSES}], got {processes!r}")
        self.processes = processes
        self.lookahead = processes * LOOKAHEAD_PER_PROCESS
        self._limits = limits
        self.patience_s = patience_s
        self._closed = False
        self._lock = threading.Lock()  # guards the pending maps and the state below, between the caller and the reader
        self._broken = ""  # why the pool no longer takes work; "" while it does
        self._ids = itertools.count()
        self._turn = itertools.count()
        self._procs: list[_Process] = []
        context = multiprocessing.get_context("spawn")
        self._wake_reader, self._wake_writer = context.Pipe(duplex=False)
        try:
            for k in range(processes):
                mine, theirs = context.Pipe(duplex=True)
                name = f"aiperf-expand-{k}"
                process = context.Process(
                    target=_serve, args=(theirs, limits, work, list(landmarks)), name=name, daemon=True
                )
                process.start()
                theirs.close()  # the process's death then ends this pipe: its reader sees EOF
                self._procs.append(_Process(process, mine))
        except Exception as exc:
            self._stop_processes()
            raise PoolUnavailable(f"{type(exc).__name__}: {str(exc)[:200]}") from exc
        self._reader = threading.Thread(target=self._read, name="aiperf-expand-reader", daemon=True)
        self._reader.start()

    def start(self, graph: Graph, kernel: int, seed: int, limits: Limits, ceiling: float = math.inf) -> _Expansion:
        """Queue ``graph``'s expansion on the process with the fewest pending; a broken pool fails it at once.

        Children over the limits or above ``ceiling`` come back packed (:func:`expand_unsent`).
        """
        if limits is not self._limits:
            raise ValueError("an expansion pool serves the limits it was started with")
        return self._send((graph, kernel, seed, ceiling))

    def grow(self, task: GrowTask) -> _Expansion:
        """Queue a tree-search task (:mod:`nas.tree_expand`); its result is a :class:`~nas.tree_expand.Growth`."""
        return self._send(task)

    def _send(self, args: Any) -> _Expansion:
        if self._closed:
            raise RuntimeError("the expansion pool is closed")
        future: Future[Any] = Future()
        with self._lock:
            if self._broken:
                future.set_exception(PoolBroken(self._broken))
                return _Expansion(future, self)
            first, count = next(self._turn), len(self._procs)
            _, target = min(enumerate(self._procs), key=lambda kp: (len(kp[1].pending), (kp[0] - first) % count))
            task_id = next(self._ids)
            target.pending[task_id] = future
        try:
            target.conn.send((task_id, args))
        except (OSError, ValueError) as exc:  # its process died (broken pipe) or the pool was closed meanwhile
            self._break(f"an expansion process could not be sent work ({type(exc).__name__}: {exc})")
        return _Expansion(future, self)

    def close(self) -> None:
        """Stop the processes now; expansions still pending fail (the start-up is over, or goes on here)."""
        if self._closed:
            return
        self._closed = True
        self._break("the expansion pool is closed")
        self._reader.join(5)
        for conn in [*(proc.conn for proc in self._procs), self._wake_reader, self._wake_writer]:
            with contextlib.suppress(OSError):
                conn.close()

    def _break(self, why: str) -> None:
        """Fail every pending expansion with ``why``, take no more work, and end the processes."""
        with self._lock:
            if not self._broken:
                self._broken = why
            pending = [future for proc in self._procs for future in proc.pending.values()]
            for proc in self._procs:
                proc.pending.clear()
        for future in pending:
            if not future.done():
                future.set_exception(PoolBroken(why))
        self._stop_processes()
        with contextlib.suppress(OSError, ValueError):
            self._wake_writer.send_bytes(b"")  # the reader ends its wait and, the pool broken, returns

    def _stop_processes(self) -> None:
        for proc in self._procs:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                proc.process.kill()  # SIGKILL: a stopped process ends too
        for proc in self._procs:
            with contextlib.suppress(OSError, ValueError, AttributeError, AssertionError):
                proc.process.join(5)

    def _read(self) -> None:
        """The reader thread: resolve each expansion as its process sends it back, or fail all when one dies."""
        conns = {proc.conn: proc for proc in self._procs}
        while not self._broken:
            for conn in wait([*conns, self._wake_reader]):
                if conn is self._wake_reader:
                    break  # the pool broke or closed: the loop's test ends it
                proc = conns[conn]  # type: ignore[index]
                try:
                    task_id, children, failure = proc.conn.recv()
                except (EOFError, OSError) as exc:  # a process died, perhaps half way through a result
                    self._break(f"an expansion process ended ({type(exc).__name__}: {exc})")
                    break
                with self._lock:
                    future = proc.pending.pop(task_id, None)
                if future is None or future.done():
                    continue
                if failure:
                    future.set_exception(PoolBroken(f"an expansion failed: {failure}"))
                else:
                    future.set_result(children)
