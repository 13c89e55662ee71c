"""`aiperf verify`: a clean run verifies; each kind of tampering is caught and named."""

from __future__ import annotations

import json
import shutil

import pytest

from aiperf.cli import main
from aiperf.errors import AiperfError
from aiperf.ledger.schema import (
    SHAPES,
    RecordType,
    RequeueRecord,
    RunStartRecord,
    TrialEndRecord,
    TrialStartRecord,
    TrialStatus,
    of_type,
)
from aiperf.ledger.store import canonical, read_ledger, read_raw_ledger, record_hash
from aiperf.results.verify import UNCHECKED_TYPES, _Consistency, verify_run


@pytest.fixture
def run_copy(sim_run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(sim_run, dst)
    return dst


def _write(run_dir, records, rechain=False):
    """Write raw JSON records back as a ledger; with ``rechain`` recompute every link and hash (a careful forger).

    Forgeries are edited as the JSON objects a forger would edit (``read_raw_ledger``), not as typed records.
    """
    if rechain:
        prev = ""
        for k, rec in enumerate(records):
            rec["seq"], rec["prev"] = k, prev
            rec["hash"] = record_hash(rec)
            prev = rec["hash"]
    (run_dir / "ledger.jsonl").write_bytes(b"".join(canonical(r) + b"\n" for r in records))


def _best_epoch(records):
    return max((r for r in records if r["type"] == RecordType.EPOCH), key=lambda r: r["val_acc"])


def test_an_untouched_run_verifies_and_the_cli_exits_0(sim_run, capsys):
    ok, message = verify_run(sim_run)
    assert ok, message
    assert message.startswith("verified")
    records = read_ledger(sim_run)
    trials = len({r.trial for r in of_type(records, TrialStartRecord)})
    assert f"FLOPs of {trials} trials" in message
    assert main(["verify", str(sim_run)]) == 0
    assert "verified" in capsys.readouterr().out


def test_an_edited_accuracy_breaks_the_chain_at_that_record(run_copy, capsys):
    records = read_raw_ledger(run_copy)
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
    records = read_raw_ledger(run_copy)
    _best_epoch(records)["val_acc"] = 0.999
    _write(run_copy, records, rechain=True)
    ok, message = verify_run(run_copy)
    assert not ok
    assert "score.best_val_acc" in message and "0.999" in message


def test_an_edited_flop_count_is_recounted_from_the_architecture(run_copy):
    records = read_raw_ledger(run_copy)
    epoch = next(r for r in records if r["type"] == RecordType.EPOCH)
    epoch["train_ops"] *= 2
    epoch["ops"] = epoch["train_ops"] + epoch["eval_ops"]
    _write(run_copy, records, rechain=True)
    ok, message = verify_run(run_copy)
    assert not ok
    first = message.splitlines()[0]
    assert "train_ops" in first and f"epoch {epoch['trial']} epoch {epoch['epoch']}" in first
    assert "stored architecture" in first


def test_an_edited_trial_flops_field_is_caught(run_copy):
    records = read_raw_ledger(run_copy)
    start = next(r for r in records if r["type"] == RecordType.TRIAL_START)
    start["flops"]["forward"] *= 0.5
    _write(run_copy, records, rechain=True)
    ok, message = verify_run(run_copy)
    assert not ok and "flops.forward" in message.splitlines()[0]


def test_a_removed_record_is_named(run_copy):
    records = read_raw_ledger(run_copy)
    removed = next(r for r in records if r["type"] == RecordType.EPOCH)
    _write(run_copy, [r for r in records if r is not removed])
    ok, message = verify_run(run_copy)
    assert not ok
    first = message.splitlines()[0]
    assert "removed" in first and f"seq {removed['seq']}" in first


def test_a_reordered_record_is_named(run_copy):
    records = read_raw_ledger(run_copy)
    k = next(i for i, r in enumerate(records) if r["type"] == RecordType.EPOCH)
    records[k], records[k + 1] = records[k + 1], records[k]
    _write(run_copy, records)
    ok, message = verify_run(run_copy)
    assert not ok
    first = message.splitlines()[0]
    assert "reordered" in first and f"line {k + 1}" in first


def test_a_truncated_ledger_with_a_valid_chain_is_caught_by_the_summary(run_copy):
    records = read_raw_ledger(run_copy)
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


# --- forgeries that re-chain the hashes and rewrite summary.json: the consistency checks ----------


def _forge(run_dir, records):
    """A careful forger: re-chain every hash and write the summary the forged ledger gives."""
    from aiperf.results.summary import write_summary

    _write(run_dir, records, rechain=True)
    write_summary(run_dir)
    return verify_run(run_dir)


def _recount(records):
    """Recompute every epoch's operation counts from its (forged) image counts, as check 3 would."""
    from aiperf.families.image.flops import aiperf_compatible_operations, count_flops, epoch_operations
    from nas.serialize import graph_from_dict

    graphs = {r["trial"]: graph_from_dict(r["graph"]) for r in records if r["type"] == RecordType.TRIAL_START}
    for r in records:
        if r["type"] == RecordType.EPOCH:
            graph = graphs[r["trial"]]
            r["train_ops"], r["eval_ops"] = epoch_operations(
                count_flops(graph), r["train_images"], r["eval_images"], r["batch_size"]
            )
            r["ops"] = r["train_ops"] + r["eval_ops"]
            r["aiperf_ops"] = aiperf_compatible_operations(graph, r["train_images"], r["eval_images"])


def test_a_raised_accuracy_with_rebuilt_hashes_and_summary_contradicts_its_trial_end(run_copy):
    records = read_raw_ledger(run_copy)
    best = _best_epoch(records)
    best["val_acc"] = 0.999
    ok, message = _forge(run_copy, records)
    assert not ok
    assert f"trial_end {best['trial']}" in message and "best_val_acc" in message


def test_halving_every_t_exceeds_the_workers_busy_time(run_copy):
    records = read_raw_ledger(run_copy)
    for r in records:
        r["t"] /= 2
    ok, message = _forge(run_copy, records)
    assert not ok
    assert "passed on the master clock" in message


def test_ten_times_the_training_images_exceeds_the_split(run_copy):
    records = read_raw_ledger(run_copy)
    for r in records:
        if r["type"] == RecordType.EPOCH:
            r["train_images"] *= 10
    _recount(records)
    ok, message = _forge(run_copy, records)
    assert not ok
    first = message.splitlines()[0]
    assert "more than the split holds" in first and "(1,438 / 359 in run_start)" in first


def _as_real(records):
    """The simulated ledger made to look like a real run's: full batches, every validation image, and
    ``wall`` advancing with ``t`` (the simulation's clock skips the waiting; a real master's does not)."""
    header = records[0]
    header["plan"]["backend"] = "tensorflow"
    for r in records:
        r["wall"] = header["wall"] + (r["t"] - header["t"])
        if r["type"] == RecordType.EPOCH:
            r["input"] = "memory"
            r["train_images"] = header["dataset"]["train_images"] // r["batch_size"] * r["batch_size"]
            r["eval_images"] = header["dataset"]["eval_images"]
    _recount(records)
    return records


def test_halving_t_of_a_real_run_disagrees_with_its_wall_clock(run_copy):
    records = _as_real(read_raw_ledger(run_copy))
    ok, message = _forge(run_copy, records)
    assert ok, message  # a consistent "real" ledger passes
    for r in records:
        r["t"] /= 2
    ok, message = _forge(run_copy, records)
    assert not ok and "the master's two clocks disagree" in message


def test_fewer_validation_images_than_the_split_are_unaccounted_for(run_copy):
    records = _as_real(read_raw_ledger(run_copy))
    ok, message = _forge(run_copy, records)
    assert ok, message  # a consistent "real" ledger passes
    epoch = next(r for r in records if r["type"] == RecordType.EPOCH)
    epoch["eval_images"] -= 100
    _recount(records)
    ok, message = _forge(run_copy, records)
    assert not ok and "130 images unaccounted for" in message  # 100 + the 30-image partial batch


def test_a_ledger_cut_after_its_best_prefix_verifies_as_not_valid(run_copy):
    records = read_raw_ledger(run_copy)
    cut = records[: len(records) // 2]
    assert cut[-1]["type"] != RecordType.RUN_STOP
    _write(run_copy, cut)  # no re-hashing: a prefix of a chain is a chain
    from aiperf.results.summary import write_summary

    summary = write_summary(run_copy)
    ok, message = verify_run(run_copy)
    assert ok, message  # a killed run verifies...
    assert summary["verdict"]["valid"] is False  # ... but is not valid
    assert "does not end with run_stop" in summary["verdict"]["headline"]


def test_records_after_run_stop_fail(run_copy):
    records = read_raw_ledger(run_copy)
    extra = dict(next(r for r in records if r["type"] == RecordType.TRIAL_START), trial="t09999")
    ok, message = _forge(run_copy, [*records, extra])
    assert not ok and "a record after the run_stop" in message


def test_a_duplicated_trial_fails(run_copy):
    records = read_raw_ledger(run_copy)
    start = next(r for r in records if r["type"] == RecordType.TRIAL_START)
    k = records.index(start)
    ok, message = _forge(run_copy, [*records[: k + 1], dict(start), *records[k + 1 :]])
    assert not ok and "attempt 0 of this trial already started" in message


def test_a_trial_without_an_end_before_run_stop_fails(run_copy):
    records = read_raw_ledger(run_copy)
    end = next(r for r in records if r["type"] == RecordType.TRIAL_END)
    ok, message = _forge(run_copy, [r for r in records if r is not end])
    assert not ok and f"trial {end['trial']}" in message and "never ended" in message


@pytest.mark.parametrize(
    ("field", "factor", "expected"),
    [("busy_s", 0.5, "but its epochs' train_s + eval_s add up to"), ("alive_s", 100.0, "passed on the master clock")],
)
def test_edited_worker_times_fail(run_copy, field, factor, expected):
    records = read_raw_ledger(run_copy)
    worker = next(r for r in records if r["type"] == RecordType.WORKER and r.get("busy_s"))
    worker[field] *= factor
    ok, message = _forge(run_copy, records)
    assert not ok and expected in message


def test_a_worker_busier_than_its_lifetime_fails(run_copy):
    records = read_raw_ledger(run_copy)
    worker = next(r for r in records if r["type"] == RecordType.WORKER and r.get("busy_s"))
    worker["alive_s"] = worker["busy_s"] / 3
    ok, message = _forge(run_copy, records)
    assert not ok and "is longer than its lifetime" in message


def test_skipped_epochs_of_a_trial_fail(run_copy):
    records = read_raw_ledger(run_copy)
    epoch = next(r for r in records if r["type"] == RecordType.EPOCH)
    epoch["epoch"] += 1
    ok, message = _forge(run_copy, records)
    assert not ok and f"epoch {epoch['epoch']} where epoch {epoch['epoch'] - 1} comes next" in message


def test_custom_rules_are_labelled_and_verify_agrees(run_copy):
    records = read_raw_ledger(run_copy)
    records[0]["rules"]["min_accuracy"] = 0.01
    ok, message = _forge(run_copy, records)
    assert ok, message
    verdict = json.loads((run_copy / "summary.json").read_text())["verdict"]
    assert verdict["comparable"] is False and not verdict["official"]
    assert "custom rules: not comparable" in verdict["headline"]
    assert "rules.min_accuracy 0.01 instead of 0.8" in verdict["headline"]
    from aiperf.results.report import _headline

    page = _headline(json.loads((run_copy / "summary.json").read_text()))
    assert 'id="verdict-workload">custom rules: not comparable: rules.min_accuracy 0.01 instead of 0.8' in page


def _sim_with_faults(run_dir, kills=(), failure_fn=None):
    """A simulated run whose workers die (re-queued trials) or whose trials fail, written like a real one."""
    from helpers import SIM_DATASET

    from aiperf.cluster.sim_pool import HybridClock, SimulatedWorkerPool
    from aiperf.config import load_config
    from aiperf.engine.master import Master, MasterSettings
    from aiperf.engine.search import make_search
    from aiperf.engine.weights import WeightStore
    from aiperf.ledger.schema import ConfigHeader, DatasetHeader, PlanHeader, RulesHeader, RunStopRecord
    from aiperf.ledger.store import LedgerWriter
    from aiperf.results.summary import write_summary
    from nas import zoo

    cfg = load_config("smoke")
    clock = HybridClock()
    pool = SimulatedWorkerPool(4, clock, nodes=2, epoch_s=5.0, failure_fn=failure_fn)
    for worker, at in kills:
        pool.kill_worker_at(worker, at)
    run_dir.mkdir()
    with LedgerWriter(run_dir) as ledger:
        ledger.append(RunStartRecord(t=0.0, run_id="faults", config=ConfigHeader(**cfg.to_dict()),
                                     plan=PlanHeader(**pool.plan.to_dict()), dataset=DatasetHeader(**SIM_DATASET),
                                     rules=RulesHeader(**cfg.rules.model_dump())))  # fmt: skip
        proposer = make_search(cfg, zoo.small_resnet((8, 8, 1), 10, width=8), 64)
        master = Master(
            MasterSettings(time_budget_s=150.0, seed=0), proposer, pool, ledger, WeightStore(16), clock=clock
        )
        outcome = master.run()
        ledger.append(RunStopRecord(t=clock(), status=outcome.status, reason=outcome.reason))
    write_summary(run_dir)
    return read_ledger(run_dir)


def test_a_run_with_lost_workers_and_requeued_trials_verifies(tmp_path):
    records = _sim_with_faults(tmp_path / "run", kills=[("w00001", 12.0), ("w00002", 60.0)])
    assert any(isinstance(r, RequeueRecord) for r in records)
    ok, message = verify_run(tmp_path / "run")
    assert ok, message


def test_a_run_whose_trials_fail_verifies(tmp_path):
    records = _sim_with_faults(tmp_path / "run", failure_fn=lambda spec: "boom" if spec.seed % 3 == 0 else None)
    assert any(isinstance(r, TrialEndRecord) and r.status is TrialStatus.FAILED for r in records)
    ok, message = verify_run(tmp_path / "run")
    assert ok, message


def test_a_requeued_attempt_that_never_was_announced_fails(tmp_path):
    _sim_with_faults(tmp_path / "run", kills=[("w00001", 12.0)])
    records = read_raw_ledger(tmp_path / "run")
    requeue = next(r for r in records if r["type"] == RecordType.REQUEUE)
    ok, message = _forge(tmp_path / "run", [r for r in records if r is not requeue])
    assert not ok and "without a requeue record announcing it" in message


def test_a_trial_copied_under_a_new_id_fails(run_copy):
    records = read_raw_ledger(run_copy)
    ends = [r for r in records if r["type"] == RecordType.TRIAL_END]
    copied = next(r["trial"] for r in ends if r["status"] == TrialStatus.COMPLETED)
    forged = []
    for r in records:
        forged.append(r)
        if r.get("trial") == copied and r["type"] in (RecordType.TRIAL_START, RecordType.EPOCH, RecordType.TRIAL_END):
            forged.append(dict(r, trial="t09999"))  # the same work claimed twice, on the same worker
    ok, message = _forge(run_copy, forged)
    assert not ok
    # The worker's time no longer adds up: which of the two checks lists it first depends on how
    # fast the simulated run's master was (its clock mixes in real time).
    assert "busy_s is" in message or "in train/eval steps by now, but only" in message, message


# --- the consistency checks' table -------------------------------------------------------------


def test_every_record_type_has_a_consistency_check_or_is_listed_as_unchecked():
    """A record type added or renamed cannot switch its check off silently (as a getattr dispatch could)."""
    checks = _Consistency(RunStartRecord(run_id="r"), []).checks
    assert set(checks).isdisjoint(UNCHECKED_TYPES)
    assert set(checks) | UNCHECKED_TYPES == set(RecordType)
    for kind, check in checks.items():
        assert check.model is SHAPES[kind], kind  # the check gets the records of its own type


def test_a_record_type_named_like_a_method_is_not_dispatched_to_it(run_copy):
    """A forged record of an unknown type named like a helper (``_wall_clock``) is no check's record."""
    records = read_raw_ledger(run_copy)
    records.insert(5, dict(records[4], type="wall_clock"))
    ok, message = _forge(run_copy, records)
    assert ok, message
