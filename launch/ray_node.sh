#!/usr/bin/env bash
# One Ray node of an aiperf cluster job, run in the foreground (`ray start --block`) so that
# the job step that started it lives exactly as long as Ray does, and stopping the step
# (SIGTERM from srun or the launcher) stops the node.
#
#   ray_node.sh ip                  print this node's IPv4 address on $AIPERF_IFACE
#   ray_node.sh head                start the head (GCS + a raylet) on this node
#   ray_node.sh worker HEAD:PORT    start a raylet that joins the cluster at HEAD:PORT
#
# Every Ray process advertises (and routes over) the address of $AIPERF_IFACE, or
# $AIPERF_NODE_IP when given. Token authentication is mandatory: the caller exports
# RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH (a 0600 file on a shared filesystem) or
# RAY_AUTH_TOKEN; without a token this script refuses to start.
#
# Parameters (environment; defaults in brackets):
#   AIPERF_IFACE            network interface to use, e.g. ib0   [first address of `hostname -I`]
#   AIPERF_NODE_IP          this node's address (overrides AIPERF_IFACE)
#   AIPERF_NUM_CPUS         CPUs Ray may schedule on this node   [SLURM_CPUS_ON_NODE, else nproc]
#   AIPERF_NUM_GPUS         GPUs Ray may schedule on this node   [SLURM_GPUS_ON_NODE, else 0]
#   AIPERF_HEAD_RESERVED_CPUS  CPUs kept from Ray on the head for the aiperf master [0]
#   AIPERF_RAY_PORT         GCS port on the head                 [6379]
#   AIPERF_NODE_MANAGER_PORT, AIPERF_OBJECT_MANAGER_PORT          [6380, 6381]
#   AIPERF_AGENT_GRPC_PORT, AIPERF_AGENT_HTTP_PORT                 [6382, 6383]
#   AIPERF_RUNTIME_ENV_PORT, AIPERF_METRICS_PORT                   [6384, 6385]
#   AIPERF_CLIENT_PORT      Ray client server on the head        [6386]
#   AIPERF_MIN_WORKER_PORT, AIPERF_MAX_WORKER_PORT                 [10002, 19999]
#   AIPERF_RAY_TMPDIR       node-local directory for Ray's sockets and logs, made 0700 and removed when
#                           the node stops              [/tmp/aiperf-ray-$SLURM_JOB_ID-$SLURMD_NODENAME]
#   AIPERF_RAY              the ray executable           [the `ray` beside AIPERF_PYTHON, else `ray` on PATH]
#   AIPERF_PYTHON           python with aiperf's dependencies (only to find AIPERF_RAY)
#
# SIGTERM or SIGINT stops the node: Ray is asked to stop and its temporary directory is removed.
set -euo pipefail

die() {
    echo "ray_node.sh: $*" >&2
    exit 2
}

node_ip() {
    if [[ -n "${AIPERF_NODE_IP:-}" ]]; then
        echo "$AIPERF_NODE_IP"
        return
    fi
    local addr=""
    if [[ -n "${AIPERF_IFACE:-}" ]]; then
        addr=$(ip -o -4 addr show dev "$AIPERF_IFACE" 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}' || true)
        [[ -n "$addr" ]] || die "interface $AIPERF_IFACE has no IPv4 address on $(hostname)"
    else
        for a in $(hostname -I); do
            case "$a" in
                127.* | ::1 | *:*) continue ;;
            esac
            addr=$a
            break
        done
        [[ -n "$addr" ]] || die "no IPv4 address found on $(hostname); set AIPERF_IFACE or AIPERF_NODE_IP"
    fi
    echo "$addr"
}

require_token() {
    [[ "${RAY_AUTH_MODE:-}" == "token" ]] || die "RAY_AUTH_MODE must be 'token': refusing to start an unauthenticated Ray node"
    if [[ -z "${RAY_AUTH_TOKEN:-}" ]]; then
        [[ -n "${RAY_AUTH_TOKEN_PATH:-}" && -s "${RAY_AUTH_TOKEN_PATH}" ]] ||
            die "no Ray token: set RAY_AUTH_TOKEN_PATH to a readable, non-empty token file (or RAY_AUTH_TOKEN)"
    fi
}

common_args() {
    local ip
    ip=$(node_ip)
    local cpus=${AIPERF_NUM_CPUS:-${SLURM_CPUS_ON_NODE:-$(nproc)}}
    local gpus=${AIPERF_NUM_GPUS:-${SLURM_GPUS_ON_NODE:-0}}
    if [[ "$1" == head ]]; then
        cpus=$((cpus - ${AIPERF_HEAD_RESERVED_CPUS:-0}))
        ((cpus >= 0)) || cpus=0
    fi
    ARGS=(
        --block
        --node-ip-address="$ip"
        --num-cpus="$cpus"
        --num-gpus="$gpus"
        --node-manager-port="${AIPERF_NODE_MANAGER_PORT:-6380}"
        --object-manager-port="${AIPERF_OBJECT_MANAGER_PORT:-6381}"
        --dashboard-agent-grpc-port="${AIPERF_AGENT_GRPC_PORT:-6382}"
        --dashboard-agent-listen-port="${AIPERF_AGENT_HTTP_PORT:-6383}"
        --runtime-env-agent-port="${AIPERF_RUNTIME_ENV_PORT:-6384}"
        --metrics-export-port="${AIPERF_METRICS_PORT:-6385}"
        --min-worker-port="${AIPERF_MIN_WORKER_PORT:-10002}"
        --max-worker-port="${AIPERF_MAX_WORKER_PORT:-19999}"
        --temp-dir="$TMPD"
        --disable-usage-stats
    )
}

ray_executable() { # AIPERF_RAY, else the ray installed beside AIPERF_PYTHON (a venv not activated), else PATH's
    local py
    if [[ -n "${AIPERF_RAY:-}" ]]; then
        echo "$AIPERF_RAY"
    elif py=$(command -v "${AIPERF_PYTHON:-}" 2>/dev/null) && [[ -n "$py" && -x "$(dirname "$py")/ray" ]]; then
        echo "$(dirname "$py")/ray"
    else
        echo ray
    fi
}

run_ray() { # ray ARGS...: in the foreground until it exits; SIGTERM/SIGINT are passed on; the temp dir goes after
    local rc=0 pid
    "$RAY" "$@" &
    pid=$!
    trap 'kill -TERM "$pid" 2>/dev/null || true' TERM INT
    while kill -0 "$pid" 2>/dev/null; do # a trapped signal ends the wait early: wait again for Ray itself
        wait "$pid" && rc=0 || rc=$?
    done
    rm -rf -- "$TMPD" 2>/dev/null || true
    exit "$rc"
}

make_tmpdir() { # Ray's sockets and logs: this user's alone (0700), even where /tmp is shared
    mkdir -p -m 700 -- "$TMPD"
    [[ -O "$TMPD" ]] || die "$TMPD belongs to another user: set AIPERF_RAY_TMPDIR"
    chmod 700 -- "$TMPD"
}

TMPD=${AIPERF_RAY_TMPDIR:-/tmp/aiperf-ray-${SLURM_JOB_ID:-${USER:-$(id -un)}}-${SLURMD_NODENAME:-$(hostname -s)}}
RAY=$(ray_executable)

export RAY_USAGE_STATS_ENABLED=0
# Ray starts its workers at niceness 15 by default, below every other program on the node: the trials are
# the work the benchmark measures, so they run at the priority the job has.
export RAY_worker_niceness=${RAY_worker_niceness:-0}
# On SIGTERM `ray start --block` drains its node for up to 30 s by default (for Ray Serve's replicas) before it
# stops: longer than Slurm's default KillWait, so the node was SIGKILLed before its temporary directory
# went. aiperf's master records its own stop; the node stops at once.
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}
case "${1:-}" in
    ip)
        node_ip
        ;;
    head)
        require_token
        command -v "$RAY" >/dev/null || die "no ray executable '$RAY' on $(hostname): set AIPERF_RAY, or AIPERF_PYTHON to a venv's python"
        common_args head
        make_tmpdir
        run_ray start --head "${ARGS[@]}" \
            --port="${AIPERF_RAY_PORT:-6379}" \
            --ray-client-server-port="${AIPERF_CLIENT_PORT:-6386}" \
            --include-dashboard=false
        ;;
    worker)
        [[ -n "${2:-}" ]] || die "usage: ray_node.sh worker HEAD_IP:PORT"
        require_token
        command -v "$RAY" >/dev/null || die "no ray executable '$RAY' on $(hostname): set AIPERF_RAY, or AIPERF_PYTHON to a venv's python"
        common_args worker
        make_tmpdir
        run_ray start --address="$2" "${ARGS[@]}"
        ;;
    *)
        die "usage: ray_node.sh ip | head | worker HEAD_IP:PORT"
        ;;
esac
