"""The language-model workload end to end through `aiperf run`: trains, counts, scores, verifies, resumes.

One small run of the ``llm`` config (a smaller seed and corpus, about 25 s on two cores) is
shared by most tests; they must not modify its files. ``llm-official`` runs on token shards
converted by the documented command.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, aiperf_cmd, cli_env, run_cli

from aiperf.families.language.epoch_size import MIN_AUTO_STEPS, auto_steps_per_epoch
from aiperf.ledger.store import read_raw_ledger
from nas.language.flops import transformer_flops
from nas.language.spec import TransformerSpec

pytestmark = pytest.mark.slow

EPOCH_DEVICE_S = 0.02
SMALL = (
    "lm.max_bytes=400000",
    "lm.seed={blocks: 1, width: 32, heads: 2, head_dim: 16, mlp_hidden: 64, context: 64}",
    # epochs sized by each worker's measured ceiling (issue 44): 0.02 s of it is about 10-20 steps of this
    # seed on a CPU core, at least 10 (MIN_AUTO_STEPS)
    "lm.steps_per_epoch=auto",
    f"lm.epoch_device_s={EPOCH_DEVICE_S}",
    "lm.learning_rate=0.01",
    "lm.eval_windows=8",
    "lm.batch_size=8",
    "lm.seq_len=64",
    "lm.hpo_batch_sizes=[4, 8]",
    "lm.hpo_seq_lens=[32, 64]",
    "lm.max_batch_tokens=512",
    "train.epochs_per_trial=1",
    "hpo.epochs=[1, 2]",
    "run.max_trials=6",
    "run.time_budget_s=600",
    "run.progress_interval_s=5",
)


def _run(results: Path, *extra: str) -> subprocess.CompletedProcess:
    settings = [f"run.results_dir={results}", *SMALL, *extra]
    args = [a for s in settings for a in ("--set", s)]
    return subprocess.run(
        aiperf_cmd("run", "--config", "llm", *args),
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=600,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def llm_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    results = tmp_path_factory.mktemp("llm-results")
    proc = _run(results)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [run_dir] = [p for p in results.iterdir() if p.is_dir()]
    return run_dir, proc


def test_a_language_run_trains_grown_transformers_and_counts_every_token(llm_run):
    run_dir, proc = llm_run
    records = read_raw_ledger(run_dir)
    start = records[0]
    assert start["family"] == "language" and start["seed_architecture"]["format"] == "aiperf-transformer"
    assert start["dataset"]["tokenizer"] == "bytes" and start["dataset"]["train_tokens"] > 300_000
    starts = {r["trial"]: r for r in records if r["type"] == "trial_start"}
    epochs = [r for r in records if r["type"] == "epoch"]
    assert len({starts[e["trial"]]["arch_id"] for e in epochs}) >= 3, "fewer than 3 architectures trained"
    grown = [s for s in starts.values() if s["inherit"] is not None]
    assert grown, "no child started from its parent's weights"
    assert all(s["morphs"] and "graph" not in s for s in grown)
    ceilings = {r["worker"]: r["ceiling"]["flops_per_s"] for r in records if r["type"] == "worker"}
    for e in epochs:
        s = starts[e["trial"]]
        h = s["hparams"]
        spec = TransformerSpec.from_dict(s["transformer"])
        flops = transformer_flops(spec, h["seq_len"])
        # each epoch has the steps its worker's recorded ceiling gives the trial's counted step
        sized = auto_steps_per_epoch(
            spec, h["batch_size"], h["seq_len"], h["epochs"], ceilings[e["worker"]], EPOCH_DEVICE_S
        )
        assert e["steps"] == sized >= MIN_AUTO_STEPS
        # the counted tokens are the steps' tokens, and the operations follow from them
        assert e["train_tokens"] == e["steps"] * e["batch_size"] * h["seq_len"]
        assert e["eval_tokens"] == 8 * h["seq_len"]
        per_token = flops.train_per_token(h["batch_size"] * h["seq_len"])
        assert s["flops"]["train_per_token"] == pytest.approx(per_token, rel=1e-12)
        expected = per_token * e["train_tokens"] + flops.forward(1) * e["eval_tokens"]
        assert e["ops"] == pytest.approx(expected, rel=1e-12) and "aiperf_ops" not in e
        assert e["val_acc"] == pytest.approx(min(1.0, max(0.0, 1 - e["bits_per_byte"] / 8)))
        assert e["bits_per_byte"] == pytest.approx(e["val_loss"] / math.log(2))
    # it learned: an untrained model needs 8 bits per byte (a uniform guess over 256 bytes)
    assert min(e["bits_per_byte"] for e in epochs) < 6.5
    summary = json.loads((run_dir / "summary.json").read_text())
    tokens = sum(e["train_tokens"] for e in epochs)
    assert summary["score"]["total_ops"] == pytest.approx(sum(e["ops"] for e in epochs))
    assert summary["language"]["tokens"] == tokens
    assert summary["language"]["tokens_per_s"] == pytest.approx(tokens / summary["score"]["wall_s"])
    assert "tokens/s" in proc.stdout and "bits per byte" in proc.stdout


def test_verify_and_the_report_read_a_language_run(llm_run):
    run_dir, _ = llm_run
    verified = run_cli("verify", str(run_dir))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert (run_dir / "report.html").is_file()
    assert "tokens" in (run_dir / "report.html").read_text()


def test_a_language_run_whose_master_died_resumes(llm_run, tmp_path):
    run_dir, _ = llm_run
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    raw = (copy / "ledger.jsonl").read_text().splitlines(keepends=True)
    # the master died after its first trial ended: everything after that record is gone (the run's
    # cap of 6 trials leaves the resumed session trials to train)
    ends = [i for i, line in enumerate(raw) if '"type":"trial_end"' in line.replace(" ", "")]
    (copy / "ledger.jsonl").write_text("".join(raw[: ends[0] + 1]))
    (copy / "summary.json").unlink()
    proc = subprocess.run(
        aiperf_cmd("run", "--resume", str(copy)),
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = read_raw_ledger(copy)
    assert any(r["type"] == "resume" for r in records)
    after = records[[r["type"] for r in records].index("resume") :]
    assert any(r["type"] == "epoch" for r in after), "the resumed session trained nothing"
    verified = run_cli("verify", str(copy))
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_the_official_workload_trains_from_token_shards_every_worker_opens(tmp_path):
    """llm-official's path: text converted to shards by the documented command, read by each worker from its path."""
    import sysconfig

    src = tmp_path / "text"
    src.mkdir()
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:60]:  # any folder of text files
        (src / path.name).write_bytes(path.read_bytes()[:20_000])
    shards = tmp_path / "shards"
    convert = subprocess.run(
        [
            *aiperf_cmd()[:2],
            "aiperf.families.language.token_shards",
            "convert",
            str(src),
            str(shards),
            "--val-fraction",
            "0.1",
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
        cwd=REPO,
    )
    assert convert.returncode == 0, convert.stderr
    results = tmp_path / "results"
    settings = [
        f"run.results_dir={results}",
        f"dataset.path={shards}",
        *(s for s in SMALL if not s.startswith(("lm.max_bytes", "run.max_trials"))),
        "run.max_trials=2",
        "lm.hpo_seq_lens=[64]",
    ]
    proc = subprocess.run(
        aiperf_cmd("run", "--config", "llm-official", *[a for s in settings for a in ("--set", s)]),
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [run_dir] = [p for p in results.iterdir() if p.is_dir()]
    records = read_raw_ledger(run_dir)
    dataset = records[0]["dataset"]
    assert (dataset["name"], dataset["source"], dataset["streaming"]) == ("token_shards", str(shards), True)
    epochs = [r for r in records if r["type"] == "epoch"]
    assert epochs and all(e["input"] == "stream" for e in epochs)
    verified = run_cli("verify", str(run_dir))
    assert verified.returncode == 0, verified.stdout + verified.stderr
