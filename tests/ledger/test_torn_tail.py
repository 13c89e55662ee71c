"""A ledger whose last record was cut short by a crash (issue 13, case 6): ``summary`` and
``verify`` say what they left out, in one line, and change nothing in the ledger."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from helpers import run_cli

from aiperf.ledger.store import read_ledger_contents


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=120)


@pytest.fixture
def torn_run(sim_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(sim_run, run_dir)
    lines = (run_dir / "ledger.jsonl").read_bytes().splitlines(keepends=True)
    whole = b"".join(lines[:-1])
    torn = lines[-1][:57]  # the run_stop record, cut by a crash in the middle of its write
    (run_dir / "ledger.jsonl").write_bytes(whole + torn)
    return run_dir, len(lines) - 1, len(torn)


def test_summary_says_what_it_dropped_and_leaves_the_ledger_alone(torn_run):
    run_dir, complete, torn_bytes = torn_run
    before = (run_dir / "ledger.jsonl").read_bytes()
    proc = _cli("summary", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    notes = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(notes) == 1, proc.stderr
    assert f"ignored a torn final record ({torn_bytes} byte(s) after seq {complete - 1}" in notes[0]
    assert "ledger.jsonl" in notes[0]
    assert "running or killed" in proc.stdout, "without its run_stop the run reads as killed"
    assert (run_dir / "ledger.jsonl").read_bytes() == before, "summary must not repair or rewrite the ledger"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ledger"]["records"] == complete


def test_verify_notes_the_torn_tail_and_judges_the_complete_records(torn_run):
    run_dir, _, torn_bytes = torn_run
    assert _cli("summary", str(run_dir)).returncode == 0
    proc = _cli("verify", str(run_dir))
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.startswith("verified:") and f"torn final record ({torn_bytes} byte(s)" in proc.stdout


def test_a_clean_ledger_gets_no_note(sim_run, tmp_path):
    shutil.copytree(sim_run, tmp_path / "run")
    assert read_ledger_contents(tmp_path / "run").torn_note("x") is None
    proc = _cli("summary", str(tmp_path / "run"))
    assert proc.returncode == 0 and proc.stderr.strip() == ""


def test_garbage_before_the_last_line_is_not_a_torn_tail(torn_run):
    run_dir, _, _ = torn_run
    data = (run_dir / "ledger.jsonl").read_bytes()
    (run_dir / "ledger.jsonl").write_bytes(data + b"\n" + data.splitlines()[-2] + b"\n")  # appended after a tear
    proc = _cli("summary", str(run_dir))
    assert proc.returncode == 2 and "is not valid JSON" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
