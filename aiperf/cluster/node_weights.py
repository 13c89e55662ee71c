"""Weights stay on the node that trained them; the master holds references (docs/cluster.md, "Weights").

At 65,536 workers, shipping every trial's weights (and every epoch's checkpoint) to the master
would put one weight set per running trial in one process and hundreds of sets a second through
it. Instead a worker hands each set it produces to its node's :class:`WeightKeeper`, a small
long-lived actor (no CPU, no GPU) that puts it in the node's object store and so *owns* it: the
set outlives the worker process that trained it (a crashed or killed worker), not the node. The
worker's message carries a :class:`~aiperf.cluster.messages.StoredWeights` -- the reference, the
node and the size -- and the master passes that on to a child or a re-queued attempt, whose worker
fetches the arrays from the node that has them.

When the set cannot be fetched (its node or keeper is gone), the worker falls back rather than
fail the trial (:func:`resolve_start`): a re-queued attempt whose checkpoint is lost starts again
from epoch 0, from its parent's weights when those can be had; a child whose parent is lost
trains from a fresh initialisation. What happened is in the ``TrialStarted`` message and so in
the ledger's ``trial_start`` record (``weights_lost``, ``inherit``, ``start_epoch``).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeAlias

from aiperf.cluster.messages import StoredWeights
from aiperf.errors import first_line
from aiperf.training.trial import TrialSpec, Weights
from nas.language.spec import Weights as LMWeights

if TYPE_CHECKING:
    from ray import ObjectRef

    from aiperf.cluster.remote import KeeperActor

logger = logging.getLogger(__name__)

# How long a worker waits for a weight set from another node before it falls back (a lost owner
# answers at once; this bounds a node that is unreachable but not yet declared dead).
FETCH_TIMEOUT_S = 120.0
# How long a worker waits for its node's keeper to take a set before it keeps the set itself (and
# stops asking): a trial's epoch must not wait on a keeper that cannot be reached, e.g. while Ray's
# control plane is frozen and the keeper's address was never looked up.
KEEP_TIMEOUT_S = 10.0

Arrays = Weights | LMWeights  # an image set (node -> arrays) or a language model's (name -> array)
WeightSource = Arrays | StoredWeights | None
KEEPER_OWNER = "weight keeper"  # StoredWeights.owner of a set its node's keeper holds
# What the master hands a worker for a trial's start: a source as above, or arrays it put in the object
# store once for several submissions (WorkerPool.put), which Ray resolves to the arrays in the worker.
SentWeights: TypeAlias = "WeightSource | ObjectRef[Arrays]"


class WeightKeeper:
    """One per node (the pool starts it beside the node's workers): owns the node's weight sets.

    Ray frees an object when its owner's process ends, and the process that calls ``ray.put``
    owns what it puts; a set put by the keeper therefore lives as long as this actor and anyone
    holding its reference (the master), whatever happens to the worker that trained it.
    """

    def __init__(self) -> None:
        self._held: dict[int, ObjectRef[Arrays]] = {}  # sets put by :meth:`hold` and not yet taken, by key
        self._keys = itertools.count()
        self._lock = threading.Lock()  # the keeper is a threaded actor (several sets copied at once)

    def keep(self, weights: Weights) -> list[ObjectRef[Arrays]]:
        """Put ``weights`` in this node's object store; the reference comes back in a list, unresolved."""
        import ray

        ref: ObjectRef[Arrays] = ray.put(weights)
        return [ref]

    def hold(self, weights: Weights) -> int:
        """Put ``weights`` in this node's object store and keep the reference here; its key comes back.

        For a node agent, whose batched stream must carry no reference (Ray 2.60 lost the count of
        references nested in a long stream's items, and freed sets the master held): the master
        takes the reference with :meth:`take`, as a call's return value, the way :meth:`keep`'s travel.
        """
        import ray

        ref: ObjectRef[Arrays] = ray.put(weights)
        with self._lock:
            key = next(self._keys)
            self._held[key] = ref
        return key

    def take(self, keys: list[int]) -> list[ObjectRef[Arrays] | None]:
        """The references held under ``keys``, handed over (None for a key not held); the keeper lets go of them."""
        with self._lock:
            return [self._held.pop(key, None) for key in keys]

    def holding(self) -> int:
        """How many sets wait to be taken (a master that lost a call's stream never takes its sets)."""
        with self._lock:
            return len(self._held)

    def alive(self) -> bool:
        return True


def reach_keeper(keeper: KeeperActor) -> bool:
    """Ask the keeper once at a worker's start, so its address is known before any trial (False: unreachable)."""
    import ray

    try:
        return bool(ray.get(keeper.alive.remote(), timeout=KEEP_TIMEOUT_S))
    except Exception as exc:
        logger.warning(f"the node's weight keeper did not answer at start ({first_line(exc, 160)})")
        return False


def weights_nbytes(weights: Weights) -> int:
    """The array bytes of a weight set."""
    return sum(int(a.nbytes) for arrays in weights.values() for a in arrays)


def store_on_node(weights: Weights, keeper: KeeperActor | None, node: str, worker: str) -> StoredWeights:
    """Hand ``weights`` to the node's keeper (or, when it does not answer, keep them in this worker's process).

    The returned set's ``owner`` says which: a caller whose keeper did not answer stops asking it.
    """
    import ray

    nbytes = weights_nbytes(weights)
    if keeper is not None:
        try:
            [ref] = ray.get(keeper.keep.remote(weights), timeout=KEEP_TIMEOUT_S)
            return StoredWeights(ref=ref, node=node, owner=KEEPER_OWNER, nbytes=nbytes)
        except Exception as exc:  # the keeper died (its process, not the node): this worker owns the set
            logger.warning(f"worker {worker}: the node's weight keeper did not answer ({first_line(exc, 160)})")
    own: ObjectRef[Arrays] = ray.put(weights)
    return StoredWeights(ref=own, node=node, owner=f"worker {worker}", nbytes=nbytes)


class NodeStore:
    """Where one process's weight sets go: its node's keeper while the keeper answers, else the process itself.

    A keeper that did not answer once is not asked again, so no later epoch waits on it.
    """

    def __init__(self, keeper: KeeperActor | None, node: str = "") -> None:
        self.keeper = keeper
        self.node = node

    def reach(self) -> None:
        """Ask the keeper once at start (its address is then known before any trial)."""
        if self.keeper is not None and not reach_keeper(self.keeper):
            self.keeper = None

    def store(self, weights: Weights, worker: str) -> StoredWeights:
        stored = store_on_node(weights, self.keeper, self.node, worker)
        if stored.owner != KEEPER_OWNER:
            self.keeper = None
        return stored

    def hold(self, weights: Weights, worker: str) -> StoredWeights | Weights:
        """Hand ``weights`` to the keeper under a key (:meth:`WeightKeeper.hold`); the arrays when it does not answer.

        Without a keeper the set travels to the master as arrays: a reference the agent put itself
        would have to cross its stream, which is what the key avoids.
        """
        if self.keeper is not None:
            import ray

            try:
                key = ray.get(self.keeper.hold.remote(weights), timeout=KEEP_TIMEOUT_S)
                return StoredWeights(
                    ref=None, key=key, node=self.node, owner=KEEPER_OWNER, nbytes=weights_nbytes(weights)
                )
            except Exception as exc:  # the keeper died (its process, not the node): the master gets the arrays
                logger.warning(f"worker {worker}: the node's weight keeper did not answer ({first_line(exc, 160)})")
                self.keeper = None
        return weights


class WeightsLost(Exception):
    """A stored weight set that cannot be fetched (its node or owner is gone)."""


def fetch_weights(source: SentWeights, timeout: float = FETCH_TIMEOUT_S) -> Arrays | None:
    """The arrays of ``source``: as they are, fetched from the node that holds them, or from the object store.

    A set the master holds as arrays (read back from disk on ``--resume``) is sent as a reference
    (:meth:`~aiperf.cluster.pool.RayWorkerPool.put`). Ray resolves it for a worker that is an actor of its
    own, where it is a call's argument, but not inside a node agent's batch, where it is nested in a list:
    the agent fetches it here.
    """
    if source is None or isinstance(source, dict):
        return source
    import ray

    if isinstance(source, StoredWeights):
        if source.ref is None:  # the master could not take it from its keeper
            raise WeightsLost(f"{source.describe()}: its keeper no longer held it")
        what, ref = source.describe(), source.ref
    else:
        what, ref = "the set the master sent", source
    try:
        return ray.get(ref, timeout=timeout)
    except Exception as exc:  # OwnerDiedError, ObjectLostError, GetTimeoutError, ...
        raise WeightsLost(f"{what}: {type(exc).__name__}") from None


@dataclass(frozen=True)
class StartWeights:
    """What a trial actually starts from after fetching: the spec to train and the arrays, and why it fell back."""

    spec: TrialSpec
    parent: Arrays | None
    resume: Arrays | None
    fallback: str = ""  # empty when everything sent could be fetched

    @property
    def inherited(self) -> bool:
        return self.resume is None and self.parent is not None


def resolve_start(
    spec: TrialSpec,
    parent: SentWeights,
    resume: SentWeights,
    fetch: Callable[[SentWeights], Arrays | None] = fetch_weights,
) -> StartWeights:
    """Fetch a trial's starting weights, falling back as the module docstring says.

    A lost checkpoint makes the attempt start at epoch 0 (from its parent's weights when the
    spec names a parent and they can be had); a lost parent makes the child start from a fresh
    initialisation. The parent is fetched only when it is needed. ``fetch`` raises
    :class:`WeightsLost` for a set that is gone (the simulated pool passes its own).
    """
    lost: list[str] = []
    if resume is not None:
        try:
            return StartWeights(spec, None, fetch(resume))
        except WeightsLost as exc:
            lost.append(f"the checkpoint of epoch {spec.start_epoch} ({exc})")
            spec = replace(spec, start_epoch=0)
    parent_weights = None
    if parent is not None:
        try:
            parent_weights = fetch(parent)
        except WeightsLost as exc:
            lost.append(f"the parent's weights ({exc})")
    if parent_weights is None and spec.parent_graph is not None:
        spec = replace(spec, parent_graph=None, morphs=[])
    fallback = ""
    if lost:
        then = "inherits its parent's weights" if parent_weights is not None else "trains from a fresh initialisation"
        fallback = f"lost {' and '.join(lost)}: starts at epoch {spec.start_epoch} and {then}"
    return StartWeights(spec, parent_weights, None, fallback)
