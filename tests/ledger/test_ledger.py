"""The ledger is append-only, hash-chained and survives a crash at any byte."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiperf.errors import AiperfError
from aiperf.ledger.schema import Record
from aiperf.ledger.store import LedgerWriter, canonical, hashed_line, read_raw_ledger, record_hash


def _write(tmp_path, n=5):
    with LedgerWriter(tmp_path) as led:
        led.append(Record(type="run_start", run_id="r"))
        for k in range(n):
            led.append(Record(type="epoch", trial="t00000", epoch=k + 1, ops=1e9, val_acc=0.5 + k / 100))
    return tmp_path / "ledger.jsonl"


def test_records_are_chained_and_sequenced(tmp_path):
    path = _write(tmp_path)
    records = read_raw_ledger(path)
    assert [r["seq"] for r in records] == list(range(6))
    assert records[0]["prev"] == ""
    for prev, rec in itertools.pairwise(records):
        assert rec["prev"] == prev["hash"]
        assert rec["hash"] == record_hash(rec)
        assert rec["t"] >= prev["t"]


def test_torn_last_line_is_dropped_and_repaired(tmp_path):
    path = _write(tmp_path)
    whole = path.read_bytes()
    lines = whole.split(b"\n")
    # Cut the file in the middle of the last record, as a SIGKILL during write would.
    for cut in range(1, len(lines[-2])):
        path.write_bytes(b"\n".join(lines[:-2]) + b"\n" + lines[-2][:cut])
        records = read_raw_ledger(path)
        assert len(records) == 5
        assert records[-1]["epoch"] == 4
    # Reopening for append repairs the tail and continues the chain.
    with LedgerWriter(tmp_path) as led:
        rec = led.append(Record(type="run_stop", status="completed"))
    records = read_raw_ledger(path)
    assert records[-1] == rec.to_dict()
    assert rec.seq == 5 and rec.prev == records[-2]["hash"]


def test_corruption_in_the_middle_is_an_error(tmp_path):
    path = _write(tmp_path)
    lines = path.read_bytes().split(b"\n")
    lines[2] = b"{not json"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(AiperfError, match="line 3"):
        read_raw_ledger(path)


def test_non_finite_numbers_are_stored_as_null(tmp_path):
    with LedgerWriter(tmp_path) as led:
        led.append(Record(type="epoch", val_loss=float("nan"), train_loss=float("inf")))
    text = (tmp_path / "ledger.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    rec = json.loads(text)
    assert rec["val_loss"] is None and rec["train_loss"] is None


def test_missing_ledger_is_a_clear_error(tmp_path):
    with pytest.raises(AiperfError, match="no ledger"):
        read_raw_ledger(tmp_path / "nope")


def test_subscribers_see_each_durable_record(tmp_path):
    seen = []
    with LedgerWriter(tmp_path) as led:
        led.subscribe(seen.append)
        led.append(Record(type="run_start", run_id="r"))
        led.append(Record(type="run_stop", status="completed"))
    assert [r.type for r in seen] == ["run_start", "run_stop"]
    assert [r.to_dict() for r in seen] == read_raw_ledger(tmp_path)


def test_clock_offset_continues_time_after_resume(tmp_path):
    with LedgerWriter(tmp_path, clock_offset=1000.0) as led:
        rec = led.append(Record(type="resume", gap_s=10.0))
    assert rec.t >= 1000.0


def test_a_batch_writes_each_record_at_once_and_fsyncs_once_at_its_end(tmp_path, monkeypatch):
    import aiperf.ledger.store as ledger_module

    synced_sizes = []
    real_fsync = ledger_module.os.fsync

    def counting_fsync(fd):
        synced_sizes.append((tmp_path / "ledger.jsonl").stat().st_size)
        real_fsync(fd)

    monkeypatch.setattr(ledger_module.os, "fsync", counting_fsync)
    seen = []
    with LedgerWriter(tmp_path) as led:
        led.subscribe(seen.append)
        led.append(Record(type="run_start", run_id="r"))
        assert len(synced_sizes) == 1  # outside a batch: one fsync per record
        with led.batch():
            for k in range(3):
                led.append(Record(type="epoch", trial="t00000", epoch=k + 1))
                # Written and flushed already: a process killed here would keep it.
                assert len(read_raw_ledger(tmp_path)) == k + 2
            with led.batch():  # nested: still one fsync, at the outermost end
                led.append(Record(type="trial_end", trial="t00000", status="completed"))
            assert len(synced_sizes) == 1
            assert [r.type for r in seen] == ["run_start"]  # subscribers see durable records only
        size = (tmp_path / "ledger.jsonl").stat().st_size
        assert synced_sizes == [synced_sizes[0], size]
        assert [r.type for r in seen] == ["run_start", "epoch", "epoch", "epoch", "trial_end"]
    assert [r.to_dict() for r in seen] == read_raw_ledger(tmp_path)


def test_a_deferred_batch_is_synced_by_the_next_sync_or_once_it_is_old_enough(tmp_path, monkeypatch):
    import aiperf.ledger.store as ledger_module

    calls = []
    monkeypatch.setattr(ledger_module.os, "fsync", lambda fd: calls.append(fd))
    clock = [100.0]
    monkeypatch.setattr(ledger_module.time, "monotonic", lambda: clock[0])
    seen = []
    led = LedgerWriter(tmp_path)
    led.subscribe(seen.append)
    with led.batch(durable=False):
        led.append(Record(type="epoch", trial="t00000", epoch=1))
    with led.batch(durable=False):
        led.append(Record(type="epoch", trial="t00000", epoch=2))
    assert calls == [] and seen == [] and len(read_raw_ledger(tmp_path)) == 2  # written, not yet durable
    clock[0] += 0.5
    led.sync_due(1.0)
    assert calls == []  # the oldest is half a second old
    clock[0] += 0.5
    led.sync_due(1.0)
    assert len(calls) == 1 and [r.epoch for r in seen] == [1, 2]
    led.sync_due(0.0)
    led.sync()
    assert len(calls) == 1  # nothing new to sync
    with led.batch(durable=False):
        led.append(Record(type="epoch", trial="t00000", epoch=3))
    led.sync()
    assert len(calls) == 2 and [r.epoch for r in seen] == [1, 2, 3]
    led.close()


def test_a_batch_ended_by_an_error_still_syncs(tmp_path, monkeypatch):
    import aiperf.ledger.store as ledger_module

    calls = []
    monkeypatch.setattr(ledger_module.os, "fsync", lambda fd: calls.append(fd))
    led = LedgerWriter(tmp_path)
    with pytest.raises(RuntimeError), led.batch():
        led.append(Record(type="epoch", trial="t00000", epoch=1))
        raise RuntimeError("handler failed")
    assert len(calls) == 1
    led.close()
    assert len(calls) == 1  # nothing left to sync at close


_JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
_JSON = st.recursive(_JSON_LEAVES, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text().filter(lambda k: k != "hash"), _JSON, max_size=12))
def test_the_written_line_is_the_canonical_encoding_of_the_record_with_its_hash(body):
    """Encoding each field once gives the same bytes and hash as encoding the record whole (unicode keys, nesting)."""
    digest, line = hashed_line(body)
    assert digest == record_hash(body)
    assert line == canonical({**body, "hash": digest})


def test_a_body_with_a_hash_or_a_non_string_key_is_refused():
    with pytest.raises(ValueError):
        hashed_line({"hash": "x"})
    with pytest.raises(ValueError):
        hashed_line({1: "x"})
