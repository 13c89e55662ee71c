"""The budget is kept by the master's own clock, whatever Ray does (docs/cluster.md, "When Ray stops answering").

Each test starts a real ``aiperf run --config smoke`` (a private local Ray instance), freezes one
of that run's own Ray processes with SIGSTOP partway through, and checks that the run still ends at
its budget, within the stated grace, and that the ledger says what happened: the control plane
(``gcs_server``) that stopped answering, or the worker whose trial ends ``unresponsive``. A hang
fails the test at its deadline instead of holding the suite; whatever was frozen is resumed and
killed in a ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from helpers import REPO, aiperf_cmd, cli_env, run_cli

from aiperf.cluster.ray_session import SHUTDOWN_WAIT_S
from aiperf.engine.master import BUDGET_GRACE_S

pytestmark = pytest.mark.slow

BUDGET_S = 45  # the freeze comes at the first trial, up to ~25 s in on a loaded box; the watch needs ~7 s after
MARGIN_S = 25  # after run_stop: the summary, the report and the interpreter's exit on two busy cores


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "ledger.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for line in lines:
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def _start(tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        aiperf_cmd(
            "run", "--config", "smoke", "--set", f"run.results_dir={tmp_path}", "--set", f"run.time_budget_s={BUDGET_S}"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=REPO,
        start_new_session=True,
    )


def _wait_for(proc: subprocess.Popen, tmp_path: Path, ready, timeout_s: float = 150) -> tuple[Path, list[dict]]:
    """The run directory once ``ready(records)`` holds; fails if the run ends or takes too long first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = [p for p in tmp_path.iterdir() if p.is_dir()]
        if runs:
            records = _records(runs[0])
            if ready(records):
                return runs[0], records
        if proc.poll() is not None:
            pytest.fail(f"the run ended early: {proc.stdout.read()[-2000:]} {proc.stderr.read()[-2000:]}")
        time.sleep(0.2)
    pytest.fail(f"the run did not get there within {timeout_s:g} s")


def _family(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        return []


def _cleanup(proc: subprocess.Popen, family: list[psutil.Process]) -> None:
    """Resume and kill what this run started, even if the test failed halfway."""
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.resume()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=30)


def _stopped_or_gone(p: psutil.Process) -> bool:
    try:
        return p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _finish_by(proc: subprocess.Popen, start: dict, limit_s: float) -> tuple[str, str, float]:
    """Wait for the CLI until ``limit_s`` after run_start (wall clock); (stdout, stderr, seconds after run_start)."""
    left = start["wall"] + limit_s - time.time()
    try:
        out, err = proc.communicate(timeout=max(1.0, left))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run was still going {limit_s:g} s after its run_start (budget {BUDGET_S} s): it hung")
    return out, err, time.time() - start["wall"]


def test_a_frozen_control_plane_is_recorded_and_the_run_still_ends_at_its_budget(tmp_path):
    proc = _start(tmp_path)
    family: list[psutil.Process] = []
    try:
        run_dir, records = _wait_for(proc, tmp_path, lambda rs: any(r["type"] == "trial_start" for r in rs))
        start = records[0]
        family = _family(proc)
        gcs = [p for p in family if p.name() == "gcs_server"]
        assert len(gcs) == 1, [p.name() for p in family]  # this run's own GCS: a descendant of its CLI process
        gcs[0].suspend()
        frozen_t = time.time() - start["wall"] + start["t"]  # on the ledger's clock
        out, err, took = _finish_by(proc, start, BUDGET_S + BUDGET_GRACE_S + 2 * SHUTDOWN_WAIT_S + MARGIN_S)
        assert _stopped_or_gone(gcs[0])  # frozen to the end (the run killed it, or it is still stopped)
    finally:
        _cleanup(proc, family)
    assert proc.returncode == 0, err[-3000:]
    records = _records(run_dir)
    stop = records[-1]
    assert stop["type"] == "run_stop" and stop["status"] == "completed", stop
    assert BUDGET_S <= stop["t"] <= BUDGET_S + BUDGET_GRACE_S, stop
    silent = stop.get("control_plane_silent_t")
    assert silent is not None, stop
    assert frozen_t - 3 <= silent <= frozen_t + 3, (silent, frozen_t)
    assert stop["control_plane_silent_s"] >= BUDGET_S - frozen_t - 3, stop
    assert "control plane" in out and "stopped answering" in out, out[-3000:]
    # Training went on without the control plane: epochs were counted after it froze.
    assert any(r["type"] == "epoch" and r["t"] > frozen_t + 2 for r in records)
    checked = run_cli("verify", str(run_dir), timeout=120)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    print(f"frozen at t={frozen_t:.1f} s, recorded silent at t={silent:.1f} s; run_stop at t={stop['t']:.1f} s; "
          f"CLI done {took:.1f} s after run_start")  # fmt: skip


def _worker_processes(family: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in family:
        with contextlib.suppress(psutil.Error):
            if "TrialWorker" in " ".join(p.cmdline()) or "TrialWorker" in p.name():
                out.append(p)
    return out


def test_a_frozen_worker_is_recorded_and_its_trial_ends_unresponsive(tmp_path):
    proc = _start(tmp_path)
    family: list[psutil.Process] = []
    try:
        # Both workers past their start-up (each has begun a trial): one frozen while still starting never
        # registers, so it cannot be recorded unresponsive (a loaded box can start the second a minute late).
        run_dir, records = _wait_for(
            proc,
            tmp_path,
            lambda rs: (
                sum(r["type"] == "epoch" for r in rs) >= 2
                and len({r["worker"] for r in rs if r["type"] == "trial_start"}) == 2
            ),
        )
        start = records[0]
        family = _family(proc)
        workers = _worker_processes(family)
        assert len(workers) == 2, [(p.name(), p.cmdline()[:2]) for p in family]
        frozen = workers[0]
        frozen.suspend()
        frozen_t = time.time() - start["wall"] + start["t"]
        _, err, took = _finish_by(proc, start, BUDGET_S + BUDGET_GRACE_S + 2 * SHUTDOWN_WAIT_S + MARGIN_S)
    finally:
        _cleanup(proc, family)
    assert proc.returncode == 0, err[-3000:]
    records = _records(run_dir)
    stop = records[-1]
    assert stop["type"] == "run_stop" and stop["t"] <= BUDGET_S + BUDGET_GRACE_S, stop
    silent = [r for r in records if r["type"] == "worker" and "unresponsive" in (r.get("retired") or "")]
    assert len(silent) == 1, [r.get("retired") for r in records if r["type"] == "worker"]
    worker = silent[0]["worker"]
    ends = [r for r in records if r["type"] == "trial_end" and r["worker"] == worker and r["t"] > frozen_t]
    assert [e["status"] for e in ends] == ["unresponsive"], ends
    end = ends[0]
    # The epochs it completed before it froze count; the one it was in when it froze does not.
    epochs = [
        r for r in records if r["type"] == "epoch" and r["trial"] == end["trial"] and r["attempt"] == end["attempt"]
    ]
    assert end["epochs"] == (epochs[-1]["epoch"] if epochs else end["epochs"])
    assert all(r["t"] <= frozen_t + 1 for r in epochs)
    checked = run_cli("verify", str(run_dir), timeout=120)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    print(f"worker {worker} frozen at t={frozen_t:.1f} s; trial {end['trial']} ended {end['status']}: {end['reason']}; "
          f"CLI done {took:.1f} s after run_start")  # fmt: skip
