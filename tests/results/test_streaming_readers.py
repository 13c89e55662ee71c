"""The ledger's readers stream: verify, summary, results.load and --resume keep what grows with the run's
trials, not its records, and say the same as they said when they held every record (issue 24, item 4)."""

from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest

from aiperf.engine.resume import ResumableLedger, read_resumable
from aiperf.ledger.schema import SHAPES, RecordType, checked_record
from aiperf.ledger.store import (
    LEDGER_NAME,
    LedgerStream,
    canonical,
    iter_ledger,
    line_hash_matches,
    parse_line,
    read_ledger,
    read_raw_ledger,
)
from aiperf.results import tables as results
from aiperf.results.summary import build_summary, save_summary, summarize
from aiperf.results.verify import verify_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import big_ledger  # the benchmark that writes long ledgers through the real writer


def _long_run(seed: Path, out: Path, records: int) -> Path:
    big_ledger.write_big_ledger(seed, out, records, workers=8, batch=64)
    return out


@pytest.fixture(scope="module")
def long_runs(sim_run, tmp_path_factory):
    """Two replayed ledgers of the simulated run, one four times the other (written by the real LedgerWriter)."""
    root = tmp_path_factory.mktemp("long")
    return _long_run(sim_run, root / "short", 1_500), _long_run(sim_run, root / "long", 6_000)


def _peak(call) -> int:
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_replayed_long_ledgers_verify(long_runs):
    for run in long_runs:
        ok, message = verify_run(run)
        assert ok, message


def test_verify_memory_grows_with_trials_not_with_records(long_runs):
    """Holding the ledger costs several times its size; streaming it costs a small share per trial."""
    short, long = long_runs
    verify_run(short)  # imports and caches warm
    peaks = [_peak(lambda run=run: verify_run(run)) for run in (short, long)]
    sizes = [(run / LEDGER_NAME).stat().st_size for run in (short, long)]
    assert sizes[1] > 3 * sizes[0]
    # Streaming: about 0.08 of the growth in file size (its per-trial state); holding the records: over 10.
    assert peaks[1] - peaks[0] < 0.3 * (sizes[1] - sizes[0]), (peaks, sizes)


def test_summary_memory_grows_with_trials_not_with_records(long_runs):
    short, long = long_runs
    build_summary(short)
    peaks = [_peak(lambda run=run: build_summary(run)) for run in (short, long)]
    sizes = [(run / LEDGER_NAME).stat().st_size for run in (short, long)]
    assert peaks[1] - peaks[0] < 0.15 * (sizes[1] - sizes[0]), (peaks, sizes)


def test_a_forged_record_in_the_middle_of_a_long_ledger_is_named_by_its_line(long_runs, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = (long_runs[1] / LEDGER_NAME).read_bytes().splitlines(keepends=True)
    (run / "summary.json").write_bytes((long_runs[1] / "summary.json").read_bytes())
    k = next(i for i in range(len(lines) // 2, len(lines)) if b'"type":"epoch"' in lines[i])
    record = json.loads(lines[k])
    record["val_acc"] = 0.999
    lines[k] = canonical(record) + b"\n"  # its old hash kept: an edit that breaks the chain here
    (run / LEDGER_NAME).write_bytes(b"".join(lines))
    ok, message = verify_run(run)
    assert not ok
    first = message.splitlines()[0]
    assert f"line {k + 1}, seq {record['seq']} (epoch" in first and "edited" in first


def test_streaming_summary_is_the_summary_of_every_record(long_runs):
    for run in long_runs:
        assert build_summary(run)["ledger"] == summarize(read_ledger(run))["ledger"]
        streamed = build_summary(run)
        held = summarize(read_ledger(run))
        streamed.pop("energy", None)
        assert streamed == held


def test_readers_are_streams(long_runs):
    stream = LedgerStream(long_runs[1])
    lines = iter(stream)
    line, record = next(lines)
    assert record["type"] == RecordType.RUN_START and line.endswith(b"\n")
    assert stream.count == 1  # one record read, not the file
    records = iter_ledger(long_runs[1])
    assert next(records).type == RecordType.RUN_START
    assert iter(records) is records


def test_results_frames_are_bounded_and_their_per_trial_figures_exact(long_runs):
    run = long_runs[1]
    full = results.load(run)
    assert full.epochs_stride == 1 and len(full.epochs) == full.epochs_total
    sampled = results.load(run, max_rows=50)
    assert len(sampled.epochs) <= 50 and sampled.epochs_stride > 1
    assert sampled.epochs_total == full.epochs_total == sum(1 for r in read_ledger(run) if r.type == "epoch")
    assert len(sampled.trials) <= 50 + results.TOP_TRIALS
    exact = full.trials.set_index("trial")
    for row in sampled.trials.itertuples():
        assert row.ops == pytest.approx(exact.loc[row.trial, "ops"])
        expected = exact.loc[row.trial, "best_val_acc"]
        assert row.best_val_acc == expected or (pd.isna(row.best_val_acc) and pd.isna(expected))
    best = full.trials["best_val_acc"].max()
    assert sampled.trials["best_val_acc"].max() == best  # the most accurate trials are always kept
    assert sampled.timeline == full.timeline and sampled.timeline[-1]["total_ops"] == pytest.approx(
        build_summary(run)["score"]["total_ops"]
    )


def test_resume_reads_the_ledger_as_a_stream(long_runs):
    ledger = read_resumable(_unfinished(long_runs[0]))
    assert isinstance(ledger, ResumableLedger) and len(ledger) == ledger.facts.count
    assert ledger.start.type == RecordType.RUN_START
    assert sum(1 for _ in ledger) == len(ledger)


def _unfinished(run: Path) -> Path:
    """The run without its run_stop (a master killed): a ledger --resume continues."""
    lines = (run / LEDGER_NAME).read_bytes().splitlines(keepends=True)
    (run / LEDGER_NAME).write_bytes(b"".join(lines[:-1]))
    return run


# --- the fast paths say what the slow ones said -------------------------------------------------------


def test_the_fast_shape_check_builds_what_pydantic_builds(sim_run, monkeypatch):
    import aiperf.ledger.schema as schema

    raw = read_raw_ledger(sim_run)
    epoch = next(r for r in raw if r["type"] == RecordType.EPOCH)
    start = next(r for r in raw if r["type"] == RecordType.TRIAL_START)
    end = next(r for r in raw if r["type"] == RecordType.TRIAL_END)
    variants = [
        {**epoch, "extra_field": [1]},
        {**epoch, "val_acc": 1.5},
        {**epoch, "val_acc": True},
        {**epoch, "ops": -1},
        {**epoch, "ops": float("inf")},
        {**epoch, "ops": float("nan")},
        {**epoch, "epoch": 0},
        {**epoch, "seq": 2**60},
        {**epoch, "train_images": 1.0},
        {**epoch, "precision": None},
        {k: v for k, v in epoch.items() if k != "val_acc"},
        {**end, "status": "weird"},
        {**end, "step_reused": 1},
        {**start, "lineage": ["a", 1]},
        {**start, "morphs": [{}, "x"]},
        {**start, "hparams": {**start["hparams"], "zz": 2}},
        {**start, "hparams": {"dropout": 2.0}},
        {**start, "flops": {"forward": 1.0}},
        {**start, "graph": []},
        {**start, "seed": 2**60},
        {k: v for k, v in start.items() if k not in ("hparams", "morphs", "info")},
    ]
    for index, record in enumerate(raw + variants):
        fast = checked_record(record, index)
        monkeypatch.setattr(schema, "_FAST_RULES_ALL", {})
        slow = checked_record(record, index)
        monkeypatch.undo()
        if isinstance(slow, str) or isinstance(fast, str):
            assert fast == slow
            continue
        assert type(fast) is type(slow) is SHAPES.get(record["type"], type(slow))
        assert fast == slow and fast.to_dict() == slow.to_dict() and fast.model_extra == slow.model_extra
        assert fast.model_fields_set == slow.model_fields_set and type(fast.type) is type(slow.type)
        for name in ("status", "hparams", "flops"):
            if hasattr(fast, name):
                assert type(getattr(fast, name)) is type(getattr(slow, name))
                assert getattr(fast, name) == getattr(slow, name)


def test_lines_parse_as_the_standard_library_reads_them():
    assert parse_line(b'{"a": 18446744073709551616}\n') == {"a": 18446744073709551616}  # exact, not a float
    assert parse_line(b'{"a": 1e400}') == {"a": float("inf")}  # refused later, by its shape
    for bad in (b'{"a": NaN}', b'{"a": Infinity}', b"{", b'"\xff"'):
        with pytest.raises(ValueError):
            parse_line(bad)


def test_the_chain_hashes_a_writers_line_as_written_and_any_other_line_the_long_way(sim_run, tmp_path):
    line = (sim_run / LEDGER_NAME).read_bytes().splitlines(keepends=True)[1]
    record = json.loads(line)
    assert line_hash_matches(line, record["hash"])
    spaced = json.dumps(record).encode() + b"\n"  # the same record, re-spaced by hand: not the writer's bytes
    assert not line_hash_matches(spaced, record["hash"])
    run = tmp_path / "run"
    run.mkdir()
    lines = (sim_run / LEDGER_NAME).read_bytes().splitlines(keepends=True)
    lines[1] = spaced
    (run / LEDGER_NAME).write_bytes(b"".join(lines))
    save_summary(run, build_summary(run))
    ok, message = verify_run(run)
    assert ok, message  # an existing ledger in another layout still verifies: its canonical form is hashed
