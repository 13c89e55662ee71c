"""One record schema in code: the enums writers use, the model per record type, the pool's event kinds."""

from __future__ import annotations

import json

import numpy as np
import pytest

import aiperf.ledger.store as ledger_module
from aiperf.cluster.messages import BadImagesReport, EpochReport, EventKind, TrialDone, TrialStarted
from aiperf.cluster.pool import PoolEvent
from aiperf.cluster.sim_pool import HybridClock, SimulatedWorkerPool
from aiperf.config import load_config
from aiperf.engine.master import Master, MasterSettings
from aiperf.engine.search import make_search
from aiperf.engine.weights import WeightStore
from aiperf.ledger.schema import (
    SHAPES,
    Record,
    RecordType,
    RunStatus,
    RunStopRecord,
    TrialEndRecord,
    TrialStartRecord,
    TrialStatus,
    json_safe,
    record_problem,
)
from aiperf.ledger.store import LEDGER_NAME, LedgerWriter, canonical, read_ledger, record_hash
from nas import zoo
from nas.morph import random_morph
from nas.proposer import TrialKind
from nas.serialize import graph_to_dict


def test_records_written_with_enums_have_the_bytes_and_hash_of_plain_strings(tmp_path, monkeypatch):
    """StrEnums serialise as their values: moving the writers to them changed no ledger byte."""
    monkeypatch.setattr(ledger_module.time, "time", lambda: 1_700_000_000.0)
    typed = [
        (RecordType.RUN_START, {"run_id": "r", "plan": {"kind": TrialKind.SEED}}),
        (RecordType.TRIAL_END, {"trial": "t00000", "status": TrialStatus.COMPLETED, "reason": ""}),
        (RecordType.RUN_STOP, {"status": RunStatus.INTERRUPTED, "reason": "x"}),
    ]
    plain = [(str(rtype.value), {k: _plain(v) for k, v in fields.items()}) for rtype, fields in typed]
    with LedgerWriter(tmp_path / "typed") as ledger:
        for k, (rtype, fields) in enumerate(typed):
            ledger.append(SHAPES[rtype](t=float(k), **fields))  # the record type's model: enums throughout
    with LedgerWriter(tmp_path / "plain") as ledger:
        for k, (name, fields) in enumerate(plain):
            ledger.append(Record(type=name, t=float(k), **fields))  # the generic record: plain strings
    assert (tmp_path / "typed" / LEDGER_NAME).read_bytes() == (tmp_path / "plain" / LEDGER_NAME).read_bytes()
    record = {"seq": 0, "type": RecordType.EPOCH, "status": TrialStatus.LOST, "prev": ""}
    same = {"seq": 0, "type": "epoch", "status": "lost", "prev": ""}
    assert canonical(record) == canonical(same) and record_hash(record) == record_hash(same)


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value.value if hasattr(value, "value") else value


def test_every_record_type_has_its_model_and_every_model_a_record_type():
    assert set(SHAPES) == set(RecordType)


def test_every_record_of_a_simulated_run_validates_against_its_model(sim_run):
    records = read_ledger(sim_run)
    types = {r.type for r in records}
    assert {"run_start", "trial_start", "epoch", "trial_end", "worker", "run_stop"} <= types
    for index, record in enumerate(records):
        assert record.type in set(RecordType), record.type
        assert record_problem(record.to_dict(), index) is None
        SHAPES[record.type].model_validate(record.to_dict())  # the record type's own model, not the generic one
        assert type(record) is SHAPES[record.type]  # and read back as that model
    for record in records:
        if isinstance(record, TrialEndRecord):
            assert record.status in set(TrialStatus)
        elif isinstance(record, RunStopRecord):
            assert record.status in set(RunStatus)
        elif isinstance(record, TrialStartRecord):
            assert record.kind in set(TrialKind)


def test_a_model_checks_the_fields_it_declares():
    """A field added to a model is checked when present (here one the issue found undocumented)."""
    record = {"seq": 3, "type": "epoch", "t": 1.0, "wall": 1.0, "prev": "", "hash": "", "trial": "t00000",
              "epoch": 1, "val_acc": 0.5, "precision": "float32", "oom_retries": 1}  # fmt: skip
    assert record_problem(record) is None
    assert "oom_retries" in (record_problem({**record, "oom_retries": "1"}) or "")


def test_a_misspelt_event_kind_fails_where_the_event_is_made():
    with pytest.raises(ValueError, match="bad_image"):
        PoolEvent("bad_image", "w00000", "t00000")
    assert PoolEvent("bad_images", "w00000").kind is EventKind.BAD_IMAGES


def _master(tmp_path) -> Master:
    cfg = load_config("smoke")
    pool = SimulatedWorkerPool(1, HybridClock())
    search = make_search(cfg, zoo.small_resnet((8, 8, 1), 10), 64)
    return Master(MasterSettings(time_budget_s=10), search, pool, LedgerWriter(tmp_path), WeightStore(2))


def test_the_master_handles_every_event_kind_and_refuses_others(tmp_path):
    master = _master(tmp_path)
    assert set(master._handlers) == set(EventKind)
    event = PoolEvent(EventKind.READY, "w00000")
    event.kind = "redy"  # type: ignore[assignment]  # what a getattr(f"_on_{kind}") dispatch silently ignored
    with pytest.raises(ValueError, match="no handler for pool event kind 'redy'"):
        master._handle([event])


def test_an_event_carrying_the_wrong_message_is_refused(tmp_path):
    master = _master(tmp_path)
    master._handle(master.pool.wait(0))  # the worker is ready
    master._fill()
    [trial] = master.active
    with pytest.raises(TypeError, match="carries TrialStarted, not EpochReport"):
        master._handle([PoolEvent(EventKind.EPOCH, "w00000", trial, report=TrialStarted(worker="w00000"))])


def test_messages_say_their_event_kind_and_refuse_unknown_fields():
    epoch = dict(epoch=1, train_images=10, eval_images=2, train_acc=0.5, train_loss=1.0, val_acc=0.5, val_loss=1.0,
                 train_s=1.0, eval_s=0.1, batch_size=8, precision="float32")  # fmt: skip
    messages = [TrialStarted(worker="w"), EpochReport(**epoch), BadImagesReport(files=[], epoch_count=0),
                TrialDone(weights={})]  # fmt: skip
    assert [m.kind for m in messages] == [EventKind.START, EventKind.EPOCH, EventKind.BAD_IMAGES, EventKind.DONE]
    with pytest.raises(TypeError, match="val_acc_top5"):
        EpochReport(**epoch, val_acc_top5=0.9)  # a field the trainer added without the message knowing it


def test_what_a_writer_hands_over_is_stored_as_json_holds_it():
    """NumPy scalars, NaN and tuples are converted at any depth; plain leaves and enums pass unchanged."""
    value = {
        "loss": float("nan"),
        "acc": np.float32(0.5),
        "epochs": np.int64(3),
        "nested": [{"shape": (1, 2), "flag": True, "none": None, "inf": float("-inf")}],
        "status": TrialStatus.COMPLETED,
        7: "key made a string",
    }
    safe = json_safe(value)
    assert safe == {
        "loss": None,
        "acc": 0.5,
        "epochs": 3,
        "nested": [{"shape": [1, 2], "flag": True, "none": None, "inf": None}],
        "status": "completed",
        "7": "key made a string",
    }
    assert type(safe["acc"]) is float and type(safe["epochs"]) is int and safe["nested"][0]["flag"] is True
    assert safe["status"] is TrialStatus.COMPLETED
    json.dumps(safe, allow_nan=False)  # raises on anything JSON cannot hold


def test_a_graphs_node_documents_are_stored_as_they_are_and_json_holds_them():
    """The writer passes a graph's nodes through without walking them: they must already be what JSON reads back."""
    rng = np.random.default_rng(3)
    graph = zoo.small_resnet((12, 12, 3), width=4)
    for _ in range(4):
        graph = random_morph(graph, rng)[0]
    doc = graph_to_dict(graph)
    safe = json_safe({"graph": doc})
    assert all(a is b for a, b in zip(safe["graph"]["nodes"], doc["nodes"], strict=True))
    assert safe == json.loads(json.dumps({"graph": doc}, allow_nan=False))
