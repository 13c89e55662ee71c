"""Each family rebuilds the architecture a trial's workers built from its trial_start record (what audits train)."""

from __future__ import annotations

import pytest

from aiperf.families import family_for
from aiperf.ledger.schema import TrialStartRecord
from nas.language.spec import TransformerSpec
from nas.serialize import graph_to_dict
from nas.zoo import small_resnet


def start(**arch) -> TrialStartRecord:
    return TrialStartRecord(
        t=1.0, trial="t00000", kind="seed", arch_id="a", flops={"train_per_image": 1.0}, params=1, **arch
    )


def test_an_image_trial_is_rebuilt_from_its_graph_under_its_hyperparameters():
    graph = small_resnet((8, 8, 3), 4, width=4, dropout=0.1)
    rec = start(graph=graph_to_dict(graph), hparams={"dropout": 0.3})
    image = family_for("image")
    assert image.recorded_arch(rec) == rec.graph
    built = image.arch_from_record(rec)
    assert built.key() == graph.key()
    assert {n.attrs.get("rate") for n in built.nodes if n.op == "dropout"} == {0.3}  # as its workers built it


def test_a_language_trial_is_rebuilt_from_its_transformer():
    spec = TransformerSpec(vocab_size=256, seq_len=16, width=16, head_dim=8, heads=(2,), mlp_hidden=(32,))
    rec = start(transformer=spec.to_dict())
    language = family_for("language")
    assert language.recorded_arch(rec) == rec.transformer
    assert language.arch_from_record(rec) == spec


@pytest.mark.parametrize(("family", "field"), [("image", "graph"), ("language", "transformer")])
def test_a_missing_or_broken_architecture_is_one_line_naming_it(family, field):
    with pytest.raises(ValueError, match=f"holds no architecture \\({field}\\)"):
        family_for(family).arch_from_record(start())
    with pytest.raises(ValueError, match="cannot be rebuilt"):
        family_for(family).arch_from_record(start(**{field: {"format": "nonsense", "nodes": 3}}))
