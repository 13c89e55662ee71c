"""A local run's Ray instance: reachable on loopback only, token-authenticated, sized by `aiperf plan`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import REPO, aiperf_cmd, cli_env

pytestmark = pytest.mark.slow

# Runs in a fresh interpreter, as `aiperf run` does: Ray is imported before start_ray is called.
_PROBE = """
import json, os
import psutil, ray
from ray._private import ray_constants
from ray._raylet import AuthenticationMode, get_authentication_mode
from aiperf.cluster.ray_session import LOOPBACK_ENV, non_loopback_listeners, ray_process_ids, start_ray

session = start_ray(num_cpus=1)


@ray.remote
def worker_pid():
    return os.getpid()


pid = ray.get(worker_pid.remote())  # a worker process exists now, with its own server
pids = ray_process_ids(os.getpid())
listening = [
    [c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name()]
    for c in psutil.net_connections("tcp")
    if c.status == psutil.CONN_LISTEN and c.pid in pids
]
result = {
    "local": session.local,
    "worker_in_family": pid in pids,
    "listening": listening,
    "exposed": non_loopback_listeners(pids),
    "token_auth": get_authentication_mode() == AuthenticationMode.TOKEN,
}
session.shutdown()
result["cluster_mode_restored"] = ray_constants.ENABLE_RAY_CLUSTER and LOOPBACK_ENV not in os.environ
print(json.dumps(result))
"""


def test_local_ray_listens_on_loopback_only_with_token_auth():
    env = cli_env()
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, cwd=REPO, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["local"] and result["worker_in_family"]
    names = {name for _, _, name in result["listening"]}
    # The check below means something only if it saw Ray's servers: the GCS, the raylet and the worker.
    assert {"gcs_server", "raylet"} <= names, names
    assert len(result["listening"]) >= 4
    assert result["exposed"] == [], f"Ray listens beyond loopback: {result['exposed']}"
    assert result["token_auth"], "Ray's token authentication must stay on"
    assert result["cluster_mode_restored"]


def test_plan_command_sizes_this_machine_without_running_anything(tmp_path):
    proc = subprocess.run(
        aiperf_cmd("plan", "--config", "smoke", "--set", f"run.results_dir={tmp_path}"),
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=REPO,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    head = re.match(r"plan: (\d+) concurrent trials on 1 node\(s\), placement per_cpu_slot", lines[0])
    assert head, lines[0]
    assert int(head.group(1)) >= 2, "a CPU-only machine still runs at least two trials at once"
    node = re.match(r"  node \S+: (\d+) CPUs, [\d.]+ GiB -> (\d+) trial\(s\) x ([\d.]+) CPU$", lines[1])
    assert node, lines[1]
    assert int(node.group(2)) == int(head.group(1))
    assert int(node.group(2)) * float(node.group(3)) <= int(node.group(1)), "more CPUs planned than the node has"
    assert list(tmp_path.iterdir()) == [], "plan must not start a run"


def test_joining_needs_a_listening_address_and_the_clusters_token(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nothing = subprocess.run(
        aiperf_cmd("plan", "--config", "smoke", "--address", f"127.0.0.1:{port}"),
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=REPO,
        timeout=60,
    )
    assert nothing.returncode == 2
    assert (
        nothing.stderr.strip() == f"aiperf: error: cannot join the Ray cluster at 127.0.0.1:{port}: Connection refused"
    )

    state = Path(tempfile.mkdtemp(prefix="alc-", dir="/tmp"))  # short: Ray's socket paths live under it
    env = {**cli_env(), "AIPERF_CLUSTER_DIR": str(state), "AIPERF_PYTHON": sys.executable}
    cluster = REPO / "launch" / "local_cluster.sh"
    try:
        subprocess.run(["bash", str(cluster), "start", "1"], env=env, check=True, capture_output=True, timeout=120)
        address = (state / "address").read_text().strip()
        stranger = {k: v for k, v in cli_env().items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
        refused = subprocess.run(
            aiperf_cmd("plan", "--config", "smoke", "--address", address),
            capture_output=True,
            text=True,
            env=stranger,
            cwd=REPO,
            timeout=120,
        )
        assert refused.returncode == 2, refused.stdout
        assert "InvalidAuthToken" in refused.stderr, "Ray must reject a driver without the cluster's token"
        last = refused.stderr.strip().splitlines()[-1]
        assert last.startswith(f"aiperf: error: cannot join the Ray cluster at {address}") and "RAY_AUTH_MODE" in last
    finally:
        subprocess.run(["bash", str(cluster), "stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(state, ignore_errors=True)
