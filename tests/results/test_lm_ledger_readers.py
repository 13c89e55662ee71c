"""The ledger's readers on a language-model run: verify recounts per token, the summary, report, results
and MLPerf log show tokens per second and bits per byte; an image run's output keeps its shape."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
from helpers import ledger_records, rehash
from lm_ledger import END_T, LOSSES, SEQ_LEN, bits_per_byte, epoch_tokens, language_run, quality

from aiperf.cli import main
from aiperf.ledger.store import canonical, read_ledger
from aiperf.results.mllog import CHECKER_RULESET, CHECKER_USAGE, parse, render, write_checker_config
from aiperf.results.report import write_report
from aiperf.results.summary import build_summary, format_summary, language_quality, save_summary
from aiperf.results.tables import load
from aiperf.results.verify import verify_run

TRAIN_TOKENS = epoch_tokens()[2] * sum(len(x) for x in LOSSES.values())


@pytest.fixture
def lm_run(tmp_path):
    return language_run(tmp_path / "run")


def _forge(run, edit):
    """Edit the ledger's JSON objects, then re-chain them and rewrite summary.json: what a careful forger does."""
    records = ledger_records(run)
    edit(records)
    rehash(records)
    (run / "ledger.jsonl").write_bytes(b"".join(canonical(r) + b"\n" for r in records))
    save_summary(run, build_summary(run))
    return records


def _first(records, kind, **match):
    return next(r for r in records if r["type"] == kind and all(r.get(k) == v for k, v in match.items()))


def _failed(run) -> str:
    ok, message = verify_run(run)
    assert not ok, message
    return message.splitlines()[0]


# --- aiperf verify ---------------------------------------------------------------------------------


def test_an_honest_language_run_verifies(lm_run, capsys):
    ok, message = verify_run(lm_run)
    assert ok, message
    assert "FLOPs of 2 trials and operations of 4 epochs recomputed" in message
    assert main(["verify", str(lm_run)]) == 0
    assert "verified" in capsys.readouterr().out


def test_a_forged_train_per_token_is_named(lm_run, capsys):
    def edit(records):
        _first(records, "trial_start", trial="t00001")["flops"]["train_per_token"] *= 0.5

    _forge(lm_run, edit)
    first = _failed(lm_run)
    assert "(trial_start t00001)" in first and "flops.train_per_token" in first and "stored architecture" in first
    assert main(["verify", str(lm_run)]) == 1
    assert "verify failed" in capsys.readouterr().out


def test_a_forged_epoch_ops_is_recounted_from_its_tokens(lm_run):
    def edit(records):
        epoch = _first(records, "epoch", trial="t00000", epoch=2)
        epoch["train_ops"] *= 2
        epoch["ops"] = epoch["train_ops"] + epoch["eval_ops"]  # consistent with itself, not with its tokens

    _forge(lm_run, edit)
    first = _failed(lm_run)
    assert "(epoch t00000 epoch 2)" in first and "train_ops" in first


def test_more_tokens_than_the_sequences_hold_are_named(lm_run):
    def edit(records):
        _first(records, "epoch", trial="t00001", epoch=1)["train_tokens"] += SEQ_LEN

    _forge(lm_run, edit)
    assert "train_tokens" in _failed(lm_run)


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda t: t.update(heads=[4]), "heads and mlp_hidden"),  # two blocks of MLP, one of attention
        (lambda t: t.update(format="graph"), "'format'"),
        (lambda t: t.update(width="wide"), "width"),
        (lambda t: t.pop("vocab_size"), "vocab_size"),
    ],
    ids=["blocks", "format", "width", "missing"],
)
def test_a_bad_transformer_is_a_problem_naming_the_trial_not_a_traceback(lm_run, damage, named):
    def edit(records):
        damage(_first(records, "trial_start", trial="t00000")["transformer"])

    _forge(lm_run, edit)
    first = _failed(lm_run)
    assert "(trial_start t00000)" in first and "stored transformer is not readable" in first and named in first


def test_a_language_trial_without_its_transformer_or_seq_len_is_named(lm_run):
    def edit(records):
        del _first(records, "trial_start", trial="t00000")["transformer"]
        del _first(records, "trial_start", trial="t00001")["hparams"]["seq_len"]

    _forge(lm_run, edit)
    ok, message = verify_run(lm_run)
    assert not ok
    assert "(trial_start t00000): a trial of a language run without its architecture (transformer)" in message
    assert "(trial_start t00001): hparams.seq_len is missing" in message


def test_image_counts_on_a_language_run_are_named(lm_run):
    def edit(records):
        _first(records, "trial_start", trial="t00000")["flops"]["train_per_image"] = 1.0
        _first(records, "epoch", trial="t00001", epoch=1)["aiperf_ops"] = 1.0

    _forge(lm_run, edit)
    ok, message = verify_run(lm_run)
    assert not ok
    assert "(trial_start t00000): flops.train_per_image on a language trial" in message
    assert "(epoch t00001 epoch 1): aiperf_ops on a language epoch" in message


def test_an_epoch_without_its_tokens_is_named(lm_run):
    def edit(records):
        del _first(records, "epoch", trial="t00000", epoch=1)["eval_tokens"]

    _forge(lm_run, edit)
    assert "(epoch t00000 epoch 1): eval_tokens is missing" in _failed(lm_run)


def test_a_quality_its_bits_per_byte_do_not_give_is_named(lm_run):
    """val_acc raised (with the trial's best, so every other record agrees) no longer matches its bits per byte."""

    def edit(records):
        epoch = _first(records, "epoch", trial="t00001", epoch=2)
        epoch["val_acc"] = 0.95
        _first(records, "trial_end", trial="t00001")["best_val_acc"] = 0.95

    _forge(lm_run, edit)
    first = _failed(lm_run)
    assert "(epoch t00001 epoch 2)" in first and "val_acc is 0.95" in first and "bits_per_byte" in first


def test_bits_per_byte_its_loss_does_not_give_are_named(lm_run):
    def edit(records):
        epoch = _first(records, "epoch", trial="t00001", epoch=2)
        epoch["bits_per_byte"] = 0.5
        epoch["val_acc"] = language_quality(0.5)
        _first(records, "trial_end", trial="t00001")["best_val_acc"] = epoch["val_acc"]

    _forge(lm_run, edit)
    first = _failed(lm_run)
    assert "(epoch t00001 epoch 2): bits_per_byte is 0.5 but val_loss" in first


def test_quality_is_clamped_to_a_fraction():
    assert language_quality(0.0) == 1.0 and language_quality(4.0) == 0.5 and language_quality(9.0) == 0.0


# --- the summary ---------------------------------------------------------------------------------------


def test_the_summary_states_tokens_per_second_and_the_best_bits_per_byte(lm_run):
    summary = build_summary(lm_run)
    language = summary["language"]
    assert summary["family"] == "language"
    assert language["tokens"] == TRAIN_TOKENS and language["eval_tokens"] == epoch_tokens()[3] * 4
    assert summary["score"]["wall_s"] == END_T  # the run's recorded end: OPS and tokens per second share it
    assert language["tokens_per_s"] == pytest.approx(TRAIN_TOKENS / END_T)
    assert language["best_bits_per_byte"] == pytest.approx(bits_per_byte(1.2))
    assert (language["best_bits_per_byte_trial"], language["best_bits_per_byte_epoch"]) == ("t00001", 2)
    best = summary["best"]
    assert best["trial"] == "t00001" and best["val_acc"] == pytest.approx(quality(1.2))
    assert best["bits_per_byte"] == pytest.approx(bits_per_byte(1.2))
    assert best["flops_train_per_token"] > 0 and "flops_train_per_image" not in best
    assert summary["dataset"]["train_tokens"] == 200_000 and summary["dataset"]["tokenizer"] == "bytes"


def test_the_printed_summary_labels_quality_as_bits_per_byte(lm_run):
    text = format_summary(build_summary(lm_run), lm_run)
    assert re.search(r"tokens +3\.41 k tokens/s +?= 10\.2 k tokens trained over 3\.0 s", text), text
    assert f"best bits per byte   {bits_per_byte(1.2):.4f} (validation, trial t00001" in text
    assert "best val accuracy" not in text
    lines = text.splitlines()
    assert lines[1].startswith("  score (OPS)") and lines[2].startswith("  tokens")


def test_an_image_summary_keeps_its_keys(sim_run):
    summary = build_summary(sim_run)
    assert "language" not in summary and "family" not in summary
    assert "flops_train_per_image" in summary["best"] and "bits_per_byte" not in summary["best"]
    assert "train_tokens" not in summary["dataset"]
    text = format_summary(summary, sim_run)
    assert "best val accuracy" in text and "tokens" not in text


# --- results, report, MLPerf log ---------------------------------------------------------------------


def test_results_carry_the_language_columns(lm_run):
    results = load(lm_run)
    epochs, trials = results.epochs, results.trials
    assert list(epochs["train_tokens"]) == [epoch_tokens()[2]] * 4
    assert list(epochs["eval_tokens"]) == [epoch_tokens()[3]] * 4
    assert list(epochs["bits_per_byte"]) == pytest.approx([bits_per_byte(x) for v in LOSSES.values() for x in v])
    assert epochs["aiperf_ops"].isna().all() and epochs["train_images"].notna().all()
    assert list(trials["seq_len"]) == [SEQ_LEN, SEQ_LEN] and list(trials["warmup_fraction"]) == [0.1, 0.1]
    assert (trials["flops_train_per_token"] > 0).all() and trials["flops_train_per_image"].isna().all()
    assert list(trials["best_bits_per_byte"]) == pytest.approx([bits_per_byte(1.6), bits_per_byte(1.2)])


def test_the_report_shows_tokens_per_second_and_bits_per_byte(lm_run):
    page = write_report(lm_run).read_text()
    page = re.sub(r"data:image/png;base64,[^\"]+", "PNG", page)
    assert "tokens per second" in page and "3.41 k tokens/s" in page
    assert "best validation bits per byte" in page and f"{bits_per_byte(1.2):.4f}" in page
    assert "train FLOPs/token" in page and "best bits/byte" in page and "sequence length" in page
    assert "train FLOPs/image" not in page and "best validation accuracy" not in page
    assert "train tokens" in page and "bytes per token" in page
    assert page.count('src="PNG"') >= 3  # score, bits per byte over time, lineage (and OPS per node)


def test_the_mllog_counts_tokens_as_samples(lm_run):
    events = [parse(line) for line in render(read_ledger(lm_run))]
    by_key = {e["key"]: e for e in events}
    assert by_key["train_samples"]["value"] == 200_000 and by_key["train_samples"]["metadata"]["unit"] == "tokens"
    assert by_key["eval_samples"]["value"] == 20_000
    score = by_key["aiperf_score"]["metadata"]
    assert score["tokens"] == TRAIN_TOKENS and math.isclose(score["tokens_per_s"], TRAIN_TOKENS / END_T)
    accuracies = [e["value"] for e in events if e["key"] == "eval_accuracy"]
    assert all(0 <= a <= 1 for a in accuracies) and len(accuracies) == 4
    json.dumps(events)  # every value is plain JSON


def test_the_language_log_passes_mlcommons_compliance_checker(lm_run, tmp_path):
    log = tmp_path / "mllog.txt"
    log.write_text("\n".join(render(read_ledger(lm_run))) + "\n")
    config = write_checker_config(tmp_path / "checker")
    proc = subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", CHECKER_USAGE, "--ruleset",
         CHECKER_RULESET, "--config", str(config), "--log_output", str(tmp_path / "checker.log"), str(log)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr
