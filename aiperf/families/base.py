"""What the master needs to know about the architectures it runs: one class per family.

The master loop (feeding workers, re-queues, records, the end) is the same whether a run
searches image classifiers (:mod:`nas.graph`) or transformer language models
(:mod:`nas.language.spec`). What differs -- the architecture a worker builds from a proposal,
how it travels and is recorded, its FLOPs, how an epoch's operations are counted, how a
``trial_start`` record becomes a proposal again on ``--resume`` -- is asked of the run's
family (:mod:`aiperf.families.image`, :mod:`aiperf.families.language`), so no part of the
master branches on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from aiperf.ledger.schema import TrialStartRecord

FamilyName = Literal["image", "language"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A proposal made ready to run: what the worker builds, what it costs, what a worker must have compiled."""

    arch: Any  # the family's architecture as trained (Graph, TransformerSpec)
    cost: Any  # the family's analytic cost (GraphCost, LMCost)
    compile_key: str


class EpochCounts(Protocol):
    """What an epoch trained and evaluated, as a worker reports it (:class:`aiperf.cluster.messages.EpochReport`)."""

    @property
    def train_images(self) -> int: ...
    @property
    def eval_images(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def train_tokens(self) -> int | None: ...
    @property
    def eval_tokens(self) -> int | None: ...


class Family(Protocol):
    """The family-specific part of running a trial (see the module docstring)."""

    name: FamilyName

    def prepare(self, proposal: Any) -> Prepared: ...

    def arch_dict(self, arch: Any) -> dict[str, Any]: ...

    def start_fields(self, proposal: Any, prepared: Prepared, batch_size: int) -> dict[str, Any]: ...

    def epoch_ops(self, prepared: Prepared, report: EpochCounts) -> tuple[float, float, float | None]: ...

    def size(self, prepared: Prepared) -> float:
        """The trial's training operations per example (image or token): what a size schedule measures."""
        ...

    def proposal_from_record(self, rec: TrialStartRecord) -> Any: ...
