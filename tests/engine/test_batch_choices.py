"""No trial is proposed with a batch its epochs cannot fill: the search space is cut to the
training images an epoch surely delivers, once, with a warning that says why."""

from __future__ import annotations

import logging

from aiperf.config import DatasetConfig, load_config
from aiperf.datasets import load_dataset
from aiperf.datasets.bad_images import largest_full_batch
from aiperf.datasets.generate import GenerateSpec, generate_imagenet
from aiperf.engine.search import batch_choices, make_search
from aiperf.families.image.seed import seed_architecture


def test_batch_sizes_above_the_largest_fillable_batch_are_dropped():
    cfg = load_config("imagenet")  # hpo.batch_sizes [128, 256, 512]
    assert batch_choices(cfg, 64) == ([128, 256, 512], 64)
    assert batch_choices(cfg, 64, 300) == ([128, 256], 64)
    assert batch_choices(cfg, 64, 105) == ([105], 64), "none fits: the largest fillable batch itself"
    assert batch_choices(cfg, 256, 105) == ([105], 105), "the default trial batch too"
    assert batch_choices(cfg, 256, 200) == ([128], 128), "the default: the largest allowed size that fits"


def test_a_tiny_folder_gets_only_batches_it_fills_and_says_why_once(tmp_path, caplog):
    tree = tmp_path / "tree"
    generate_imagenet(tree, GenerateSpec(classes=2, train_per_class=6, val_per_class=2, min_side=8, max_side=16,
                                         quirks=False, bad=1))  # fmt: skip
    overrides = [f"dataset.path={tree}", "dataset.image_size=[8,8]", "dataset.storage=stream",
                 "dataset.max_bad_fraction=0.2", "model.seed_architecture=small_resnet", "model.width=4",
                 "hpo.batch_sizes=[4,16,32]"]  # fmt: skip
    cfg = load_config("imagenet", overrides)
    dataset = load_dataset(DatasetConfig(**cfg.dataset.model_dump()))
    largest = largest_full_batch(dataset, 0.2)
    assert (dataset.train_size, largest) == (13, 10)
    with caplog.at_level(logging.WARNING, logger="aiperf"):
        proposer = make_search(cfg, seed_architecture(cfg, dataset), 64, dataset)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0] == (
        "hpo.batch_sizes 16, 32 and the plan's batch size 64 cannot be filled by the 10 training images every "
        "epoch surely delivers (13 in the split, less the 3 that dataset.max_bad_fraction=0.2 lets be skipped); "
        "a training batch must be full, so trials use batch sizes 4 (default 4)"
    )
    batches = set()
    for k in range(12):
        proposal = proposer.ask(f"t{k:05d}")
        batches.add(proposal.hparams["batch_size"])
        proposer.tell(f"t{k:05d}", 0.5, final=True)
    assert batches == {4}
