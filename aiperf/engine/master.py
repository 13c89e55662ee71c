"""The master loop: keep every worker fed, record every completed epoch, survive failures.

It composes three replaceable parts — a :class:`~nas.proposer.Proposer` (what to try
next), a :class:`~aiperf.cluster.pool.WorkerPool` (where and how trials run) and a
:class:`~aiperf.ledger.store.LedgerWriter` (what happened) — so it can be tested in
milliseconds with an in-process pool and scaled to thousands of simulated workers.

Time: everything is measured on this process's clock (the ledger's ``t``), never on a
worker's, so the score never mixes node clocks. The budget is kept on that clock too: no step
of the loop waits on Ray for more than a poll (the pool never asks Ray's control plane on this
thread), so the run ends at its budget even when Ray's control plane stops answering, and its
``run_stop`` comes at most ``BUDGET_GRACE_S`` later (docs/cluster.md, "When Ray stops answering").

A run that cannot train stops instead of spending its budget: when every worker failed to
start (and none can be started any more), when ``stop_after_failures`` trials in a row fail
with the same error on as many workers with no epoch completing in between, or when more
images cannot be decoded than ``dataset.max_bad_fraction`` allows. It then ends with status
``failed`` and a one-line reason naming the worker, its node and the cause. Trials lost with
their worker (a node died) are re-queued from their last epoch as before.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, Unpack

from aiperf.cluster.messages import (
    BadImagesReport,
    EpochReport,
    EventKind,
    StoredWeights,
    TrialDone,
    TrialStarted,
    WorkerInfo,
    WorkerStats,
)
from aiperf.cluster.pool import FINAL_ANSWER_S, FINAL_STATS_S, PoolEvent, WorkerPool
from aiperf.datasets.bad_images import over_limit, skipped_note, too_many_bad_images
from aiperf.engine.progress import Progress
from aiperf.engine.weights import SavedFile, WeightStore
from aiperf.families import Family, Prepared
from aiperf.families.image.family import ImageFamily
from aiperf.ledger.schema import (
    BadImagesRecord,
    CeilingHeader,
    EpochRecord,
    IdleGaps,
    RequeueRecord,
    RunStatus,
    TrialEndRecord,
    TrialHparams,
    TrialStartRecord,
    TrialStatus,
    WeightsRecord,
    WorkerFailedRecord,
    WorkerRecord,
    json_safe,
)
from aiperf.ledger.store import LedgerWriter
from aiperf.training.trial import TrialSpec, TrialSpecDict, Weights
from nas.proposer import Proposer

if TYPE_CHECKING:
    from aiperf.cluster.node_weights import SentWeights
    from aiperf.config import Config
    from nas.language.search import LMTrialProposal
    from nas.proposer import TrialProposal

logger = logging.getLogger(__name__)  # aiperf -v run: each trial's lifecycle at INFO, each epoch at DEBUG

# The most a run's run_stop comes after its budget: the loop's last poll (MasterSettings.poll_s), the
# final "alive?" to the workers holding trials (FINAL_ANSWER_S), the kept weights still being collected
# (COLLECT_AT_END_S), the idle workers' final stats (5 s) and the control-plane watch's last question (2 s),
# with room to spare; tests/cluster/test_control_plane.py.
BUDGET_GRACE_S = 20.0
# The longest a written ledger record waits for its fsync (group commit; docs/ledger.md): a machine
# crash can lose at most this much of records nothing was yet decided on. A killed process loses none.
MAX_UNSYNCED_S = 1.0
# The most the run's end waits for the kept weight sets still being collected from their nodes (each is
# collected as its trial ends, so only the last few remain; one not collected by then gets no file).
COLLECT_AT_END_S = 5.0
# ... and when a signal stopped the run (scancel, a job's time limit): the job's Ray processes stop with the
# master, those of its own node within seconds, and the master's process goes with its raylet. Its end then
# asks nothing it would wait for: no worker is asked whether it answers, no final statistics are waited for,
# and the kept sets still being collected get this long.
COLLECT_ON_SIGNAL_S = 1.0
# From this many workers waiting for their first trial on, no trial is held for another worker (_next_for):
# holding saves one compile on a busy worker, and each of the waiting ones waits a proposal more for it.
HOLD_WAITING_LIMIT = 1024
TRIAL_S_WEIGHT = 0.2  # the newest completed trial's weight in the moving average of seconds per unit of work
# The cyclic collector's first generation runs after this many allocations instead of 700: the master
# allocates graphs, specs and records by the hundred thousand and frees them by reference counting, and
# the collections were 10-18 % of its CPU in a 32,768-worker start-up (benchmarks/RESULTS.md, "The
# collector's threshold in the master"). Set for the run, then put back.
GC_FIRST_GENERATION = 100_000
# While workers that never had a trial wait for a fill (the start of a run: all of them), the collector
# does not run at all: what the fill allocates lives on (graphs, specs, trial state) or is freed by
# reference counting, so a collection there finds next to nothing and costs every waiting worker
# its time (1.5 s of a 24 s fill at 65,536 workers; benchmarks/RESULTS.md, "The start-up fill without
# the collector"). It runs again after the fill.


@dataclass
class TrialState:
    """The master's view of one trial across its attempts."""

    trial_id: str
    proposal: TrialProposal | LMTrialProposal  # the family's proposal
    prepared: Prepared  # the architecture as trained (an image graph with the trial's dropout rate), its cost
    seed: int
    attempt: int = 0
    epochs_done: int = 0
    checkpoint: Weights | StoredWeights | None = None  # weights after the last completed epoch (for a re-queue)
    started: bool = False  # the current attempt has begun on its worker
    recorded: bool = False  # a trial_start is in the ledger, so the trial must get a trial_end
    worker: str | None = None
    best: float | None = None
    inherit: str | None = None  # the trial whose weights it actually starts from
    sent_parent: str | None = None  # the kept trial whose weights the current attempt was sent (it may not get them)
    started_t: float | None = None  # the master's clock when its current attempt began on its worker
    aimed_at: float | None = None  # the share of the budget whose size band it was proposed for
    steps_per_epoch: int | None = None  # the steps its last epoch reported: a later attempt continues with them

    @property
    def compile_key(self) -> str:
        """What a worker must have compiled to train it without compiling again."""
        return self.prepared.compile_key


@dataclass
class MasterSettings:
    time_budget_s: float
    max_trials: int | None = None
    max_trial_retries: int = 2
    seed: int = 0
    checkpoint_every_epoch: bool = True
    poll_s: float = 0.5
    stop_after_failures: int = 5
    dataset_images: int = 0  # training + validation images: the base of the bad-image share (0: no check)
    max_bad_fraction: float = 0.001
    compiled_models: int = 4  # architectures each worker keeps compiled (train.compiled_models)
    queue_depth: int = 2  # trials queued per worker (cluster.queue_depth): how long a new one waits to start
    # What holding a trial for the worker that has its architecture compiled saves: one compile on that
    # worker. A re-tune's first step with the model kept took 0.06 s on an H200 against 2.3-2.7 s compiled
    # again (benchmarks/RESULTS.md, "a re-tune's first step"); the lower figure, rounded down.
    held_trial_worth_s: float = 2.0

    @classmethod
    def from_config(cls, cfg: Config, dataset_images: int = 0) -> MasterSettings:
        """The master's part of a run config (one place, so real and simulated runs agree)."""
        return cls(
            time_budget_s=cfg.run.time_budget_s,
            max_trials=cfg.run.max_trials,
            max_trial_retries=cfg.cluster.max_trial_retries,
            seed=cfg.run.seed,
            queue_depth=cfg.cluster.queue_depth,
            checkpoint_every_epoch=cfg.cluster.checkpoint_every_epoch,
            stop_after_failures=cfg.run.stop_after_failures,
            dataset_images=dataset_images,
            max_bad_fraction=cfg.dataset.max_bad_fraction,
            compiled_models=cfg.train.compiled_models,
        )


def cause_key(error: str) -> str:
    """An error with its paths and numbers blanked: the same cause in different trials matches."""
    text = re.sub(r"(?<![\w.])/\S+", "<path>", error)
    return re.sub(r"\d+", "#", text)


class _Measured(TypedDict, total=False):
    """What a completed trial's ``trial_end`` adds from its worker's report (:class:`TrialDone`)."""

    startup_s: float | None
    first_step_s: float | None
    compile_s: float | None
    step_reused: bool | None
    batch_size: int | None
    requested_batch_size: int | None


@dataclass
class _Failure:
    cause: str
    worker: str
    node: str
    error: str


class RunStopFields(TypedDict, total=False):
    """What ``run_stop`` says about Ray's control plane when it stopped answering (absent: it always answered)."""

    control_plane_silent_t: float
    control_plane_silent_s: float | None


@dataclass
class RunOutcome:
    status: RunStatus
    reason: str
    trials_started: int = 0
    trials_completed: int = 0
    worker_stats: dict[str, WorkerStats] = field(default_factory=dict)
    control_plane_silent_t: float | None = None  # when Ray's control plane first stopped answering (None: never)
    control_plane_silent_s: float | None = None  # how long, in all, it did not answer

    def run_stop_fields(self) -> RunStopFields:
        """What ``run_stop`` adds to the status and reason (nothing when the control plane always answered)."""
        if self.control_plane_silent_t is None:
            return {}
        return {
            "control_plane_silent_t": self.control_plane_silent_t,
            "control_plane_silent_s": self.control_plane_silent_s,
        }


class Master:
    """Runs the search until the time budget (or trial cap) is reached or it is told to stop."""

    def __init__(
        self,
        settings: MasterSettings,
        proposer: Proposer[Any],
        pool: WorkerPool,
        ledger: LedgerWriter,
        weights: WeightStore,
        progress: Progress | None = None,
        first_trial: int = 0,
        epochs_before: int = 0,
        clock: Callable[[], float] | None = None,
        family: Family | None = None,
    ) -> None:
        self.settings = settings
        self.family: Family = family if family is not None else ImageFamily()
        self.proposer = proposer
        self.pool = pool
        self.ledger = ledger
        self.weights = weights
        self.progress = progress
        self.clock = clock or ledger.elapsed
        self.trials: dict[str, TrialState] = {}  # pending, running and re-queued trials, and those with kept weights
        self.active: dict[str, TrialState] = {}  # submitted and not ended
        self.retry_queue: list[TrialState] = []
        self.compiled_on: dict[str, OrderedDict[str, None]] = {}  # worker -> architectures it has compiled (LRU)
        self.compiled_by: dict[str, dict[str, int]] = {}  # architecture -> workers that have it compiled -> since when
        # architecture -> compiled_by's (since when, worker) as a heap: the first of its workers that holds nothing is
        # found without passing the ones that do (thousands, in a start-up fill that holds re-tunes of the seed)
        self._compiled_queue: dict[str, list[tuple[int, str]]] = {}
        self._compiled_order = itertools.count()
        self.held: dict[str, TrialState] = {}  # worker -> a trial kept for it: it has the architecture compiled
        self._ask_s = 0.0  # the master's time per proposal (moving average): a held trial's cost to each idle worker
        # Seconds a completed trial took per unit of its work (size x epochs; moving average, 0 before the first),
        # and the work of the trial proposed last: a new trial's expected length is their product.
        self._s_per_work = 0.0
        self._last_work = 0.0
        self._ids = itertools.count(first_trial)
        self.proposed = first_trial
        self.completed = 0
        self.stop_requested: str | None = None
        self.worker_ready_t: dict[str, float] = {}
        self.worker_busy: dict[str, float] = {}
        self.worker_compile: dict[str, float] = {}  # completed trials' compile_s (tracing/compilation alone)
        self.worker_gaps: dict[str, list[float]] = {}
        self.worker_stats: dict[str, WorkerStats] = {}
        self.retired: set[str] = set()
        self._niceness_noted = False  # a worker below the priority of other programs was reported
        self.failure: str | None = None  # why the run cannot go on (ends it as failed)
        self.start_failures: list[_Failure] = []
        self.failure_streak: list[_Failure] = []  # trial failures since the last completed epoch
        self.epochs_counted = 0
        self.epochs_before = epochs_before  # counted by earlier sessions of a resumed run
        self.bad_images: set[str] = set()
        self.missing_images: set[str] = set()  # of bad_images: files deleted since the run began
        self.control_plane_silent_t: float | None = None  # the first silence of Ray's control plane (master's t)
        self.control_plane_silent_s = 0.0  # its silences that ended
        self._silent_from: float | None = None  # the current silence began then (master's t)
        self._handlers: dict[EventKind, Callable[[PoolEvent], None]] = {
            EventKind.READY: self._on_ready,
            EventKind.START_FAILED: self._on_start_failed,
            EventKind.START: self._on_start,
            EventKind.EPOCH: self._on_epoch,
            EventKind.BAD_IMAGES: self._on_bad_images,
            EventKind.DONE: self._on_done,
            EventKind.FAILED: self._on_failed,
            EventKind.LOST: self._on_lost,
            EventKind.CONTROL_PLANE: self._on_control_plane,
        }

    # -- control ---------------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Ask the loop to end at the next opportunity (signal handlers call this)."""
        self.stop_requested = reason

    def fail(self, reason: str) -> None:
        """End the run as failed at the next opportunity: it cannot make progress (the first reason stays)."""
        if self.failure is None:
            self.failure = reason

    def _may_propose(self) -> bool:
        cap = self.settings.max_trials
        return self.stop_requested is None and (cap is None or self.proposed < cap)

    def run(self) -> RunOutcome:
        # Long-lived search state (graphs, caches) need not be rescanned by the cyclic collector:
        # freezing it removes generation-2 pauses from the proposal path (benchmarks/RESULTS.md, "Figures moved
        # from code comments").
        gc.collect()
        gc.freeze()
        thresholds = gc.get_threshold()
        gc.set_threshold(max(GC_FIRST_GENERATION, thresholds[0]), *thresholds[1:])
        try:
            return self._run()
        finally:
            gc.set_threshold(*thresholds)

    def _run(self) -> RunOutcome:
        status, reason = RunStatus.COMPLETED, "time budget reached"
        try:
            while True:
                now = self.clock()
                if self.failure is not None:
                    status, reason = RunStatus.FAILED, self.failure
                    break
                if self.stop_requested is not None:
                    status, reason = RunStatus.INTERRUPTED, self.stop_requested
                    break
                if now >= self.settings.time_budget_s:
                    break
                if not self._may_propose() and not self.active and not self.retry_queue and not self.held:
                    reason = f"all {self.proposed} trials finished"
                    break
                self._handle(self.pool.sync())
                self._check_workers()
                if self.failure is not None:
                    continue
                self._fill()
                timeout = min(self.settings.poll_s, max(0.0, self.settings.time_budget_s - now))
                self._handle(self.pool.wait(timeout))
                self.ledger.sync_due(MAX_UNSYNCED_S)
                self._check_workers()
                if self.progress is not None:
                    running = sum(1 for st in self.active.values() if st.started)
                    self.progress.maybe_print(self.clock(), running, len(self.active) - running)
        except KeyboardInterrupt:
            status, reason = RunStatus.INTERRUPTED, "interrupted by the user"
        finally:
            self.proposer.close()  # nothing more is proposed: its expansion processes go
        if status is RunStatus.COMPLETED and self.epochs_counted == 0 and self.epochs_before == 0:
            # A run that counted nothing has no score: it failed, however cleanly it ended.
            status, reason = RunStatus.FAILED, self._nothing_trained()
        self._finish()
        logger.info(f"run {status}: {reason} ({self.proposed} trial(s) proposed, {self.completed} completed)")
        silent_s = None
        if self.control_plane_silent_t is not None:
            silent_s = self.control_plane_silent_s + (
                self.clock() - self._silent_from if self._silent_from is not None else 0.0
            )
        return RunOutcome(
            status, reason, self.proposed, self.completed, self.worker_stats, self.control_plane_silent_t, silent_s
        )

    def _nothing_trained(self) -> str:
        ready = len(self.worker_ready_t)
        return (
            f"no epoch completed within the {self.settings.time_budget_s:g} s budget ({ready} worker(s) became"
            f" ready, {self.proposed} trial(s) proposed): raise run.time_budget_s, or see why with aiperf -v run"
        )

    # -- submitting ------------------------------------------------------------------------------
    def _training_progress(self) -> float:
        """When the trial asked for next will end its training, as a share of the budget (the size schedule's clock).

        Now, plus its wait behind the trials queued ahead of it on a worker (half of the running
        one's length and ``queue_depth - 2`` whole ones) and its own length, each estimated as the
        seconds completed trials took per unit of work times the work of the trial proposed last
        (trials lengthen as networks grow, so a plain mean of lengths lags). A trial inside the band
        of its end is inside or above it through its training; one proposed for the band of the
        moment it was asked trained below it, the more so as trials grew (benchmarks/RESULTS.md,
        "The search keeps pace with its size schedule").
        """
        length = self._s_per_work * self._last_work
        lead = (max(0.0, self.settings.queue_depth - 1.5) + 1.0) * length
        return (self.clock() + lead) / self.settings.time_budget_s

    def _work(self, state: TrialState) -> float:
        """A trial's work for the length estimate: its size (the family's measure) times its epochs."""
        return self.family.size(state.prepared) * max(1, int(state.proposal.hparams.get("epochs", 1)))

    def _new_trial(self) -> TrialState:
        trial_id = f"t{next(self._ids):05d}"
        self.proposed += 1
        aimed_at = min(1.0, self._training_progress())
        self.proposer.at(aimed_at)
        proposal = self.proposer.ask(trial_id)
        seed = self.settings.seed * 100_003 + self.proposed
        state = TrialState(trial_id, proposal, self.family.prepare(proposal), seed, aimed_at=aimed_at)
        self._last_work = self._work(state)
        self.trials[trial_id] = state
        if logger.isEnabledFor(logging.INFO):
            origin = f" of {proposal.parent}" if proposal.parent else ""
            change = f" ({'; '.join(m.describe() for m in proposal.morphs)})" if proposal.morphs else ""
            hparams = ", ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in proposal.hparams.items()
            )
            logger.info(f"trial {trial_id} proposed: {proposal.kind}{origin}{change}; {hparams}")
        return state

    def _spec(self, state: TrialState) -> tuple[TrialSpecDict, SentWeights, SentWeights]:
        """The spec of the next attempt and the weights it is sent: its checkpoint, and its parent's.

        A re-queued attempt is sent its parent's weights beside its checkpoint (when the parent is
        still kept): should the checkpoint be gone with its node, the worker starts the attempt
        again from the parent rather than from nothing (:mod:`aiperf.cluster.node_weights`).
        """
        p = state.proposal
        parent_ref: SentWeights = None
        resume_ref: SentWeights = None
        if state.checkpoint is not None:
            resume_ref = self.pool.put(state.checkpoint)
        inherit = (
            p.inherit if p.inherit is not None and p.inherit in self.weights and p.inherit in self.trials else None
        )
        if inherit is not None:
            parent_ref = self.weights.shared(inherit, self.pool.put)
        parent_graph = self.family.arch_dict(self.trials[inherit].prepared.arch) if inherit else None
        state.sent_parent = inherit
        state.inherit = inherit if state.checkpoint is None else state.inherit
        spec = TrialSpec(
            trial_id=state.trial_id,
            kind=str(p.kind),  # a plain string: an enum member pickles through Python code, a str in C
            graph=self.family.arch_dict(state.prepared.arch),
            hparams=dict(p.hparams),
            seed=state.seed,
            parent_graph=parent_graph,
            morphs=[m.to_dict() for m in p.morphs] if inherit else [],
            attempt=state.attempt,
            start_epoch=state.epochs_done if state.checkpoint is not None else 0,
            checkpoint_every_epoch=self.settings.checkpoint_every_epoch,
            steps_per_epoch=state.steps_per_epoch if state.checkpoint is not None else None,
        )
        return spec.to_dict(), parent_ref, resume_ref

    def _fill(self) -> None:
        free = self.pool.free_workers()
        if free:
            self.ledger.sync()  # what the next proposals learn from is durable before they are made
        # Workers that never had a trial wait, idle, for this fill: at the start of a run, all of them.
        waiting = sum(1 for worker in free if worker not in self.compiled_on)
        paused = waiting > 0 and gc.isenabled()
        if paused:
            gc.disable()
        try:
            self._fill_workers(free, waiting)
        finally:
            if paused:
                gc.enable()

    def _fill_workers(self, free: list[str], waiting: int) -> None:
        for worker in free:
            if worker not in self.compiled_on:
                waiting -= 1
            state = self._next_for(worker, waiting)
            if state is None:
                return
            spec, parent_ref, resume_ref = self._spec(state)
            state.worker = worker
            state.started = False
            self.active[state.trial_id] = state
            self.pool.submit(worker, state.trial_id, state.attempt, spec, parent_ref, resume_ref)
            self._note_compiled(worker, state.compile_key)
            logger.debug(f"trial {state.trial_id} (attempt {state.attempt}) submitted to worker {worker}")

    def _next_for(self, worker: str, waiting: int = 0) -> TrialState | None:
        """The trial ``worker`` trains next: one held for it, a re-queued one, or a new proposal.

        Affinity: a worker that has an architecture compiled trains it without tracing or
        compiling again. A re-queued trial goes preferably to a free worker that has it. A new
        proposal whose architecture only another worker has compiled (a re-tune, mostly) is
        held for that worker, which takes it as soon as it is free, and this worker gets the
        next proposal instead -- at most one trial is held per worker, so no worker ever
        waits for work while another trial is held. A held trial saves one compile but makes
        each of the ``waiting`` workers after this one (idle ones that never had a trial) wait
        one proposal longer; where that costs more than the compile saves -- the start-up fill
        of thousands of workers -- this worker takes the proposal itself. The cost is judged by
        the proposals of the moment, which can be cheaper than the next ones (the first wave's
        re-tunes come before its start-up children), so from HOLD_WAITING_LIMIT waiting workers
        on nothing is held: a trial held then reached its worker only after the whole fill.
        """
        held = self.held.pop(worker, None)
        if held is not None:
            self._unheld(worker)
            return held
        if self.retry_queue:
            mine = self.compiled_on.get(worker) or OrderedDict()
            pick = next((s for s in self.retry_queue if s.compile_key in mine), self.retry_queue[0])
            self.retry_queue.remove(pick)
            return pick
        while self._may_propose():
            asked = self.clock()
            state = self._new_trial()
            self._ask_s += 0.05 * (self.clock() - asked - self._ask_s)
            if self.proposed % 2000 == 0:
                gc.freeze()  # move what the search has accumulated out of the collector's view
            if waiting >= HOLD_WAITING_LIMIT or waiting * self._ask_s > self.settings.held_trial_worth_s:
                return state  # holding it would cost the waiting workers more than the compile it saves
            other = self._compiled_elsewhere(state.compile_key, worker)
            if other is None:
                return state
            self.held[other] = state
        if self.held:  # nothing else to train (the trial cap is reached): a held trial must not leave this worker idle
            other = next(iter(self.held))
            state = self.held.pop(other)
            self._unheld(other)
            return state
        return None

    def _compiled_elsewhere(self, key: str, worker: str) -> str | None:
        """Another live worker with ``key`` compiled and nothing held for it (None if ``worker`` has it too)."""
        if key in (self.compiled_on.get(worker) or ()):
            return None  # so ``worker`` itself is not among compiled_by[key] either
        workers, queue = self.compiled_by.get(key), self._compiled_queue.get(key)
        while workers and queue:  # the earliest compiled first, as compiled_by's order
            since, other = queue[0]
            if workers.get(other) == since and other not in self.held and other not in self.retired:
                return other
            heapq.heappop(queue)  # forgotten, retired, or holding a trial until _unheld puts it back
        return None

    def _unheld(self, worker: str) -> None:
        """``worker`` holds nothing any more: it is a candidate again for the architectures it has compiled."""
        for key in self.compiled_on.get(worker) or ():
            workers, queue = self.compiled_by[key], self._compiled_queue[key]
            heapq.heappush(queue, (workers[worker], worker))
            if len(queue) > 2 * len(workers) + 64:  # workers put back without ever being taken off: one entry each
                self._compiled_queue[key] = sorted((since, w) for w, since in workers.items())

    def _note_compiled(self, worker: str, key: str) -> None:
        """Mirror the worker's own cache of compiled models (same capacity, least recently used first out)."""
        if self.settings.compiled_models <= 0:
            return
        keys = self.compiled_on.setdefault(worker, OrderedDict())
        keys[key] = None
        keys.move_to_end(key)
        workers = self.compiled_by.setdefault(key, {})
        if worker not in workers:
            since = workers[worker] = next(self._compiled_order)
            heapq.heappush(self._compiled_queue.setdefault(key, []), (since, worker))
        while len(keys) > self.settings.compiled_models:
            self._forget_compiled(worker, keys.popitem(last=False)[0])

    def _forget_compiled(self, worker: str, key: str) -> None:
        workers = self.compiled_by.get(key)
        if workers is not None:
            workers.pop(worker, None)
            if not workers:
                del self.compiled_by[key]
                del self._compiled_queue[key]

    def _release_held(self, worker: str) -> None:
        """A worker that is gone takes nothing held for it: that trial never started, so it simply runs elsewhere."""
        for key in self.compiled_on.pop(worker, None) or ():
            self._forget_compiled(worker, key)
        state = self.held.pop(worker, None)
        if state is not None:
            self.retry_queue.append(state)

    # -- events ----------------------------------------------------------------------------------
    def _handle(self, events: list[PoolEvent]) -> None:
        # Group commit: the records are written now and fsync'ed before anything is proposed or
        # submitted on the strength of them (_fill), or MAX_UNSYNCED_S after, whichever comes first
        # (the ledger's durability contract, docs/ledger.md). One fsync per event batch was a third
        # of the master's time at 2,048 workers on a busy disk (benchmarks/RESULTS.md, "Thousands of nodes").
        with self.ledger.batch(durable=False):
            for ev in events:
                handler = self._handlers.get(ev.kind)
                if handler is None:  # a kind added to EventKind without a handler: never silently ignored
                    raise ValueError(f"the master has no handler for pool event kind {ev.kind!r}")
                handler(ev)

    def _on_ready(self, ev: PoolEvent) -> None:
        if ev.worker not in self.worker_ready_t:
            logger.info(f"{self._where(ev.worker)} ready")
            if self.progress is not None:
                self.progress.worker_ready(self._where(ev.worker), self.clock())
            self._note_niceness(ev.worker)
        self.worker_ready_t.setdefault(ev.worker, self.clock())

    def _note_niceness(self, worker: str) -> None:
        """Say once that workers train below the priority of other programs (Ray's default for its workers).

        On a machine shared with anything else the trials then get what the others leave, and the
        score measures that. aiperf's local start and launchers start Ray's workers at niceness 0;
        a cluster started by hand (``ray start``) needs ``RAY_worker_niceness=0`` in its environment.
        """
        niceness = (self.pool.worker_info(worker) or {}).get("niceness")
        if self._niceness_noted or not isinstance(niceness, int) or niceness <= 0:
            return
        self._niceness_noted = True
        text = (
            f"{self._where(worker)} trains at niceness {niceness}, below every other program on its node:"
            " start that node's Ray with RAY_worker_niceness=0 in its environment (aiperf's launchers do)"
        )
        self._warn(text)

    def _warn(self, text: str) -> None:
        """A warning the user must see while the run goes on: on its progress line, else in the log."""
        if self.progress is not None:
            self.progress.note(text)
        else:
            logger.warning(text)

    def _where(self, worker: str, data: WorkerInfo | None = None) -> str:
        """``worker w0003 on node gpu17``: for messages."""
        info = data or self.pool.worker_info(worker) or {}
        node = info.get("hostname") or str(info.get("node", ""))[:12] or "?"
        return f"worker {worker} on node {node}"

    def _on_start_failed(self, ev: PoolEvent) -> None:
        d = ev.data
        self.ledger.append(
            WorkerFailedRecord(
                worker=ev.worker,
                node=d.get("node", ""),
                hostname=d.get("hostname", ""),
                cause=ev.error,
            )
        )
        self.start_failures.append(_Failure(cause_key(ev.error), ev.worker, self._where(ev.worker, d), ev.error))
        self.retired.add(ev.worker)  # it never worked: no worker record with busy times
        logger.info(f"{self._where(ev.worker, d)} failed to start: {ev.error}")
        if self.progress is not None:
            self.progress.note(f"{self._where(ev.worker, d)} failed to start: {ev.error}")

    def _check_workers(self) -> None:
        """Fail the run when no worker is left and none can be started (or none ever started)."""
        if not self.start_failures or self.failure is not None:
            return
        live = self.pool.live_workers()
        if live is None or live > 0:
            return
        if self.worker_ready_t and self.pool.may_start_workers():
            return  # workers ran before: replacements get their attempts
        last = self.start_failures[-1]
        same = sum(1 for f in self.start_failures if f.cause == last.cause)
        others = f" ({same - 1} more failed the same way)" if same > 1 else ""
        self.fail(f"no worker could start: {last.node}: {last.error}{others}")

    def _on_bad_images(self, ev: PoolEvent) -> None:
        state = self.active.get(ev.trial) if ev.trial is not None else None
        d = _report(ev, BadImagesReport)
        new = [name for name in d.files if name not in self.bad_images]
        self.bad_images.update(new)
        gone = [name for name in new if name in set(d.missing)]
        self.missing_images.update(gone)
        total, fraction = self.settings.dataset_images, self.settings.max_bad_fraction
        count = max(len(self.bad_images), int(d.epoch_count))
        over = bool(d.over_limit) or (total > 0 and over_limit(count, total, fraction))
        if not new and not over:
            return  # another worker found the same files first
        info = self.pool.worker_info(ev.worker)
        self.ledger.append(
            BadImagesRecord(
                trial=ev.trial,
                worker=ev.worker,
                node=info.get("node", ""),
                files=new,
                count=len(self.bad_images),
                epoch_count=d.epoch_count,
                over_limit=over,
                missing=gone,
            )
        )
        if over and total > 0:
            names, missing = sorted(self.bad_images), sorted(self.missing_images)
            message = too_many_bad_images(names, total, fraction, count, missing)
            self.fail(f"{message} (reported by {self._where(ev.worker)})")
        elif state is not None and self.progress is not None and new:
            self.progress.note(skipped_note(new, gone))

    def _on_start(self, ev: PoolEvent) -> None:
        state = self.active.get(ev.trial) if ev.trial is not None else None
        if state is None or state.attempt != ev.attempt:
            return
        now = self.clock()
        state.started = True
        state.started_t = now
        state.recorded = True
        info = self.pool.worker_info(ev.worker)
        lost = self._weights_lost(state, ev.report) if isinstance(ev.report, TrialStarted) else ""
        p = state.proposal
        batch = int(p.hparams["batch_size"])
        again = f", attempt {state.attempt} from epoch {state.epochs_done}" if state.attempt else ""
        logger.info(f"trial {state.trial_id} started on {self._where(ev.worker, info)}{again}")
        self.ledger.append(
            TrialStartRecord(
                t=now,
                trial=state.trial_id,
                kind=p.kind,
                parent=p.parent,
                inherit=state.inherit,
                morphs=[m.to_dict() for m in p.morphs],
                lineage=[m.describe() for m in p.morphs],
                hparams=TrialHparams(**p.hparams),
                **self.family.start_fields(p, state.prepared, batch),
                worker=ev.worker,
                node=info.get("node", ""),
                attempt=state.attempt,
                start_epoch=state.epochs_done if state.checkpoint is not None else 0,
                seed=state.seed,  # the trial's training seed: `aiperf audit --retrain` trains it again
                aimed_at=state.aimed_at,
                weights_lost=lost or None,
                info=p.info,
            )
        )

    def _weights_lost(self, state: TrialState, started: TrialStarted) -> str:
        """Take in what the attempt starts from when weights it was sent could not be fetched; why, or ""."""
        if not started.weights_lost:
            return ""
        logger.warning(f"trial {state.trial_id}: {started.weights_lost}")
        if started.start_epoch == 0 and state.checkpoint is not None:
            state.checkpoint = None  # gone with its node: the attempt starts again from epoch 0
            state.epochs_done = 0
        if not started.inherited and state.checkpoint is None:
            if state.sent_parent is not None:
                self.weights.lost(state.sent_parent)  # later children get its file, or nothing
            state.inherit = None
        return started.weights_lost

    def _on_epoch(self, ev: PoolEvent) -> None:
        state = self.active.get(ev.trial) if ev.trial is not None else None
        if state is None or state.attempt != ev.attempt:
            return
        d = _report(ev, EpochReport)
        now = self.clock()
        train_ops, eval_ops, aiperf_ops = self.family.epoch_ops(state.prepared, d)
        info = self.pool.worker_info(ev.worker)
        compatible: _Comparable = {"aiperf_ops": aiperf_ops} if aiperf_ops is not None else {}
        self.ledger.append(
            epoch_record(
                d,
                t=now,
                trial=state.trial_id,
                attempt=state.attempt,
                train_ops=train_ops,
                eval_ops=eval_ops,
                ops=train_ops + eval_ops,
                worker=ev.worker,
                node=info.get("node", ""),
                **compatible,
            )
        )
        if d.idle_before_s is not None:
            self.worker_gaps.setdefault(ev.worker, []).append(d.idle_before_s)
        self.worker_busy[ev.worker] = self.worker_busy.get(ev.worker, 0.0) + d.train_s + d.eval_s
        state.epochs_done = d.epoch
        state.steps_per_epoch = d.steps
        self.epochs_counted += 1
        self.failure_streak.clear()
        if d.weights is not None:
            state.checkpoint = d.weights
        state.best = d.val_acc if state.best is None else max(state.best, d.val_acc)
        logger.debug(f"trial {state.trial_id} epoch {d.epoch}: val_acc {d.val_acc:.4f}, {train_ops + eval_ops:.3g} ops")
        self.proposer.tell(state.trial_id, state.best, final=False)
        if self.progress is not None:
            self.progress.epoch(train_ops + eval_ops, d.val_acc, now)

    def _on_done(self, ev: PoolEvent) -> None:
        state = self.active.pop(ev.trial, None) if ev.trial is not None else None
        if state is None or state.attempt != ev.attempt:
            return
        d = _report(ev, TrialDone)
        now = self.clock()
        if d.worker_stats:
            self.worker_stats[ev.worker] = d.worker_stats
        state.checkpoint = None
        compile_s = d.compile_s if d.compile_s is not None else d.first_step_s
        if compile_s is not None:
            self.worker_compile[ev.worker] = self.worker_compile.get(ev.worker, 0.0) + compile_s
        best = state.best if state.best is not None else 0.0
        work = self._work(state)
        if state.started_t is not None and work > 0:  # recent trials weigh most
            rate = (now - state.started_t) / work
            self._s_per_work = (
                rate if not self._s_per_work else self._s_per_work + TRIAL_S_WEIGHT * (rate - self._s_per_work)
            )
        self._record_end(
            state,
            TrialStatus.COMPLETED,
            "",
            ev.worker,
            now,
            startup_s=d.startup_s,
            first_step_s=d.first_step_s,
            compile_s=d.compile_s,
            step_reused=d.step_reused,
            batch_size=d.batch_size,
            requested_batch_size=d.requested_batch_size,
        )
        self.weights.put(state.trial_id, d.weights, best)
        self._record_saved(self.weights.drain_saved(), now)
        self.completed += 1
        self._forget_ended(state.trial_id)
        done = f"{state.epochs_done} epoch(s), best val_acc {best:.4f}"
        logger.info(f"trial {state.trial_id} completed on worker {ev.worker}: {done}")
        self.proposer.tell(state.trial_id, best, final=True)
        if self.progress is not None:
            self.progress.trial_done()

    def _on_failed(self, ev: PoolEvent) -> None:
        state = self.active.get(ev.trial) if ev.trial is not None else None
        if state is None or state.attempt != ev.attempt:
            return
        del self.active[state.trial_id]
        now = self.clock()
        if ev.worker_lost and not state.started:
            self.retry_queue.append(state)  # never began: simply run it elsewhere
            logger.info(f"trial {state.trial_id} goes to another worker: {ev.worker} was lost before it began")
            return
        if ev.worker_lost and state.attempt < self.settings.max_trial_retries:
            keep = state.epochs_done if state.checkpoint is not None else 0
            if state.checkpoint is None:
                state.epochs_done = 0
            state.attempt += 1
            self.ledger.append(
                RequeueRecord(
                    t=now,
                    trial=state.trial_id,
                    attempt=state.attempt,
                    from_epoch=keep,
                    reason=ev.error,
                    worker=ev.worker,
                )
            )
            self.retry_queue.append(state)
            logger.info(f"trial {state.trial_id} re-queued from epoch {keep} (attempt {state.attempt}): {ev.error}")
            return
        status = TrialStatus.FAILED
        if ev.worker_lost:
            status = TrialStatus.UNRESPONSIVE if ev.unresponsive else TrialStatus.LOST
        logger.info(f"trial {state.trial_id} {status} on worker {ev.worker}: {ev.error}")
        self._record_end(state, status, ev.error, ev.worker, now)
        self._forget_ended(state.trial_id)
        self.proposer.forget(state.trial_id)
        if self.progress is not None:
            self.progress.trial_failed(state.trial_id, ev.error)
        self._note_failure(ev.worker, ev.error)

    def _record_saved(self, saved: list[tuple[str, SavedFile]], now: float) -> None:
        """A ``weights`` record per kept set whose file was written: its hash, for `aiperf audit`.

        These are each trial's weights after its last epoch; on a Ray cluster the file is collected
        from the trial's node a little after the trial ended (:class:`~aiperf.engine.weights.WeightStore`).
        """
        for trial, file in saved:
            state = self.trials.get(trial)
            if state is None:
                continue
            self.ledger.append(
                WeightsRecord(
                    t=now,
                    trial=trial,
                    attempt=state.attempt,
                    epoch=state.epochs_done,
                    file=file.file,
                    sha256=file.sha256,
                    bytes=file.size,
                )
            )

    def _forget_ended(self, trial_id: str) -> None:
        """Drop an ended trial's state unless children may still inherit its weights (its graph is needed).

        At 65,536 workers a run ends hundreds of thousands of trials; each one's graph and FLOPs
        count are about 25 KB (a 30-layer net; benchmarks/RESULTS.md, "Thousands of nodes"). A trial
        whose kept weights are dropped for better ones is forgotten then.
        """
        if trial_id not in self.weights:
            self.trials.pop(trial_id, None)
        for evicted in self.weights.drain_evicted():
            if evicted not in self.active:
                self.trials.pop(evicted, None)

    def _record_end(
        self,
        state: TrialState,
        status: TrialStatus,
        reason: str,
        worker: str | None,
        now: float,
        **measured: Unpack[_Measured],
    ) -> None:
        """Record how the current attempt of ``state`` ended: every recorded trial_start gets its trial_end."""
        self.ledger.append(
            TrialEndRecord(
                t=now,
                trial=state.trial_id,
                status=status,
                reason=reason,
                attempt=state.attempt,
                epochs=state.epochs_done,
                best_val_acc=state.best,
                worker=worker,
                **measured,
            )
        )

    def _note_failure(self, worker: str, error: str) -> None:
        """Fail the run when the last trials all failed the same way, across the workers, with no epoch between."""
        failure = _Failure(cause_key(error), worker, self._where(worker), error)
        if self.failure_streak and self.failure_streak[-1].cause != failure.cause:
            self.failure_streak.clear()
        self.failure_streak.append(failure)
        n = self.settings.stop_after_failures
        live = self.pool.live_workers()
        workers_needed = min(n, live) if live else n
        if len(self.failure_streak) < n or len({f.worker for f in self.failure_streak}) < workers_needed:
            return
        which = (
            f"the first {len(self.failure_streak)} trials all failed"
            if self.epochs_counted == 0
            else f"{len(self.failure_streak)} trials in a row failed, with no epoch completing in between,"
        )
        self.fail(f"{which} with the same error; the last on {failure.node}: {error}")

    def _on_lost(self, ev: PoolEvent) -> None:
        logger.info(f"{self._where(ev.worker)} lost: {ev.error}")
        self._release_held(ev.worker)
        self._record_worker(ev.worker, retired_because=ev.error)
        if ev.unresponsive and self.progress is not None:
            self.progress.note(f"{self._where(ev.worker)} is {ev.error}; its trials go to other workers")

    def _on_control_plane(self, ev: PoolEvent) -> None:
        """Ray's control plane stopped answering (or answers again): noted now, recorded in run_stop.

        Trials go on on the workers there are (their results do not pass through it); no worker
        can be started or replaced meanwhile, and the run still ends at its budget.
        """
        now = self.clock()
        began = max(0.0, now - float(ev.data.get("silent_s", 0.0)))
        if not ev.data.get("answering"):
            self._silent_from = began
            if self.control_plane_silent_t is None:
                self.control_plane_silent_t = began
            text = (
                f"Ray's control plane (GCS) stopped answering at t={began:.1f} s; trials go on on the workers there"
                " are, and the run ends at its budget"
            )
        else:
            self.control_plane_silent_s += now - (self._silent_from if self._silent_from is not None else began)
            self._silent_from = None
            text = f"Ray's control plane answers again (t={now:.1f} s)"
        self._warn(text)

    # -- the end ---------------------------------------------------------------------------------
    def _record_worker(self, worker: str, retired_because: str) -> None:
        if worker in self.retired:
            return
        self.retired.add(worker)
        start = self.worker_ready_t.get(worker)
        now = self.clock()
        alive = now - start if start is not None else None
        busy = self.worker_busy.get(worker, 0.0)
        compile_s = min(busy, self.worker_compile.get(worker, 0.0))  # first steps are inside busy time
        gaps = sorted(self.worker_gaps.get(worker, []))
        info = self.pool.worker_info(worker)
        self.ledger.append(
            WorkerRecord(
                t=now,
                worker=worker,
                node=info.get("node", ""),
                hostname=info.get("hostname", ""),
                device=info.get("device", {}),
                precision=info.get("precision"),
                init_s=info.get("init_s"),
                ceiling=_ceiling(info),
                niceness=info.get("niceness"),
                decode_threads=info.get("decode_threads"),
                busy_s=busy,
                alive_s=alive,
                busy_fraction=(busy / alive) if alive else None,
                compile_s=compile_s,
                steady_busy_fraction=(max(0.0, busy - compile_s) / alive) if alive else None,
                idle_gaps=IdleGaps(
                    count=len(gaps),
                    mean_s=sum(gaps) / len(gaps) if gaps else None,
                    max_s=gaps[-1] if gaps else None,
                    median_s=gaps[len(gaps) // 2] if gaps else None,
                ),
                worker_reported=_reported(self.worker_stats.get(worker)),
                retired=retired_because,
            )
        )

    def _finish(self) -> None:
        with self.ledger.batch():  # durable before the caller writes run_stop
            self._close_all()

    def _close_all(self) -> None:
        # Whose worker still answers decides how a trial it was training ends: stopped by the end of
        # the run, or unresponsive (its worker stopped answering). Either way its completed epochs count.
        signalled = self.stop_requested is not None
        silent = self.pool.unresponsive(FINAL_ANSWER_S) if self.active and not signalled else {}
        now = self.clock()
        for state in [*self.active.values(), *self.retry_queue]:
            if state.recorded:
                status = TrialStatus.STOPPED
                if not state.started:
                    reason = "the run ended before its re-queued attempt could start; its completed epochs are counted"
                elif signalled:
                    # A scheduler ending the job (scancel, a time limit) signals the workers with the master:
                    # they are stopped with the run, not asked (the answer would come too late to matter).
                    reason = (
                        f"the run was stopped ({self.stop_requested}) and its worker with it; its completed epochs"
                        " are counted, its unfinished epoch is not"
                    )
                elif state.worker in silent:
                    status = TrialStatus.UNRESPONSIVE
                    reason = (
                        f"its worker stopped answering ({silent[state.worker]}); its completed epochs are counted,"
                        " its unfinished epoch is not"
                    )
                else:
                    reason = "the run ended while it was training; its unfinished epoch is not counted"
                logger.info(f"trial {state.trial_id} {status}: {reason}")
                self._record_end(state, status, reason, state.worker, now)
            self.proposer.forget(state.trial_id)
        self.active.clear()
        self.retry_queue.clear()
        # The kept sets' files are collected from their nodes before the workers and keepers go.
        self._record_saved(self.weights.finish(COLLECT_ON_SIGNAL_S if signalled else COLLECT_AT_END_S), self.clock())
        final = self.pool.retire_all(wait_s=0.0 if signalled else FINAL_STATS_S)
        self.worker_stats.update(final.stats)
        for worker in self.worker_ready_t:
            if signalled and worker not in final.lost:
                why = f"stopped with the run ({self.stop_requested})"
            elif worker in silent:
                why = f"unresponsive at the run's end: {silent[worker]}"
            else:
                why = final.lost.get(worker, "run ended")
            self._record_worker(worker, retired_because=why)


class _Comparable(TypedDict, total=False):
    """An epoch's operations as earlier versions counted them: absent where the family counts no such figure."""

    aiperf_ops: float


class _EpochMeasured(_Comparable, total=False):
    """What the master adds to a worker's epoch report in its record: where, when, and the operations it counted."""

    t: float
    trial: str
    attempt: int
    train_ops: float
    eval_ops: float
    ops: float
    worker: str
    node: str


def epoch_record(report: EpochReport, **measured_here: Unpack[_EpochMeasured]) -> EpochRecord:
    """The worker's epoch report as its ledger record: each field the record declares, copied by name.

    ``measured_here`` adds what the master knows (trial, operations, time); a field the report
    and the record share reaches the ledger without being named again here.
    """
    shared = {f.name: getattr(report, f.name) for f in fields(report) if f.name in EpochRecord.model_fields}
    for name in _WHEN_MEASURED:  # an image epoch's record has no null token counts, an old worker's no compile_s
        if shared.get(name) is None:
            shared.pop(name, None)
    return EpochRecord(**shared, **measured_here)


_WHEN_MEASURED = ("train_tokens", "eval_tokens", "bits_per_byte", "compile_s", "compile_wait_s")


def _ceiling(info: WorkerInfo) -> CeilingHeader | None:
    """The worker's measured ceiling as its record's header (the model the record would validate its dict into)."""
    ceiling = info.get("ceiling")
    # json_safe: as the record's own constructor treats the fields it is given (a NaN becomes null).
    return CeilingHeader.model_validate(json_safe(ceiling)) if ceiling is not None else None


def _reported(stats: WorkerStats | None) -> dict[str, object] | None:
    """The worker's own accounting as its record's ``worker_reported`` (a plain dict, as the record holds it)."""
    return dict(stats) if stats is not None else None


_Message = TypeVar("_Message", EpochReport, TrialDone, BadImagesReport)


def _report(ev: PoolEvent, expected: type[_Message]) -> _Message:
    """The event's trial message, which must be of the kind its event says (a pool bug otherwise)."""
    if not isinstance(ev.report, expected):
        raise TypeError(
            f"a {ev.kind} event from {ev.worker} carries {type(ev.report).__name__}, not {expected.__name__}"
        )
    return ev.report
