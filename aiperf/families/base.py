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

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Literal, Protocol, TypedDict, TypeVar

if TYPE_CHECKING:
    from aiperf.config import Config
    from aiperf.ledger.schema import TrialFlops, TrialStartRecord

FamilyName = Literal["image", "language"]
ArchT = TypeVar("ArchT")  # a family's architecture as trained (Graph, TransformerSpec)
CostT = TypeVar("CostT")  # its analytic cost (GraphCost, LMCost)
ProposalT = TypeVar("ProposalT")  # what the family's proposer proposes (TrialProposal, LMTrialProposal)
DataT = TypeVar("DataT")  # what its runs train on (Dataset, LanguageData)


class StartFields(TypedDict, total=False):
    """A family's own fields of a ``trial_start`` record (:class:`aiperf.ledger.schema.TrialStartRecord`)."""

    arch_id: str
    graph: dict[str, object]  # an image trial's architecture (nas.serialize)
    transformer: dict[str, object]  # a language trial's (nas.language.spec)
    flops: TrialFlops
    params: int


@dataclass(frozen=True, slots=True)
class Prepared(Generic[ArchT, CostT]):
    """A proposal made ready to run: what the worker builds, what it costs, what a worker must have compiled."""

    arch: ArchT  # the family's architecture as trained (Graph, TransformerSpec)
    cost: CostT  # the family's analytic cost (GraphCost, LMCost)
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


class Family(Protocol[ProposalT, ArchT, CostT, DataT]):
    """The family-specific part of running a trial (see the module docstring).

    Generic in the family's proposal, architecture, cost and data; the master holds a family it does not
    know (bare ``Family``), so it never branches on which one it is.
    """

    name: FamilyName

    def load_data(self, cfg: Config) -> DataT:
        """The data a run of ``cfg`` trains on (a run, its ``--resume`` and its audit load it alike)."""
        ...

    def seed(self, cfg: Config, data: DataT) -> ArchT:
        """The search's starting architecture, sized to ``data``."""
        ...

    def loaded_line(self, data: DataT, seed: ArchT) -> str:
        """One line saying what was loaded: the data's size and source, and the seed (the run prints it)."""
        ...

    def best_text(self, best_val_acc: float | None) -> str:
        """The best quality so far as the progress line shows it (an image run's accuracy, a language run's
        bits per byte)."""
        ...

    def default_batch(self, cfg: Config, accelerators: bool) -> int:
        """The batch a trial trains with unless its hyperparameters say otherwise (the plan states it)."""
        ...

    def trial_sizing(self, cfg: Config) -> str:
        """How a trial's work is sized, as the plan states it: its epochs' steps and where they come from."""
        ...

    def prepare(self, proposal: ProposalT) -> Prepared[ArchT, CostT]: ...

    def arch_dict(self, arch: ArchT) -> dict[str, object]: ...

    def start_fields(self, proposal: ProposalT, prepared: Prepared[ArchT, CostT], batch_size: int) -> StartFields: ...

    def epoch_ops(self, prepared: Prepared[ArchT, CostT], report: EpochCounts) -> tuple[float, float, float | None]: ...

    def size(self, prepared: Prepared[ArchT, CostT]) -> float:
        """The trial's training operations per example (image or token): what a size schedule measures."""
        ...

    def proposal_from_record(self, rec: TrialStartRecord) -> ProposalT: ...

    def recorded_arch(self, rec: TrialStartRecord) -> dict[str, object] | None:
        """A trial's architecture document as its ``trial_start`` holds it (None: not recorded)."""
        ...

    def arch_from_record(self, rec: TrialStartRecord) -> ArchT:
        """The architecture a trial's workers built, from its ``trial_start``; ValueError saying what is wrong."""
        ...


def rebuild_recorded(doc: dict[str, object] | None, field: str, build: Callable[[dict[str, object]], ArchT]) -> ArchT:
    """A trial's architecture rebuilt from its ``trial_start`` document (its ``field``) by ``build``; a ValueError
    saying what is wrong where it is missing or cannot be rebuilt (what :meth:`Family.arch_from_record` raises)."""
    from aiperf.errors import first_line
    from nas.errors import NasError

    if doc is None:
        raise ValueError(f"its trial_start record holds no architecture ({field})")
    try:
        return build(doc)
    except (NasError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"its recorded architecture cannot be rebuilt ({first_line(exc, 200)})") from None
