"""One Ray actor per worker against one node agent per node, on the local multi-node cluster.

Starts ``launch/local_cluster.sh`` (a head without CPUs and ``--nodes`` worker nodes of
``--cpus`` CPUs each, every node its own raylet), then runs the same ``aiperf run --config smoke``
once per ``cluster.actors`` mode and reads what each did from its ledger and the process table:

* **actors**: the Ray actor processes the run had while it trained (``ray::RayTrialWorker``,
  ``ray::WeightKeeper``, ``ray::NodeAgent``; the telemetry samplers, one per node in both modes,
  are listed apart). Each is an actor in Ray's control plane, which is what grows with the machine.
* **start-up**: seconds from ``run_start`` until every worker had begun its first trial (the
  last worker's first ``trial_start``), and the workers' own start-up (``init_s``, mean and max).
* **event rate**: the master's records of trial events (``trial_start``, ``epoch``, ``trial_end``)
  per second of run, and the master process's CPU seconds per such record.

    PYTHONPATH=. python benchmarks/node_agents.py --nodes 2 --cpus 2 --budget 120

Run it on an otherwise idle machine: both modes share its cores with the cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
LOCAL_CLUSTER = REPO / "launch" / "local_cluster.sh"
ACTOR_KINDS = ("RayTrialWorker", "WeightKeeper", "NodeAgent", "NodeSampler")
TRIAL_EVENTS = ("trial_start", "epoch", "trial_end")


class Cluster:
    """launch/local_cluster.sh with a state directory of its own."""

    def __init__(self, nodes: int, cpus: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="alc-", dir="/tmp"))
        self.env = dict(os.environ)
        self.env.update(
            AIPERF_CLUSTER_DIR=str(self.dir),
            AIPERF_HEAD_CPUS="0",
            AIPERF_NODE_CPUS=str(cpus),
            AIPERF_PYTHON=sys.executable,
        )
        for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
            self.env.pop(key, None)
        self.sh("start", str(nodes + 1))

    def sh(self, *args: str) -> str:
        done = subprocess.run(["bash", str(LOCAL_CLUSTER), *args], env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"local_cluster.sh {' '.join(args)}: {done.stderr[-2000:]}")
        return done.stdout

    def driver_env(self) -> dict[str, str]:
        env = dict(self.env)
        env.update(item.split("=", 1) for item in self.sh("env").split()[1:])  # "export K=V K=V ..."
        env["PYTHONPATH"] = str(REPO)
        return env

    def actor_processes(self) -> dict[str, int]:
        """Ray actor processes on every node, by actor class."""
        groups = {int(p.read_text()) for p in self.dir.glob("node*.pgid")}
        counts = dict.fromkeys(ACTOR_KINDS, 0)
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if os.getpgid(proc.pid) not in groups and not _under(proc, groups):
                    continue
                line = " ".join(proc.info["cmdline"] or [])
            except (psutil.Error, ProcessLookupError):
                continue
            for kind in ACTOR_KINDS:
                if line.startswith(f"ray::{kind}"):
                    counts[kind] += 1
        return counts

    def stop(self) -> None:
        subprocess.run(["bash", str(LOCAL_CLUSTER), "stop"], env=self.env, capture_output=True, timeout=120)
        shutil.rmtree(self.dir, ignore_errors=True)


def _under(proc: psutil.Process, groups: set[int]) -> bool:
    """Whether one of ``proc``'s ancestors leads a node's process group (Ray gives workers groups of their own)."""
    try:
        return any(parent.pid in groups for parent in proc.parents())
    except psutil.Error:
        return False


def run_mode(cluster: Cluster, mode: str, budget: float, results: Path) -> dict[str, Any]:
    """One ``aiperf run`` with ``cluster.actors=mode``; what its ledger and the process table say."""
    sets = [f"cluster.actors={mode}", f"run.time_budget_s={budget:g}", f"run.results_dir={results}"]
    cmd = [sys.executable, "-m", "aiperf.cli", "run", "--config", "smoke"]
    for item in sets:
        cmd += ["--set", item]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    proc = subprocess.Popen(cmd, env=cluster.driver_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    actors: dict[str, int] = {}
    while proc.poll() is None:
        time.sleep(2.0)
        if time.monotonic() - began > budget / 2:  # while it trains: every worker is up
            counts = cluster.actor_processes()
            actors = {k: max(v, actors.get(k, 0)) for k, v in counts.items()}
    out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"aiperf run ({mode}) failed:\n{out[-3000:]}")
    run_dir = next(p for p in results.iterdir() if (p / "ledger.jsonl").exists())
    records = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    first_start: dict[str, float] = {}
    for r in records:
        if r["type"] == "trial_start":
            first_start.setdefault(r["worker"], r["t"])
    workers = [r for r in records if r["type"] == "worker"]
    inits = [r["init_s"] for r in workers if r.get("init_s") is not None]
    events = sum(r["type"] in TRIAL_EVENTS for r in records)
    length = records[-1]["t"]
    master_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {
        "mode": mode,
        "actors": actors,
        "workers": len(workers),
        "all_started_s": max(first_start.values()) if first_start else None,
        "init_s_mean": sum(inits) / len(inits) if inits else None,
        "init_s_max": max(inits) if inits else None,
        "trial_events": events,
        "run_s": length,
        "events_per_s": events / length if length else None,
        "master_cpu_s": master_cpu,
        "master_cpu_ms_per_event": 1000 * master_cpu / events if events else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2, help="worker nodes (besides a head without CPUs)")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs per worker node (one worker each)")
    parser.add_argument("--budget", type=float, default=120.0, help="run.time_budget_s of each run")
    parser.add_argument("--modes", default="per_worker,per_node")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    cluster = Cluster(args.nodes, args.cpus)
    rows = []
    try:
        for mode in args.modes.split(","):
            with tempfile.TemporaryDirectory(prefix="aiperf-agents-") as tmp:
                rows.append(run_mode(cluster, mode, args.budget, Path(tmp)))
    finally:
        cluster.stop()
    print(f"{args.nodes} worker node(s) x {args.cpus} CPU(s), smoke config, {args.budget:g} s budget")
    head = f"{'mode':<11}{'actors':>8}{'workers':>9}{'all started':>13}{'init mean/max':>16}{'events/s':>10}"
    print(head + f"{'master CPU/event':>18}")
    for r in rows:
        trial_actors = sum(v for k, v in r["actors"].items() if k != "NodeSampler")
        init = f"{r['init_s_mean']:.1f}/{r['init_s_max']:.1f} s" if r["init_s_mean"] is not None else "-"
        print(
            f"{r['mode']:<11}{trial_actors:>8}{r['workers']:>9}{r['all_started_s']:>12.1f}s{init:>16}"
            f"{r['events_per_s']:>10.2f}{r['master_cpu_ms_per_event']:>15.1f} ms"
        )
        print(f"{'':<11}actor processes: {r['actors']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
