"""`aiperf audit` on a language-model run: hashes, re-evaluation, re-training, and the edits it must catch.

The run is written by hand as the master writes one (typed records through ``LedgerWriter``, weights
through the weight store's ``save_weights``) from two tiny trials really trained on a 200 kB slice
of the text corpus (width 16, 1 block, 2 steps of 4 windows per epoch, 2 epochs) by the worker's runner,
and a third grown from the first by a morph, inheriting its weights: it verifies, and only
re-executing it can tell a forgery. Each test copies it before touching it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import ledger_records, rechain

keras = pytest.importorskip("keras")

from aiperf.config import load_config  # noqa: E402
from aiperf.engine.audit import (  # noqa: E402
    REEVAL_TOLERANCE_BITS_PER_BYTE,
    _load_data,
    _trials,
    audit_run,
    reevaluate_lm,
)
from aiperf.engine.weights import load_lm_weights, save_weights  # noqa: E402
from aiperf.errors import AiperfError  # noqa: E402
from aiperf.families.language.data import load_language_data  # noqa: E402
from aiperf.families.language.evaluate import evaluate_lm_weights  # noqa: E402
from aiperf.families.language.family import LMCost  # noqa: E402
from aiperf.families.language.runner import LMRunnerSettings, LMTrialRunner, lm_quality  # noqa: E402
from aiperf.families.language.trainer import train_lm_trial  # noqa: E402
from aiperf.ledger.schema import (  # noqa: E402
    EpochRecord,
    RunStartRecord,
    RunStatus,
    RunStopRecord,
    TrialEndRecord,
    TrialFlops,
    TrialHparams,
    TrialStartRecord,
    TrialStatus,
    WeightsRecord,
)
from aiperf.ledger.store import LedgerWriter, read_ledger  # noqa: E402
from aiperf.results.summary import build_summary, save_summary  # noqa: E402
from aiperf.results.verify import verify_run  # noqa: E402
from aiperf.training.trial import TrialSpec  # noqa: E402
from nas.language.flops import transformer_flops  # noqa: E402
from nas.language.morph import LMMorph, apply_spec_morph  # noqa: E402
from nas.language.spec import TransformerSpec, init_weights  # noqa: E402

SEQ, BATCH, STEPS, WINDOWS, EPOCHS = 16, 4, 2, 2, 2
SPEC = TransformerSpec(vocab_size=256, seq_len=SEQ, width=16, head_dim=8, heads=(2,), mlp_hidden=(32,))
HPARAMS = {"learning_rate": 1e-2, "warmup_fraction": 0.0, "weight_decay": 0.01, "batch_size": BATCH, "seq_len": SEQ}
MORPH = LMMorph("wider_mlp", 0, 48)
CHILD = apply_spec_morph(SPEC, MORPH)
# trial -> (training seed, spec, the trial it inherits from): two seeds, one child grown from the first
TRIALS = {"t00000": (1, SPEC, None), "t00001": (2, SPEC, None), "t00002": (3, CHILD, "t00000")}
OVERRIDES = [
    "run.name=lm-audit",
    "lm.max_bytes=200000",
    f"lm.steps_per_epoch={STEPS}",
    f"lm.eval_windows={WINDOWS}",
    "model.precision=float32",
]
# What audit_run and the worker set in the process environment, put back after each test.
ENV_KEYS = ("KERAS_BACKEND", "OMP_NUM_THREADS", "TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")


@pytest.fixture(autouse=True)
def _environment(monkeypatch):
    for key in ENV_KEYS:
        monkeypatch.setitem(os.environ, key, os.environ.get(key, "tensorflow" if key == "KERAS_BACKEND" else "1"))


def _trial_flops(spec: TransformerSpec) -> TrialFlops:
    """A trial's per-token counts, as the master's LanguageFamily records them."""
    cost = LMCost(transformer_flops(spec, SEQ), BATCH * SEQ)
    return TrialFlops(
        forward=cost.flops.forward(1),
        backward=cost.flops.backward(1),
        update_per_step=cost.flops.update_per_step,
        train_per_token=cost.train_per_token,
        eval_per_token=cost.eval_per_token,
    )


def _write_run(run_dir: Path) -> Path:
    """Train the trials through the worker's runner; write the ledger, weights and summary as a master would."""
    cfg = load_config("llm", OVERRIDES)
    data = load_language_data(cfg)
    runner = LMTrialRunner(data, LMRunnerSettings("float32", False, STEPS, WINDOWS))  # CPU: model.jit auto is off
    hparams = {**HPARAMS, "epochs": EPOCHS}
    kept: dict[str, dict[str, np.ndarray]] = {}
    (run_dir / "weights").mkdir(parents=True)  # the weight store's folder
    start = time.time()
    with LedgerWriter(run_dir) as ledger:

        def clock() -> float:  # the master's clock: verify compares it with each record's wall time
            return time.time() - start

        ledger.append(
            RunStartRecord(
                t=0.0, run_id="lm-audit", family="language", config=cfg.to_dict(),
                plan={"backend": cfg.model.backend, "concurrency": 1, "precision": "float32", "batch_size": BATCH,
                      "threads_per_trial": 1, "nodes": [{"node_id": "n0", "hostname": "h0", "cpus": 1, "gpus": 0}]},
                dataset={**data.describe(), "fingerprint": data.fingerprint()},
                rules=cfg.rules.model_dump(), seed_architecture=SPEC.to_dict(),
            )
        )  # fmt: skip
        for trial, (seed, spec, parent) in TRIALS.items():
            morphs = [MORPH.to_dict()] if parent else []
            flops = _trial_flops(spec)
            ledger.append(
                TrialStartRecord(
                    t=clock(), trial=trial, kind="morph" if parent else "seed", parent=parent, inherit=parent,
                    morphs=morphs, lineage=[parent] if parent else [], arch_id=spec.key(),
                    transformer=spec.to_dict(), hparams=TrialHparams(**hparams), flops=flops,
                    params=spec.params(), seed=seed, worker="w0", node="n0",
                )
            )  # fmt: skip
            task = TrialSpec(
                trial_id=trial,
                kind="morph" if parent else "seed",
                graph=spec.to_dict(),
                hparams=hparams,
                seed=seed,
                parent_graph=SPEC.to_dict() if parent else None,
                morphs=morphs,
                checkpoint_every_epoch=False,
            )
            epochs = []
            for item in runner.run(task, kept[parent] if parent else None):
                if item["type"] == "done":
                    kept[trial] = item["weights"]
                    continue
                epochs.append(item["val_acc"])
                train_ops = flops.train_per_token * item["train_tokens"]
                eval_ops = flops.eval_per_token * item["eval_tokens"]
                ledger.append(
                    EpochRecord(
                        t=clock(), trial=trial, epoch=item["epoch"], train_images=item["train_images"],
                        eval_images=item["eval_images"], train_tokens=item["train_tokens"],
                        eval_tokens=item["eval_tokens"], steps=item["steps"], batch_size=item["batch_size"],
                        train_ops=train_ops, eval_ops=eval_ops, ops=train_ops + eval_ops, val_acc=item["val_acc"],
                        train_loss=item["train_loss"], val_loss=item["val_loss"],
                        bits_per_byte=item["bits_per_byte"], train_s=item["train_s"], eval_s=item["eval_s"],
                        data_wait_s=0.0, input=item["input"], precision=item["precision"], worker="w0", node="n0",
                    )
                )  # fmt: skip
            file = f"weights/{trial}.npz"
            digest, size = save_weights(kept[trial], run_dir / file)
            ledger.append(
                WeightsRecord(t=clock(), trial=trial, epoch=EPOCHS, file=file, sha256=digest, bytes=size)
            )  # fmt: skip
            ledger.append(
                TrialEndRecord(
                    t=clock(), trial=trial, status=TrialStatus.COMPLETED, epochs=EPOCHS, best_val_acc=max(epochs)
                )
            )  # fmt: skip
        ledger.append(RunStopRecord(t=clock(), status=RunStatus.COMPLETED, reason="max_trials reached"))
    save_summary(run_dir, build_summary(run_dir))
    return run_dir


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory) -> Path:
    """The hand-written language run, shared read-only (a few seconds: two tiny trials trained)."""
    run = _write_run(tmp_path_factory.mktemp("lm-audit") / "run")
    ok, message = verify_run(run)
    assert ok, message
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run, target)
    return target


def _replace_weights(run: Path, trial: str, weights: dict[str, np.ndarray]) -> None:
    """Write other weights for ``trial`` and re-record their hash: the ledger still verifies."""
    digest, size = save_weights(weights, run / "weights" / f"{trial}.npz")
    records = ledger_records(run)
    for rec in records:
        if rec["type"] == "weights" and rec["trial"] == trial:
            rec["sha256"], rec["bytes"] = digest, size
    rechain(run, records)


@pytest.mark.slow  # the module's run trains (about 10 s on one core with the first re-evaluation)
def test_a_language_run_re_evaluates_to_its_recorded_quality(lm_run, tmp_path):
    run = _copy(lm_run, tmp_path)
    result = audit_run(run, sample=4)
    assert result.ok, result.message
    assert result.message.startswith("audited: run lm-audit: 3 trial(s) re-evaluated"), result.message
    assert "3 weights file(s) match their ledger hashes" in result.message
    data = json.loads((run / "audit.json").read_text())
    assert data["family"] == "language" and data["weight_files"] == dict.fromkeys(TRIALS, "ok")
    assert data["tolerances"]["reevaluate_bits_per_byte"] == REEVAL_TOLERANCE_BITS_PER_BYTE
    checks = {c["trial"]: c for c in data["trials"]}
    assert set(checks) == set(TRIALS) and {c["check"] for c in checks.values()} == {"reevaluate"}
    assert all(c["status"] == "pass" for c in checks.values())
    for check in checks.values():  # float32 on the machine that trained it: equal to rounding
        recorded, measured = check["recorded"], check["measured"]
        assert measured["bits_per_byte"] == pytest.approx(recorded["bits_per_byte"], abs=1e-5)
        assert measured["val_acc"] == pytest.approx(recorded["val_acc"], abs=1e-6)
        assert 0 < measured["val_acc"] < 1  # the quality is not clamped: the comparison means something
        assert "validation windows" in check["detail"]
    assert verify_run(run)[0]  # the audit's record keeps the ledger verifiable


@pytest.mark.slow  # trains a trial (and starts Keras when run alone)
def test_the_evaluation_reproduces_the_trainers_final_epoch():
    """evaluate_lm_weights is the trainer's evaluation: a trained trial's weights give its last val_loss."""
    cfg = load_config("llm", OVERRIDES)
    windows = load_language_data(cfg).windows()
    hparams = {**HPARAMS, "epochs": 1}
    result = train_lm_trial(
        SPEC, hparams, windows, steps_per_epoch=1, eval_windows=WINDOWS, precision="float32", seed=3, jit_compile=False
    )
    got = evaluate_lm_weights(
        SPEC, hparams, result.weights, windows, steps_per_epoch=1, eval_windows=WINDOWS, precision="float32"
    )
    assert got.val_loss == pytest.approx(result.val_loss, abs=1e-6)
    assert got.bits_per_byte == pytest.approx(result.val_loss / math.log(2), abs=1e-6)
    assert got.quality == pytest.approx(lm_quality(result.bits_per_byte), abs=1e-7)
    assert (got.windows, got.tokens, got.val_fingerprint) == (WINDOWS, WINDOWS * SEQ, result.val_fingerprint)
    with pytest.raises(AiperfError, match="seq_len"):
        evaluate_lm_weights(
            SPEC, {**hparams, "seq_len": SEQ + 1}, result.weights, windows, steps_per_epoch=1, eval_windows=WINDOWS
        )


@pytest.mark.slow  # the module's run trains (shared with the other slow tests)
def test_a_forged_quality_fails_re_evaluation_naming_the_trial(lm_run, tmp_path):
    """val_acc 0.01 better (0.08 bits per byte), every figure that follows from it forged to match: verify passes."""
    run = _copy(lm_run, tmp_path)
    records = ledger_records(run)
    for rec in records:
        if rec["type"] == "epoch" and (rec["trial"], rec["epoch"]) == ("t00002", EPOCHS):
            rec["val_acc"] += 0.01
            rec["bits_per_byte"] -= 0.08
            rec["val_loss"] = rec["bits_per_byte"] * math.log(2)
    end = next(r for r in records if r["type"] == "trial_end" and r["trial"] == "t00002")
    end["best_val_acc"] = max(r["val_acc"] for r in records if r["type"] == "epoch" and r["trial"] == "t00002")
    rechain(run, records)
    result = audit_run(run, sample=4)
    assert not result.ok
    first = result.message.splitlines()[0]
    assert first.startswith("audit failed: trial t00002: reevaluate: epoch 2 (its stored weights)"), first
    assert "val_acc 0.01000 apart; bits per byte 0.0800 apart" in first, first
    assert {c["trial"]: c["status"] for c in result.data["trials"]} == {
        "t00000": "pass",
        "t00001": "pass",
        "t00002": "fail",
    }


@pytest.mark.slow  # the module's run trains (shared with the other slow tests)
def test_tampered_weights_with_a_rewritten_hash_fail_re_evaluation_naming_the_trial(lm_run, tmp_path):
    run = _copy(lm_run, tmp_path)
    weights = load_lm_weights(run / "weights/t00001.npz", SPEC)
    rng = np.random.default_rng(0)
    _replace_weights(run, "t00001", {k: v + rng.normal(0, 0.5, v.shape).astype(np.float32) for k, v in weights.items()})
    result = audit_run(run, sample=4)
    assert not result.ok
    first = result.message.splitlines()[0]
    assert first.startswith("audit failed: trial t00001: reevaluate: epoch 2 (its stored weights)"), first
    assert "bits per byte" in first and "apart" in first
    checks = {c["trial"]: c["status"] for c in result.data["trials"]}
    assert checks == {"t00000": "pass", "t00001": "fail", "t00002": "pass"}


@pytest.mark.slow  # the module's run trains (shared with the other slow tests)
def test_weights_of_another_architecture_are_a_failure_naming_the_trial(lm_run, tmp_path):
    run = _copy(lm_run, tmp_path)
    other = TransformerSpec(vocab_size=256, seq_len=SEQ, width=24, head_dim=8, heads=(2,), mlp_hidden=(32,))
    _replace_weights(run, "t00000", init_weights(other, 0))
    result = audit_run(run, sample=4)
    assert not result.ok
    first = result.message.splitlines()[0]
    assert first.startswith("audit failed: trial t00000: reevaluate: weights/t00000.npz"), first
    assert {c["trial"]: c["status"] for c in result.data["trials"]} == {
        "t00000": "fail",
        "t00001": "pass",
        "t00002": "pass",
    }


@pytest.mark.slow  # the module's run trains (shared with the other slow tests)
def test_a_bad_recorded_transformer_is_a_failure_naming_the_trial_not_a_traceback(lm_run):
    """Checked per trial (a ledger whose transformer is bad does not verify: verify recounts its FLOPs)."""
    records = read_ledger(lm_run)
    trials = _trials(records)
    cfg = load_config("llm", OVERRIDES)
    windows = load_language_data(cfg).windows()
    bad = {
        "missing": None,
        "not a transformer": {"format": "aiperf-graph"},
        "wrong heads": {**SPEC.to_dict(), "heads": [2, 2]},
    }
    for why, doc in bad.items():
        t = trials["t00001"]
        t.start = t.start.model_copy(update={"transformer": doc})
        check = reevaluate_lm(lm_run, cfg, windows, 1, "t00001", t)
        assert (check.trial, check.check, check.status) == ("t00001", "reevaluate", "fail"), why
        assert "architecture" in check.detail, (why, check.detail)
    t = trials["t00000"]
    t.start = t.start.model_copy(update={"hparams": TrialHparams(**{**HPARAMS, "seq_len": SEQ * 4, "epochs": 2})})
    check = reevaluate_lm(lm_run, cfg, windows, 1, "t00000", t)
    assert check.status == "fail" and "cannot be evaluated" in check.detail and "seq_len" in check.detail


@pytest.mark.slow  # the module's run trains, and its trials again
def test_retrain_reproduces_language_trials_through_the_worker_a_child_from_its_parents_stored_weights(
    lm_run, tmp_path
):
    run = _copy(lm_run, tmp_path)
    # A run whose workers sized their epochs by their ceilings (lm.steps_per_epoch auto): the audit's worker
    # must train the recorded steps per epoch (2), not size them again by its own ceiling (10 or more).
    records = ledger_records(run)
    records[0]["config"]["lm"]["steps_per_epoch"] = "auto"
    rechain(run, records)
    result = audit_run(run, sample=0, retrain_count=len(TRIALS), speed_factor=1000.0)
    assert result.ok, result.message
    retrained = {c["trial"]: c for c in result.data["trials"] if c["check"] == "retrain"}
    assert set(retrained) == set(TRIALS), retrained  # t00002 inherits t00000's weights through its morph
    for check in retrained.values():
        recorded, measured = check["recorded"]["val_acc"], check["measured"]["val_acc"]
        assert check["status"] == "pass" and len(recorded) == EPOCHS
        assert measured == pytest.approx(recorded, abs=1e-5)  # the same code on the same machine


def test_the_data_must_be_the_language_data_the_run_used():
    cfg = load_config("llm", OVERRIDES)
    data = load_language_data(cfg)
    dataset = {**data.describe(), "fingerprint": data.fingerprint()}
    header = RunStartRecord(t=0.0, run_id="lm", family="language", config=cfg.to_dict(), dataset=dataset)
    assert _load_data(cfg, header).fingerprint() == header.dataset.fingerprint
    other = load_config("llm", [*OVERRIDES, "lm.max_bytes=100000"])
    with pytest.raises(AiperfError, match="is not the one the run used"):
        _load_data(other, header)
    with pytest.raises(AiperfError, match="language family"):
        _load_data(load_config("smoke"), header)
