"""The Slurm launcher, run against fake `srun`, `scontrol`, `hostname`, `ip`, `ray` and `python`.

The fakes log every call (with the environment that matters) and behave enough like the
real tools for the script to go through a whole job: `srun` runs its command once per
node of --nodelist, each fake `ray start` blocks until SIGTERM, the fake `aiperf plan`
reports how many fake Ray nodes are up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO

SBATCH = REPO / "launch" / "aiperf.sbatch"
RAY_NODE = REPO / "launch" / "ray_node.sh"
LOCAL_CLUSTER = REPO / "launch" / "local_cluster.sh"

FAKES = {
    "scontrol": """
echo "scontrol $*" >> "$FAKE_LOG"
if [[ "$1 $2" == "show config" && -n "${FAKE_KILL_WAIT:-}" ]]; then
    echo "KillOnBadExit           = 0"
    echo "KillWait                = $FAKE_KILL_WAIT sec"
    exit 0
fi
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
# As slurmstepd does, the tasks start with default signal handling, whatever srun ignores.
for n in "${nodes[@]}"; do FAKE_NODE=$n env --default-signal=TERM "$@" & pids+=($!); done
echo "${pids[*]}" > "$FAKE_STATE/step-$nodelist"
trap 'kill -KILL "${pids[@]}" 2>/dev/null; echo "srun-killed-its-tasks $nodelist" >> "$FAKE_LOG"; exit 0' TERM
wait
rm -f "$FAKE_STATE/step-$nodelist"
echo "srun-exit $nodelist" >> "$FAKE_LOG"
""",
    "squeue": """
[[ "$*" == "-h -s -j 4242 -o %i" ]] || exit 1
for f in "$FAKE_STATE"/step-*; do [[ -e "$f" ]] && echo "4242.${f##*/step-}"; done
echo "4242.batch"
""",
    "scancel": """
echo "scancel $*" >> "$FAKE_LOG"
sig=${1#--signal=}
step=${2#4242.}
[[ -e "$FAKE_STATE/step-$step" ]] || exit 1
kill -"$sig" $(cat "$FAKE_STATE/step-$step") 2>/dev/null || true
""",
    "ray": """
echo "ray[$FAKE_NODE] $* | auth=$RAY_AUTH_MODE token=$RAY_AUTH_TOKEN_PATH path=$PYTHONPATH" >> "$FAKE_LOG"
if [[ -n "${FAKE_RAY_FAIL:-}" && ( "$FAKE_RAY_FAIL" == 1 || "$FAKE_RAY_FAIL" == "$FAKE_NODE" ) ]]; then
    echo "ray: could not connect to the GCS at 10.0.0.1:6379" >&2
    exit 1
fi
touch "$FAKE_STATE/up-$FAKE_NODE"
stopped() {
    rm -f "$FAKE_STATE/up-$FAKE_NODE"
    tmp=$(echo "$*" | tr ' ' '\n' | sed -n 's/^--temp-dir=//p')
    token=$([[ -e $RAY_AUTH_TOKEN_PATH ]] && echo left || echo gone)
    echo "ray-stopped $FAKE_NODE token=$token tmp=$(stat -c %a "$tmp")" >> "$FAKE_LOG"
    exit 0
}
trap 'stopped "$@"' TERM
while true; do sleep 0.05; done
""",
    "fakepython": """
if [[ "$1" == "-c" ]]; then exec "$REAL_PYTHON" "$@"; fi
# Python installs its SIGTERM handler even where the signal was ignored: so does this fake run.
if [[ "$3" == run && -z "${FAKE_REEXEC:-}" ]]; then FAKE_REEXEC=1 exec env --default-signal=TERM "$0" "$@"; fi
echo "python $* | auth=$RAY_AUTH_MODE mode=$(stat -c %a "$RAY_AUTH_TOKEN_PATH")" >> "$FAKE_LOG"
case "$3" in
    plan)
        [[ -e "$FAKE_STATE/up-$FAKE_HEAD" ]] || { echo "aiperf: error: cannot join" >&2; exit 2; }
        up=$(ls "$FAKE_STATE" | grep -c '^up-')
        echo "plan: $up concurrent trials on $up node(s), placement per_accelerator"
        ;;
    run)
        if [[ -n "${FAKE_RUN_S:-}" ]]; then
            trap 'echo "run-terminated" >> "$FAKE_LOG"; exit 130' TERM
            sleep "$FAKE_RUN_S" &
            wait
        fi
        exit "${FAKE_RUN_RC:-0}" ;;
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
    assert calls[:2] == ["scontrol show config", "scontrol show hostnames node[001-003]"]

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
        "--temp-dir=/tmp/aiperf-ray-4242-node001",
    }
    assert expected_head <= _flags(calls[head])
    token = slurm.job_dir / "ray_auth_token"
    assert f"auth=token token={token} path={REPO}" in calls[head]

    # One step per worker node, each watched on its own.
    worker_steps = [_index(calls, f"srun --nodelist={node} ") for node in ("node002", "node003")]
    for step in worker_steps:
        assert {"--nodes=1", "--ntasks=1", "--gpus-per-task=8", "--overlap"} <= _flags(calls[step])
        assert calls[step].endswith("ray_node.sh worker 10.0.0.1:6379")
    for k, node in ((2, "node002"), (3, "node003")):
        line = calls[_index(calls, f"ray[{node}] start ")]
        assert {"--address=10.0.0.1:6379", "--block", f"--node-ip-address=10.0.0.{k}", "--num-gpus=8"} <= _flags(line)
        assert f"--temp-dir=/tmp/aiperf-ray-4242-{node}" in _flags(line)
        assert "--head" not in line and f"auth=token token={token}" in line

    run = _index(calls, "python -m aiperf.cli run ")
    assert calls[run] == (
        "python -m aiperf.cli run --address 10.0.0.1:6379 --planned-nodes 3 --config smoke --set run.time_budget_s=60"
        " | auth=token mode=600"
    )
    # Head first, then (once the head answers) the workers, then (once all three nodes are up) the run.
    waited_for_all = [k for k, line in enumerate(calls) if line.startswith("python -m aiperf.cli plan --address")]
    assert head < min(worker_steps) and max(worker_steps) < run and waited_for_all and waited_for_all[-1] < run
    # Teardown after the run: the token deleted first, then every Ray node stopped (its 0700 temp dir then
    # removed), every step ended.
    tail = calls[run + 1 :]
    assert {f"ray-stopped node00{k} token=gone tmp=700" for k in (1, 2, 3)} <= set(tail), tail
    assert {"srun-exit node001", "srun-exit node002", "srun-exit node003"} <= set(tail)
    assert not list(slurm.state.glob("up-*")) and not token.exists()
    assert not [p for p in Path("/tmp").glob("aiperf-ray-4242-node00*")], "a Ray temporary directory was left"


def test_the_ray_beside_the_python_is_used_without_an_activated_venv(slurm):
    """Issue 46, finding 2: with AIPERF_PYTHON set and no venv on PATH, `ray` was not found."""
    venv = slurm.bin.parent / "venv" / "bin"
    venv.mkdir(parents=True)
    for name in ("fakepython", "ray"):
        (slurm.bin / name).rename(venv / name)
    done = slurm.sbatch("--config", "smoke", AIPERF_PYTHON=str(venv / "fakepython"))
    assert done.returncode == 0, done.stderr
    assert _index(slurm.calls(), "ray[node002] start ")
    (venv / "ray").unlink()
    done = slurm.sbatch("--config", "smoke", AIPERF_PYTHON=str(venv / "fakepython"), PATH=f"{slurm.bin}:/usr/bin:/bin")
    assert done.returncode == 2 and "no ray executable 'ray': set AIPERF_RAY" in done.stderr


def test_a_worker_node_that_cannot_start_fails_the_job_at_once_with_its_name(slurm):
    """Finding 3: a dead worker step went unnoticed for AIPERF_START_TIMEOUT_S, then the run went on alone."""
    done = slurm.sbatch("--config", "smoke", FAKE_RAY_FAIL="node003", AIPERF_START_TIMEOUT_S="300")
    assert done.returncode == 2
    assert "the Ray node on node003 exited before joining: ray: could not connect to the GCS" in done.stderr
    assert "1 of 3 node(s) down, AIPERF_MIN_NODES=3" in done.stderr
    assert not any(line.startswith("python -m aiperf.cli run") for line in slurm.calls())
    assert not (slurm.job_dir / "ray_auth_token").exists()


def test_with_min_nodes_the_run_goes_on_without_a_node_that_failed(slurm):
    done = slurm.sbatch("--config", "smoke", FAKE_RAY_FAIL="node003", AIPERF_MIN_NODES="2")
    assert done.returncode == 0, done.stderr
    assert _index(slurm.calls(), "python -m aiperf.cli run ")
    done = slurm.sbatch("--config", "smoke", AIPERF_MIN_NODES="4")
    assert done.returncode == 2 and "AIPERF_MIN_NODES=4: must be from 1 to the job's 3 node(s)" in done.stderr


def test_the_run_is_told_the_job_s_end_less_the_teardown(slurm):
    """Finding 4: a job that reached its time limit was interrupted and invalid, with no warning before."""
    done = slurm.sbatch("--config", "smoke", SLURM_JOB_END_TIME="1900000000", FAKE_KILL_WAIT="12")
    assert done.returncode == 0, done.stderr
    run = slurm.calls()[_index(slurm.calls(), "python -m aiperf.cli run ")]
    assert run.startswith(
        "python -m aiperf.cli run --address 10.0.0.1:6379 --planned-nodes 3 --must-end-by 1899999993 --config smoke"
    ), "the run is told the job's nodes and its end"
    assert "(within 7 s)" in done.stderr  # KillWait 12 s less 5


def test_a_signal_to_the_job_waits_for_the_run_to_write_and_keeps_its_exit_code(slurm):
    """scancel signals every process of the job: the run stops on its own; the script must not exit first."""
    proc = subprocess.Popen(
        ["bash", str(SBATCH), "--config", "smoke"],
        env={**slurm.env, "FAKE_RUN_S": "30"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            line.startswith("python -m aiperf.cli run") for line in (slurm.calls() if slurm.log.exists() else [])
        ):
            time.sleep(0.1)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGTERM)  # as Slurm does: every process of the job
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err  # the run's own code: interrupted
    calls = slurm.calls()
    assert "run-terminated" in calls and calls.count("run-terminated") == 1, "the run got one SIGTERM, not two"
    assert calls.index("run-terminated") < min(k for k, c in enumerate(calls) if c.startswith("ray-stopped"))
    assert not (slurm.job_dir / "ray_auth_token").exists()


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
    assert {f"ray-stopped node00{k} token=gone tmp=700" for k in (1, 2, 3)} <= set(slurm.calls())
    assert not (slurm.job_dir / "ray_auth_token").exists()


def test_head_that_cannot_start_fails_with_one_line(slurm):
    done = slurm.sbatch("--config", "smoke", FAKE_RAY_FAIL="1")
    assert done.returncode == 2
    assert "the Ray head on node001 exited: ray: could not connect to the GCS" in done.stderr
    calls = slurm.calls()
    assert not any(line.startswith("python -m aiperf.cli run") for line in calls)
    assert not any(line.startswith("srun --nodelist=node002") for line in calls), "workers started without a head"


def test_single_node_job_needs_no_worker_step(tmp_path):
    slurm = FakeSlurm(tmp_path, ["node001"])
    done = slurm.sbatch("--config", "smoke")
    assert done.returncode == 0, done.stderr
    calls = slurm.calls()
    assert [line.split()[1] for line in calls if line.startswith("srun ")] == ["--nodelist=node001"]
    assert _index(calls, "python -m aiperf.cli run --address 10.0.0.1:6379 --planned-nodes 1 --config smoke")


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


def test_every_variable_the_launch_scripts_read_is_in_the_readme_table():
    """Issue 46, finding 2: AIPERF_RAY was read by ray_node.sh and named nowhere a user looks."""
    import re

    read = set()
    for script in (SBATCH, RAY_NODE):
        read |= set(re.findall(r"\$\{?(AIPERF_[A-Z0-9_]+)", script.read_text()))
    readme = (REPO / "launch" / "README.md").read_text()
    table = readme[readme.index("| variable | default | meaning |") : readme.index("## A simulated cluster")]
    documented = set(re.findall(r"`(AIPERF_[A-Z0-9_]+)`", table))
    assert read, "no variable found: the pattern no longer matches the scripts"
    assert read - documented == set(), f"read by the scripts, missing from launch/README.md: {read - documented}"
