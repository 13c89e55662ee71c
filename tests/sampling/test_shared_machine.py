"""A machine shared with other work (issue 13, case 8): the run's own CPU time is told apart from
everything else on its hosts, and a significant share outside the run is noted in the verdict,
the summary and the report. (The real run with competing CPU burners is in test_output_safety.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import types

import psutil
import pytest
from helpers import run_cli

from aiperf.sampling.telemetry import (
    SHARED_MACHINE_PERCENT,
    TELEMETRY_NAME,
    NodeSampler,
    RunProcesses,
    cpu_shares,
    shared_machine_notes,
    summarize_telemetry,
)


def _sample(t: float, busy: float, run: float, node: str = "n1", host: str = "h1", cpus: int = 2) -> dict:
    return {"wall": 1000.0 + t, "node_wall": 1000.0 + t, "node": node, "hostname": host, "cpus": cpus,
            "cpu_busy_s": 5000.0 + busy, "run_cpu_s": run, "cpu_percent": 50.0, "accelerators": []}  # fmt: skip


def test_cpu_outside_the_run_is_a_share_of_the_host_capacity():
    # 2 CPUs for 10 s = 20 CPU-s; the host was busy 18 CPU-s, of which the run used 8.
    shares = cpu_shares([_sample(0, 0, 0), _sample(10, 18, 8)])
    assert shares["cpu_outside_percent"] == pytest.approx(50.0)
    assert shares["cpu_run_percent"] == pytest.approx(40.0)
    notes = shared_machine_notes(shares)
    assert notes == ["shared machine: 50 % of CPU time outside the run"]


def test_a_small_share_outside_is_no_note_and_old_samples_are_no_figure():
    quiet = cpu_shares([_sample(0, 0, 0), _sample(10, 19, 18)])
    assert quiet["cpu_outside_percent"] == pytest.approx(5.0) and SHARED_MACHINE_PERCENT > 5.0
    assert shared_machine_notes(quiet) == []
    old = [{k: v for k, v in s.items() if k not in ("cpu_busy_s", "run_cpu_s")} for s in (_sample(0, 0, 0),) * 2]
    assert cpu_shares(old) == {"cpu_run_percent": None, "cpu_outside_percent": None}
    assert summarize_telemetry(old)["cpu_outside_percent"] is None


def test_nodes_sharing_a_host_count_it_once_and_a_resumed_sampler_continues_it():
    rounds = [
        _sample(0, 0, 0, node="a"),
        _sample(0, 0, 0, node="b"),  # a second Ray node on the same host (a simulated cluster)
        _sample(10, 18, 8, node="a"),
        _sample(10, 18, 8, node="b"),
        # the master was resumed: a new sampler on the same host, whose run counter starts again
        _sample(100, 500, 0, node="c"),
        _sample(110, 520, 18, node="c"),
        _sample(115, 510, 20, node="c"),  # a counter that went backwards: that interval is skipped
    ]
    shares = cpu_shares(rounds)
    assert shares["cpu_outside_percent"] == pytest.approx(100.0 * (10 + 2) / 40)
    assert shares["cpu_run_percent"] == pytest.approx(100.0 * (8 + 18) / 40)


def _burner(*extra: str, detached: bool = False) -> subprocess.Popen | int:
    """A busy loop: a child of this process, or (detached) re-parented away from it."""
    code = "import sys\nwhile True: pass"
    if not detached:
        return subprocess.Popen([sys.executable, "-c", code, *extra])
    shell = subprocess.run(
        ["bash", "-c", f'{sys.executable} -c "{code}" {" ".join(extra)} >/dev/null 2>&1 & echo $!'],
        capture_output=True,
        text=True,
        start_new_session=True,
    )
    return int(shell.stdout.strip())


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def test_the_run_is_the_master_its_descendants_and_its_ray_session():
    session = "session_2099-01-01_00-00-00_000000_1"
    me = psutil.Process()
    run = RunProcesses(psutil, session, me.pid, me.create_time())
    child = _burner()
    in_session = _burner(f"--session-dir=/tmp/ray/{session}", detached=True)
    outsider = _burner(detached=True)
    try:
        time.sleep(0.3)
        run.update()  # the first update sets the baselines
        before = {pid: _cpu(pid) for pid in (me.pid, child.pid, in_session, outsider)}
        # Wait for CPU time, not for wall time: on a loaded machine three burners may get little of it.
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and min(_cpu(p) - before[p] for p in (child.pid, in_session, outsider)) < 0.5:
            time.sleep(0.2)
        run.update()
        after = {pid: _cpu(pid) for pid in before}
    finally:
        for pid in (in_session, outsider):
            os.kill(pid, 9)
        child.kill()
        child.wait()
    delta = {pid: after[pid] - before[pid] for pid in before}
    assert child.pid in run.pids and in_session in run.pids and me.pid in run.pids
    assert outsider not in run.pids
    assert delta[outsider] > 0.2, "the outsider must have run for the check to mean anything"
    expected = delta[me.pid] + delta[child.pid] + delta[in_session]
    assert run.cpu_s == pytest.approx(expected, abs=0.3)


class _NVMLError(Exception):
    pass


def test_gpu_time_of_processes_outside_the_run_where_nvml_tells(monkeypatch):
    foreign = _burner(detached=True)
    nvml = types.ModuleType("pynvml")
    samples = {
        0: [],  # nobody used it
        1: [(os.getpid(), 70)],  # only the run
        2: [(os.getpid(), 60), (foreign, 30)],  # the run and a local stranger
        3: [(os.getpid(), 60), (2**22 + 7, 30)],  # a PID this namespace cannot see: unknown
    }

    def utilization(handle, last_seen):
        if handle == 4:
            raise _NVMLError("Not Supported")
        return [types.SimpleNamespace(pid=p, smUtil=u, timeStamp=last_seen + 1) for p, u in samples[handle]]

    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: 5
    nvml.nvmlDeviceGetHandleByIndex = lambda k: k
    nvml.nvmlDeviceGetName = lambda h: "GPU"
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=1, total=2)
    nvml.nvmlDeviceGetPowerUsage = lambda h: 100_000
    nvml.nvmlDeviceGetProcessUtilization = utilization
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    me = psutil.Process()
    try:
        sampler = NodeSampler({"pid": me.pid, "started": me.create_time(), "host": os.uname().nodename})
        outside = [a["outside_util_percent"] for a in sampler.sample()["accelerators"]]
    finally:
        os.kill(foreign, 9)
    assert outside == [0.0, 0.0, 30.0, None, None]
    summary = summarize_telemetry([{"wall": 1.0, "node": "n", "accelerators": [{"outside_util_percent": 30.0}]}])
    assert shared_machine_notes(summary) == ["shared machine: 30 % of GPU time outside the run"]


def _telemetry_run(sim_run, tmp_path, busy: float, run: float):
    run_dir = tmp_path / "run"
    shutil.copytree(sim_run, run_dir)
    lines = [_sample(t, busy * t / 60, run * t / 60, node="sim-node-0", host="sim") for t in range(0, 61, 5)]
    (run_dir / TELEMETRY_NAME).write_text("".join(json.dumps(s) + "\n" for s in lines))
    return run_dir


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=120)


def test_summary_verify_and_report_show_the_shared_machine(sim_run, tmp_path):
    run_dir = _telemetry_run(sim_run, tmp_path, busy=108.0, run=60.0)  # 120 CPU-s capacity, 48 outside
    summary = _cli("summary", str(run_dir))
    assert summary.returncode == 0, summary.stderr
    verdict_line = next(ln for ln in summary.stdout.splitlines() if ln.strip().startswith("verdict"))
    assert verdict_line.endswith("; shared machine: 40 % of CPU time outside the run")
    recorded = json.loads((run_dir / "summary.json").read_text())
    assert recorded["verdict"]["notes"] == ["shared machine: 40 % of CPU time outside the run"]
    assert recorded["verdict"]["valid"] == json.loads((sim_run / "summary.json").read_text())["verdict"]["valid"]
    assert _cli("verify", str(run_dir)).returncode == 0
    report = _cli("report", str(run_dir))
    assert report.returncode == 0, report.stderr
    page = (run_dir / "report.html").read_text()
    assert 'id="verdict-note">shared machine: 40 % of CPU time outside the run</p>' in page


def test_a_machine_to_itself_gets_no_note(sim_run, tmp_path):
    run_dir = _telemetry_run(sim_run, tmp_path, busy=110.0, run=108.0)
    assert _cli("summary", str(run_dir)).returncode == 0
    recorded = json.loads((run_dir / "summary.json").read_text())
    assert "notes" not in recorded["verdict"] and "shared machine" not in recorded["verdict"]["headline"]
    assert recorded["telemetry"]["cpu_outside_percent"] == pytest.approx(100 * 2 / 120)
