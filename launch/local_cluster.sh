#!/usr/bin/env bash
# A multi-node Ray cluster simulated on this machine, for development and fault tests.
# Every node is a separate process (launch/local_node.py: own raylet, own temp dir, own
# process group, custom resource aiperf_local_node_K); all of them listen on loopback
# only and share a fresh token (0600 file).
#
#   local_cluster.sh start N       head + N-1 worker nodes (AIPERF_NODE_CPUS CPUs each)
#   local_cluster.sh add [CPUS]    one more worker node (a node joining a running cluster)
#   local_cluster.sh kill K        SIGKILL node K's process group: a crashed node (0 = head); returns once it is gone
#   local_cluster.sh status        nodes and whether their processes are alive
#   local_cluster.sh env           the exports a driver needs:  eval "$(launch/local_cluster.sh env)"
#   local_cluster.sh stop          stop every node and delete the token
#
# Then:  eval "$(launch/local_cluster.sh env)"; python -m aiperf.cli run --config smoke
#
# Parameters (environment; defaults in brackets):
#   AIPERF_CLUSTER_DIR   state, logs and Ray temp dirs; keep it short (Unix socket paths) [/tmp/aiperf-lc-$USER]
#   AIPERF_NODE_CPUS     CPUs per worker node [1]
#   AIPERF_HEAD_CPUS     CPUs on the head [AIPERF_NODE_CPUS]; 0 keeps trials off the head
#   AIPERF_RAY_PORT      GCS port [a free port]
#   AIPERF_PYTHON        python with Ray installed [python3]
#   RAY_health_check_period_ms / _timeout_ms / _failure_threshold / _initial_delay_ms
#                        how fast a dead node is noticed [1000 / 1000 / 3 / 1000: a few seconds]
set -euo pipefail

DIR=${AIPERF_CLUSTER_DIR:-/tmp/aiperf-lc-${USER:-$(id -un)}}
PY=${AIPERF_PYTHON:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() {
    echo "local_cluster.sh: $*" >&2
    exit 2
}

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

node_alive() { # K: whether node K's process group still has a member that is not a zombie
    local pgid
    pgid=$(cat "$DIR/node$1.pgid" 2>/dev/null) || return 1
    ps -eo pgid=,stat= | awk -v g="$pgid" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

wait_started() { # K: until the node reports that Ray runs (or it died)
    local log=$DIR/node$1.log
    for _ in $(seq 1 600); do
        grep -q "Ray runtime started" "$log" 2>/dev/null && return 0
        node_alive "$1" || die "node $1 exited while starting; see $log"
        sleep 0.1
    done
    die "node $1 did not start within 60 s; see $log"
}

launch_node() { # K ROLE ARGS...: start node K in its own session; its pid is its process-group id
    local k=$1
    shift
    mkdir -p "$DIR/n$k"
    setsid bash -c 'echo $$ > "$0"; exec "$@"' "$DIR/node$k.pgid" \
        "$PY" "$HERE/local_node.py" "$@" --temp-dir="$DIR/n$k" >"$DIR/node$k.log" 2>&1 </dev/null &
    for _ in $(seq 1 50); do
        [[ -s "$DIR/node$k.pgid" ]] && break
        sleep 0.1
    done
}

setup_env() {
    # Ray workers import aiperf by name (the package is used from this checkout, not installed).
    export PYTHONPATH=$HERE/..${PYTHONPATH:+:$PYTHONPATH}
    export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$DIR/token RAY_USAGE_STATS_ENABLED=0
    unset RAY_AUTH_TOKEN RAY_ADDRESS
    export RAY_worker_niceness=${RAY_worker_niceness:-0} # Ray's default, 15, puts the trials below everything else
    export RAY_health_check_period_ms=${RAY_health_check_period_ms:-1000}
    export RAY_health_check_timeout_ms=${RAY_health_check_timeout_ms:-1000}
    export RAY_health_check_failure_threshold=${RAY_health_check_failure_threshold:-3}
    export RAY_health_check_initial_delay_ms=${RAY_health_check_initial_delay_ms:-1000}
}

next_index() {
    local k=0
    while [[ -e "$DIR/node$k.pgid" ]]; do k=$((k + 1)); done
    echo "$k"
}

add_worker() { # CPUS
    local k
    k=$(next_index)
    launch_node "$k" worker --address="$(cat "$DIR/address")" --num-cpus="$1" \
        --resources="{\"aiperf_local_node_$k\": 1}"
    wait_started "$k"
    echo "$k"
}

cmd_start() {
    local n=${1:-}
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "usage: local_cluster.sh start N (N >= 1 nodes, the head included)"
    [[ ! -e "$DIR/address" ]] || die "a cluster is already running from $DIR (local_cluster.sh stop first)"
    mkdir -p "$DIR"
    chmod 700 "$DIR"
    (
        umask 077
        "$PY" -c 'import secrets; print(secrets.token_hex(32), end="")' >"$DIR/token"
    )
    setup_env
    local port=${AIPERF_RAY_PORT:-$(free_port)}
    echo "127.0.0.1:$port" >"$DIR/address"
    launch_node 0 head --port="$port" --num-cpus="${AIPERF_HEAD_CPUS:-${AIPERF_NODE_CPUS:-1}}" \
        --resources='{"aiperf_local_node_0": 1}'
    wait_started 0
    for ((k = 1; k < n; k++)); do
        add_worker "${AIPERF_NODE_CPUS:-1}" >/dev/null
    done
    echo "local cluster: $n node(s) at 127.0.0.1:$port (state in $DIR)"
}

cmd_kill() { # returns once no process of the node is left (`status` right after says dead)
    local k=${1:-}
    [[ -e "$DIR/node$k.pgid" ]] || die "no node $k"
    kill -KILL -- "-$(cat "$DIR/node$k.pgid")" 2>/dev/null || true
    for _ in $(seq 1 100); do
        node_alive "$k" || return 0
        sleep 0.1
    done
    die "node $k still has processes 10 s after SIGKILL"
}

cmd_stop() {
    [[ -d "$DIR" ]] || return 0
    local f pgids=()
    for f in "$DIR"/node*.pgid; do
        [[ -e "$f" ]] && pgids+=("$(cat "$f")")
    done
    for g in ${pgids[@]+"${pgids[@]}"}; do kill -TERM -- "-$g" 2>/dev/null || true; done
    for _ in $(seq 1 50); do
        local alive=0
        for g in ${pgids[@]+"${pgids[@]}"}; do kill -0 -- "-$g" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for g in ${pgids[@]+"${pgids[@]}"}; do kill -KILL -- "-$g" 2>/dev/null || true; done
    rm -f "$DIR/token" "$DIR/address" "$DIR"/node*.pgid
}

cmd_status() {
    [[ -e "$DIR/address" ]] || die "no cluster running from $DIR"
    echo "address $(cat "$DIR/address")"
    local k=0
    while [[ -e "$DIR/node$k.pgid" ]]; do
        if node_alive "$k"; then echo "node $k: alive (pgid $(cat "$DIR/node$k.pgid"))"; else echo "node $k: dead"; fi
        k=$((k + 1))
    done
}

case "${1:-}" in
    start) cmd_start "${2:-}" ;;
    add)
        [[ -e "$DIR/address" ]] || die "no cluster running from $DIR"
        setup_env
        add_worker "${2:-${AIPERF_NODE_CPUS:-1}}"
        ;;
    kill) cmd_kill "${2:-}" ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env)
        [[ -e "$DIR/address" ]] || die "no cluster running from $DIR"
        echo "export RAY_ADDRESS=$(cat "$DIR/address") RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$DIR/token"
        ;;
    *) die "usage: local_cluster.sh start N | add [CPUS] | kill K | status | env | stop" ;;
esac
