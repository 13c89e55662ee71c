"""The language family's part of running a trial: transformer specs, FLOPs per token (docs/flops.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiperf.families.base import EpochCounts, FamilyName, Prepared, StartFields, rebuild_recorded
from aiperf.ledger.schema import TrialFlops, TrialStartRecord

if TYPE_CHECKING:
    from aiperf.config import Config
    from aiperf.families.language.data import LanguageData
    from nas.language.flops import TransformerFlops
    from nas.language.search import LMTrialProposal
    from nas.language.spec import TransformerSpec


@dataclass(frozen=True, slots=True)
class LMCost:
    """A language trial's FLOPs per token at its sequence length and batch (nas.language.flops)."""

    flops: TransformerFlops
    tokens_per_step: int

    @property
    def train_per_token(self) -> float:
        return self.flops.train_per_token(self.tokens_per_step)

    @property
    def eval_per_token(self) -> float:
        return self.flops.forward(1)


class LanguageFamily:
    """Transformer language models: specs, FLOPs per token at the trial's sequence length (docs/flops.md)."""

    name: FamilyName = "language"

    def load_data(self, cfg: Config) -> LanguageData:
        from aiperf.families.language.data import load_language_data

        return load_language_data(cfg)

    def seed(self, cfg: Config, data: LanguageData) -> TransformerSpec:
        from aiperf.families.language.seed import lm_seed_spec

        return lm_seed_spec(cfg, data.vocab_size)

    def loaded_line(self, data: LanguageData, seed: TransformerSpec) -> str:
        return (
            f"aiperf: dataset {data.name}: {data.train_tokens:,} train / {data.val_tokens:,} validation tokens,"
            f" vocabulary {data.vocab_size} ({data.tokenizer}; {data.source}); seed model {seed.n_blocks} blocks,"
            f" width {seed.width}, {seed.params():,} parameters"
        )

    def best_text(self, best_val_acc: float | None) -> str:
        """Bits per byte, 8 x (1 - the quality a language epoch reports as val_acc; docs/llm.md)."""
        return f"bits/byte {8 * (1 - best_val_acc):.3f}" if best_val_acc is not None else "bits/byte -"

    def default_batch(self, cfg: Config, accelerators: bool) -> int:
        """``lm.batch_size`` sequences of ``lm.seq_len`` tokens, on any device."""
        return cfg.lm.batch_size

    def trial_sizing(self, cfg: Config) -> str:
        """``lm.steps_per_epoch``, or with ``auto`` the seconds of each worker's ceiling an epoch is sized to."""
        if cfg.lm.steps_per_epoch == "auto":
            return f"epochs of {cfg.lm.epoch_device_s:g} s at each worker's measured ceiling (lm.steps_per_epoch auto)"
        return f"epochs of {cfg.lm.steps_per_epoch} steps (lm.steps_per_epoch)"

    def prepare(self, proposal: LMTrialProposal) -> Prepared[TransformerSpec, LMCost]:
        from nas.language.flops import transformer_flops

        seq_len, batch = int(proposal.hparams["seq_len"]), int(proposal.hparams["batch_size"])
        spec = proposal.spec
        return Prepared(spec, LMCost(transformer_flops(spec, seq_len), batch * seq_len), f"lm:{spec.key()}:{seq_len}")

    def arch_dict(self, arch: TransformerSpec) -> dict[str, object]:
        return arch.to_dict()

    def start_fields(
        self, proposal: LMTrialProposal, prepared: Prepared[TransformerSpec, LMCost], batch_size: int
    ) -> StartFields:
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

    def size(self, prepared: Prepared[TransformerSpec, LMCost]) -> float:
        cost: LMCost = prepared.cost
        return float(cost.train_per_token)

    def epoch_ops(
        self, prepared: Prepared[TransformerSpec, LMCost], report: EpochCounts
    ) -> tuple[float, float, float | None]:
        """Training: FLOPs per token (its step's update included) x tokens; evaluation: forward x tokens."""
        cost: LMCost = prepared.cost
        if report.train_tokens is None or report.eval_tokens is None:
            raise ValueError("a language epoch report must carry train_tokens and eval_tokens")
        return cost.train_per_token * report.train_tokens, cost.eval_per_token * report.eval_tokens, None

    def proposal_from_record(self, rec: TrialStartRecord) -> LMTrialProposal:
        from aiperf.errors import AiperfError
        from nas.language.search import LMTrialProposal

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

    def recorded_arch(self, rec: TrialStartRecord) -> dict[str, object] | None:
        return rec.transformer

    def arch_from_record(self, rec: TrialStartRecord) -> TransformerSpec:
        """The recorded transformer (hyperparameters do not change its spec)."""
        from nas.language.spec import TransformerSpec

        return rebuild_recorded(rec.transformer, "transformer", TransformerSpec.from_dict)
