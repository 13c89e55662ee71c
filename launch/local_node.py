"""One node of a loopback-only Ray cluster on this machine (used by ``local_cluster.sh``).

Why not ``ray start``: Ray binds its servers to loopback only when the node IP is exactly
127.0.0.1, and it keeps 127.0.0.1 only with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` —
a setting under which ``ray start --address`` refuses to join a cluster, while without it
Ray rewrites 127.0.0.1 to the machine's routable address. So each node is started here,
as Ray's own multi-node test helper (``ray.cluster_utils.Cluster``) does, through
``ray._private.node.Node`` with that setting on. The process blocks like ``ray start
--block``: SIGTERM stops the node; SIGKILL of its process group is a node crash (Ray's
processes are bound to this one and die with it).

Token authentication: the caller exports ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

LOOPBACK = "127.0.0.1"


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="local_node.py", description=__doc__.splitlines()[0])
    p.add_argument("role", choices=["head", "worker"])
    p.add_argument("--address", help="the head's GCS address (workers)")
    p.add_argument("--port", type=int, help="GCS port (head)")
    p.add_argument("--num-cpus", type=float, default=1.0)
    p.add_argument("--resources", default="{}", help="custom resources as JSON")
    p.add_argument("--temp-dir", required=True)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if os.environ.get("RAY_AUTH_MODE") != "token":
        print("local_node.py: RAY_AUTH_MODE must be 'token' (refusing an unauthenticated node)", file=sys.stderr)
        return 2
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read when Ray is imported: node IP stays 127.0.0.1
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    params = RayParams(
        node_ip_address=LOOPBACK,
        num_cpus=args.num_cpus,
        num_gpus=0,
        resources=json.loads(args.resources),
        temp_dir=args.temp_dir,
        include_dashboard=False,
        dashboard_agent_listen_port=None,  # a free port: several nodes share this host
        node_manager_port=0,
        min_worker_port=0,
        max_worker_port=0,
    )
    head = args.role == "head"
    if head:
        params.gcs_server_port = args.port
    else:
        if not args.address:
            print("local_node.py: a worker needs --address HEAD:PORT", file=sys.stderr)
            return 2
        params.gcs_address = args.address
        params.include_log_monitor = False  # one log monitor per host is enough
    node = Node(params, head=head, shutdown_at_exit=True, spawn_reaper=True)

    def stop(signum: int, frame: object) -> None:
        node.kill_all_processes(check_alive=False, allow_graceful=True)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"Ray runtime started: {args.role} at {node.gcs_address}, node {node.node_id}", flush=True)
    while True:
        time.sleep(1.0)
        dead = node.dead_processes()
        if dead:  # like `ray start --block`: a node missing one of its processes is a dead node
            print(f"local_node.py: Ray processes exited: {[name for name, _ in dead]}", file=sys.stderr, flush=True)
            return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
