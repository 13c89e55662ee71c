"""Config loading: built-ins validate, overrides apply, every mistake is one line naming the key."""

from __future__ import annotations

import pytest

from aiperf.config import BUILTIN_CONFIGS, load_config
from aiperf.errors import AiperfError


@pytest.mark.parametrize("name", BUILTIN_CONFIGS)
def test_builtin_configs_validate(name):
    cfg = load_config(name)
    assert cfg.run.time_budget_s > 0


def test_default_is_the_mnist_five_minute_run():
    cfg = load_config()
    assert cfg.dataset.name == "mnist"
    assert cfg.run.time_budget_s == 300
    assert cfg.rules.min_accuracy == 0.95
    assert cfg.model.backend == "tensorflow"


def test_overrides_parse_yaml_values():
    cfg = load_config(
        "smoke", ["train.batch_size=32", "hpo.kernel_sizes=[3, 5]", "run.max_trials=4", "cluster.address=null"]
    )
    assert cfg.train.batch_size == 32
    assert cfg.hpo.kernel_sizes == [3, 5]
    assert cfg.run.max_trials == 4
    assert cfg.cluster.address is None


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["train.batch_size=0"], "train.batch_size"),
        (["train.bogus=1"], "train.bogus: unknown key"),
        (["bogus.x=1"], "bogus: unknown key"),
        (["dataset.name=imagenet21k"], "dataset.name"),
        (["run.time_budget_s=-5"], "run.time_budget_s"),
        (["run.time_budget_s=soon"], "run.time_budget_s"),
        (["hpo.learning_rate=[0.5, 0.1]"], "learning_rate: low 0.5 exceeds high 0.1"),
        (["model.backend=mxnet"], "model.backend"),
        (["train.batch_size"], "expected key=value"),
        (["train=3"], "train"),
    ],
)
def test_bad_values_name_the_key(overrides, fragment):
    with pytest.raises(AiperfError) as info:
        load_config("smoke", overrides)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message
    assert message.startswith("config error:")


def test_bad_files(tmp_path):
    with pytest.raises(AiperfError, match="no such file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed\n")
    with pytest.raises(AiperfError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(AiperfError, match="mapping"):
        load_config(listy)
    with pytest.raises(AiperfError, match="built-in"):
        load_config("no_such_builtin")


def test_config_defaults_are_the_searchs_own_defaults():
    """One place for defaults: a config that says nothing searches exactly as the search package would."""
    from dataclasses import fields

    from aiperf.config import Config
    from nas.hpo import HyperparameterSpace
    from nas.search import SearchSettings

    cfg, search, space = Config(), SearchSettings(), HyperparameterSpace()
    for name in ("strategy", "ucb_beta", "retune_fraction", "max_morphs_per_child", "gp_window", "candidates"):
        assert getattr(cfg.search, name) == getattr(search, name), name
    for f in fields(HyperparameterSpace):
        assert tuple(getattr(cfg.hpo, f.name)) == tuple(getattr(space, f.name)), f.name
    train = cfg.train
    defaults = dict(search.default_hparams)
    assert (train.learning_rate, train.weight_decay, train.dropout, train.kernel_size, train.epochs_per_trial) == (
        defaults["learning_rate"],
        defaults["weight_decay"],
        defaults["dropout"],
        defaults["kernel_size"],
        defaults["epochs"],
    )
