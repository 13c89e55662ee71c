"""Every size or count a config can ask for has a maximum, refused as a one-line config error before
any work (docs/limits.md): a run asked for 10^8 concurrent trials hung creating actors before."""

from __future__ import annotations

import pytest
from helpers import run_cli_bounded

from aiperf.config import load_config
from aiperf.errors import AiperfError

TOO_LARGE = [
    ("cluster.min_concurrent_trials=100000000", "less than or equal to 1024"),
    ("cluster.max_concurrent_trials=1000000", "less than or equal to 131072"),
    ("cluster.max_nodes=20000", "less than or equal to 16384"),
    ("cluster.keep_weights=1000000000", "less than or equal to 100000"),
    ("cluster.max_trial_retries=1000", "less than or equal to 100"),
    ("cluster.cpus_per_trial=100000", "from 1 to 1024"),
    ("search.candidates=1000000000", "less than or equal to 100000"),
    ("search.batch=100000", "auto or an integer from 1 to 4096"),
    ("search.batch=0", "auto or an integer from 1 to 4096"),
    ("search.processes=257", "auto or an integer from 0 to 256"),
    ("search.processes=-1", "auto or an integer from 0 to 256"),
    ("search.gp_window=1000000000", "less than or equal to 20000"),
    ("search.max_layers=1000000", "less than or equal to 10000"),
    ("search.max_params=100000000000000", "less than or equal to 10000000000000"),
    ("search.max_flops_per_image=1.0e20", "less than or equal to 10000000000000000"),
    ("search.ucb_beta=1e300", "less than or equal to 1000000"),
    ("train.batch_size=99999999999", "from 1 to 1,048,576"),
    ("train.max_batch_size=99999999999", "less than or equal to 1048576"),
    ("train.eval_batch_size=99999999999", "less than or equal to 1048576"),
    ("hpo.batch_sizes=[64,10000000000]", "from 1 to 1,048,576"),
    ("hpo.epochs=[1,1000000000]", "1,000 or less"),
    ("dataset.synthetic.train_size=10000000000", "less than or equal to 100000000"),
    ("dataset.synthetic.shape=[100000,100000,3]", "less than or equal to 4096"),
    ("dataset.synthetic.shape=[32,32,100000]", "less than or equal to 64"),
    ("dataset.image_size=[100000,100000]", "less than or equal to 4096"),
    ("dataset.max_train_images=10000000000", "less than or equal to 100000000"),
    ("run.max_trials=10000000000", "less than or equal to 1000000000"),
    ("rules.min_precision_bits=100000", "less than or equal to 64"),
    ("rules.official_min_duration_s=1e300", "less than or equal to"),
]


@pytest.mark.parametrize(("override", "says"), TOO_LARGE, ids=[o for o, _ in TOO_LARGE])
def test_a_size_or_count_over_its_maximum_is_a_config_error(override, says):
    with pytest.raises(AiperfError) as info:
        load_config("smoke", [override])
    message = str(info.value)
    assert message.startswith("config error: ") and says in message and "\n" not in message
    assert override.split("=")[0].rsplit(".", 1)[-1] in message  # the setting is named


def test_the_cli_refuses_it_before_starting_anything(tmp_path):
    proc = run_cli_bounded(
        "run",
        "--config",
        "smoke",
        "--set",
        f"run.results_dir={tmp_path}",
        "--set",
        "cluster.min_concurrent_trials=100000000",
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "cluster.min_concurrent_trials" in line and "1024" in line
    assert not any(tmp_path.iterdir()), "nothing was started, nothing written"


def test_the_built_in_configs_are_inside_every_limit():
    from aiperf.config import BUILTIN_CONFIGS

    for name in BUILTIN_CONFIGS:
        load_config(name)


@pytest.mark.parametrize(
    ("workers", "batch"), [(1, 1), (64, 1), (127, 1), (128, 2), (4096, 64), (65_536, 128), (10**6, 128)]
)
def test_search_batch_auto_is_one_architecture_per_64_concurrent_trials_up_to_128(workers, batch):
    from aiperf.engine.search import search_batch

    assert search_batch(load_config("default"), workers) == batch
    assert search_batch(load_config("default", ["search.batch=7"]), workers) == 7


@pytest.mark.parametrize(
    ("workers", "cores", "processes"),
    [(2, 64, 0), (1023, 64, 0), (1024, 64, 16), (65_536, 8, 7), (65_536, 3, 2), (65_536, 2, 1), (4096, 1, 0)],
)
def test_search_processes_auto_starts_expansion_processes_only_for_a_large_first_wave(
    monkeypatch, workers, cores, processes
):
    import os

    from aiperf.engine.search import expand_processes

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert expand_processes(load_config("default"), workers) == processes
    assert expand_processes(load_config("default", ["search.processes=3"]), workers) == 3


@pytest.mark.parametrize(("workers", "ahead"), [(1, 0), (1023, 0), (1024, 8), (131_072, 8)])
def test_tpe_is_asked_ahead_from_a_thousand_workers_whatever_the_processes(workers, ahead):
    from aiperf.engine.search import search_settings

    for processes in ("0", "4"):
        cfg = load_config("default", [f"search.processes={processes}"])
        settings = search_settings(cfg, 64, workers=workers)
        assert settings.tune_ahead == ahead  # the processes never change what is proposed
        assert settings.processes == int(processes)


@pytest.mark.parametrize(
    ("workers", "fraction", "tunes"), [(8, 0.25, 0), (1023, 0.25, 0), (1024, 0.25, 256), (65_536, 0.1, 6553)]
)
def test_the_first_waves_re_tunes_come_first_from_a_thousand_workers(workers, fraction, tunes):
    from aiperf.engine.search import search_settings

    cfg = load_config("default", [f"search.retune_fraction={fraction}"])
    assert search_settings(cfg, 64, workers=workers).first_wave_tunes == tunes  # small runs keep their order
