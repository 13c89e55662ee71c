"""The Slurm launcher, run against fake `srun`, `scontrol`, `hostname`, `ip`, `ray` and `python`.

The fakes log every call (with the environment that matters) and behave enough like the
real tools for the script to go through a whole job: `srun` runs its command once per
node of --nodelist, each fake `ray start` blocks until SIGTERM, the fake `aiperf plan`
reports how many fake Ray nodes are up.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

SBATCH = REPO / "launch" / "aiperf.sbatch"
RAY_NODE = REPO / "launch" / "ray_node.sh"
LOCAL_CLUSTER = REPO / "launch" / "local_cluster.sh"

FAKES = {
    "scontrol": """
echo "scontrol $*" >> "$FAKE_LOG"
[[ "$1 $2" == "show hostnames" ]] || exit 1
for n in $FAKE_NODES; do echo "$n"; done
""",
    "hostname": """
node=${FAKE_NODE:-unknown}
num=$((10#${node//[!0-9]/}))
if [[ "${1:-}" == "-I" ]]; then echo "10.0.0.$num fd00::$num"; else echo "$node"; fi
""",
    "ip": """
node=${FAKE_NODE:-unknown}
num=$((10#${node//[!0-9]/}))
[[ "$*" == "-o -4 addr show dev ib0" ]] || exit 1
echo "3: ib0    inet 10.9.0.$num/16 brd 10.9.255.255 scope global ib0"
""",
    "srun": """
echo "srun $*" >> "$FAKE_LOG"
nodelist=""
while [[ $# -gt 0 && "$1" == -* ]]; do
    case "$1" in --nodelist=*) nodelist=${1#--nodelist=} ;; esac
    shift
done
pids=()
IFS=, read -ra nodes <<< "$nodelist"
for n in "${nodes[@]}"; do FAKE_NODE=$n "$@" & pids+=($!); done
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait; echo "srun-exit $nodelist" >> "$FAKE_LOG"; exit 0' TERM
wait
echo "srun-exit $nodelist" >> "$FAKE_LOG"
""",
    "ray": """
echo "ray[$FAKE_NODE] $* | auth=$RAY_AUTH_MODE token=$RAY_AUTH_TOKEN_PATH path=$PYTHONPATH" >> "$FAKE_LOG"
[[ -n "${FAKE_RAY_FAIL:-}" ]] && exit 1
touch "$FAKE_STATE/up-$FAKE_NODE"
trap 'rm -f "$FAKE_STATE/up-$FAKE_NODE"; echo "ray-stopped $FAKE_NODE" >> "$FAKE_LOG"; exit 0' TERM
while true; do sleep 0.05; done
""",
    "fakepython": """
if [[ "$1" == "-c" ]]; then exec "$REAL_PYTHON" "$@"; fi
echo "python $* | auth=$RAY_AUTH_MODE mode=$(stat -c %a "$RAY_AUTH_TOKEN_PATH")" >> "$FAKE_LOG"
case "$3" in
    plan)
        [[ -e "$FAKE_STATE/up-$FAKE_HEAD" ]] || { echo "aiperf: error: cannot join" >&2; exit 2; }
        up=$(ls "$FAKE_STATE" | grep -c '^up-')
        echo "plan: $up concurrent trials on $up node(s), placement per_accelerator"
        ;;
    run) exit "${FAKE_RUN_RC:-0}" ;;
esac
""",
}


class FakeSlurm:
    def __init__(self, root: Path, nodes: list[str]) -> None:
        self.bin = root / "bin"
        self.state = root / "state"
        self.job_dir = root / "job"
        self.log = root / "calls.log"
        self.bin.mkdir()
        self.state.mkdir()
        for name, body in FAKES.items():
            path = self.bin / name
            path.write_text("#!/usr/bin/env bash\n" + body)
            path.chmod(0o755)
        self.env = {
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "HOME": os.environ.get("HOME", "/tmp"),
            "USER": "tester",
            "FAKE_LOG": str(self.log),
            "FAKE_STATE": str(self.state),
            "FAKE_NODES": " ".join(nodes),
            "FAKE_HEAD": nodes[0],
            "FAKE_NODE": nodes[0],  # the batch script runs on the first node
            "REAL_PYTHON": sys.executable,
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "node[001-003]",
            "SLURM_CPUS_ON_NODE": "64",
            "SLURM_SUBMIT_DIR": str(root),
            "AIPERF_REPO": str(REPO),
            "AIPERF_JOB_DIR": str(self.job_dir),
            "AIPERF_PYTHON": str(self.bin / "fakepython"),
            "AIPERF_POLL_S": "0.1",
            "AIPERF_START_TIMEOUT_S": "20",
        }

    def sbatch(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(SBATCH), *args], env={**self.env, **env}, capture_output=True, text=True, timeout=120
        )

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()


def _index(calls: list[str], prefix: str) -> int:
    hits = [k for k, line in enumerate(calls) if line.startswith(prefix)]
    assert len(hits) == 1, f"expected one call starting with {prefix!r}: {calls}"
    return hits[0]


def _flags(line: str) -> set[str]:
    return set(line.split(" | ")[0].split())


@pytest.fixture
def slurm(tmp_path):
    return FakeSlurm(tmp_path, ["node001", "node002", "node003"])


def test_gpu_job_starts_head_then_workers_runs_aiperf_and_tears_down(slurm):
    done = slurm.sbatch("--config", "smoke", "--set", "run.time_budget_s=60", SLURM_GPUS_PER_NODE="h100:8")
    assert done.returncode == 0, done.stderr
    calls = slurm.calls()
    assert calls[0] == "scontrol show hostnames node[001-003]"

    head_step = _index(calls, "srun --nodelist=node001 ")
    assert {"--nodes=1", "--ntasks=1", "--cpus-per-task=64", "--gpus-per-task=8", "head"} <= _flags(calls[head_step])
    head = _index(calls, "ray[node001] start --head")
    expected_head = {
        "--block",
        "--node-ip-address=10.0.0.1",
        "--port=6379",
        "--num-cpus=64",
        "--num-gpus=8",
        "--include-dashboard=false",
        "--temp-dir=/tmp/aiperf-ray-4242",
    }
    assert expected_head <= _flags(calls[head])
    token = slurm.job_dir / "ray_auth_token"
    assert f"auth=token token={token} path={REPO}" in calls[head]

    workers_step = _index(calls, "srun --nodelist=node002,node003 ")
    step_flags = _flags(calls[workers_step])
    assert {"--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--gpus-per-task=8"} <= step_flags
    assert calls[workers_step].endswith("ray_node.sh worker 10.0.0.1:6379")
    for k, node in ((2, "node002"), (3, "node003")):
        line = calls[_index(calls, f"ray[{node}] start ")]
        assert {"--address=10.0.0.1:6379", "--block", f"--node-ip-address=10.0.0.{k}", "--num-gpus=8"} <= _flags(line)
        assert "--head" not in line and f"auth=token token={token}" in line

    run = _index(calls, "python -m aiperf.cli run ")
    assert calls[run] == (
        "python -m aiperf.cli run --address 10.0.0.1:6379 --config smoke --set run.time_budget_s=60"
        " | auth=token mode=600"
    )
    # Head first, then (once the head answers) the workers, then (once all three nodes are up) the run.
    waited_for_all = [k for k, line in enumerate(calls) if line.startswith("python -m aiperf.cli plan --address")]
    assert head < workers_step < run and waited_for_all and waited_for_all[-1] < run
    # Teardown after the run: every Ray node stopped, both steps ended, the token gone.
    tail = calls[run + 1 :]
    assert {f"ray-stopped node00{k}" for k in (1, 2, 3)} <= set(tail)
    assert {"srun-exit node001", "srun-exit node002,node003"} <= set(tail)
    assert not list(slurm.state.glob("up-*")) and not token.exists()


def test_cpu_job_binds_the_named_interface_and_ports(slurm):
    done = slurm.sbatch(
        "--config", "smoke", AIPERF_IFACE="ib0", AIPERF_RAY_PORT="7000", AIPERF_NODE_MANAGER_PORT="7001"
    )
    assert done.returncode == 0, done.stderr
    calls = slurm.calls()
    head = calls[_index(calls, "ray[node001] start --head")]
    assert {"--node-ip-address=10.9.0.1", "--port=7000", "--node-manager-port=7001", "--num-gpus=0"} <= _flags(head)
    worker = calls[_index(calls, "ray[node003] start ")]
    assert {"--address=10.9.0.1:7000", "--node-ip-address=10.9.0.3", "--node-manager-port=7001"} <= _flags(worker)
    assert not any("--gpus-per-task" in line for line in calls if line.startswith("srun "))
    assert calls[_index(calls, "python -m aiperf.cli run ")].startswith(
        "python -m aiperf.cli run --address 10.9.0.1:7000 "
    )


def test_failed_run_keeps_its_exit_code_and_still_tears_down(slurm):
    done = slurm.sbatch("--config", "smoke", FAKE_RUN_RC="3")
    assert done.returncode == 3
    assert {f"ray-stopped node00{k}" for k in (1, 2, 3)} <= set(slurm.calls())
    assert not (slurm.job_dir / "ray_auth_token").exists()


def test_head_that_cannot_start_fails_with_one_line(slurm):
    done = slurm.sbatch("--config", "smoke", FAKE_RAY_FAIL="1")
    assert done.returncode == 2
    assert "the Ray head exited; see" in done.stderr
    calls = slurm.calls()
    assert not any(line.startswith("python -m aiperf.cli run") for line in calls)
    assert not any(line.startswith("srun --nodelist=node002") for line in calls), "workers started without a head"


def test_single_node_job_needs_no_worker_step(tmp_path):
    slurm = FakeSlurm(tmp_path, ["node001"])
    done = slurm.sbatch("--config", "smoke")
    assert done.returncode == 0, done.stderr
    calls = slurm.calls()
    assert [line.split()[1] for line in calls if line.startswith("srun ")] == ["--nodelist=node001"]
    assert _index(calls, "python -m aiperf.cli run --address 10.0.0.1:6379 --config smoke")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "RAY_AUTH_MODE must be 'token'"),
        ({"RAY_AUTH_MODE": "token"}, "no Ray token"),
        ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/nonexistent/token"}, "no Ray token"),
    ],
)
def test_ray_node_refuses_to_start_without_a_token(env, message):
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    for role in (["head"], ["worker", "10.0.0.1:6379"]):
        done = subprocess.run(["bash", str(RAY_NODE), *role], env={**base, **env}, capture_output=True, text=True)
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["start"], ["start", "0"], ["frobnicate"], ["kill", "7"]])
def test_local_cluster_rejects_bad_usage_with_one_line(args, tmp_path):
    env = {**os.environ, "AIPERF_CLUSTER_DIR": str(tmp_path / "c")}
    done = subprocess.run(["bash", str(LOCAL_CLUSTER), *args], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stderr.startswith("local_cluster.sh: ")
    assert len(done.stderr.strip().splitlines()) == 1
