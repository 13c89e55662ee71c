"""What the master needs to know about the architectures it runs: one class per family.

The master loop (feeding workers, re-queues, records, the end) is the same whether a run
searches image classifiers (:mod:`nas.graph`) or transformer language models
(:mod:`nas.transformer`). What differs -- the architecture a worker builds from a proposal,
how it travels and is recorded, its FLOPs, how an epoch's operations are counted, how a
``trial_start`` record becomes a proposal again on ``--resume`` -- is asked of the run's
family, so no part of the master branches on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from aiperf.metrics.flops import GraphCost, aiperf_compatible_operations, count_flops_memo, epoch_operations
from aiperf.record.schema import TrialFlops, TrialStartRecord
from aiperf.training.compiled_models import compile_key
from aiperf.training.trial import apply_hparams
from nas.serialize import graph_to_dict

if TYPE_CHECKING:
    from aiperf.cluster.messages import EpochReport
    from nas.graph import Graph
    from nas.lm_search import LMTrialProposal
    from nas.proposer import TrialProposal
    from nas.transformer import TransformerSpec
    from nas.transformer_flops import TransformerFlops

FamilyName = Literal["image", "language"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A proposal made ready to run: what the worker builds, what it costs, what a worker must have compiled."""

    arch: Any  # the family's architecture as trained (Graph, TransformerSpec)
    cost: Any  # the family's analytic cost (GraphCost, LMCost)
    compile_key: str


@dataclass(frozen=True, slots=True)
class LMCost:
    """A language trial's FLOPs per token at its sequence length and batch (nas.transformer_flops)."""

    flops: TransformerFlops
    tokens_per_step: int

    @property
    def train_per_token(self) -> float:
        return self.flops.train_per_token(self.tokens_per_step)

    @property
    def eval_per_token(self) -> float:
        return self.flops.forward(1)


class Family(Protocol):
    """The family-specific part of running a trial (see the module docstring)."""

    name: FamilyName

    def prepare(self, proposal: Any) -> Prepared: ...

    def arch_dict(self, arch: Any) -> dict[str, Any]: ...

    def start_fields(self, proposal: Any, prepared: Prepared, batch_size: int) -> dict[str, Any]: ...

    def epoch_ops(self, prepared: Prepared, report: EpochReport) -> tuple[float, float, float | None]: ...

    def proposal_from_record(self, rec: TrialStartRecord) -> Any: ...


class ImageFamily:
    """Convolutional image classifiers: graphs, FLOPs per image, AIPerf's compatible count beside ours."""

    name: FamilyName = "image"

    def prepare(self, proposal: TrialProposal) -> Prepared:
        graph = apply_hparams(proposal.graph, proposal.hparams)  # what the worker will build
        return Prepared(graph, count_flops_memo(graph), compile_key(graph))

    def arch_dict(self, arch: Graph) -> dict[str, Any]:
        """The graph as a worker is sent it: plain dicts, which Ray's pickler copies in C.

        A node's kept document is a :class:`nas.graph.NodeDoc`, a dict subclass, which Ray's
        cloudpickle hands to a Python-level reducer node by node: 64 us per spec of a 22-node graph
        against 12 us with plain dicts (3 us to make), paid by the master for every submission.
        """
        doc = graph_to_dict(arch)
        doc["nodes"] = [dict(node) for node in doc["nodes"]]
        return doc

    def start_fields(self, proposal: TrialProposal, prepared: Prepared, batch_size: int) -> dict[str, Any]:
        cost: GraphCost = prepared.cost
        return {
            "arch_id": prepared.arch.key(),
            "graph": graph_to_dict(prepared.arch),
            "flops": TrialFlops(
                forward=cost.forward,
                backward=cost.backward,
                update_per_step=cost.update_per_step,
                train_per_image=cost.train_per_image(batch_size),
                eval_per_image=cost.eval_per_image,
            ),
            "params": proposal.graph.param_count,
        }

    def epoch_ops(self, prepared: Prepared, report: EpochReport) -> tuple[float, float, float | None]:
        train, evaluation = epoch_operations(prepared.cost, report.train_images, report.eval_images, report.batch_size)
        return train, evaluation, aiperf_compatible_operations(prepared.arch, report.train_images, report.eval_images)

    def proposal_from_record(self, rec: TrialStartRecord) -> TrialProposal:
        from aiperf.errors import AiperfError
        from nas.morph import Morph
        from nas.proposer import TrialKind, TrialProposal
        from nas.serialize import graph_from_dict

        if rec.graph is None:
            raise AiperfError("its architecture (graph) is not recorded")
        return TrialProposal(
            graph=graph_from_dict(rec.graph),
            kind=TrialKind(rec.kind),
            hparams=rec.hparams.model_dump(exclude_unset=True),
            parent=rec.parent,
            inherit=rec.inherit,
            morphs=tuple(Morph.from_dict(m) for m in rec.morphs),
            info=rec.info,
        )


class LanguageFamily:
    """Transformer language models: specs, FLOPs per token at the trial's sequence length (docs/flops.md)."""

    name: FamilyName = "language"

    def prepare(self, proposal: LMTrialProposal) -> Prepared:
        from nas.transformer_flops import transformer_flops

        seq_len, batch = int(proposal.hparams["seq_len"]), int(proposal.hparams["batch_size"])
        spec = proposal.spec
        return Prepared(spec, LMCost(transformer_flops(spec, seq_len), batch * seq_len), f"lm:{spec.key()}:{seq_len}")

    def arch_dict(self, arch: TransformerSpec) -> dict[str, Any]:
        return arch.to_dict()

    def start_fields(self, proposal: LMTrialProposal, prepared: Prepared, batch_size: int) -> dict[str, Any]:
        cost: LMCost = prepared.cost
        spec: TransformerSpec = prepared.arch
        return {
            "arch_id": spec.key(),
            "transformer": spec.to_dict(),
            "flops": TrialFlops(
                forward=cost.flops.forward(1),
                backward=cost.flops.backward(1),
                update_per_step=cost.flops.update_per_step,
                train_per_token=cost.train_per_token,
                eval_per_token=cost.eval_per_token,
            ),
            "params": spec.params(),
        }

    def epoch_ops(self, prepared: Prepared, report: EpochReport) -> tuple[float, float, float | None]:
        """Training: FLOPs per token (its step's update included) x tokens; evaluation: forward x tokens."""
        cost: LMCost = prepared.cost
        if report.train_tokens is None or report.eval_tokens is None:
            raise ValueError("a language epoch report must carry train_tokens and eval_tokens")
        return cost.train_per_token * report.train_tokens, cost.eval_per_token * report.eval_tokens, None

    def proposal_from_record(self, rec: TrialStartRecord) -> LMTrialProposal:
        from aiperf.errors import AiperfError
        from nas.lm_search import LMTrialProposal

        if rec.transformer is None:
            raise AiperfError("its architecture (transformer) is not recorded")
        return LMTrialProposal.from_dict(
            {
                "spec": rec.transformer,
                "kind": rec.kind,
                "hparams": rec.hparams.model_dump(exclude_unset=True),
                "parent": rec.parent,
                "inherit": rec.inherit,
                "morphs": rec.morphs,
                "info": rec.info,
            }
        )


def family_for(name: str) -> Family:
    """The family a config (``Config.family``) or a run header (``run_start.family``) names."""
    if name == "language":
        return LanguageFamily()
    if name == "image":
        return ImageFamily()
    raise ValueError(f"unknown architecture family {name!r}")
