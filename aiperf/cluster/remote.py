"""The Ray actor handles the pool calls, as protocols: which remote methods each actor has, and what they return.

Ray's stubs type an ``ActorHandle``'s methods as ``Never`` (they are looked up at run time), so
code that calls ``handle.info.remote()`` on one would go unchecked. These protocols say what the
pool relies on instead: each remote method's ``remote(...)`` gives an ``ObjectRef`` of its
result (a streaming method's, an ``ObjectRefGenerator``). A handle Ray gives back is taken as
one of them where it is made (:mod:`aiperf.cluster.pool`). Nothing here imports Ray at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeAlias, TypeVar

if TYPE_CHECKING:
    from ray import ObjectRef, ObjectRefGenerator

    from aiperf.cluster.messages import WorkerInfo, WorkerStats
    from aiperf.cluster.node_weights import Arrays

R = TypeVar("R")

# What ``ray.wait`` waits on: a call's result, or a streaming call's generator.
Waitable: TypeAlias = "ObjectRef[object] | ObjectRefGenerator"


class RemoteMethod(Protocol[R]):
    """One method of an actor handle: ``remote(...)`` calls it, ``options(...)`` sets how (a concurrency group)."""

    def remote(self, *args: object) -> ObjectRef[R]: ...

    def options(self, **options: object) -> RemoteMethod[R]: ...


class RemoteStream(Protocol):
    """A streaming-generator method of an actor handle: its call gives the generator of its items' references."""

    def remote(self, *args: object) -> ObjectRefGenerator: ...


class WorkerActor(Protocol):
    """A :class:`~aiperf.cluster.worker.RayTrialWorker` actor."""

    info: RemoteMethod[WorkerInfo]
    run_trial: RemoteStream
    prepare: RemoteMethod[bool]
    stats: RemoteMethod[WorkerStats]
    alive: RemoteMethod[bool]


class AgentActor(Protocol):
    """A :class:`~aiperf.cluster.node_agent.NodeAgent` actor (its methods take the slot's key)."""

    start: RemoteMethod[WorkerInfo]
    run_trials: RemoteStream
    alive: RemoteMethod[bool]
    stats: RemoteMethod[WorkerStats]
    stop: RemoteMethod[None]


class KeeperActor(Protocol):
    """A :class:`~aiperf.cluster.node_weights.WeightKeeper` actor."""

    keep: RemoteMethod[list[ObjectRef[Arrays]]]
    hold: RemoteMethod[int]
    take: RemoteMethod[list[ObjectRef[Arrays] | None]]
    alive: RemoteMethod[bool]
