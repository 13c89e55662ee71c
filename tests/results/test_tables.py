"""`aiperf.results.tables.load`: the ledger as DataFrames that agree with the score and summary."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from aiperf.errors import AiperfError
from aiperf.ledger.schema import EpochRecord, Record, RecordType, RunStartRecord, TrialStartRecord, of_type
from aiperf.ledger.store import LedgerWriter, read_ledger
from aiperf.results.tables import load, master_time
from aiperf.sampling.telemetry import TELEMETRY_NAME


def test_frames_agree_with_the_ledger_and_the_summary(sim_run):
    res = load(sim_run)
    records = read_ledger(sim_run)
    summary = json.loads((sim_run / "summary.json").read_text())
    assert res.header.type == RecordType.RUN_START and res.header.run_id == summary["run_id"]
    assert isinstance(res.trials, pd.DataFrame) and isinstance(res.epochs, pd.DataFrame)
    assert len(res.epochs) == sum(1 for r in records if isinstance(r, EpochRecord))
    assert res.epochs["ops"].sum() == pytest.approx(summary["score"]["total_ops"])
    assert res.epochs["val_acc"].max() == pytest.approx(summary["score"]["best_val_acc"])
    assert len(res.trials) == summary["trials"]["started"]
    assert res.trials["trial"].is_unique
    assert res.trials["ops"].sum() == pytest.approx(summary["score"]["total_ops"])
    statuses = res.trials["status"].value_counts().to_dict()
    assert statuses == summary["trials"]["by_status"]
    assert len(res.workers) == summary["workers"]["count"] == 4
    assert res.telemetry.empty  # a simulated run has no hardware to sample


def test_generation_counts_the_steps_from_the_seed(sim_run):
    trials = load(sim_run).trials.set_index("trial")
    seeds = trials[trials["parent"].isna()]
    assert (seeds["depth"] == 0).all()
    children = trials[trials["parent"].notna()]
    assert not children.empty
    for trial, row in children.iterrows():
        assert row["depth"] == trials.loc[row["parent"], "depth"] + 1, trial


def test_hyperparameters_and_flops_come_from_trial_start(sim_run):
    res = load(sim_run)
    first = of_type(read_ledger(sim_run), TrialStartRecord)[0]
    row = res.trials.set_index("trial").loc[first.trial]
    assert row["batch_size"] == first.hparams.batch_size
    assert row["flops_train_per_image"] == first.flops.train_per_image
    assert row["params"] == first.params


def test_telemetry_samples_become_rows_on_the_master_clock(tmp_path):
    with LedgerWriter(tmp_path) as ledger:
        start = ledger.append(RunStartRecord(t=0.0, run_id="r", config={}, plan={}, dataset={}, rules={}))
    sample = {"wall": start.wall + 1.0, "node": "n1", "hostname": "h1", "cpu_percent": 50.0,
              "host_mem_used_bytes": 10, "host_mem_total_bytes": 100,
              "accelerators": [{"index": 0, "name": "GPU", "util_percent": 90.0, "mem_used_bytes": 5,
                                "mem_total_bytes": 8, "power_w": 300.0}]}  # fmt: skip
    lines = [json.dumps(sample), json.dumps({"wall": start.wall, "node": "n2", "error": "gone"}), '{"torn']
    (tmp_path / TELEMETRY_NAME).write_text("\n".join(lines))
    tel = load(tmp_path).telemetry
    assert list(tel["device"]) == ["cpu", "gpu0"]
    assert list(tel["util_percent"]) == [50.0, 90.0]
    assert tel["power_w"].iloc[1] == 300.0
    assert list(tel["t"]) == pytest.approx([1.0, 1.0])


def test_master_time_follows_the_clock_offset_across_a_resume():
    records = [Record(wall=1000.0, t=0.0), Record(wall=1010.0, t=10.0), Record(wall=2000.0, t=50.0)]
    assert master_time(records, [999.0, 1005.0, 2001.0]) == [-1.0, 5.0, 51.0]


def test_a_directory_without_a_ledger_is_a_one_line_error(tmp_path):
    with pytest.raises(AiperfError, match="no ledger here"):
        load(tmp_path)


def test_the_host_rows_say_what_share_of_the_cpus_the_run_itself_used(smoke_run, tmp_path):
    import json
    import shutil

    from aiperf.results.tables import load

    run = shutil.copytree(smoke_run[0], tmp_path / "run")
    start = json.loads((run / "ledger.jsonl").read_text().splitlines()[0])["wall"]
    samples = [
        {"wall": start + 1.0, "node_wall": start + 1.0, "node": "n1", "hostname": "h", "cpu_percent": 100.0,
         "cpus": 2, "run_cpu_s": 10.0, "accelerators": []},
        {"wall": start + 6.0, "node_wall": start + 6.0, "node": "n1", "hostname": "h", "cpu_percent": 100.0,
         "cpus": 2, "run_cpu_s": 15.0, "accelerators": []},
    ]  # fmt: skip
    (run / "telemetry.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    host = load(run).telemetry
    assert list(host["util_percent"]) == [100.0, 100.0]  # the host was busy ...
    assert host["run_util_percent"].isna().iloc[0] and host["run_util_percent"].iloc[1] == 50.0  # ... half of it not us
