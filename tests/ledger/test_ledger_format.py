"""The typed records keep the ledger format: a ledger written before the models existed reads back
to the same JSON, and writing its records again gives the same bytes and hashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import aiperf.ledger.store as ledger_module
from aiperf.ledger.schema import (
    HEADER,
    SHAPES,
    AuditRecord,
    EpochRecord,
    Record,
    RecordType,
    TrialEndRecord,
    TrialStatus,
)
from aiperf.ledger.store import LEDGER_NAME, LedgerWriter, read_ledger, read_raw_ledger, record_hash

# Written by the code before typed records (commit 065d148): a real smoke run, continued with
# every other record type, a NaN loss, None values, a record type and a field from a newer writer.
FORMAT_1 = Path(__file__).parent.parent / "data" / "ledger-format-1.jsonl"


def test_every_record_of_the_old_ledger_reads_as_its_model_and_back_to_its_json():
    raw = read_raw_ledger(FORMAT_1)
    records = read_ledger(FORMAT_1)
    assert len(records) == len(raw) == 54
    for before, record in zip(raw, records, strict=True):
        assert type(record) is SHAPES.get(before["type"], Record)
        assert record.to_dict() == before
        assert json.dumps(record.to_dict(), sort_keys=True) == json.dumps(before, sort_keys=True)  # 1 stays 1, 1.0 1.0
        assert record_hash(record.to_dict()) == before["hash"]
    newer = {AuditRecord}  # record types added after this ledger was written
    assert {type(r) for r in records} >= set(SHAPES.values()) - newer
    future = next(r for r in records if r.type == "future_record")
    assert type(future) is Record and future.extra("novelty") == {"a": [1, 2.5, None]}
    stopped = [r for r in records if isinstance(r, TrialEndRecord) and r.status is TrialStatus.STOPPED]
    assert stopped and stopped[0].extra("new_field_from_newer_writer") == 3


def test_writing_the_old_records_again_gives_the_same_bytes(tmp_path, monkeypatch):
    raw = read_raw_ledger(FORMAT_1)
    walls = iter(r["wall"] for r in raw)
    monkeypatch.setattr(ledger_module.time, "time", lambda: next(walls))
    with LedgerWriter(tmp_path) as ledger:
        for before in raw:
            fields = {k: v for k, v in before.items() if k not in HEADER or k == "t"}
            shape = SHAPES.get(before["type"], Record)
            extra = {"type": before["type"]} if shape is Record else {}
            written = ledger.append(shape(**fields, **extra))
            assert written.hash == before["hash"] and written.seq == before["seq"]
    assert (tmp_path / LEDGER_NAME).read_bytes() == FORMAT_1.read_bytes()


def test_a_writer_names_only_what_it_sets_and_a_nan_loss_is_null(tmp_path):
    with LedgerWriter(tmp_path) as ledger:
        ledger.append(Record(type=RecordType.RUN_START, run_id="r"))
        written = ledger.append(
            EpochRecord(trial="t00000", epoch=1, val_acc=0.5, precision="float32", train_loss=float("nan"))
        )
    line = json.loads((tmp_path / LEDGER_NAME).read_text().splitlines()[1])
    assert set(line) == {*HEADER, "trial", "epoch", "val_acc", "precision", "train_loss"}
    assert line["train_loss"] is None and written.train_loss is None
    assert read_ledger(tmp_path)[1] == written


def test_a_record_a_writer_gets_wrong_fails_where_it_is_made():
    with pytest.raises(ValueError, match="val_acc"):
        EpochRecord(trial="t00000", epoch=1, val_acc=1.5, precision="float32")


def test_the_mllog_of_the_old_ledger_is_the_log_the_earlier_code_wrote():
    """mllog.txt is rebuilt from the ledger on --resume: the typed readers must rebuild it byte for byte
    (MLCommons' logger also records the line of its call in aiperf/results/mllog.py)."""
    from aiperf.results.mllog import render

    expected = (Path(__file__).parent.parent / "data" / "mllog-format-1.txt").read_text()
    assert "".join(line + "\n" for line in render(read_ledger(FORMAT_1))) == expected
