"""What aiperf logs reaches the terminal: warnings always (as `aiperf: warning: ...`), the engine's work with -v."""

from __future__ import annotations

import logging
import shutil
import subprocess

import numpy as np
import pytest
from helpers import run_cli

import aiperf.ledger.store as ledger_module
from aiperf.engine.weights import WeightStore, save_weights
from aiperf.ledger.schema import Record, ResumeRecord, of_type
from aiperf.ledger.store import LedgerWriter, read_ledger, read_raw_ledger
from aiperf.logs import configure, through


@pytest.fixture
def terminal():
    """The CLI's handler on the aiperf loggers, removed again afterwards."""
    yield configure
    configure(0)
    for name in ("aiperf", "nas"):
        log = logging.getLogger(name)
        log.handlers.clear()
        log.setLevel(logging.NOTSET)


def test_warnings_always_show_and_engine_detail_only_with_v(terminal, capsys):
    log = logging.getLogger("aiperf.engine.master")
    terminal(0)
    log.warning("the ledger is slow")
    log.info("trial t00000 proposed")
    assert capsys.readouterr().err == "aiperf: warning: the ledger is slow\n"
    terminal(1)
    terminal(1)  # configuring again replaces the handler: no line twice
    log.info("trial t00000 proposed")
    log.debug("an epoch")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].endswith("INFO aiperf.engine.master: trial t00000 proposed")
    terminal(2)
    log.debug("an epoch")
    assert capsys.readouterr().err.endswith("DEBUG aiperf.engine.master: an epoch\n")


@pytest.fixture
def no_terminal():
    """No CLI handler on the aiperf loggers (a test run in-process before may have configured one); restored after."""
    saved = {name: list(logging.getLogger(name).handlers) for name in ("aiperf", "nas")}
    for name in saved:
        logging.getLogger(name).handlers.clear()
    yield
    for name, handlers in saved.items():
        logging.getLogger(name).handlers[:] = handlers


def test_a_run_sends_warnings_through_its_own_stream_even_without_the_cli(capsys, no_terminal):
    class Stream:
        def __init__(self):
            self.lines = []

        def write(self, text):
            self.lines.append(text)

        def flush(self):
            pass

    stream = Stream()
    with through(stream):
        logging.getLogger("aiperf.engine.weights").warning("weights not saved")
    logging.getLogger("aiperf.engine.weights").info("after the run")
    assert "".join(stream.lines) == "aiperf: warning: weights not saved\n"
    assert not logging.getLogger("aiperf").handlers  # the temporary handler is gone again
    assert capsys.readouterr().err == ""


def test_a_slow_fsync_is_a_warning_at_most_once_a_minute(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="aiperf")
    monkeypatch.setattr(ledger_module, "SLOW_SYNC_S", -1.0)  # every fsync counts as slow
    with LedgerWriter(tmp_path) as ledger:
        for k in range(5):
            ledger.append(Record(type="epoch", trial="t00000", epoch=k + 1))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "fsync of the ledger took" in warnings[0] and str(tmp_path) in warnings[0]


def test_kept_weights_that_cannot_be_read_back_are_skipped_with_a_warning_naming_them(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="aiperf")
    folder = tmp_path / "weights"
    folder.mkdir()
    save_weights({0: [np.ones((2, 2), dtype=np.float32)]}, folder / "t00001.npz")
    (folder / "t00002.npz").write_bytes(b"PK\x03\x04 cut short")  # a zip that ends early
    store = WeightStore(4, folder)
    assert store.reload({"t00001": 0.5, "t00002": 0.6}) == ["weights/t00002.npz"]
    assert "t00001" in store and "t00002" not in store
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert str(folder / "t00002.npz") in warning and "start from scratch" in warning


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=600)


@pytest.mark.slow
def test_aiperf_v_run_shows_each_trials_lifecycle(tmp_path):
    proc = _cli(
        "-v", "run", "--config", "smoke", "--set", f"run.results_dir={tmp_path}", "--set", "run.max_trials=3",
        "--set", "run.time_budget_s=300",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    for trial in ("t00000", "t00001", "t00002"):
        assert f"INFO aiperf.engine.master: trial {trial} proposed: " in proc.stderr
        assert f"trial {trial} started on worker w000" in proc.stderr
        assert f"trial {trial} completed on worker w000" in proc.stderr
    assert "ready" in proc.stderr and "INFO aiperf.engine.master: run completed: all 3 trials finished" in proc.stderr
    assert "aiperf result:" in proc.stdout and "INFO" not in proc.stdout


@pytest.mark.slow
def test_a_corrupt_weights_file_on_resume_is_a_warning_naming_it_and_is_recorded(smoke_run, tmp_path):
    run_dir, first = smoke_run
    assert "INFO" not in first.stderr and "aiperf: warning" not in first.stderr  # quiet without -v
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    lines = (copy / "ledger.jsonl").read_bytes().splitlines(keepends=True)
    assert read_raw_ledger(copy)[-1]["type"] == "run_stop"
    (copy / "ledger.jsonl").write_bytes(b"".join(lines[:-1]))  # as if the master died before its run_stop
    victim = sorted((copy / "weights").glob("t*.npz"))[0]
    victim.write_bytes(victim.read_bytes()[:100])
    proc = _cli("run", "--resume", str(copy))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    warning = next(line for line in proc.stderr.splitlines() if line.startswith("aiperf: warning: "))
    assert str(victim) in warning and "cannot be read back" in warning
    [resume] = of_type(read_ledger(copy), ResumeRecord)
    assert resume.weights_skipped == [f"weights/{victim.name}"]
