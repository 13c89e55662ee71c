"""The image family's part of running a trial: graphs, FLOPs per image, AIPerf's compatible count."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiperf.families.base import EpochCounts, FamilyName, Prepared, StartFields, rebuild_recorded
from aiperf.families.image.compiled_models import compile_key
from aiperf.families.image.flops import GraphCost, aiperf_compatible_operations, count_flops_memo, epoch_operations
from aiperf.ledger.schema import TrialFlops, TrialStartRecord
from aiperf.training.trial import apply_hparams
from nas.serialize import graph_to_dict

if TYPE_CHECKING:
    from aiperf.config import Config
    from aiperf.datasets import Dataset
    from nas.graph import Graph
    from nas.proposer import TrialProposal


class ImageFamily:
    """Convolutional image classifiers: graphs, FLOPs per image, AIPerf's compatible count beside ours."""

    name: FamilyName = "image"

    def load_data(self, cfg: Config) -> Dataset:
        from aiperf.datasets import load_dataset

        return load_dataset(cfg.dataset)

    def seed(self, cfg: Config, data: Dataset) -> Graph:
        from aiperf.families.image.seed import seed_architecture

        return seed_architecture(cfg, data)

    def loaded_line(self, data: Dataset, seed: Graph) -> str:
        return (
            f"aiperf: dataset {data.name}: {data.train_size} train / {data.val_size} validation images "
            f"{tuple(data.input_shape)}, {data.num_classes} classes ({data.source})"
        )

    def best_text(self, best_val_acc: float | None) -> str:
        return f"val acc {best_val_acc:.4f}" if best_val_acc is not None else "val acc -"

    def default_batch(self, cfg: Config, accelerators: bool) -> int:
        """``train.batch_size``; "auto": 256 images on accelerators, 64 on CPUs; at most ``train.max_batch_size``."""
        asked = cfg.train.batch_size
        return min(int(asked) if asked != "auto" else 256 if accelerators else 64, cfg.train.max_batch_size)

    def trial_sizing(self, cfg: Config) -> str:
        """An image trial's epochs pass over the training split once (``hpo.epochs`` of them)."""
        return "epochs of one pass over the training images"

    def prepare(self, proposal: TrialProposal) -> Prepared[Graph, GraphCost]:
        graph = apply_hparams(proposal.graph, proposal.hparams)  # what the worker will build
        return Prepared(graph, count_flops_memo(graph), compile_key(graph))

    def arch_dict(self, arch: Graph) -> dict[str, object]:
        """The graph as a worker is sent it: plain dicts, which Ray's pickler copies in C.

        A node's kept document is a :class:`nas.graph.NodeDoc`, a dict subclass, which Ray's
        cloudpickle hands to a Python-level reducer node by node: 64 us per spec of a 22-node graph
        against 12 us with plain dicts (3 us to make), paid by the master for every submission.
        """
        doc = graph_to_dict(arch)
        doc["nodes"] = [dict(node) for node in doc["nodes"]]
        return doc

    def start_fields(
        self, proposal: TrialProposal, prepared: Prepared[Graph, GraphCost], batch_size: int
    ) -> StartFields:
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

    def size(self, prepared: Prepared[Graph, GraphCost]) -> float:
        cost: GraphCost = prepared.cost
        return float(cost.forward + cost.backward)

    def epoch_ops(self, prepared: Prepared[Graph, GraphCost], report: EpochCounts) -> tuple[float, float, float | None]:
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

    def recorded_arch(self, rec: TrialStartRecord) -> dict[str, object] | None:
        return rec.graph

    def arch_from_record(self, rec: TrialStartRecord) -> Graph:
        """The recorded graph under the trial's hyperparameters (what its workers built)."""
        from nas.serialize import graph_from_dict

        hparams = rec.hparams.model_dump(exclude_unset=True)
        return rebuild_recorded(rec.graph, "graph", lambda doc: apply_hparams(graph_from_dict(doc), hparams))
