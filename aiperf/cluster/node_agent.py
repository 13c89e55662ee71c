"""One Ray actor per node (``cluster.actors: per_node``): a node agent runs that node's trials.

With one actor per worker, a 10,000-node machine with 8 accelerators a node needs 80,000 Ray
actors, beyond what Ray's own release tests exercise (about 10,000). A :class:`NodeAgent`
holds the resources of all its node's slots and runs each slot's :class:`TrialWorker` in a
process of its own (started with ``spawn``, its accelerators chosen by ``CUDA_VISIBLE_DEVICES``
before any framework loads), so the cluster has one actor per node and the workers keep what
one process per accelerator gives them: their own framework state and device.

The agent fetches the weights a trial is sent and hands the arrays to the slot's process; each set
the process sends back goes to the node's weight keeper (:mod:`aiperf.cluster.node_weights`), which
owns it, as it does for workers that are actors of their own; the agent's stream names it by the
keeper's key and the master takes its reference from the keeper. So a node has two actors: its
agent and its keeper.

The pool sends the trials it hands one agent's slots in a row as one call (:meth:`NodeAgent.run_trials`).
A slot's process that dies ends its trial's share of that stream as lost -- the pool treats it
as a lost worker, like a dead actor -- and the pool may start the slot again on the same agent.
The master sees the same workers (``w0003``), the same events and the same records in both modes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Generator
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Literal

from aiperf.cluster.messages import (
    EpochReport,
    TrialDone,
    TrialEnded,
    TrialMessage,
    TrialStarted,
    WorkerInfo,
    WorkerStats,
)
from aiperf.cluster.node_weights import NodeStore, SentWeights, StartWeights, resolve_start
from aiperf.datasets.base import Dataset
from aiperf.errors import first_line
from aiperf.families.language.data import LanguageData
from aiperf.training.compile_ahead import ahead_supported
from aiperf.training.trial import TrialSpec, TrialSpecDict

if TYPE_CHECKING:
    from aiperf.cluster.remote import KeeperActor
    from aiperf.cluster.worker import TrialWorker, WorkerSettings

logger = logging.getLogger(__name__)

SLOT_START_S = 600.0  # the most a slot's process may take to start (framework import, device, ceiling)
PARENT_CHECK_S = 1.0  # how often a slot's process checks that its agent still exists
SLOT_STOP_S = 5.0  # how long a stopped slot's process gets to exit before it is killed
SLOT_REAP_S = 1.0  # how long a slot's process whose pipe closed gets to be reaped before its exit code is read


TrialRequest = tuple[int, str, TrialSpecDict, SentWeights, SentWeights]  # slot key, worker id, spec, parent, resume
# What a slot's process sends its agent, by its first item: its description once ready, a trial's message, the
# end of a trial's messages, its accounting, or an error as "Type: words" (the trial raised, or the start failed).
SlotReply = (
    tuple[Literal["ready"], WorkerInfo]
    | tuple[Literal["message"], TrialMessage]
    | tuple[Literal["end"], None]
    | tuple[Literal["stats"], WorkerStats]
    | tuple[Literal["error"], str]
)


class SlotLost(Exception):
    """A slot's worker process died (or was stopped) while the agent waited on it."""


class TrialRaised(Exception):
    """The trial raised in its slot's process; the message is the process's own ``Type: words``."""

    def __str__(self) -> str:
        return str(self.args[0])


def device_shares(gpus: list[float], ids: list[str]) -> list[list[str]]:
    """The accelerator ids of each slot, in slot order, from the agent's ``ids`` and each slot's share.

    A whole share takes that many ids in turn; fractional shares (``fractional`` placement) pack
    onto one id until it is full. Without ids (a CPU node) every slot gets none.
    """
    if not ids:
        return [[] for _ in gpus]
    out, used = [], 0.0
    for share in gpus:
        first = math.floor(used + 1e-9)
        used += share
        last = max(first + 1, math.ceil(used - 1e-9))
        out.append(ids[first:last] if share > 0 else [])
    return out


def _exit_with_parent(parent: int) -> None:
    """End this slot's process once its agent is gone (killed, or its node's Ray stopped), even mid-epoch."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


def _slot_main(
    conn: Connection, worker_id: str, dataset: Dataset | LanguageData, settings: WorkerSettings, devices: str | None
) -> None:
    """A slot's process: build the worker, then answer the agent's requests until told to stop or the pipe closes.

    A thread reads the pipe, so a ``prepare`` request (a trial queued behind the running one) reaches the
    worker's compile thread while a trial trains; every other request is answered here, in order.
    """
    if devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True, name="parent-watch").start()
    from aiperf.cluster.worker import TrialWorker

    try:
        worker = TrialWorker(worker_id, dataset, settings)
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {first_line(exc, 400)}"))
        return
    conn.send(("ready", worker.info()))
    requests: queue.SimpleQueue[tuple] = queue.SimpleQueue()
    ahead: queue.SimpleQueue[TrialSpecDict] = queue.SimpleQueue()
    threading.Thread(target=_read_requests, args=(conn, requests, ahead), daemon=True, name="requests").start()
    threading.Thread(target=_compile_ahead, args=(worker, ahead), daemon=True, name="compile-ahead").start()
    while True:
        request = requests.get()
        kind = request[0]
        if kind == "stop":
            return
        try:
            if kind == "run":
                for message in worker.run_trial(*request[1:]):
                    conn.send(("message", message))
                conn.send(("end", None))
            elif kind == "stats":
                conn.send(("stats", worker.stats()))
        except Exception as exc:  # the trial raised: its stream ends with the error, the process goes on
            conn.send(("error", f"{type(exc).__name__}: {first_line(exc, 400)}"))


def _read_requests(
    conn: Connection, requests: queue.SimpleQueue[tuple], ahead: queue.SimpleQueue[TrialSpecDict]
) -> None:
    """The slot's pipe, read as requests come: ``prepare`` goes to the compile thread, the rest in order."""
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):  # the agent is gone
            requests.put(("stop",))
            return
        if request[0] == "prepare":
            ahead.put(request[1])
        else:
            requests.put(request)


def _compile_ahead(worker: TrialWorker, ahead: queue.SimpleQueue[TrialSpecDict]) -> None:
    """The slot's compile thread: each queued trial's model built and its steps compiled (``TrialWorker.prepare``)."""
    while True:
        worker.prepare(ahead.get())


class _SlotProcess:
    """The agent's side of one slot: its process, its pipe, and a lock so one request talks at a time."""

    def __init__(
        self, worker_id: str, dataset: Dataset | LanguageData, settings: WorkerSettings, devices: str | None
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_slot_main, args=(child, worker_id, dataset, settings, devices), name=f"aiperf-{worker_id}"
        )
        self.process.start()
        child.close()
        self.lock = threading.Lock()  # one request and its answers at a time
        self._send_lock = threading.Lock()  # a prepare request may be sent while another request is answered
        self.worker_id = worker_id
        self.ready = False  # its worker answered: trials may be sent
        self.training = False  # a trial is running on it (not merely a stats request holding the lock)

    def receive(self, timeout: float | None = None) -> SlotReply:
        """The process's next reply; :class:`SlotLost` when it died or stayed silent past ``timeout``."""
        try:
            if timeout is not None and not self.conn.poll(timeout):
                raise SlotLost(f"worker {self.worker_id}'s process did not answer within {timeout:g} s")
            return self.conn.recv()
        except (EOFError, OSError):
            raise self.lost() from None

    def send(self, message: tuple) -> None:
        """Send the process a request; :class:`SlotLost` when it is gone (it died while it had nothing to do)."""
        try:
            with self._send_lock:
                self.conn.send(message)
        except OSError:
            raise self.lost() from None

    def prepare(self, spec: TrialSpecDict) -> None:
        """Have the process compile a queued trial ahead (no answer; a process already gone is found by the trial)."""
        with contextlib.suppress(OSError), self._send_lock:
            self.conn.send(("prepare", spec))

    def lost(self) -> SlotLost:
        """Why the process can no longer be reached: the same words however the agent found out.

        Its pipe closes as it dies, a moment before it can be reaped, so its exit code is waited for briefly.
        """
        self.process.join(SLOT_REAP_S)
        if self.process.is_alive():
            return SlotLost(f"worker {self.worker_id}'s process closed its pipe and did not exit")
        return SlotLost(f"worker {self.worker_id}'s process died (exit code {self.process.exitcode})")

    def stop(self) -> None:
        with contextlib.suppress(OSError), self._send_lock:  # a process already gone has no pipe to read it
            self.conn.send(("stop",))
        self.process.join(SLOT_STOP_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(SLOT_STOP_S)
        self.conn.close()


class NodeAgent:
    """The Ray actor of one node (threaded: each slot's request runs on a thread of its own)."""

    def __init__(self, shares: dict[int, float], keeper: KeeperActor | None = None) -> None:
        """``shares``: each slot's accelerator share by key, in the order they are cut from the agent's accelerators.

        ``keeper``: the node's :class:`~aiperf.cluster.node_weights.WeightKeeper`, which owns the sets the agent's
        workers produce (a set the agent put itself and yielded was freed under the master: Ray 2.60 raised
        ``ReferenceCountingAssertionError`` collecting it, and children waited on their parents for the fetch timeout).
        """
        import ray

        self._node = ray.get_runtime_context().get_node_id()
        self._store = NodeStore(keeper, self._node)
        ids = [str(i) for i in ray.get_gpu_ids()]
        cut = device_shares(list(shares.values()), ids)
        self._devices = {key: (",".join(d) if ids else None) for key, d in zip(shares, cut, strict=True)}
        self._slots: dict[int, _SlotProcess] = {}
        self._failed: dict[int, str] = {}  # slots whose start failed, with why
        self._changed = threading.Condition()  # a slot registered, became ready, failed or stopped
        self._ahead = False  # queued trials go to their slots to be compiled ahead (set from the slots' settings)
        self._waiting: dict[int, list[TrialSpec]] = {}  # per slot: the trials waiting for it, in the order they came

    def start(self, key: int, worker_id: str, dataset: Dataset | LanguageData, settings: WorkerSettings) -> WorkerInfo:
        """Start slot ``key``'s process (a slot started before is stopped first); its description once ready.

        The pool queues trials on a slot while it starts; they wait in :meth:`_slot` until it is ready.
        """
        self._ahead = settings.compile_ahead and ahead_supported(settings.backend, 1)
        with self._changed:
            old = self._slots.pop(key, None)
            self._failed.pop(key, None)
        if old is not None:
            old.stop()
        slot = _SlotProcess(worker_id, dataset, settings, self._devices.get(key))
        with self._changed:
            self._slots[key] = slot
            self._changed.notify_all()
        try:
            reply = slot.receive(SLOT_START_S)
            if reply[0] != "ready":
                raise RuntimeError(reply[1])
        except Exception as exc:
            with self._changed:
                self._failed[key] = str(exc)
                self._slots.pop(key, None)
                self._changed.notify_all()
            slot.stop()
            raise
        with self._changed:
            slot.ready = True
            self._changed.notify_all()
        return {**reply[1], "node": self._node, "agent_pid": os.getpid()}

    def _slot(self, key: int, wait_s: float = SLOT_START_S) -> _SlotProcess:
        """Slot ``key`` once it is ready (waiting up to ``wait_s`` while it starts); :class:`SlotLost` if it is not."""
        deadline = time.monotonic() + wait_s
        with self._changed:
            while True:
                slot = self._slots.get(key)
                if slot is not None and slot.ready:
                    return slot
                if key in self._failed:
                    raise SlotLost(f"slot {key} of this node agent failed to start: {self._failed[key]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SlotLost(f"slot {key} of this node agent is not running")
                self._changed.wait(left)

    def run_trials(self, batch: list[TrialRequest]) -> Generator[tuple[int, TrialMessage | TrialEnded], None, None]:
        """Run one remote call's trials, ``(slot key, worker id, spec, parent, resume)`` each; relay their messages.

        The master sends the trials it hands this node's slots in a row as one call
        (:mod:`aiperf.cluster.call_batch`). Each slot's trials run in order on a thread of its own
        (waiting for the slot while it runs an earlier call's trial); the stream carries
        ``(index in batch, message)`` and ends every trial's share with a :class:`TrialEnded` --
        its failure, or that its slot's process died -- so one trial's end never ends its neighbours'.

        The slots' threads only talk to their processes: every call into Ray -- fetching the
        weights a trial is sent, handing each set it trains to the node's keeper -- is made here,
        on the call's own thread, so a call's weights are fetched before any of its trials starts.

        The stream carries no object reference: each set goes to the keeper under a key
        (:meth:`~aiperf.cluster.node_weights.WeightKeeper.hold`) and the item carries the key; the
        master takes the reference from the keeper. With references in the items (Ray 2.60), the
        keeper sometimes freed a set the master held -- ``ReferenceCountingAssertionError`` when the
        master collected it, in 7 of 9 runs of the two-node agent test
        (tests/cluster/test_multinode.py) -- the class of fault of ray-project/ray issue 58080.
        """
        out: queue.SimpleQueue[tuple[int, TrialMessage | TrialEnded]] = queue.SimpleQueue()
        by_slot: dict[int, list[tuple[int, str, StartWeights]]] = {}
        for index, (key, worker_id, spec, parent, resume) in enumerate(batch):
            try:
                start = resolve_start(TrialSpec.from_dict(spec), parent, resume)
            except Exception as exc:
                out.put((index, TrialEnded(error=f"{type(exc).__name__}: {first_line(exc, 400)}")))
                continue
            by_slot.setdefault(key, []).append((index, worker_id, start))
            self._queue_behind(key, worker_id, start.spec)

        def run_slot(key: int, trials: list[tuple[int, str, StartWeights]]) -> None:
            for index, worker_id, start in trials:
                try:
                    for message in self._relay(key, worker_id, start):
                        out.put((index, message))
                    ended = TrialEnded()
                except SlotLost as exc:
                    ended = TrialEnded(error=f"SlotLost: {exc}", lost=True)
                except TrialRaised as exc:
                    ended = TrialEnded(error=str(exc))
                except Exception as exc:
                    ended = TrialEnded(error=f"{type(exc).__name__}: {first_line(exc, 400)}")
                out.put((index, ended))

        for key, trials in by_slot.items():
            threading.Thread(target=run_slot, args=(key, trials), daemon=True, name=f"slot-{key}").start()
        running = len(batch)
        while running:
            index, item = out.get()
            if isinstance(item, (EpochReport, TrialDone)) and isinstance(item.weights, dict):
                item.weights = self._store.hold(item.weights, batch[index][1])
            running -= isinstance(item, TrialEnded)
            yield index, item

    def _queue_behind(self, key: int, worker_id: str, spec: TrialSpec) -> None:
        """Note a trial waiting for slot ``key``; if a trial runs there and none waits before it, compile it ahead now.

        The trials a slot will run next, from any call, wait here in the order they came; each
        trial that starts sends the first of them to be compiled ahead (:meth:`_relay`).
        """
        with self._changed:  # noted even before a slot's start says whether it compiles ahead
            waiting = self._waiting.setdefault(key, [])
            waiting.append(spec)
            slot = self._slots.get(key)
            first = len(waiting) == 1
        if self._ahead and first and slot is not None and slot.ready and slot.worker_id == worker_id and slot.training:
            slot.prepare(spec.to_dict())

    def _next_behind(self, key: int, started: TrialSpec) -> TrialSpec | None:
        """Slot ``key`` started ``started`` (or gave it up): the trial waiting first behind it, if any."""
        with self._changed:
            waiting = self._waiting.get(key, [])
            if started in waiting:
                waiting.remove(started)
                self._changed.notify_all()  # the trial behind it may go
            return waiting[0] if waiting else None

    def _await_turn(self, key: int, spec: TrialSpec) -> None:
        """Wait until ``spec`` is the first trial waiting for slot ``key``: a slot runs its trials in the order
        they came, from any call.

        Each call's trials run on a thread of their own, and threads waiting for one slot (while it starts,
        or behind a trial) take it in no set order: a later call's trial could start first, and the trial
        compiled ahead for the place behind it would not be the one that comes next. Each call queues its
        trials in its own order, so the first waiting is always its thread's next: no thread waits on another
        that waits on it.
        """
        with self._changed:
            while (waiting := self._waiting.get(key)) and spec in waiting and waiting[0] != spec:
                self._changed.wait()

    def _relay(self, key: int, worker_id: str, start: StartWeights) -> Generator[TrialMessage, None, None]:
        """Run a trial on slot ``key`` from the weights fetched for it; its messages as its process sends them.

        The trial waiting first behind it on the slot is sent to be compiled ahead meanwhile.
        """
        try:
            self._await_turn(key, start.spec)
            slot = self._slot(key)
            if slot.worker_id != worker_id:  # the worker was lost and its slot started again for another
                raise SlotLost(f"worker {worker_id} is gone: its slot now runs worker {slot.worker_id}")
        except BaseException:
            self._next_behind(key, start.spec)  # gave up its place: the trials behind it may go
            raise
        with slot.lock:
            slot.training = True
            try:
                try:
                    slot.send(("run", start.spec.to_dict(), start.parent, start.resume))
                finally:
                    behind = self._next_behind(key, start.spec)
                if behind is not None and self._ahead:
                    slot.prepare(behind.to_dict())
                while True:
                    reply = slot.receive()
                    if reply[0] == "end":
                        return
                    if reply[0] == "error":
                        raise TrialRaised(reply[1])
                    if reply[0] != "message":  # a stats answer (a process sends "ready" once, before any trial)
                        continue
                    value = reply[1]
                    if isinstance(value, TrialStarted) and start.fallback:
                        value.weights_lost, value.inherited = start.fallback, start.inherited
                    yield value
            finally:
                slot.training = False

    def alive(self, key: int) -> bool:
        """The master's liveness question for one slot: its process must still exist."""
        slot = self._slot(key, wait_s=0.0)
        if not slot.process.is_alive():
            raise slot.lost()
        return True

    def stats(self, key: int) -> WorkerStats:
        slot = self._slot(key)
        with slot.lock:
            slot.send(("stats",))
            reply = slot.receive(SLOT_STOP_S)
        if reply[0] != "stats":
            raise RuntimeError(f"worker {slot.worker_id} answered {reply[0]} to a stats request")
        return reply[1]

    def stop(self, key: int) -> None:
        """Stop slot ``key``'s process (a lost or retired worker)."""
        with self._changed:
            slot = self._slots.pop(key, None)
            self._changed.notify_all()
        if slot is not None:
            slot.stop()

    def stop_all(self) -> None:
        with self._changed:
            slots, self._slots = list(self._slots.values()), {}
            self._changed.notify_all()
        for slot in slots:
            slot.stop()
