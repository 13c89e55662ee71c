"""`aiperf run` end to end through the CLI: a real smoke run, bad input, and killing a run."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import REPO, aiperf_cmd, cli_env, run_cli

from aiperf.ledger.store import read_raw_ledger, record_hash

pytestmark = pytest.mark.slow


def test_smoke_run_trains_distinct_architectures_and_scores(smoke_run):
    run_dir, proc = smoke_run
    out = proc.stdout
    assert "plan: 2 concurrent trials" in out, "the 2-core box must run at least two trials at once"
    assert "score (OPS)" in out and "verdict" in out
    records = read_raw_ledger(run_dir)
    assert records[0]["type"] == "run_start" and records[-1]["type"] == "run_stop"
    for prev, rec in itertools.pairwise(records):
        assert rec["prev"] == prev["hash"] and rec["hash"] == record_hash(rec)
    epochs = [r for r in records if r["type"] == "epoch"]
    trained = {r["trial"] for r in epochs}
    archs = {r["arch_id"] for r in records if r["type"] == "trial_start" and r["trial"] in trained}
    assert len(archs) >= 3, f"only {len(archs)} distinct architectures were trained"
    # Its search ran in processes of its own (conftest.smoke_run): the start-up, then children of
    # completed trials from the tree search, and TPE's re-tunes.
    assert records[0]["config"]["search"]["processes"] == 1
    started = [r for r in records if r["type"] == "trial_start"]
    assert any(r["info"].get("strategy") == "bayesian" for r in started), [r["info"] for r in started]
    assert any(r["kind"] == "tune" for r in started)
    # The worker's step count reaches the record (full batches only, docs/ledger.md).
    assert all(r["steps"] >= 1 and r["steps"] * r["batch_size"] == r["train_images"] for r in epochs)
    # Two trials really overlapped in time on different workers.
    starts = {r["trial"]: (r["t"], r["worker"]) for r in records if r["type"] == "trial_start"}
    ends = {r["trial"]: r["t"] for r in records if r["type"] == "trial_end"}
    overlapping = [
        (a, b)
        for a in starts
        for b in starts
        if a < b and starts[a][1] != starts[b][1] and starts[a][0] < ends[b] and starts[b][0] < ends[a]
    ]
    assert overlapping
    summary = json.loads((run_dir / "summary.json").read_text())
    score = summary["score"]
    assert score["total_ops"] == pytest.approx(sum(r["ops"] for r in epochs))
    assert records[-1]["type"] == "run_stop" and score["wall_s"] == pytest.approx(records[-1]["t"])  # the run's end
    assert score["wall_s"] >= max(r["t"] for r in epochs)
    assert score["ops_per_s"] == pytest.approx(score["total_ops"] / score["wall_s"])
    assert score["best_val_acc"] == pytest.approx(max(r["val_acc"] for r in epochs))
    assert summary["precision"] == ["float32"]
    assert summary["verdict"]["headline"].startswith(("valid", "invalid"))
    # Each worker's compile share is what the trials it completed spent tracing, inside its busy time.
    for w in (r for r in records if r["type"] == "worker"):
        mine = [
            r for r in records if r["type"] == "trial_end" and r["status"] == "completed" and r["worker"] == w["worker"]
        ]
        for end in mine:  # tracing beyond the first step's batch, and beyond the first evaluation's images
            longest_eval = max(r["eval_s"] for r in epochs if r["trial"] == end["trial"])
            assert 0 <= end["compile_s"] <= end["first_step_s"] + longest_eval
        assert w["compile_s"] == pytest.approx(min(w["busy_s"], sum(r["compile_s"] for r in mine)))
        assert 0 <= w["steady_busy_fraction"] <= w["busy_fraction"] <= 1
    assert "excluding compilation" in out
    # Every trial's hyperparameters are on record next to its architecture.
    for r in records:
        if r["type"] == "trial_start":
            assert set(r["hparams"]) == {
                "learning_rate",
                "batch_size",
                "weight_decay",
                "dropout",
                "kernel_size",
                "epochs",
            }
            assert r["graph"]["format"] == "aiperf-graph"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=timeout)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["run", "--set", "train.batch_size=0"], "train.batch_size"),
        (["run", "--set", "search.bogus=1"], "search.bogus: unknown key"),
        (["run", "--config", "/nonexistent/x.yaml"], "no such file"),
        (["run", "--bogus-flag"], "unrecognized arguments"),
        (["run", "--set", "dataset.name=cifar10", "--set", "dataset.path=/nonexistent/cifar"], "/nonexistent/cifar"),
        (["run", "--set", "dataset.name=fashion_mnist", "--set", "dataset.path=/nonexistent/fm"], "/nonexistent/fm"),
        (["run", "--resume", "/nonexistent/run"], "no such run directory"),
        (["run", "--repeat", "0"], "--repeat must be from 1 to 100"),
        (["run", "--repeat", "101"], "--repeat must be from 1 to 100"),
        (["run", "--repeat", "3", "--set", "run.seed=4294967295"], "needs seeds up to 4294967297"),
        (["run", "--repeat", "2", "--resume", "/nonexistent/run"], "cannot be combined with --resume"),
        (["flops", "/nonexistent/arch.json"], "no such file"),
        (["summary", "/tmp"], "not a run directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, fragment, tmp_path):
    proc = (
        _cli(*args, "--set", f"run.results_dir={tmp_path}")
        if args[0] == "run" and "--resume" not in args
        else _cli(*args)
    )
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert fragment in lines[0]
    assert "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir()), "a rejected run must not create a run directory"


def test_corrupt_dataset_file_names_the_file(tmp_path):
    folder = tmp_path / "cifar"
    folder.mkdir()
    for name in ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"):
        (folder / name).write_bytes(b"\x80\x04not really a pickle")
    proc = _cli(
        "run",
        "--set",
        "dataset.name=cifar10",
        "--set",
        f"dataset.path={folder}",
        "--set",
        f"run.results_dir={tmp_path / 'res'}",
    )
    assert proc.returncode == 2
    assert "data_batch_1" in proc.stderr and "Traceback" not in proc.stderr


def _start_run(
    tmp_path: Path, budget: int = 120, *extra: str, on_poll: Callable[[int], None] | None = None
) -> tuple[subprocess.Popen, Path]:
    """A smoke run started in its own session, returned once it has 3 epochs; ``on_poll(pid)`` runs while waiting."""
    sets = (f"run.results_dir={tmp_path}", f"run.time_budget_s={budget}", *extra)
    proc = subprocess.Popen(
        aiperf_cmd("run", "--config", "smoke", *(arg for name in sets for arg in ("--set", name))),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=REPO,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if on_poll is not None:
            on_poll(proc.pid)
        runs = [p for p in tmp_path.iterdir() if p.is_dir()]
        if runs and (runs[0] / "ledger.jsonl").exists():
            records = read_raw_ledger(runs[0])
            if sum(r["type"] == "epoch" for r in records) >= 3:
                return proc, runs[0]
        if proc.poll() is not None:
            pytest.fail(f"the run ended early: {proc.stdout.read()[-2000:]} {proc.stderr.read()[-2000:]}")
        time.sleep(0.2)
    proc.kill()
    pytest.fail("no epoch completed within 240 s")


def _spawned_in_group(group: int) -> list[int]:
    """Processes of process group ``group`` started by multiprocessing's spawn (the start-up expansion pool)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[2]) == group and b"multiprocessing" in cmdline:
            found.append(int(entry.name))
    return found


def test_sigterm_stops_cleanly_with_a_summary(tmp_path):
    # With a start-up expansion process: the run is searching through it when the signal comes.
    seen: set[int] = set()
    proc, run_dir = _start_run(tmp_path, 120, "search.processes=1", on_poll=lambda p: seen.update(_spawned_in_group(p)))
    assert seen, "search.processes=1 started no expansion process"
    before = read_raw_ledger(run_dir)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    deadline = time.monotonic() + 15
    while _spawned_in_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _spawned_in_group(proc.pid), "the expansion process outlived the run"
    start = read_raw_ledger(run_dir)[0]
    assert start["config"]["search"]["processes"] == 1
    records = read_raw_ledger(run_dir)
    assert records[: len(before)] == before, "records written before the signal changed"
    assert records[-1]["type"] == "run_stop" and records[-1]["status"] == "interrupted"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["trials"]["epochs_counted"] == sum(r["type"] == "epoch" for r in records)
    assert "verdict" in out


def test_sigkill_keeps_every_completed_epoch(tmp_path):
    proc, run_dir = _start_run(tmp_path)
    time.sleep(2.0)
    before = read_raw_ledger(run_dir)
    import os

    os.killpg(proc.pid, signal.SIGKILL)  # the CLI and everything it started
    proc.wait(timeout=30)
    records = read_raw_ledger(run_dir)
    assert len(records) >= len(before)
    assert records[: len(before)] == before
    for prev, rec in itertools.pairwise(records):
        assert rec["prev"] == prev["hash"]
    assert not any(r["type"] == "run_stop" for r in records)
    # The summary can still be computed from what was kept.
    done = _cli("summary", str(run_dir))
    assert done.returncode == 0, done.stderr
    assert "running or killed" in done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trials"]["epochs_counted"] == sum(r["type"] == "epoch" for r in records) >= 3


def test_a_completed_run_cannot_be_resumed(smoke_run):
    run_dir, _ = smoke_run
    before = (run_dir / "ledger.jsonl").read_bytes()
    proc = _cli("run", "--resume", str(run_dir))
    assert proc.returncode == 2
    assert "already completed" in proc.stderr and "Traceback" not in proc.stderr
    assert (run_dir / "ledger.jsonl").read_bytes() == before
