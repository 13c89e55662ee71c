"""`aiperf audit`: a real smoke run re-evaluated and re-trained, and the edits it must catch.

One real 2-trial smoke run (``audited_run``) is copied before anything touches it;
each forgery is re-chained and given a matching summary.json, so ``aiperf verify`` passes and
only the re-execution can tell.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import ledger_records, rechain, run_cli

from aiperf.engine.weights import WeightStore, file_sha256, load_weights
from aiperf.ledger.audit_file import AUDIT_NAME, read_audit
from aiperf.ledger.store import canonical


def _audit(*args: str) -> subprocess.CompletedProcess:
    return run_cli("audit", *args, timeout=300)


def _copy(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / run.name
    shutil.copytree(run, target, ignore=shutil.ignore_patterns("run.lock", AUDIT_NAME, "report.html"))
    return target


def _stored_epoch(records: list[dict]) -> tuple[dict, dict]:
    """The first weights record and the epoch record whose weights it holds."""
    w = next(r for r in records if r["type"] == "weights")
    epoch = next(
        r
        for r in records
        if r["type"] == "epoch"
        and r["trial"] == w["trial"]
        and r["epoch"] == w["epoch"]
        and r["attempt"] == w["attempt"]
    )
    return w, epoch


def test_weight_store_hashes_what_it_writes(tmp_path):
    store = WeightStore(capacity=1, directory=tmp_path / "weights")
    weights = {1: [np.arange(6, dtype=np.float32).reshape(2, 3)], 3: [np.ones(4, np.float32)]}
    assert store.put("t00001", weights, 0.5)
    saved = store.saved("t00001")
    assert saved is not None and saved.file == "weights/t00001.npz"
    data = (tmp_path / saved.file).read_bytes()
    assert (saved.sha256, saved.size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert np.array_equal(load_weights(tmp_path / saved.file)[1][0], weights[1][0])
    assert store.put("t00002", weights, 0.9)  # evicts t00001: its file and its hash go
    assert store.saved("t00001") is None and not (tmp_path / "weights/t00001.npz").exists()
    assert not store.put("t00003", weights, 0.1) and store.saved("t00003") is None


def test_hashing_a_weights_file_refuses_what_is_not_a_regular_file(tmp_path):
    """A FIFO where a weights file belongs (a run directory from someone else) fails at once, never blocks."""
    os.mkfifo(tmp_path / "t00001.npz")
    with pytest.raises(OSError, match="not a regular file"):
        file_sha256(tmp_path / "t00001.npz")
    (tmp_path / "t00002.npz").write_bytes(b"weights")
    assert file_sha256(tmp_path / "t00002.npz") == (hashlib.sha256(b"weights").hexdigest(), 7)


@pytest.mark.slow
def test_untouched_run_audits_and_retrains(audited_run, tmp_path):
    run = _copy(audited_run, tmp_path)
    proc = _audit(str(run), "--retrain", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stderr == ""  # the frameworks' native start-up notes do not reach the terminal
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"audited: run {run.name}: ") and "1 re-trained" in first, proc.stdout
    records = ledger_records(run)
    best = max((r for r in records if r["type"] == "epoch"), key=lambda r: (r["val_acc"], -r["seq"]))
    data = read_audit(run)
    assert data is not None and data["ok"] and data["run_id"] == run.name
    checks = {(c["trial"], c["check"]): c for c in data["trials"]}
    stored = {r["trial"]: r for r in records if r["type"] == "weights"}
    assert len(stored) == 2  # both trials completed and were kept: both re-evaluated, the best among them
    assert {t for (t, kind), c in checks.items() if kind == "reevaluate" and c["status"] == "pass"} == set(stored)
    assert best["trial"] in stored
    for (trial, kind), check in checks.items():
        if kind == "reevaluate" and check["status"] == "pass":  # compared against the stored epoch's figure
            epoch = next(
                r
                for r in records
                if r["type"] == "epoch" and r["trial"] == trial and r["epoch"] == stored[trial]["epoch"]
            )
            assert check["recorded"] == epoch["val_acc"] and abs(check["measured"] - epoch["val_acc"]) <= 1 / 300
    assert [c["status"] for c in data["trials"] if c["check"] == "retrain"] == ["pass"]
    assert data["machine"]["backend"] == "tensorflow" and data["machine"]["threads"] >= 1

    from aiperf.results.report import write_report

    html = write_report(run).read_text()
    assert "Audit" in html and "re-evaluated" in html and best["trial"] in html


@pytest.mark.slow
def test_forged_val_acc_fails_naming_the_trial(audited_run, tmp_path):
    run = _copy(audited_run, tmp_path)
    records = ledger_records(run)
    w, epoch = _stored_epoch(records)
    epoch["val_acc"] = 0.999  # now the best trial too
    for rec in records:
        if rec["type"] == "trial_end" and rec["trial"] == w["trial"]:
            rec["best_val_acc"] = 0.999  # a careful forger keeps the trial's own claim consistent
    rechain(run, records)
    proc = _audit(str(run), "--sample", "0")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"audit failed: trial {w['trial']}: reevaluate: ") and "recorded val_acc 0.9990" in first
    assert read_audit(run)["ok"] is False


@pytest.mark.slow  # the shared real run trains
def test_tampered_weights_file_is_named(audited_run, tmp_path):
    run = _copy(audited_run, tmp_path)
    w, _ = _stored_epoch(ledger_records(run))
    path = run / w["file"]
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    proc = _audit(str(run))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"audit failed: trial {w['trial']}: {w['file']} has SHA-256 "), first
    assert w["sha256"][:16] in first and "changed after the run wrote it" in first


@pytest.mark.slow
def test_epochs_faster_than_this_machine_fail_the_retrain(audited_run, tmp_path):
    run = _copy(audited_run, tmp_path)
    records = ledger_records(run)
    for rec in records:
        if rec["type"] == "epoch":
            rec["train_s"] /= 100
            rec["eval_s"] /= 100
        elif rec["type"] == "worker":  # its busy time is the sum of its epochs' (verify checks that)
            for key in ("busy_s", "compile_s", "busy_fraction", "steady_busy_fraction"):
                if isinstance(rec.get(key), float):
                    rec[key] /= 100
    rechain(run, records)
    proc = _audit(str(run), "--sample", "0", "--retrain", "1", "--seed", "3")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    first = proc.stdout.splitlines()[0]
    assert first.startswith("audit failed: trial t") and ": retrain: the ledger's epochs" in first, first
    assert "4x faster than this machine" in first


@pytest.mark.slow
def test_another_dataset_is_unreadable_input(audited_run, tmp_path):
    run = _copy(audited_run, tmp_path)
    records = ledger_records(run)
    records[0]["dataset"]["fingerprint"] = "f" * 64
    rechain(run, records)
    proc = _audit(str(run))
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "fingerprint" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["/nonexistent/run"], "not a run directory"),
        (["RUN", "--retrain", "-1"], "--retrain"),
        (["RUN", "--speed-factor", "0.5"], "--speed-factor"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, fragment, tmp_path):
    (tmp_path / "ledger.jsonl").write_text("")
    proc = _audit(*[str(tmp_path) if a == "RUN" else a for a in args])
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr, proc.stderr


@pytest.mark.slow  # the shared real run trains
def test_a_naive_edit_fails_at_verify_before_anything_runs(audited_run, tmp_path):
    run = _copy(audited_run, tmp_path)
    lines = (run / "ledger.jsonl").read_text().splitlines()
    k = next(i for i, line in enumerate(lines) if '"type":"epoch"' in line)
    rec = json.loads(lines[k])
    rec["val_acc"] = 0.999
    lines[k] = canonical(rec).decode()
    (run / "ledger.jsonl").write_text("\n".join(lines) + "\n")
    proc = _audit(str(run))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    assert proc.stdout.startswith(f"audit failed: the ledger does not verify: line {k + 1}, seq {k} (epoch ")
    assert read_audit(run)["ok"] is False and "machine" not in read_audit(run)  # nothing was re-executed


@pytest.mark.slow  # the shared real run trains; each audit re-evaluates its best trial
def test_an_audit_is_bound_to_the_ledger_and_a_forged_audit_json_is_never_shown_as_passed(audited_run, tmp_path):
    from aiperf.results.report import write_report

    run = _copy(audited_run, tmp_path)
    before = ledger_records(run)
    assert _audit(str(run), "--sample", "0").returncode == 0
    after = ledger_records(run)
    assert after[: len(before)] == before  # appended to, nothing rewritten
    (bound,) = after[len(before) :]
    assert bound["type"] == "audit" and bound["ok"] is True and bound["audited_hash"] == before[-1]["hash"]
    assert bound["result_sha256"] == hashlib.sha256((run / AUDIT_NAME).read_bytes()).hexdigest()
    assert run_cli("verify", str(run)).returncode == 0  # the summary was rewritten to the new end
    assert "Audit: passed" in write_report(run).read_text()
    assert _audit(str(run), "--sample", "0").returncode == 0  # a second audit audits the same run records
    assert ledger_records(run)[-1]["audited_hash"] == before[-1]["hash"]

    # The real audit fails (a weights file replaced); a forger then writes ok: true with the right last_hash.
    weights = next(run.glob("weights/*.npz"))
    weights.write_bytes(weights.read_bytes()[:-1] + b"x")
    assert _audit(str(run), "--sample", "0").returncode == 1
    failed = json.loads((run / AUDIT_NAME).read_text())
    assert failed["ok"] is False and ledger_records(run)[-1]["ok"] is False
    forged = {**failed, "ok": True, "message": "audited: all good", "problems": []}
    (run / AUDIT_NAME).write_text(json.dumps(forged))
    html = write_report(run).read_text()
    assert "Audit: passed" not in html and "Audit: not vouched for" in html and "it was changed" in html


def test_the_report_shows_an_odd_or_unbound_audit_without_failing_and_never_as_passed(sim_run, tmp_path):
    from aiperf.results.report import write_report

    run = tmp_path / "run"
    shutil.copytree(sim_run, run)
    odd = {"ok": True, "message": "audited: <b>", "ledger": [], "options": 5, "trials": "x", "audited_at": "nan"}
    (run / AUDIT_NAME).write_text(json.dumps(odd))
    html = write_report(run).read_text()
    assert "Audit: passed" not in html and "Audit: not vouched for" in html and "audited: &lt;b&gt;" in html
    assert "the ledger holds no audit record" in html


@pytest.mark.slow
def test_the_audit_trains_with_the_trainer_settings_the_run_recorded(audited_run, tmp_path, monkeypatch):
    """One translation from the recorded config to trainer settings, for the run's workers and the audit."""
    import dataclasses

    from aiperf.cluster.worker import WorkerSettings, trainer_settings
    from aiperf.engine.audit import audit_run
    from aiperf.engine.resume import recorded_config, run_start
    from aiperf.families.image import trainer as trainer_module
    from aiperf.ledger.store import read_ledger
    from aiperf.training.backend import describe_device

    run = tmp_path / "run"
    shutil.copytree(audited_run, run)
    used = []
    build = trainer_module.TrialRunner.__init__

    def spy(self, dataset, settings, backend=None):
        used.append(settings)
        build(self, dataset, settings, backend)

    monkeypatch.setattr(trainer_module.TrialRunner, "__init__", spy)
    result = audit_run(run, sample=1, retrain_count=1)
    records = read_ledger(run)
    cfg = recorded_config(records)
    workers = WorkerSettings.from_config(cfg)
    threads = run_start(records).plan.threads_per_trial
    the_runs = trainer_settings(dataclasses.replace(workers, threads=threads), describe_device(cfg.model.backend))
    assert result.ok and {c["check"] for c in result.data["trials"]} == {"reevaluate", "retrain"}, result.message
    assert len(used) >= 2 and all(settings == the_runs for settings in used), (used, the_runs)
    assert (the_runs.compiled_models, the_runs.decode_threads, the_runs.bn_momentum) == (1, 2, 0.95)
