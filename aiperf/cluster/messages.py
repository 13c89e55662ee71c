"""What a worker tells the master: the pool's event kinds and the messages a trial streams back.

A trial's worker sends :class:`TrialStarted` when it begins, one :class:`EpochReport` per
completed epoch, :class:`BadImagesReport` when it found images it cannot decode, and
:class:`TrialDone` with the final weights. They cross the Ray boundary (pickled), so they
are plain data classes with slots: nothing to import on the master beyond this module, and
attribute access instead of string keys that a typo would turn into a silent ``None``.

:class:`EventKind` names everything a :class:`~aiperf.cluster.pool.WorkerPool` can report;
the master maps each kind to one handler and refuses any other.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, TypedDict

if TYPE_CHECKING:
    from ray import ObjectRef

    from aiperf.cluster.node_weights import Arrays
    from aiperf.training.trial import Weights


class WorkerInfo(TypedDict, total=False):
    """What a worker says about itself once it is ready (:meth:`~aiperf.cluster.worker.TrialWorker.info`).

    The master's worker records and messages read it. Not total: an in-process pool's workers
    describe only part of it, and a lost worker's event carries only its node and host.
    """

    worker: str
    node: str  # the Ray node id
    hostname: str
    pid: int
    agent_pid: int  # a node agent's slot: the agent's process (the worker runs in a process of its own)
    device: dict[str, object]  # aiperf.training.backend.DeviceInfo, as a dict
    precision: str
    versions: dict[str, str]
    threads: int
    decode_threads: int | None  # None: the dataset is held in memory (nothing to decode)
    init_s: float
    ceiling: dict[str, object] | None  # aiperf.system.ceiling.Ceiling, as a dict (None: not measured)
    niceness: int | None  # None: the platform has no niceness


class IdleGapStats(TypedDict):
    """A worker's idle gaps between trials (seconds); None where it had none."""

    count: int
    mean_s: float | None
    max_s: float | None
    median_s: float | None


class WorkerStats(TypedDict):
    """A worker's own busy/idle accounting (:meth:`~aiperf.cluster.worker.TrialWorker.stats`): ``worker_reported``."""

    worker: str
    busy_s: float
    alive_s: float
    busy_fraction: float | None
    trials: int
    init_s: float
    idle_gaps: IdleGapStats


class EventKind(enum.StrEnum):
    """What happened on a worker (the ``kind`` of a :class:`~aiperf.cluster.pool.PoolEvent`)."""

    READY = "ready"  # the worker started and described itself
    START_FAILED = "start_failed"  # the worker could not start (backend, device, dataset)
    START = "start"  # a trial began on its worker
    EPOCH = "epoch"  # a trial completed an epoch
    BAD_IMAGES = "bad_images"  # a trial found images that cannot be decoded
    DONE = "done"  # a trial completed
    FAILED = "failed"  # a trial raised, or was lost with its worker
    LOST = "lost"  # the worker (process or node) is gone, or stopped answering (``unresponsive``)
    CONTROL_PLANE = "control_plane"  # Ray's control plane (the GCS) stopped answering, or answers again


@dataclass(kw_only=True, slots=True)
class StoredWeights:
    """A weight set left on the node that trained it: a reference the master hands on, not the arrays.

    ``ref`` is a Ray object reference owned by the node's weight keeper (``owner`` says which
    process: ``weight keeper``, or ``worker <id>`` when the keeper did not answer); the set lives as long
    as that owner and anyone holding the reference. :mod:`aiperf.cluster.node_weights`.
    """

    ref: ObjectRef[Arrays] | None
    node: str
    owner: str
    nbytes: int
    key: int | None = None  # set, with ``ref`` None, while the master has yet to take the reference from the keeper

    @property
    def pending(self) -> bool:
        """Whether this set is named by its keeper's key only: the master must take its reference before using it.

        A node agent's batched stream carries keys, not references (:meth:`WeightKeeper.hold
        <aiperf.cluster.node_weights.WeightKeeper.hold>`): Ray 2.60 lost the count of references
        nested in the items of a long-running streaming generator.
        """
        return self.ref is None and self.key is not None

    def describe(self) -> str:
        return f"{self.nbytes:,} bytes held by the {self.owner} on node {self.node[:16] or '(unknown)'}"


@dataclass(kw_only=True, slots=True)
class TrialStarted:
    """The worker began the trial (its queue reached it), and what it starts from.

    ``weights_lost`` is empty unless weights the master sent could not be fetched (their node is
    gone): then ``start_epoch`` and ``inherited`` say what the trial starts from instead. Both are
    None from a worker that does not fetch (the trial starts as sent).
    """

    kind: ClassVar[EventKind] = EventKind.START
    worker: str
    start_epoch: int | None = None
    inherited: bool | None = None
    weights_lost: str = ""


@dataclass(kw_only=True, slots=True)
class EpochReport:
    """One completed epoch as the worker measured it; the master counts its operations."""

    kind: ClassVar[EventKind] = EventKind.EPOCH
    epoch: int  # 1-based, counting the epochs of earlier attempts
    train_images: int  # images actually trained on (undecodable ones excluded); a language trial's sequences
    eval_images: int  # a language trial's validation windows
    train_acc: float | None  # None: not measured (a language trial)
    train_loss: float
    val_acc: float
    val_loss: float
    train_s: float  # device step time of the training pass
    eval_s: float
    batch_size: int  # the batch size actually used (after any out-of-memory halving)
    precision: str  # the Keras dtype policy actually used
    steps: int | None = None  # training steps (the simulator does not report them)
    data_wait_s: float | None = None  # seconds of train_s spent waiting for input
    input: str | None = None  # stream | memory (| simulated)
    skipped_images: int = 0
    missing_images: int = 0  # of skipped_images: files deleted since the run began
    oom_retries: int = 0
    idle_before_s: float | None = None  # first epoch of a trial: the worker's idle time before it
    compile_s: float | None = None  # of train_s + eval_s: tracing/compilation this epoch disclosed (CompileShares)
    compile_wait_s: float | None = None  # first epoch: of idle_before_s, waiting for this trial's steps to compile
    weights: Weights | StoredWeights | None = None  # the checkpoint for a re-queue (None: not checkpointed)
    train_tokens: int | None = None  # a language trial: tokens trained on (targets), the count its FLOPs scale with
    eval_tokens: int | None = None  # a language trial: validation tokens
    bits_per_byte: float | None = None  # a language trial: validation bits per byte of text


@dataclass(kw_only=True, slots=True)
class BadImagesReport:
    """Images of the dataset this worker found undecodable and had not reported before."""

    kind: ClassVar[EventKind] = EventKind.BAD_IMAGES
    files: list[str]
    epoch_count: int  # images skipped in the reporting epoch
    over_limit: bool = False  # the share passed dataset.max_bad_fraction: the run must stop
    missing: list[str] = field(default_factory=list)  # of files: those that no longer exist (deleted, not damaged)


@dataclass(kw_only=True, slots=True)
class TrialDone:
    """The trial completed: its trained weights and what its start-up cost."""

    kind: ClassVar[EventKind] = EventKind.DONE
    weights: Weights | StoredWeights
    startup_s: float | None = None  # build + compile + weight load
    first_step_s: float | None = None  # tracing/compilation plus one step
    compile_s: float | None = None  # tracing/compilation alone: first step and first evaluation beyond ordinary ones
    step_reused: bool | None = None  # trained on a model this worker had already compiled
    best_val_acc: float | None = None
    batch_size: int | None = None
    requested_batch_size: int | None = None
    precision: str | None = None
    worker_stats: WorkerStats | None = None  # the worker's own busy/idle accounting so far


TrialMessage = TrialStarted | EpochReport | BadImagesReport | TrialDone


@dataclass(kw_only=True, slots=True)
class TrialEnded:
    """The end of one trial's messages in a node agent's batched stream, where its own stream would have ended.

    A node agent runs the trials of one remote call in one stream
    (:meth:`~aiperf.cluster.node_agent.NodeAgent.run_trials`), so a trial's failure cannot end the
    stream as an exception: it ends the trial's share of it here. ``error`` is None when its
    messages simply ran out (after ``done``); ``lost`` says the slot's process died (a lost
    worker, not a failing trial).
    """

    error: str | None = None
    lost: bool = False
