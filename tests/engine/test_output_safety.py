"""Output can neither stop nor stall a run (issue 13, case 4; and case 8 on the way): a closed pipe
(``| head -1``), a reader that stopped reading, a terminal that is resized, closed descriptors."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import pty
import shlex
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
from helpers import REPO, aiperf_cmd, cli_env

from aiperf.engine.output import Output
from aiperf.ledger.store import read_raw_ledger

F_SETPIPE_SZ = 1031


def _run_args(results: Path, trials: int, *extra: str) -> list[str]:
    """A smoke run that ends when its ``trials`` end (on a loaded box a time budget can pass before any epoch),
    on one worker: what is written, not how many write it, is under test."""
    return aiperf_cmd(
        "run",
        "--config",
        "smoke",
        *("--set", f"run.results_dir={results}", "--set", f"run.max_trials={trials}"),
        *("--set", "run.time_budget_s=600", "--set", "cluster.max_concurrent_trials=1"),
        *extra,
    )


def _completed_run(results: Path) -> tuple[Path, dict]:
    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
    records = read_raw_ledger(run_dir)  # every line of the ledger is a record: nothing else was written into it
    assert records[-1]["type"] == "run_stop" and records[-1]["status"] == "completed"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and (run_dir / "report.html").exists()
    verify = subprocess.run(aiperf_cmd("verify", str(run_dir)), capture_output=True, env=cli_env(), cwd=REPO)
    assert verify.returncode == 0, verify.stdout
    return run_dir, summary


def test_a_failed_write_switches_output_off_and_raises_nothing():
    class Broken(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    out = Output(Broken())
    print("first", file=out)
    print("second", file=out)
    assert isinstance(out.failure, BrokenPipeError) and not out.enabled


def test_a_reader_that_stops_reading_never_blocks_the_writer():
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):
        while True:  # the reader read nothing: the pipe is full
            os.write(write_end, b"old output\n")
    os.set_blocking(write_end, True)
    out = Output(os.fdopen(write_end, "w"), background=True, max_pending=10)
    started = time.monotonic()
    for k in range(2000):
        print(f"line {k:05d}", file=out)
    assert time.monotonic() - started < 60, "the writer was blocked"  # a hang guard, not a speed target
    assert out.dropped >= 2 * 2000 - 2 * 10 - 2 and not out.drain(0.2)
    assert os.read(read_end, 11) == b"old output\n"
    os.close(read_end)  # the blocked write now fails: output switches off
    deadline = time.monotonic() + 30
    while out.enabled and time.monotonic() < deadline:
        time.sleep(0.05)
    assert isinstance(out.failure, BrokenPipeError)


@pytest.mark.slow
def test_a_run_piped_into_head_on_a_busy_machine_completes_and_says_it_shared_the_machine(tmp_path):
    """``aiperf run | head -1`` (case 4) while a CPU burner competes for the box (case 8).

    One burner holds half of a 2-core box; the run ends on its trial count, so the slowed workers
    complete epochs however long they take to start (a run that completes none fails, by design).
    """
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)]
    try:
        command = shlex.join(
            _run_args(tmp_path, 3, "--set", "run.progress_interval_s=0.5", "--set", "run.telemetry_interval_s=1")
        )
        proc = subprocess.run(
            ["bash", "-c", f"{command} | head -1; exit ${{PIPESTATUS[0]}}"],
            capture_output=True,
            text=True,
            env=cli_env(),
            cwd=REPO,
            timeout=600,
        )
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout.splitlines()) == 1 and proc.stdout.startswith("aiperf: dataset")
    for bad in ("Traceback", "Exception ignored", "BrokenPipeError", "unexpected error"):
        assert bad not in proc.stderr, proc.stderr[-3000:]
    assert "progress output stopped (Broken pipe)" in proc.stderr
    _, summary = _completed_run(tmp_path)
    telemetry = summary["telemetry"]
    assert telemetry["cpu_outside_percent"] >= 20, telemetry  # a busy loop on one of this machine's cores
    assert telemetry["cpu_run_percent"] > 0, "the run's own processes were not counted as the run's"
    assert "shared machine:" in summary["verdict"]["headline"]
    assert summary["verdict"]["notes"][0].startswith("shared machine: ")


@pytest.mark.slow
def test_a_stalled_reader_and_closed_descriptors_do_not_hold_the_run(tmp_path):
    """stdout into a 4 KB pipe that is never read; stdin and stderr closed."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)

    def close_stdin_and_stderr() -> None:
        os.close(0)
        os.close(2)

    proc = subprocess.Popen(
        _run_args(tmp_path, 2, "--set", "run.progress_interval_s=0.05"),
        stdout=write_end,
        env=cli_env(),
        cwd=REPO,
        preexec_fn=close_stdin_and_stderr,
    )
    os.close(write_end)
    try:
        deadline = time.monotonic() + 400  # hang guard
        stopped = False
        while time.monotonic() < deadline and not stopped and proc.poll() is None:
            runs = [p for p in tmp_path.iterdir() if (p / "ledger.jsonl").exists()]
            stopped = bool(runs) and read_raw_ledger(runs[0])[-1]["type"] == "run_stop"
            time.sleep(1)
        assert stopped or proc.poll() == 0, "the run did not finish while its output was not read"
        assert proc.wait(timeout=120) == 0, "the process did not exit while its output was not read"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert os.read(read_end, 100).startswith(b"aiperf: dataset")
    os.close(read_end)
    _completed_run(tmp_path)


@pytest.mark.slow
def test_on_a_terminal_that_is_resized_the_run_redraws_its_line_and_completes(tmp_path):
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        _run_args(tmp_path, 2, "--set", "run.progress_interval_s=0.5"),
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env=cli_env(),
        cwd=REPO,
    )
    os.close(slave)
    seen = bytearray()

    def read_terminal() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    try:
        size = 0
        while proc.poll() is None:
            size += 1
            fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 20 + size % 40, 60 + size % 100, 0, 0))
            proc.send_signal(signal.SIGWINCH)
            time.sleep(0.3)
        assert proc.wait(timeout=600) == 0, bytes(seen[-3000:]).decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    os.close(master)
    text = bytes(seen).decode(errors="replace")
    assert "\r\x1b[K[0:00:" in text, "on a terminal the progress line is redrawn in place"
    assert "aiperf result" in text and "Traceback" not in text
    _completed_run(tmp_path)
