"""Start-up expansions in other processes of the head node.

At 65,536 workers the start-up fill builds about 100,000 child graphs, their keys and FLOPs
counts, which is four fifths of the time before every worker has its first trial
(benchmarks/RESULTS.md, "The start-up fill at 65,536 workers, profiled"). A node's expansion
depends on nothing but the node (:func:`nas.startup.expand`), so the nodes queued next are
expanded here, ``processes`` at a time, while the master hands out the children of the
current one. Processes are spawned, not forked: the master runs threads (Ray's, the
ledger's) that a fork would copy in whatever state they were. The limits travel once, when a
process starts; each task carries one graph there and its children back.
"""

from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from nas.graph import Graph
from nas.limits import Limits
from nas.startup import LOOKAHEAD_PER_PROCESS, Expanded, expand

logger = logging.getLogger(__name__)
MAX_PROCESSES = 256
_LIMITS: Limits | None = None  # this expansion process's copy, set once by _adopt_limits


def _adopt_limits(limits: Limits) -> None:
    global _LIMITS
    _LIMITS = limits


def _expand_here(graph: Graph, kernel: int, seed: int) -> list[Expanded]:
    assert _LIMITS is not None, "an expansion process starts with the run's limits"
    return expand(graph, kernel, seed, _LIMITS)


class ExpandPool:
    """``processes`` spawned processes expanding start-up nodes ahead of the master (see the module docstring)."""

    def __init__(self, processes: int, limits: Limits) -> None:
        if isinstance(processes, bool) or not isinstance(processes, int) or not 1 <= processes <= MAX_PROCESSES:
            raise ValueError(f"expansion processes must be an integer in [1, {MAX_PROCESSES}], got {processes!r}")
        self.processes = processes
        self.lookahead = processes * LOOKAHEAD_PER_PROCESS
        self._limits = limits
        self._executor: ProcessPoolExecutor | None = ProcessPoolExecutor(
            processes, mp_context=multiprocessing.get_context("spawn"), initializer=_adopt_limits, initargs=(limits,)
        )

    def start(self, graph: Graph, kernel: int, seed: int, limits: Limits) -> Future[list[Expanded]]:
        if limits is not self._limits:
            raise ValueError("an expansion pool serves the limits it was started with")
        if self._executor is None:
            raise RuntimeError("the expansion pool is closed")
        try:
            return self._executor.submit(_expand_here, graph, kernel, seed)
        except (BrokenProcessPool, OSError, RuntimeError) as exc:  # a process died or could not start: it fails
            # when its result is wanted, and the start-up goes on in the master (nas.startup)
            failed: Future[list[Expanded]] = Future()
            failed.set_exception(exc)
            return failed

    def close(self) -> None:
        """Stop the processes now; expansions not yet started are dropped (the start-up is over)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
