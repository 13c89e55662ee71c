"""Faults on a real (simulated multi-node) Ray cluster: a node dies mid-run, a node joins late,
the master dies and the run is resumed. Each node of the simulated cluster is its own set of
Ray processes (launch/local_cluster.sh), so killing one is what a node crash looks like to Ray.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from helpers import REPO, aiperf_cmd, cli_env, killed_if_left, start_cli

from aiperf.cluster.ray_session import non_loopback_listeners
from aiperf.ledger.store import read_raw_ledger

pytestmark = pytest.mark.slow

LOCAL_CLUSTER = REPO / "launch" / "local_cluster.sh"


class LocalCluster:
    """launch/local_cluster.sh driven from a test, with its own state directory."""

    def __init__(self) -> None:
        # Short path: Ray's Unix socket paths under it must stay below ~107 characters.
        self.dir = Path(tempfile.mkdtemp(prefix="alc-", dir="/tmp"))
        self.env = cli_env()
        self.env.update(
            AIPERF_CLUSTER_DIR=str(self.dir), AIPERF_HEAD_CPUS="0", AIPERF_NODE_CPUS="1", AIPERF_PYTHON=sys.executable
        )
        for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
            self.env.pop(key, None)

    def sh(self, *args: str) -> str:
        proc = subprocess.run(
            ["bash", str(LOCAL_CLUSTER), *args], env=self.env, capture_output=True, text=True, timeout=180
        )
        assert proc.returncode == 0, f"local_cluster.sh {' '.join(args)}: {proc.stderr[-2000:]}"
        return proc.stdout

    def driver_env(self) -> dict[str, str]:
        env = dict(self.env)
        exports = self.sh("env").split()[1:]  # "export K=V K=V ..."
        env.update(item.split("=", 1) for item in exports)
        return env

    def pgids(self) -> list[int]:
        return [int(p.read_text()) for p in sorted(self.dir.glob("node*.pgid"))]

    def processes(self) -> set[int]:
        """Every process of every node: the node's process group and all its descendants."""
        groups = set(self.pgids())
        out = set()
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) in groups:
                    out.add(proc.pid)
                    out.update(c.pid for c in proc.children(recursive=True))
            except (psutil.Error, ProcessLookupError):
                continue
        return out


@pytest.fixture
def cluster():
    c = LocalCluster()
    try:
        yield c
    finally:
        groups = c.pgids()
        subprocess.run(["bash", str(LOCAL_CLUSTER), "stop"], env=c.env, capture_output=True, timeout=120)
        for g in groups:  # whatever survived a clean stop (should be nothing)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(g, signal.SIGKILL)
        shutil.rmtree(c.dir, ignore_errors=True)


def _wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the run ended before {what}: {proc.stdout.read()[-3000:]}")
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def _records(results: Path) -> list[dict]:
    runs = [p for p in results.iterdir() if (p / "ledger.jsonl").exists()] if results.exists() else []
    return read_raw_ledger(runs[0]) if runs else []


def _check_ledger_consistent(records: list[dict]) -> None:
    started = {r["trial"] for r in records if r["type"] == "trial_start"}
    ended = Counter(r["trial"] for r in records if r["type"] == "trial_end")
    epochs = [(r["trial"], r["attempt"], r["epoch"]) for r in records if r["type"] == "epoch"]
    assert len(epochs) == len(set(epochs)), "an epoch was counted twice"
    assert all(t in started for t, _, _ in epochs), "an epoch of a trial that never started"
    assert set(ended) == started and set(ended.values()) == {1}, "every started trial ends exactly once"
    for prev, rec in itertools.pairwise(records):
        assert rec["prev"] == prev["hash"] and rec["seq"] == prev["seq"] + 1, "the hash chain is broken"


def _check_summary_counts_epochs(run_dir: Path, records: list[dict]) -> None:
    done = subprocess.run(aiperf_cmd("summary", str(run_dir)), capture_output=True, text=True, env=cli_env())
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    epochs = [r for r in records if r["type"] == "epoch"]
    assert summary["trials"]["epochs_counted"] == len(epochs)
    assert summary["score"]["total_ops"] == pytest.approx(sum(r["ops"] for r in epochs))


def test_node_death_requeues_its_trial_and_late_nodes_are_used(cluster, tmp_path):
    cluster.sh("start", "3")  # a head without CPUs (the master's node) and two 1-CPU worker nodes
    token = Path(cluster.driver_env()["RAY_AUTH_TOKEN_PATH"])
    assert token.stat().st_mode & 0o777 == 0o600
    ray_pids = cluster.processes()
    assert len(ray_pids) >= 6
    assert non_loopback_listeners(ray_pids) == [], "the simulated cluster must listen on loopback only"

    results = tmp_path / "results"
    run = start_cli(
        "run", "--config", "smoke", "--set", f"run.results_dir={results}", "--set", "run.time_budget_s=80",
        env=cluster.driver_env(),
    )  # fmt: skip
    with killed_if_left(run):
        first = _wait_for(lambda: _records(results), 120, "the run to start", run)
        node_of = {
            n["node_id"]: int(k.rsplit("_", 1)[1])
            for n in first[0]["system"]["nodes"]
            for k in n["resources"]
            if k.startswith("aiperf_local_node_")
        }
        assert sorted(node_of.values()) == [0, 1, 2]
        assert first[0]["plan"]["concurrency"] == 2, "one trial per 1-CPU worker node, none on the 0-CPU head"
        doomed = next(nid for nid, k in node_of.items() if k == 2)
        _wait_for(
            lambda: any(r["type"] == "trial_start" and r["node"] == doomed for r in _records(results)),
            150,
            "a trial on node 2",
            run,
        )
        cluster.sh("kill", "2")
        assert "node 2: dead" in cluster.sh("status"), "kill returned before the node was gone"
        cluster.sh("add", "1")  # a node joining the running cluster: the pool's sync must use it
        out, _ = run.communicate(timeout=240)
    assert run.returncode == 0, out[-3000:]

    run_dir = next(results.iterdir())
    records = read_raw_ledger(run_dir)
    _check_ledger_consistent(records)
    assert records[-1]["type"] == "run_stop" and records[-1]["status"] == "completed"

    # The killed node's trial was re-queued from its last completed epoch and finished elsewhere.
    requeues = [r for r in records if r["type"] == "requeue"]
    assert requeues, "the trial on the killed node was not re-queued"
    for rq in requeues:
        trial = rq["trial"]
        starts = [r for r in records if r["type"] == "trial_start" and r["trial"] == trial]
        assert starts[0]["node"] == doomed and starts[0]["attempt"] == 0
        earlier = [r for r in records if r["type"] == "epoch" and r["trial"] == trial and r["attempt"] == 0]
        assert rq["from_epoch"] == len(earlier)
        retry = [r for r in starts if r["attempt"] == rq["attempt"]]
        end = next(r for r in records if r["type"] == "trial_end" and r["trial"] == trial)
        if retry:
            # Its checkpoint stayed on the dead node (weights stay where they were trained): the next
            # attempt says it was lost and starts again at epoch 0, from the trial's parent if it had one.
            assert retry[0]["node"] != doomed and retry[0]["start_epoch"] == 0
            if rq["from_epoch"]:
                assert "the checkpoint of epoch" in retry[0]["weights_lost"]
            assert end["status"] in ("completed", "stopped")
        else:  # the run ended before a worker was free for it
            assert end["status"] == "stopped"
    for start in [r for r in records if r["type"] == "trial_start" and r.get("weights_lost")]:
        assert start["start_epoch"] == 0  # whatever was lost, the attempt starts over
        if "fresh initialisation" in start["weights_lost"]:
            assert start["inherit"] is None
    killed_at = min(r["t"] for r in requeues)
    assert not [r for r in records if r["type"] == "epoch" and r["node"] == doomed and r["t"] > killed_at]
    lost = [r for r in records if r["type"] == "worker" and r["node"] == doomed]
    assert lost and lost[0]["retired"] != "run ended", "the dead node's worker was not retired as lost"

    # The node that joined during the run got a worker and ran trials.
    late = {r["node"] for r in records if r["type"] == "trial_start"} - set(node_of)
    assert len(late) == 1, "no trial ran on the node that joined late"
    _check_summary_counts_epochs(run_dir, records)

    procs = []
    for pid in cluster.processes():  # now also the trial workers the raylets started
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    cluster.sh("stop")
    _wait_for(lambda: not _alive(procs), 60, "every process of the cluster to exit after stop")


def test_master_death_then_resume_continues_the_same_run(tmp_path):
    results = tmp_path / "results"
    env = cli_env()
    env.pop("RAY_ADDRESS", None)
    # It ends on a trial count: the resumed master proposes the trials left (ids go on from the first's).
    bounds = ("--set", "run.max_trials=10", "--set", "run.time_budget_s=300")
    first = start_cli("run", "--config", "smoke", "--set", f"run.results_dir={results}", *bounds, env=env)
    family: list[psutil.Process] = []
    try:
        _wait_for(lambda: sum(r["type"] == "epoch" for r in _records(results)) >= 2, 180, "two epochs", first)
        family = psutil.Process(first.pid).children(recursive=True)
        names = {p: " ".join(p.cmdline()) for p in family}
        assert any("raylet" in cmd for cmd in names.values()), "the run's own Ray processes were not found"
        core = [p for p, cmd in names.items() if "Agent" not in cmd]
        first.send_signal(signal.SIGKILL)  # the master dies; only the CLI process is killed
        first.wait(timeout=30)
        # Its Ray processes share its fate: the GCS, the raylet and the workers go at once; Ray's
        # agents notice their raylet is gone and follow within about a minute (checked at the end).
        _wait_for(lambda: not _alive(core), 30, "the dead master's GCS, raylet and workers to exit")
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)

    run_dir = next(results.iterdir())
    before = read_raw_ledger(run_dir)
    assert not any(r["type"] == "run_stop" for r in before)
    running = {r["trial"] for r in before if r["type"] == "trial_start"} - {
        r["trial"] for r in before if r["type"] == "trial_end"
    }
    last_id = max(int(r["trial"][1:]) for r in before if r["type"] == "trial_start")

    resumed = subprocess.run(
        aiperf_cmd("run", "--resume", str(run_dir)), capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    records = read_raw_ledger(run_dir)
    assert records[: len(before)] == before, "resume changed records written before the master died"
    _check_ledger_consistent(records)  # one hash chain across both masters
    resume = records[len(before)]
    assert resume["type"] == "resume" and resume["from_seq"] == before[-1]["seq"]
    assert resume["gap_s"] > 0 and resume["t"] >= before[-1]["t"] + resume["gap_s"] - 1e-3
    closed = records[len(before) + 1 : len(before) + 1 + len(running)]
    assert {r["trial"] for r in closed} == running
    assert all(r["type"] == "trial_end" and r["status"] == "lost" for r in closed)
    new_starts = [r for r in records[len(before) :] if r["type"] == "trial_start"]
    assert new_starts, "the resumed run started no trial"
    assert min(int(r["trial"][1:]) for r in new_starts) > last_id
    assert records[-1]["type"] == "run_stop" and records[-1]["status"] == "completed"
    _check_summary_counts_epochs(run_dir, records)
    # The score's time is the run's recorded end on the master's clock, the downtime included.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["score"]["wall_s"] == pytest.approx(records[-1]["t"])
    assert summary["score"]["wall_s"] >= resume["gap_s"] + before[-1]["t"] - 1e-3
    try:
        _wait_for(lambda: not _alive(family), 60, "the dead master's Ray agents to exit")
    finally:
        for p in _alive(family):
            p.kill()


def test_node_agents_on_two_nodes_keep_every_worker_fed_and_children_find_their_parents(cluster, tmp_path):
    # cluster.actors=per_node across real nodes: a child's parent lives in the other node's object store.
    # Sets the agent put itself were freed under the master (ReferenceCountingAssertionError on collecting
    # them) and children then waited on their parents: one slot per node starved (6 trials against 67).
    # So were keeper-owned sets whose references a batched call's stream carried (7 runs of 9): the stream
    # now names each set by its keeper's key and the master takes the reference from the keeper.
    cluster.env["AIPERF_NODE_CPUS"] = "2"
    cluster.sh("start", "3")  # a head without CPUs and two 2-CPU nodes: two workers per node agent
    results = tmp_path / "results"
    run = start_cli(
        "run", "--config", "smoke", "--set", "cluster.actors=per_node", "--set", "run.time_budget_s=60",
        "--set", f"run.results_dir={results}",
        env=cluster.driver_env(),
    )  # fmt: skip
    with killed_if_left(run):
        out, _ = run.communicate(timeout=300)
    assert run.returncode == 0, out[-3000:]
    assert "could not be collected" not in out and "could not be taken" not in out, out[-3000:]
    records = read_raw_ledger(next(results.iterdir()))
    _check_ledger_consistent(records)
    assert records[0]["plan"]["actors"] == "per_node" and records[0]["plan"]["concurrency"] == 4
    starts = [r for r in records if r["type"] == "trial_start"]
    per_worker = Counter(r["worker"] for r in starts)
    assert len(per_worker) == 4 and min(per_worker.values()) >= max(per_worker.values()) / 3, per_worker
    # Started by launch/local_cluster.sh: the node agents' worker processes train at niceness 0, not Ray's 15.
    assert sorted((r["worker"], r["niceness"]) for r in records if r["type"] == "worker") == [
        (w, 0) for w in sorted(per_worker)
    ]
    assert len({r["node"] for r in starts}) == 2
    assert not [r for r in starts if r.get("weights_lost")], "a parent's weights could not be fetched"
    assert [r for r in starts if r["inherit"]], "no child inherited"
    kept = [r for r in records if r["type"] == "weights"]
    assert kept and {r["trial"] for r in kept} <= {r["trial"] for r in starts}
