"""Readers hold one record at a time to its limit: a ledger or telemetry file whose tail claims a
gigabyte is refused by its offset, in bounded memory, and never reads as "verified"."""

from __future__ import annotations

import shutil

import pytest
from helpers import run_cli_bounded

from aiperf.ledger.store import MAX_RECORD_BYTES, read_ledger_contents
from aiperf.sampling.telemetry import MAX_SAMPLE_BYTES, TELEMETRY_NAME

GIB = 1 << 30


def _copy(sim_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(sim_run, run)
    return run


def _sparse_tail(path, size: int, byte: bytes = b"") -> int:
    """Extend ``path`` by ``size`` bytes without writing them (a sparse file: zeros, no disk used)."""
    end = path.stat().st_size
    with open(path, "r+b") as fh:
        if byte:
            fh.seek(end)
            fh.write(byte)
        fh.truncate(end + size)
    return end


@pytest.mark.parametrize("command", ["verify", "summary", "report"])
def test_a_gigabyte_torn_tail_on_the_ledger_is_refused_by_its_offset_in_bounded_memory(sim_run, tmp_path, command):
    run = _copy(sim_run, tmp_path)
    offset = _sparse_tail(run / "ledger.jsonl", GIB, b"{")
    proc = run_cli_bounded(command, str(run), memory=2 * GIB)
    assert proc.returncode == 2, proc.stdout[-500:] + proc.stderr[-1000:]
    assert "verified" not in proc.stdout and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"at byte {offset:,}" in line and f"{MAX_RECORD_BYTES:,} bytes" in line and "ledger.jsonl" in line


def test_a_line_just_under_the_limit_is_still_read_as_a_torn_tail(sim_run, tmp_path):
    run = _copy(sim_run, tmp_path)
    complete = read_ledger_contents(run)
    _sparse_tail(run / "ledger.jsonl", MAX_RECORD_BYTES - 1, b"{")
    contents = read_ledger_contents(run)
    assert contents.records == complete.records and contents.torn_bytes == MAX_RECORD_BYTES - 1


def test_an_oversized_line_in_the_middle_of_a_ledger_is_refused_too(sim_run, tmp_path):
    run = _copy(sim_run, tmp_path)
    lines = (run / "ledger.jsonl").read_bytes().splitlines(keepends=True)
    lines.insert(3, b" " * (MAX_RECORD_BYTES + 10) + b"\n")  # blank to a reader that splits first
    (run / "ledger.jsonl").write_bytes(b"".join(lines))
    proc = run_cli_bounded("verify", str(run), memory=2 * GIB)
    assert proc.returncode == 2 and "longer than" in proc.stderr and "after 3 record(s)" in proc.stderr


def test_a_gigabyte_line_in_telemetry_is_refused_by_its_offset(sim_run, tmp_path):
    run = _copy(sim_run, tmp_path)
    path = run / TELEMETRY_NAME
    path.write_bytes(b'{"wall": 1.0, "node": "n"}\n')
    _sparse_tail(path, GIB)
    proc = run_cli_bounded("verify", str(run), memory=2 * GIB)
    assert proc.returncode == 2 and "verified" not in proc.stdout and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert TELEMETRY_NAME in line and "at byte 27" in line and f"{MAX_SAMPLE_BYTES:,} bytes" in line
