"""launch/aiperf.sbatch under a real Slurm: a controller and two ``slurmd`` on this host (issue 46).

Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them where apt can): ``munged`` with a key
of its own, ``slurmctld`` and two ``slurmd`` (nodes n1, n2 on distinct ports), all under a folder
of this test's, stopped at the end. Each job runs the real launcher with this checkout's Python:
a completed smoke job that verifies, a worker step killed mid-run, ``scancel`` mid-run (nothing
left behind: no token, no Ray process, no temporary folder) and a job whose time limit is
shorter than its run (refused before the run starts). Skipped, with the reason, where Slurm is
not installed or the test does not run as root (the daemons need it).

The two Ray nodes share this host, so every fixed Ray port is 0 (any free port) but the head's own
(GCS, client server).
They listen on this host's address (Ray binds to the node address ``ray start`` is given; only
``launch/local_node.py`` can keep a node on loopback), with the job's token, for the test's length.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import REPO, aiperf_cmd, cli_env

from aiperf.ledger.store import read_raw_ledger

pytestmark = pytest.mark.slow

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "squeue", "sinfo")
KILL_WAIT_S = 30  # Slurm's default: SIGTERM to every process of a cancelled job, SIGKILL this long after


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RealSlurm:
    """A controller and two compute daemons on this host, configured under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge.socket"
        self.env = {**cli_env(), "SLURM_CONF": str(self.conf)}
        self.pids: list[int] = []

    def start(self) -> None:
        root = self.root
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        subprocess.run(
            ["munged", "--force", f"--key-file={key}", f"--socket={self.munge_socket}", f"--pid-file={root}/munged.pid",
             f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        ctld, n1, n2 = _free_port(), _free_port(), _free_port()
        for folder in ("state", "spool-n1", "spool-n2"):
            (root / folder).mkdir()
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=aiperftest",
                    f"SlurmctldHost={self.host}(127.0.0.1)",
                    f"SlurmctldPort={ctld}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "CredType=cred/munge",
                    f"StateSaveLocation={root}/state",
                    f"SlurmdSpoolDir={root}/spool-%n",
                    f"SlurmctldPidFile={root}/slurmctld.pid",
                    f"SlurmdPidFile={root}/slurmd-%n.pid",
                    f"SlurmctldLogFile={root}/slurmctld.log",
                    f"SlurmdLogFile={root}/slurmd-%n.log",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "SchedulerType=sched/builtin",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    f"KillWait={KILL_WAIT_S}",
                    "InactiveLimit=0",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    f"NodeName=n1 NodeHostname={self.host} NodeAddr=127.0.0.1 Port={n1} CPUs=2 State=UNKNOWN",
                    f"NodeName=n2 NodeHostname={self.host} NodeAddr=127.0.0.1 Port={n2} CPUs=2 State=UNKNOWN",
                    "PartitionName=test Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE",
                    "",
                ]
            )
        )
        subprocess.run(["slurmctld", "-c", "-f", str(self.conf)], check=True, env=self.env, timeout=60)
        for node in ("n1", "n2"):
            subprocess.run(["slurmd", "-c", "-f", str(self.conf), "-N", node], check=True, env=self.env, timeout=60)
        deadline = time.monotonic() + 90
        states = ""
        while time.monotonic() < deadline:
            states = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout
            if states.count("idle") == 2:
                return
            time.sleep(1)
        raise AssertionError(f"the two slurmd did not become idle: {states!r}; see {root}")

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        for pid_file in sorted(self.root.glob("*.pid")):
            with contextlib.suppress(ValueError, OSError, ProcessLookupError):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
        time.sleep(2)
        for pid_file in sorted(self.root.glob("*.pid")):
            with contextlib.suppress(ValueError, OSError, ProcessLookupError):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)

    def sbatch(self, job_dir: Path, results: Path, *run_args: str, slurm_args: tuple[str, ...] = ()) -> str:
        """Submit the launcher on both nodes; returns the job id."""
        env = {
            **self.env,
            "AIPERF_REPO": str(REPO),
            "AIPERF_PYTHON": sys.executable,
            "AIPERF_JOB_DIR": str(job_dir),
            "AIPERF_POLL_S": "1",
            "AIPERF_START_TIMEOUT_S": "120",
            "AIPERF_RAY_PORT": str(_free_port()),
            "AIPERF_CLIENT_PORT": str(_free_port()),  # the head's alone; Ray refuses 0 for it
            **{f"AIPERF_{name}_PORT": "0" for name in ("NODE_MANAGER", "OBJECT_MANAGER", "AGENT_GRPC", "AGENT_HTTP",
                                                        "RUNTIME_ENV", "METRICS")},
        }  # fmt: skip
        out = subprocess.run(
            ["sbatch", "--parsable", "--nodes=2", f"--output={job_dir}.out", f"--chdir={self.root}", *slurm_args,
             str(REPO / "launch" / "aiperf.sbatch"), "--config", "smoke", "--set", f"run.results_dir={results}",
             *run_args],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields, or {} once the controller forgot the job."""
        out = self.run("scontrol", "show", "job", job_id, "-o").stdout
        return dict(item.split("=", 1) for item in out.split() if "=" in item)

    def wait_done(self, job_id: str, timeout_s: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", None):
                return fields
            time.sleep(1)
        self.run("scancel", job_id)
        raise AssertionError(f"job {job_id} did not end within {timeout_s:g} s: {fields}")


@pytest.fixture(scope="module")
def slurm() -> Iterator[RealSlurm]:
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        pytest.skip(f"Slurm is not installed here ({', '.join(missing)} missing: apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        pytest.skip("the Slurm daemons of this test need root")
    root = Path(tempfile.mkdtemp(prefix="asl-", dir="/tmp"))  # short: Ray's socket paths live under the job dirs
    cluster = RealSlurm(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _run_dir(results: Path) -> Path:
    (run,) = [p for p in results.iterdir() if (p / "ledger.jsonl").exists()]
    return run


def _wait_for(what: str, predicate, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, ValueError, OSError, StopIteration):
            if predicate():
                return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def _epochs(results: Path) -> int:
    return sum(r["type"] == "epoch" for r in read_raw_ledger(_run_dir(results)))


def _left_behind(job_id: str, job_dir: Path) -> list[str]:
    """What a job may not leave: its token, Ray processes of its, Ray temporary folders of its."""
    left = [str(job_dir / "ray_auth_token")] if (job_dir / "ray_auth_token").exists() else []
    left += [str(p) for p in Path("/tmp").glob(f"aiperf-ray-{job_id}-*")]
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(proc.info["cmdline"] or [])
            if f"aiperf-ray-{job_id}-" in cmd or str(job_dir) in cmd:
                left.append(f"process {proc.pid}: {cmd[:120]}")
    return left


def _verify(run: Path) -> subprocess.CompletedProcess:
    return subprocess.run(aiperf_cmd("verify", str(run)), capture_output=True, text=True, env=cli_env(), timeout=120)


def test_a_job_completes_and_verifies_even_with_a_worker_step_killed_mid_run(slurm, tmp_path):
    # One job for two things a job must do (a job costs about a minute of CI): complete and verify on both
    # nodes, and survive the loss of the node that is not the head by re-queueing its trial.
    job_dir, results = slurm.root / "j-kill", tmp_path / "results"
    submitted = time.time()
    job = slurm.sbatch(job_dir, results, "--set", "run.time_budget_s=90")

    def training_on_n2() -> bool:  # n2 is the node that is not the head; its step is killed while it trains
        records = read_raw_ledger(_run_dir(results))
        (n2,) = [n["node_id"] for n in records[0]["system"]["nodes"] if not n["is_head"]]
        started = {r["trial"] for r in records if r["type"] == "trial_start" and r["node"] == n2}
        return _epochs(results) >= 1 and bool(started - {r["trial"] for r in records if r["type"] == "trial_end"})

    _wait_for("a trial training on n2 after a first epoch", training_on_n2, 300)
    steps = slurm.run("squeue", "-h", "-s", "-j", job, "-o", "%i %N").stdout.split("\n")
    (worker_step,) = [line.split()[0] for line in steps if line.strip().endswith(" n2")]
    assert slurm.run("scancel", "--signal=KILL", worker_step).returncode == 0
    fields = slurm.wait_done(job, 400)
    log = Path(f"{job_dir}.out").read_text()
    assert fields["JobState"] == "COMPLETED", log[-3000:]
    records = read_raw_ledger(_run_dir(results))
    assert records[-1]["type"] == "run_stop" and records[-1]["status"] == "completed"
    assert len(records[0]["system"]["nodes"]) == 2, "both Slurm nodes joined the run"
    assert {r["niceness"] for r in records if r["type"] == "worker"} == {0}, "Ray's default would be 15"
    workers = [(r["worker"], r["node"], r["retired"]) for r in records if r["type"] == "worker"]
    assert [r for r in records if r["type"] == "requeue"], f"the killed node's trial was not re-queued: {workers}"
    assert _verify(_run_dir(results)).returncode == 0
    # The job's two nodes, as the launcher told the run, against the two that trained (n2 did before its death).
    assert records[0]["plan"]["planned_nodes"] == 2
    summary = json.loads((_run_dir(results) / "summary.json").read_text())
    assert (summary["devices"]["planned_nodes"], summary["devices"]["trained_nodes"]) == (2, 2)
    [rule] = [r for r in summary["verdict"]["rules"] if r["name"] == "planned nodes"]
    assert rule["passed"], rule
    # A node killed with SIGKILL cannot remove its temporary folder (as after a crash); the others are gone.
    killed = f"/tmp/aiperf-ray-{job}-n2"
    _wait_for("the job's processes to be gone", lambda: not set(_left_behind(job, job_dir)) - {killed}, 30)
    shutil.rmtree(killed, ignore_errors=True)
    # The timeline docs/cluster.md states (pytest -s shows it).
    print(f"slurm job: submitted to run_start {records[0]['wall'] - submitted:.1f} s, run {records[-1]['t']:.1f} s,"
          f" submitted to job end {time.time() - submitted:.1f} s")  # fmt: skip


def test_scancel_mid_run_ends_it_interrupted_and_leaves_nothing(slurm, tmp_path):
    job_dir, results = slurm.root / "j-cancel", tmp_path / "results"
    job = slurm.sbatch(job_dir, results, "--set", "run.time_budget_s=600")
    _wait_for("a first epoch", lambda: _epochs(results) >= 1, 300)
    cancelled = time.monotonic()
    assert slurm.run("scancel", job).returncode == 0
    slurm.wait_done(job, 120)
    _wait_for("the job's processes to be gone", lambda: not _left_behind(job, job_dir), 60)
    teardown_s = time.monotonic() - cancelled
    records = read_raw_ledger(_run_dir(results))
    log = Path(f"{job_dir}.out").read_text()
    assert records[-1]["type"] == "run_stop" and records[-1]["status"] == "interrupted", (records[-1], log[-3000:])
    ends = [r for r in records if r["type"] == "trial_end"]
    assert ends and not [r for r in ends if r["status"] == "unresponsive"], "the job's end is not a fault"
    telemetry = json.loads((_run_dir(results) / "summary.json").read_text()).get("telemetry") or {}
    assert not telemetry.get("nodes_lost"), f"nodes the job's end stopped counted as lost: {telemetry}"
    assert teardown_s < KILL_WAIT_S + 5, f"the teardown outlived KillWait: {teardown_s:.0f} s"
    print(f"slurm job: scancel to nothing left {teardown_s:.1f} s (KillWait {KILL_WAIT_S} s)")


def test_a_job_shorter_than_its_run_is_refused_before_the_run_starts(slurm, tmp_path):
    job_dir, results = slurm.root / "j-short", tmp_path / "results"
    # Five minutes against a run that needs eleven: on a loaded CI box the job's start-up (its head, Ray on both
    # nodes) took 70 s of a two-minute job, which left no time for any run and so gave the other advice.
    job = slurm.sbatch(job_dir, results, "--set", "run.time_budget_s=600", slurm_args=("--time=5",))
    fields = slurm.wait_done(job, 300)
    log = Path(f"{job_dir}.out").read_text()
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "2:0", (fields, log[-3000:])
    assert "--must-end-by" in log and "lower run.time_budget_s to at most" in log, log[-3000:]
    assert not results.exists() or not any(results.iterdir()), "a run was started"
    _wait_for("the job's processes to be gone", lambda: not _left_behind(job, job_dir), 30)
