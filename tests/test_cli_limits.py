"""Every number the CLI takes has a range, checked while parsing: one line, exit 2, before any work.

Each hostile value runs ``aiperf`` in a process of its own under a 3 GiB address-space limit
(``run_cli_bounded``), so a check that moved after the work fails here as a killed process or a
slow one, not as a machine out of memory. The maxima themselves are accepted (parse only).
"""

from __future__ import annotations

import argparse
import time

import pytest
from helpers import run_cli_bounded

from aiperf import cli_limits as limits
from aiperf.cli import build_parser
from aiperf.datasets.generate import GenerateSpec
from aiperf.errors import AiperfError

FAST_S = 30  # a refused flag costs the interpreter's start (well under a second); the margin is for a busy box

DIR = "OUT"  # replaced by a fresh path under tmp_path
RUN = "RUNDIR"  # replaced by a folder holding an empty ledger.jsonl

HOSTILE = [
    # --- scaling
    (["scaling", "--simulate", "--config", "smoke", "--nodes", "99999999999999999999", "-o", DIR], limits.NODES),
    (["scaling", "--simulate", "--config", "smoke", "--nodes", "100000", "-o", DIR], limits.NODES),
    (["scaling", "--simulate", "--config", "smoke", "--nodes", "1,2,16385", "-o", DIR], limits.NODES),
    (["scaling", "--simulate", "--nodes", "0", "-o", DIR], limits.NODES),
    (["scaling", "--simulate", "--nodes", "-4", "-o", DIR], limits.NODES),
    (["scaling", "--simulate", "--nodes", "1,two", "-o", DIR], limits.NODES),
    (["scaling", "--simulate", "--nodes", ",", "-o", DIR], limits.NODES),
    (["scaling", "--simulate", "--nodes", "9" * 100_000, "-o", DIR], limits.NODES),
    # --- make-imagenet
    (["make-imagenet", DIR, "--max-side", "9000"], limits.MAX_SIDE),
    (["make-imagenet", DIR, "--max-side", "0"], limits.MAX_SIDE),
    (["make-imagenet", DIR, "--min-side", "9000"], limits.MIN_SIDE),
    (["make-imagenet", DIR, "--min-side", "0"], limits.MIN_SIDE),
    (["make-imagenet", DIR, "--classes", "100001"], limits.CLASSES),
    (["make-imagenet", DIR, "--classes", "1"], limits.CLASSES),
    (["make-imagenet", DIR, "--train-per-class", "100001"], limits.TRAIN_PER_CLASS),
    (["make-imagenet", DIR, "--val-per-class", "0"], limits.VAL_PER_CLASS),
    (["make-imagenet", DIR, "--val-per-class", "1e9"], limits.VAL_PER_CLASS),
    (["make-imagenet", DIR, "--bad", "100001"], limits.BAD),
    (["make-imagenet", DIR, "--bad", "-1"], limits.BAD),
    (["make-imagenet", DIR, "--train-shards", "16385"], limits.TRAIN_SHARDS),
    (["make-imagenet", DIR, "--val-shards", "0"], limits.VAL_SHARDS),
    (["make-imagenet", DIR, "--seed", "4294967296"], limits.MAKE_SEED),
    (["make-imagenet", DIR, "--seed", "-1"], limits.MAKE_SEED),
    (["make-imagenet", DIR, "--mean-kb", "nan"], limits.MEAN_KB),
    (["make-imagenet", DIR, "--mean-kb", "inf"], limits.MEAN_KB),
    (["make-imagenet", DIR, "--mean-kb=-inf"], limits.MEAN_KB),
    (["make-imagenet", DIR, "--mean-kb", "1e999"], limits.MEAN_KB),
    (["make-imagenet", DIR, "--mean-kb", "0"], limits.MEAN_KB),
    (["make-imagenet", DIR, "--mean-kb", "20000"], limits.MEAN_KB),
    # --- audit, check
    (["audit", RUN, "--sample", "-1"], limits.AUDIT_SAMPLE),
    (["audit", RUN, "--sample", "1000001"], limits.AUDIT_SAMPLE),
    (["audit", RUN, "--retrain", "1001"], limits.AUDIT_RETRAIN),
    (["audit", RUN, "--retrain", "-1"], limits.AUDIT_RETRAIN),
    (["audit", RUN, "--retrain", "many"], limits.AUDIT_RETRAIN),
    (["audit", RUN, "--seed", "-1"], limits.AUDIT_SEED),
    (["audit", RUN, "--speed-factor", "nan"], limits.SPEED_FACTOR),
    (["audit", RUN, "--speed-factor", "0.5"], limits.SPEED_FACTOR),
    (["audit", RUN, "--speed-factor", "1e7"], limits.SPEED_FACTOR),
    (["check", RUN, "--retrain", "1001"], limits.AUDIT_RETRAIN),
    (["check", RUN, "--sample", "-1"], limits.AUDIT_SAMPLE),
    # --- run, flops
    (["run", "--repeat", "0"], limits.REPEAT),
    (["run", "--repeat", "101"], limits.REPEAT),
    (["run", "--repeat", "99999999999999999999999999"], limits.REPEAT),
    (["run", "--planned-nodes", "0"], limits.PLANNED_NODES),
    (["run", "--planned-nodes", "16385"], limits.PLANNED_NODES),
    (["flops", "arch.json", "--batch-size", "0"], limits.BATCH_SIZE),
    (["flops", "arch.json", "--batch-size", str((1 << 20) + 1)], limits.BATCH_SIZE),
]


def _one_line_refusal(args: list[str], tmp_path) -> tuple[str, float]:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "ledger.jsonl").write_text("")
    out = tmp_path / "out"
    args = [str(out) if a == DIR else str(tmp_path / "run") if a == RUN else a for a in args]
    started = time.monotonic()
    proc = run_cli_bounded(*args, timeout=120)
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    assert len(lines[0]) < 400
    assert not out.exists(), "refused before any work"
    return lines[0], elapsed


@pytest.mark.parametrize(("args", "bound"), HOSTILE, ids=[f"{a[0]} {b.flag} #{k}" for k, (a, b) in enumerate(HOSTILE)])
def test_a_number_out_of_range_is_refused_at_parsing(args, bound, tmp_path):
    line, elapsed = _one_line_refusal(args, tmp_path)
    assert bound.flag in line and bound.text in line, line
    assert elapsed < FAST_S


def test_too_many_node_counts_are_refused(tmp_path):
    line, _ = _one_line_refusal(["scaling", "--simulate", "--nodes", ",".join(["1"] * 33), "-o", DIR], tmp_path)
    assert "--nodes" in line and f"from 1 to {limits.NODE_SIZES_MAX} node counts" in line


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--classes", "100000", "--train-per-class", "100000"], "at most 4,000,000"),
        (
            ["--classes", "100", "--train-per-class", "5000", "--min-side", "4096", "--max-side", "4096"],
            "at most 16 TiB",
        ),
        (["--min-side", "4096", "--max-side", "64"], "need --min-side <= --max-side, got 4096 > 64"),
    ],
)
def test_make_imagenet_bounds_the_whole_tree_before_writing(args, fragment, tmp_path):
    line, elapsed = _one_line_refusal(["make-imagenet", DIR, *args], tmp_path)
    assert fragment in line and line.startswith("aiperf: error: make-imagenet: ")
    assert elapsed < FAST_S


# --- the maxima (and minima) are accepted ---------------------------------------------------------------


def _parse(*args: str) -> argparse.Namespace:
    return build_parser().parse_args(list(args))


def test_every_maximum_and_minimum_parses():
    hi = _parse(
        "make-imagenet", "out", "--classes", "100000", "--train-per-class", "100000", "--val-per-class", "100000",
        "--min-side", "4096", "--max-side", "4096", "--mean-kb", "10240", "--bad", "100000",
        "--train-shards", "16384", "--val-shards", "16384", "--seed", "4294967295",
    )  # fmt: skip
    assert (hi.classes, hi.train_per_class, hi.val_per_class) == (100_000, 100_000, 100_000)
    assert (hi.min_side, hi.max_side, hi.mean_kb, hi.bad) == (4096, 4096, 10240.0, 100_000)
    assert (hi.train_shards, hi.val_shards, hi.seed) == (16_384, 16_384, 2**32 - 1)
    lo = _parse("make-imagenet", "out", "--classes", "2", "--train-per-class", "1", "--val-per-class", "1",
                "--min-side", "1", "--max-side", "1", "--mean-kb", "1", "--bad", "0", "--train-shards", "1",
                "--val-shards", "1", "--seed", "0")  # fmt: skip
    assert (lo.classes, lo.min_side, lo.mean_kb, lo.seed) == (2, 1, 1.0, 0)
    assert _parse("scaling", "--nodes", "1,16384").nodes == [1, 16_384]
    assert _parse("scaling", "--nodes", ",".join(map(str, range(1, 33)))).nodes == list(range(1, 33))
    assert _parse("run", "--repeat", "100").repeat == 100 and _parse("run", "--repeat", "1").repeat == 1
    audit = _parse("audit", "r", "--sample", "1000000", "--retrain", "1000", "--seed", "4294967295",
                   "--speed-factor", "1e6")  # fmt: skip
    assert (audit.sample, audit.retrain, audit.seed, audit.speed_factor) == (10**6, 1000, 2**32 - 1, 1e6)
    assert _parse("audit", "r", "--speed-factor", "1").speed_factor == 1.0
    check = _parse("check", "p", "--sample", "1000000", "--retrain", "1000")
    assert (check.sample, check.retrain) == (10**6, 1000)
    assert _parse("flops", "f", "--batch-size", str(1 << 20)).batch_size == 1 << 20


def _ranged_actions():
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, sub in subs.choices.items():
        for action in sub._actions:
            yield command, action


def test_every_number_the_cli_takes_has_a_range_and_its_default_is_in_it():
    for command, action in _ranged_actions():
        assert action.type not in (int, float), f"aiperf {command} {action.option_strings}: a number with no range"
        if isinstance(action.type, (limits.IntRange, limits.FloatRange)):
            assert action.type.text in (action.help or ""), "the range is in --help"
            if action.default is not None:
                assert action.type.check(action.default) == action.default, (command, action.option_strings)


def test_the_seed_limit_is_the_configs():
    from aiperf.config import MAX_SEED

    assert limits.SEED_MAX == MAX_SEED


def test_the_tree_bounds_accept_their_maxima():
    GenerateSpec(classes=40_000, train_per_class=90, val_per_class=10, quirks=False).check()  # 4,000,000 images
    with pytest.raises(AiperfError, match="4,000,001 images; at most 4,000,000"):
        GenerateSpec(classes=40_000, train_per_class=90, val_per_class=10, quirks=False, bad=1).check()
    at_limit = {"classes": 5, "train_per_class": 69_904, "val_per_class": 1, "quirks": False, "max_side": 4096}
    GenerateSpec(**at_limit, min_side=4096).check()  # 349,525 images of 4,096 x 4,096: 16 TiB less 16 MB
    with pytest.raises(AiperfError, match="at most 16 TiB"):
        GenerateSpec(**at_limit, min_side=4096, bad=1).check()
    GenerateSpec(**at_limit, bad=1).check()  # the same count at ImageNet's sizes: their side stays under 900


# --- the library checks the same ranges where a caller other than the CLI passes the number ---------------


def test_the_simulator_refuses_a_huge_cluster_before_allocating_it(monkeypatch, tmp_path):
    from aiperf.cluster import sim_pool
    from aiperf.config import load_config
    from aiperf.engine.scaling import SimulationSettings, scaling_command, simulate_run
    from nas import zoo

    class Allocated(Exception):
        pass

    def pool(workers, *_args, **kwargs):
        raise Allocated(workers, kwargs["nodes"])

    monkeypatch.setattr(sim_pool, "SimulatedWorkerPool", pool)
    cfg = load_config("smoke", [])
    with pytest.raises(AiperfError, match="--nodes must be from 1 to 16,384, got 100000"):
        simulate_run(cfg, 100_000, tmp_path / "r", None, {})  # type: ignore[arg-type]
    with pytest.raises(AiperfError, match="more than the simulator's 131,072 workers"):
        simulate_run(cfg, 16_384, tmp_path / "r", None, {}, SimulationSettings(workers_per_node=9))  # type: ignore[arg-type]
    seed = zoo.small_resnet((28, 28, 1), 10, width=8)  # the search is made before the workers, as in a real run
    with pytest.raises(Allocated) as allocated:  # the largest study passes the check
        simulate_run(cfg, 16_384, tmp_path / "r", seed, {"train_images": 1, "eval_images": 1})
    assert allocated.value.args == (131_072, 16_384)
    with pytest.raises(AiperfError, match="--nodes must be from 1 to 16,384"):
        scaling_command([1, 99_999], simulate=True, config="smoke", overrides=[], address=None, output=str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_the_audit_and_repeat_refuse_counts_out_of_range(tmp_path):
    from aiperf.config import load_config
    from aiperf.engine.audit import audit_run
    from aiperf.engine.repeat import repeat_seeds

    with pytest.raises(AiperfError, match="--sample must be from 0 to 1,000,000, got 1000001"):
        audit_run(tmp_path, sample=1_000_001)
    with pytest.raises(AiperfError, match="--retrain must be from 0 to 1,000, got -1"):
        audit_run(tmp_path, retrain_count=-1)
    with pytest.raises(AiperfError, match="--repeat must be from 1 to 100, got 101"):
        repeat_seeds(load_config("smoke", []), 101)
