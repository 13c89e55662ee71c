"""The MLPerf-style log: MLPerf's line format and keys, paired epoch intervals, live and resumable writing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from aiperf.ledger.schema import (
    EpochRecord,
    RequeueRecord,
    ResumeRecord,
    RunStartRecord,
    RunStatus,
    RunStopRecord,
    TrialEndRecord,
    TrialStartRecord,
    TrialStatus,
    of_type,
)
from aiperf.ledger.store import LedgerWriter, read_ledger
from aiperf.metrics.score import compute_score
from aiperf.results.mllog import (
    CHECKER_RULESET,
    CHECKER_USAGE,
    MLLOG_NAME,
    PREFIX,
    attach,
    parse,
    render,
    write_checker_config,
)

HEADER_KEYS = ["submission_benchmark", "submission_org", "submission_division", "submission_status",
               "submission_platform", "number_of_nodes", "accelerators_per_node", "train_samples", "eval_samples",
               "run_start", "run_stop", "init_start", "init_stop", "cache_clear", "aiperf_workload"]  # fmt: skip


def _events(lines):
    events = [parse(line) for line in lines]
    assert all(e is not None for e in events)
    return events


def test_every_line_has_mlperfs_prefix_and_field_order(sim_run):
    lines = (sim_run / MLLOG_NAME).read_text().splitlines()
    assert lines and all(line.startswith(PREFIX) for line in lines)
    for line in lines:
        assert list(json.loads(line[len(PREFIX) :])) == ["namespace", "time_ms", "event_type", "key", "value",
                                                           "metadata"]  # fmt: skip
    events = _events(lines)
    assert {e["event_type"] for e in events} == {"INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"}
    records = {r.seq: r for r in read_ledger(sim_run)}
    for e in events:  # each line is stamped with the wall time of the ledger record it came from
        record = records[e["metadata"]["seq"]]
        eval_ms = round(1000 * record.eval_s) if e["key"] == "eval_start" else 0  # it began eval_s earlier
        assert e["time_ms"] == int(record.wall * 1000) - eval_ms
        assert e["metadata"]["file"] == "aiperf/results/mllog.py"  # the caller MLLogger wrote when aiperf called it


def test_every_line_is_what_mlcommons_logger_writes_for_its_event(sim_run):
    """The lines are encoded here for speed; MLLogger itself must write the very same bytes."""
    import logging

    import numpy as np
    from mlperf_logging.mllog.mllog import MLLogger

    from aiperf.results.mllog import CALLER, encode_line

    written: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            written.append(record.getMessage())

    logger = logging.Logger("mllog-reference")
    logger.addHandler(Collect())
    reference = MLLogger(logger=logger, default_namespace="")
    method = {"INTERVAL_START": reference.start, "INTERVAL_END": reference.end, "POINT_IN_TIME": reference.event}
    events = _events((sim_run / MLLOG_NAME).read_text().splitlines())
    events.append({"event_type": "POINT_IN_TIME", "key": "k", "value": np.float32(0.5), "time_ms": 1,
                   "metadata": {**CALLER, "n": np.int64(3), "a": np.arange(2), "text": "é\u2028"}})  # fmt: skip
    assert {e["event_type"] for e in events} == set(method)
    for e in events:
        metadata = {k: v for k, v in e["metadata"].items() if k not in CALLER}
        written.clear()
        # MLLogger adds its caller first and then the metadata given: giving the caller's fields
        # would only make it warn about overridden fields, so they are compared after it.
        method[e["event_type"]](key=e["key"], value=e["value"], metadata=metadata, time_ms=e["time_ms"])
        (line,) = written
        caller = json.loads(line[len(PREFIX) :])["metadata"]
        expected = line.replace(json.dumps(caller), json.dumps({**CALLER, **metadata}, default=_numpy_plain))
        assert encode_line(e["event_type"], e["key"], e["value"], metadata, e["time_ms"]) == expected


def _numpy_plain(value):
    return value.item() if hasattr(value, "item") and value.ndim == 0 else value.tolist()


def test_the_log_written_during_the_run_is_the_log_of_the_ledger(sim_run):
    assert (sim_run / MLLOG_NAME).read_text().splitlines() == render(read_ledger(sim_run))


def test_header_and_run_interval_follow_mlperf(sim_run):
    events = _events((sim_run / MLLOG_NAME).read_text().splitlines())
    counts = Counter(e["key"] for e in events)
    for key in HEADER_KEYS:
        assert counts[key] == 1, key
    by_key = {e["key"]: e for e in events}
    assert by_key["number_of_nodes"]["value"] == 2
    assert by_key["accelerators_per_node"]["value"] == 0
    assert by_key["submission_division"]["value"] in ("open", "closed")
    assert by_key["submission_status"]["value"] in ("cloud", "onprem", "preview", "research")
    assert by_key["train_samples"]["value"] == 1438 and by_key["eval_samples"]["value"] == 359
    keys = [e["key"] for e in events]
    assert keys.index("run_start") < keys.index("epoch_start")
    assert events[-1]["key"] == "run_stop" and events[-1]["event_type"] == "INTERVAL_END"
    # The simulated accuracy (~0.7) stays below the smoke config's 0.8: MLPerf calls that "aborted".
    assert events[-1]["metadata"]["status"] == "aborted"
    score = compute_score(read_ledger(sim_run))
    assert by_key["aiperf_score"]["value"] == pytest.approx(score.regulated)


def test_every_epoch_interval_is_opened_once_and_closed_once(sim_run):
    events = _events((sim_run / MLLOG_NAME).read_text().splitlines())
    open_epochs: set[tuple] = set()
    closed = Counter()
    counted_ops = 0.0
    for e in events:
        m = e["metadata"]
        key = (m.get("trial"), m.get("attempt"), m.get("epoch_num"))
        if e["key"] == "epoch_start":
            assert key not in open_epochs, f"{key} opened twice"
            open_epochs.add(key)
        elif e["key"] == "epoch_stop":
            assert key in open_epochs, f"{key} closed without being opened"
            open_epochs.remove(key)
            closed[key] += 1
            counted_ops += m["ops"] if m["counted"] else 0.0
    assert not open_epochs, f"left open: {open_epochs}"
    assert all(n == 1 for n in closed.values())
    records = read_ledger(sim_run)
    epochs = of_type(records, EpochRecord)
    accuracies = [e["value"] for e in events if e["key"] == "eval_accuracy"]
    assert accuracies == [r.val_acc for r in epochs]
    assert counted_ops == pytest.approx(sum(r.ops for r in epochs))


def _header(ledger, min_accuracy=0.5):
    header = RunStartRecord(t=0.0, run_id="r", config={"run": {"seed": 3}}, rules={"min_accuracy": min_accuracy},
                            dataset={"name": "d", "train_images": 10, "eval_images": 5},
                            plan={"nodes": [{"gpus": 4, "cpus": 32, "accelerator": "H100"}] * 2})  # fmt: skip
    return ledger.append(header)


def _trial_start(ledger, attempt=0, start_epoch=0):
    return ledger.append(TrialStartRecord(trial="t00000", kind="seed", attempt=attempt, start_epoch=start_epoch,
                                   hparams={"epochs": 2}, worker="w0", arch_id="a0", flops={"train_per_image": 1.0},
                                   params=10))  # fmt: skip


def _epoch(ledger, epoch, attempt=0):
    ledger.append(EpochRecord(trial="t00000", epoch=epoch, attempt=attempt, ops=100.0, aiperf_ops=90.0, train_ops=80.0,
                              eval_ops=20.0, val_acc=0.6 + 0.1 * epoch, precision="float32"))  # fmt: skip


def test_lines_are_on_disk_as_soon_as_their_record_is_appended(tmp_path):
    path = tmp_path / MLLOG_NAME
    ledger = LedgerWriter(tmp_path)
    _header(ledger)
    attach(tmp_path, ledger)
    keys = lambda: [parse(line)["key"] for line in path.read_text().splitlines()]  # noqa: E731
    assert keys()[-3:] == ["init_start", "init_stop", "run_start"] and "accelerators_per_node" in keys()
    _trial_start(ledger)
    assert keys()[-1] == "epoch_start"
    _epoch(ledger, 1)
    assert keys()[-5:] == ["eval_start", "eval_stop", "eval_accuracy", "epoch_stop", "epoch_start"]
    ledger.append(RequeueRecord(trial="t00000", attempt=1, from_epoch=1, reason="node died"))
    last = parse(path.read_text().splitlines()[-1])
    assert last["key"] == "epoch_stop" and last["metadata"]["counted"] is False and "node died" in last["metadata"][
        "reason"]  # fmt: skip
    _trial_start(ledger, attempt=1, start_epoch=1)
    first_of_attempt = parse(path.read_text().splitlines()[-1])
    assert first_of_attempt["metadata"]["epoch_num"] == 2 and first_of_attempt["metadata"]["attempt"] == 1
    _epoch(ledger, 2, attempt=1)
    ledger.append(TrialEndRecord(trial="t00000", status=TrialStatus.COMPLETED))
    ledger.append(RunStopRecord(status=RunStatus.COMPLETED, reason="time budget reached"))
    ledger.close()
    events = _events(path.read_text().splitlines())
    assert events[-1]["metadata"]["status"] == "success"  # completed and 0.8 >= min_accuracy 0.5
    by_key = {e["key"]: e for e in events}
    assert by_key["number_of_nodes"]["value"] == 2 and by_key["accelerators_per_node"]["value"] == 4
    assert by_key["seed"]["value"] == 3
    assert path.read_text().splitlines() == render(read_ledger(tmp_path))


def test_a_resumed_run_continues_the_log_without_repeating_it(tmp_path):
    path = tmp_path / MLLOG_NAME
    ledger = LedgerWriter(tmp_path)
    _header(ledger)
    attach(tmp_path, ledger)
    _trial_start(ledger)
    _epoch(ledger, 1)
    ledger.close()  # the master dies here; its log also lost half a line
    with open(path, "ab") as fh:
        fh.write(b':::MLLOG {"namespace": "", "ti')
    resumed = LedgerWriter(tmp_path)
    attach(tmp_path, resumed)
    resumed.append(ResumeRecord(gap_s=12.5, from_seq=2))
    resumed.append(TrialEndRecord(trial="t00000", status=TrialStatus.LOST, reason="the master stopped while it ran"))
    resumed.append(RunStopRecord(status=RunStatus.COMPLETED, reason="time budget reached"))
    resumed.close()
    lines = path.read_text().splitlines()
    assert lines == render(read_ledger(tmp_path))
    assert Counter(parse(line)["key"] for line in lines)["run_start"] == 1
    assert any(parse(line)["key"] == "aiperf_resume" for line in lines)


def test_a_log_that_disagrees_with_the_ledger_is_rewritten_from_it(tmp_path):
    ledger = LedgerWriter(tmp_path)
    _header(ledger)
    (tmp_path / MLLOG_NAME).write_text(PREFIX + '{"key": "forged"}\n')
    attach(tmp_path, ledger)
    _trial_start(ledger)
    ledger.close()
    assert (tmp_path / MLLOG_NAME).read_text().splitlines() == render(read_ledger(tmp_path))


def test_parse_ignores_other_lines():
    assert parse("hello") is None
    assert parse(PREFIX + "{broken") is None
    assert parse(PREFIX + '{"key": "run_start"}') == {"key": "run_start"}


@pytest.mark.slow
def test_the_real_smoke_run_wrote_its_log(smoke_run):
    run_dir, _ = smoke_run
    lines = (run_dir / MLLOG_NAME).read_text().splitlines()
    assert lines == render(read_ledger(run_dir))
    assert parse(lines[-1])["key"] == "run_stop"


@pytest.mark.slow
def test_the_real_smoke_runs_log_passes_the_compliance_checker(smoke_run, tmp_path):
    run_dir, _ = smoke_run
    rc, output = _compliance(run_dir / MLLOG_NAME, tmp_path)
    assert rc == 0, output


def _compliance(log, tmp_path):
    """MLCommons' compliance checker (HPC 3.0.0) on ``log``, with aiperf registered as an open benchmark."""
    config = write_checker_config(tmp_path / "checker")
    proc = subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", CHECKER_USAGE, "--ruleset",
         CHECKER_RULESET, "--config", str(config), "--log_output", str(tmp_path / "checker.log"), str(log)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def test_the_log_passes_mlcommons_compliance_checker(sim_run, tmp_path):
    rc, output = _compliance(sim_run / MLLOG_NAME, tmp_path)
    assert rc == 0, output
    assert "open_aiperf.yaml" in output and "SUCCESS" in output  # common, open-division and aiperf's rules ran


def test_the_checker_rejects_a_log_without_what_mlperf_requires(sim_run, tmp_path):
    lines = (sim_run / MLLOG_NAME).read_text().splitlines()
    dropped = {"init_start", "init_stop", "cache_clear", "eval_start", "eval_stop"}
    log = tmp_path / "hand-written.txt"
    log.write_text("\n".join(line for line in lines if parse(line)["key"] not in dropped) + "\n")
    rc, output = _compliance(log, tmp_path)
    assert rc == 1
    assert "'init_stop'" in output and "'cache_clear'" in output and "FAILED" in output


def test_a_resumed_session_end_is_not_a_second_run_stop(tmp_path):
    path = tmp_path / MLLOG_NAME
    ledger = LedgerWriter(tmp_path)
    _header(ledger)
    attach(tmp_path, ledger)
    _trial_start(ledger)
    _epoch(ledger, 1)
    ledger.append(TrialEndRecord(trial="t00000", status=TrialStatus.STOPPED))
    ledger.append(RunStopRecord(status=RunStatus.INTERRUPTED, reason="SIGTERM"))
    ledger.close()
    assert parse(path.read_text().splitlines()[-1])["key"] == "run_stop"  # as far as anyone knew then
    resumed = LedgerWriter(tmp_path)
    resumed.append(ResumeRecord(gap_s=3.0, from_seq=4))
    attach(tmp_path, resumed)  # the master attaches after its resume record, as aiperf run --resume does
    resumed.append(RunStopRecord(status=RunStatus.COMPLETED, reason="time budget reached"))
    resumed.close()
    lines = path.read_text().splitlines()
    assert lines == render(read_ledger(tmp_path))
    keys = Counter(parse(line)["key"] for line in lines)
    assert (keys["run_start"], keys["run_stop"], keys["aiperf_session_stop"]) == (1, 1, 1)


def test_custom_rules_are_labelled_in_the_log(tmp_path):
    ledger = LedgerWriter(tmp_path)
    _header(ledger)
    ledger.close()
    event = next(e for e in _events(render(read_ledger(tmp_path))) if e["key"] == "aiperf_workload")
    assert event["value"] is None and event["metadata"]["label"] == "custom rules: not comparable"
    assert event["metadata"]["comparable"] is False


def test_a_new_runs_log_from_the_header_it_wrote_is_the_log_read_back_from_the_ledger(tmp_path):
    # A new run hands attach the header LedgerWriter.append returned, so a 65,536-worker header
    # is not parsed again while every worker waits; the log must be the one the ledger gives.
    given, read = tmp_path / "given", tmp_path / "read"
    for run_dir, pass_header in ((given, True), (read, False)):
        ledger = LedgerWriter(run_dir)
        header = _header(ledger)
        attach(run_dir, ledger, [header] if pass_header else None)
        _trial_start(ledger)
        _epoch(ledger, 1)
        ledger.close()
    for run_dir in (given, read):
        assert (run_dir / MLLOG_NAME).read_text().splitlines() == render(read_ledger(run_dir))
    strip = lambda text: [{k: v for k, v in parse(line).items() if k != "time_ms"} for line in text.splitlines()]  # noqa: E731
    assert strip((given / MLLOG_NAME).read_text()) == strip((read / MLLOG_NAME).read_text())


def test_records_said_to_be_the_ledgers_but_not_all_of_it_are_not_trusted(tmp_path):
    ledger = LedgerWriter(tmp_path)
    _header(ledger)
    second = _trial_start(ledger)
    attach(tmp_path, ledger, [second])  # one of two records: the ledger is read instead
    ledger.close()
    lines = (tmp_path / MLLOG_NAME).read_text().splitlines()
    assert lines == render(read_ledger(tmp_path))
    assert Counter(parse(line)["key"] for line in lines)["run_start"] == 1
