"""One master per run directory (issue 13, case 1): a live run refuses a second master, a dead
master's stale lock is taken over by --resume, and a new run never shares a directory."""

from __future__ import annotations

import itertools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import REPO, aiperf_cmd, cli_env, run_cli

from aiperf.engine import run as run_module
from aiperf.errors import AiperfError
from aiperf.ledger.runlock import LOCK_NAME, RunLock, RunLocked, live_holder
from aiperf.ledger.store import canonical, read_raw_ledger, record_hash


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=timeout)


HOLDER = textwrap.dedent(
    """
    import sys, time
    from aiperf.ledger.runlock import RunLock
    lock = RunLock(sys.argv[1]).acquire("lock holder for a test")
    print("locked", flush=True)
    time.sleep(600)
    """
)


def _hold_lock(run_dir: Path) -> subprocess.Popen:
    """Another process holding the run lock, as a live master would."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True, env=cli_env(), cwd=REPO
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _chain_ok(records: list[dict]) -> bool:
    return all(r["hash"] == record_hash(r) and r["seq"] == k for k, r in enumerate(records)) and all(
        b["prev"] == a["hash"] for a, b in itertools.pairwise(records)
    )


def test_a_second_lock_on_a_run_directory_is_refused_naming_pid_and_host(tmp_path):
    first = RunLock(tmp_path).acquire()
    try:
        with pytest.raises(RunLocked) as info:
            RunLock(tmp_path).acquire()
        message = str(info.value)
        assert f"PID {os.getpid()}" in message and platform.node() in message and "\n" not in message
        assert live_holder(tmp_path).pid == os.getpid()
    finally:
        first.release()
    assert live_holder(tmp_path) is None
    assert (tmp_path / LOCK_NAME).read_bytes() == b"", "a clean release leaves no holder behind"
    with RunLock(tmp_path) as again:
        assert again.previous is None  # nothing stale to report after a clean release


def test_the_lock_of_a_killed_holder_is_stale_and_names_it(tmp_path):
    holder = _hold_lock(tmp_path)
    with pytest.raises(RunLocked, match=f"PID {holder.pid}"):
        RunLock(tmp_path).acquire()
    holder.kill()
    holder.wait()
    lock = RunLock(tmp_path).acquire()
    try:
        assert lock.previous is not None and lock.previous.pid == holder.pid
        assert lock.previous.host == platform.node()
    finally:
        lock.release()


def test_a_planted_symlink_is_never_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_NAME).symlink_to(victim)
    with pytest.raises(AiperfError, match="symbolic link"):
        RunLock(run_dir).acquire()
    assert victim.read_text() == "precious\n"


def test_a_run_id_collision_draws_another_id(tmp_path, monkeypatch):
    ids = iter(["20260101-000000-x-aaaa", "20260101-000000-x-aaaa", "20260101-000000-x-bbbb"])
    monkeypatch.setattr(run_module, "new_run_id", lambda name: next(ids))
    first = run_module.create_run_dir(tmp_path, "x")
    (first[1] / "ledger.jsonl").write_text("mine\n")
    second = run_module.create_run_dir(tmp_path, "x")
    assert first[0] == "20260101-000000-x-aaaa" and second[0] == "20260101-000000-x-bbbb"
    assert (first[1] / "ledger.jsonl").read_text() == "mine\n", "an existing run directory is never reused"
    monkeypatch.setattr(run_module, "new_run_id", lambda name: "20260101-000000-x-aaaa")
    with pytest.raises(AiperfError, match="no free run id"):
        run_module.create_run_dir(tmp_path, "x", attempts=3)


def test_resume_of_a_locked_run_is_refused_before_touching_the_ledger(sim_run, tmp_path):
    """A live lock holder: --resume exits 2 naming it, and does not even cut the ledger's torn tail."""
    run_dir = tmp_path / "run"
    shutil.copytree(sim_run, run_dir)
    lines = (run_dir / "ledger.jsonl").read_bytes().splitlines(keepends=True)
    (run_dir / "ledger.jsonl").write_bytes(b"".join(lines[:-3]) + b'{"seq": 172, "ty')  # still being written
    before = (run_dir / "ledger.jsonl").read_bytes()
    holder = _hold_lock(run_dir)
    try:
        proc = _cli("run", "--resume", str(run_dir), timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert f"PID {holder.pid}" in lines[0] and f"on host {platform.node()}" in lines[0]
    assert (run_dir / "ledger.jsonl").read_bytes() == before


@pytest.mark.slow
def test_resume_while_the_run_is_going_is_refused_and_the_run_completes_intact(tmp_path):
    """Issue 13, case 1, for real: two masters on one live run directory."""
    proc = subprocess.Popen(
        aiperf_cmd(
            "run", "--config", "smoke", "--set", f"run.results_dir={tmp_path}", "--set", "run.time_budget_s=120"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 240
        run_dir = None
        while time.monotonic() < deadline and proc.poll() is None:
            runs = [p for p in tmp_path.iterdir() if (p / "ledger.jsonl").exists()]
            if runs and any(r["type"] == "epoch" for r in read_raw_ledger(runs[0])):
                run_dir = runs[0]
                break
            time.sleep(0.5)
        assert run_dir is not None, "the first run never completed an epoch"
        before = read_raw_ledger(run_dir)
        second = _cli("run", "--resume", str(run_dir), timeout=120)
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
        message = second.stderr.strip()
        assert len(message.splitlines()) == 1
        assert "running aiperf master" in message and f"PID {proc.pid}" in message and platform.node() in message
        # A summary of the live run is printed but summary.json is left to its master.
        live = _cli("summary", str(run_dir), timeout=120)
        assert live.returncode == 0 and "aiperf result" in live.stdout
        assert "still going" in live.stderr and not (run_dir / "summary.json").exists()
        proc.send_signal(signal.SIGTERM)  # the first master, undisturbed, ends cleanly
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    records = read_raw_ledger(run_dir)
    assert records[: len(before)] == before and _chain_ok(records)
    assert [r["type"] for r in records].count("run_start") == 1
    assert not any(r["type"] == "resume" for r in records), "the refused master appended nothing"
    assert records[-1]["type"] == "run_stop" and records[-1]["status"] == "interrupted"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trials"]["epochs_counted"] == sum(r["type"] == "epoch" for r in records)
    assert _cli("verify", str(run_dir)).returncode == 0


def _resumable_copy(smoke_dir: Path, dst: Path) -> list[dict]:
    """The smoke run as if its master had been killed before retiring its workers."""
    shutil.copytree(smoke_dir, dst)
    records = read_raw_ledger(dst)
    cut = next(k for k, r in enumerate(records) if r["type"] in ("worker", "run_stop"))
    kept = records[:cut]
    (dst / "ledger.jsonl").write_bytes(b"".join(canonical(r) + b"\n" for r in kept))
    (dst / "summary.json").unlink()
    return kept


@pytest.mark.slow
def test_resume_takes_over_the_stale_lock_of_a_killed_master(smoke_run, tmp_path):
    run_dir = tmp_path / "run"
    kept = _resumable_copy(smoke_run[0], run_dir)
    holder = _hold_lock(run_dir)  # the "master", killed while holding the lock
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert json.loads((run_dir / LOCK_NAME).read_text())["pid"] == holder.pid  # its record stays behind
    with (run_dir / "ledger.jsonl").open("ab") as fh:
        fh.write(b'{"seq": 99, "type": "epo')  # and the torn record of its last write
    (run_dir / ".summary.json.0badc0de.tmp").write_text("{")  # and a temporary file it never renamed
    (run_dir / "weights" / ".t00001.npz.0badc0de.tmp").write_bytes(b"PK")
    proc = _cli("run", "--resume", str(run_dir))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"took over the run lock of a master that is no longer running (PID {holder.pid}" in proc.stdout
    records = read_raw_ledger(run_dir)
    assert records[: len(kept)] == kept and _chain_ok(records)
    assert records[len(kept)]["type"] == "resume"
    assert records[-1]["type"] == "run_stop"
    assert not list(run_dir.glob("*.tmp")) and not list((run_dir / "weights").glob("*.tmp"))
    assert (run_dir / LOCK_NAME).read_bytes() == b""
    assert _cli("verify", str(run_dir)).returncode == 0


FORKING_HOLDER = textwrap.dedent(
    """
    import os, sys, time
    from aiperf.ledger.runlock import RunLock
    lock = RunLock(sys.argv[1]).acquire("a master that starts a helper process")
    if os.fork() == 0:  # the child shares the locked file description
        time.sleep(600)
        os._exit(0)
    print("locked", flush=True)
    time.sleep(600)
    """
)


def test_a_lock_kept_by_a_child_of_a_dead_master_says_so(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", FORKING_HOLDER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=REPO,
        start_new_session=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    holder.kill()  # the master dies; its child lives on with the lock
    holder.wait()
    try:
        with pytest.raises(RunLocked) as info:
            RunLock(tmp_path).acquire()
        assert f"PID {holder.pid}" in str(info.value) and "has exited" in str(info.value)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # the child
    deadline = time.monotonic() + 30
    while live_holder(tmp_path) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    with RunLock(tmp_path) as lock:
        assert lock.previous.pid == holder.pid


def test_a_file_system_without_locks_refuses_the_run(tmp_path, monkeypatch):
    import errno

    import aiperf.ledger.runlock as runlock

    def no_locks(fd, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(runlock.fcntl, "flock", no_locks)
    with pytest.raises(AiperfError) as info:
        RunLock(tmp_path).acquire()
    message = str(info.value)
    assert "does not support file locks (ENOSYS)" in message and "run.results_dir" in message
