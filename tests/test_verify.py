"""`aiperf verify`: a clean run verifies; each kind of tampering is caught and named."""

from __future__ import annotations

import json
import shutil

import pytest

from aiperf.cli import main
from aiperf.errors import AiperfError
from aiperf.record.ledger import canonical, read_ledger, record_hash
from aiperf.record.verify import verify_run


@pytest.fixture
def run_copy(sim_run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(sim_run, dst)
    return dst


def _write(run_dir, records, rechain=False):
    """Write records back as a ledger; with ``rechain`` recompute every link and hash (a careful forger)."""
    if rechain:
        prev = ""
        for k, rec in enumerate(records):
            rec["seq"], rec["prev"] = k, prev
            rec["hash"] = record_hash(rec)
            prev = rec["hash"]
    (run_dir / "ledger.jsonl").write_bytes(b"".join(canonical(r) + b"\n" for r in records))


def _best_epoch(records):
    return max((r for r in records if r["type"] == "epoch"), key=lambda r: r["val_acc"])


def test_an_untouched_run_verifies_and_the_cli_exits_0(sim_run, capsys):
    ok, message = verify_run(sim_run)
    assert ok, message
    assert message.startswith("verified")
    records = read_ledger(sim_run)
    trials = len({r["trial"] for r in records if r["type"] == "trial_start"})
    assert f"FLOPs of {trials} trials" in message
    assert main(["verify", str(sim_run)]) == 0
    assert "verified" in capsys.readouterr().out


def test_an_edited_accuracy_breaks_the_chain_at_that_record(run_copy, capsys):
    records = read_ledger(run_copy)
    best = _best_epoch(records)
    best["val_acc"] = 0.999
    _write(run_copy, records)
    ok, message = verify_run(run_copy)
    assert not ok
    first = message.splitlines()[0]
    assert f"seq {best['seq']} (epoch {best['trial']} epoch {best['epoch']})" in first and "edited" in first
    assert main(["verify", str(run_copy)]) == 1
    assert "verify failed" in capsys.readouterr().out


def test_an_edited_accuracy_with_rebuilt_hashes_is_caught_by_the_summary(run_copy):
    records = read_ledger(run_copy)
    _best_epoch(records)["val_acc"] = 0.999
    _write(run_copy, records, rechain=True)
    ok, message = verify_run(run_copy)
    assert not ok
    assert "score.best_val_acc" in message and "0.999" in message


def test_an_edited_flop_count_is_recounted_from_the_architecture(run_copy):
    records = read_ledger(run_copy)
    epoch = next(r for r in records if r["type"] == "epoch")
    epoch["train_ops"] *= 2
    epoch["ops"] = epoch["train_ops"] + epoch["eval_ops"]
    _write(run_copy, records, rechain=True)
    ok, message = verify_run(run_copy)
    assert not ok
    first = message.splitlines()[0]
    assert "train_ops" in first and f"epoch {epoch['trial']} epoch {epoch['epoch']}" in first
    assert "stored architecture" in first


def test_an_edited_trial_flops_field_is_caught(run_copy):
    records = read_ledger(run_copy)
    start = next(r for r in records if r["type"] == "trial_start")
    start["flops"]["forward"] *= 0.5
    _write(run_copy, records, rechain=True)
    ok, message = verify_run(run_copy)
    assert not ok and "flops.forward" in message.splitlines()[0]


def test_a_removed_record_is_named(run_copy):
    records = read_ledger(run_copy)
    removed = next(r for r in records if r["type"] == "epoch")
    _write(run_copy, [r for r in records if r is not removed])
    ok, message = verify_run(run_copy)
    assert not ok
    first = message.splitlines()[0]
    assert "removed" in first and f"seq {removed['seq']}" in first


def test_a_reordered_record_is_named(run_copy):
    records = read_ledger(run_copy)
    k = next(i for i, r in enumerate(records) if r["type"] == "epoch")
    records[k], records[k + 1] = records[k + 1], records[k]
    _write(run_copy, records)
    ok, message = verify_run(run_copy)
    assert not ok
    first = message.splitlines()[0]
    assert "reordered" in first and f"line {k + 1}" in first


def test_a_truncated_ledger_with_a_valid_chain_is_caught_by_the_summary(run_copy):
    records = read_ledger(run_copy)
    _write(run_copy, records[:-3])  # the chain of what remains is intact
    ok, message = verify_run(run_copy)
    assert not ok
    assert "ledger.records" in message or "ledger.last_hash" in message


@pytest.mark.parametrize(
    ("path", "value"),
    [(("score", "regulated"), 1e15), (("verdict", "valid"), True), (("trials", "started"), 999)],
)
def test_an_edited_summary_is_named(run_copy, path, value):
    summary = json.loads((run_copy / "summary.json").read_text())
    if summary[path[0]][path[1]] == value:
        value = not value if isinstance(value, bool) else value + 1
    summary[path[0]][path[1]] = value
    (run_copy / "summary.json").write_text(json.dumps(summary))
    ok, message = verify_run(run_copy)
    assert not ok
    assert f"summary.json {path[0]}.{path[1]} is" in message.splitlines()[0]


def test_a_missing_summary_fails(run_copy):
    (run_copy / "summary.json").unlink()
    ok, message = verify_run(run_copy)
    assert not ok and "summary.json is missing" in message


def test_a_garbled_line_in_the_middle_is_unreadable_input_exit_2(run_copy, capsys):
    lines = (run_copy / "ledger.jsonl").read_bytes().split(b"\n")
    lines[3] = b"{not json"
    (run_copy / "ledger.jsonl").write_bytes(b"\n".join(lines))
    with pytest.raises(AiperfError, match="line 4 is not valid JSON"):
        verify_run(run_copy)
    assert main(["verify", str(run_copy)]) == 2
    err = capsys.readouterr().err
    assert "line 4 is not valid JSON" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_real_smoke_run_verifies(smoke_run):
    run_dir, _ = smoke_run
    ok, message = verify_run(run_dir)
    assert ok, message
