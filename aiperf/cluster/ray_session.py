"""Start or join the Ray cluster the run uses, safely.

A local run starts a private Ray instance bound to loopback only. Every Ray server binds
the *node IP*, and Ray turns a requested ``127.0.0.1`` into the machine's routable address
unless its "cluster mode" is off; that switch (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``) is
read once, when Ray is first imported. So :func:`start_ray` sets the variable for the Ray
processes it starts *and* turns the already-imported switch off in this process, asks
for node IP 127.0.0.1, and leaves the dashboard off. It restores both on shutdown, so the
same process can later join a real cluster. Joining a cluster at a loopback address
(``launch/local_cluster.sh``) does the same, or Ray would look for it on the routable address.

Ray's token authentication stays as Ray configures it (on by default for local instances
since Ray 2.59); nothing here disables it or sets a password. Joining an existing cluster
(``--address`` or ``RAY_ADDRESS``) uses the addresses that cluster was started with — the
``launch/`` scripts bind them to the interface the user names and share a per-job token
(``RAY_AUTH_MODE=token`` with ``RAY_AUTH_TOKEN_PATH``).
"""

from __future__ import annotations

import logging
import os
import socket
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiperf.errors import AiperfError, first_line

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK_IP = "127.0.0.1"
# Ray reports a missing or wrong token only in its own log lines; the error itself says "failed to connect".
TOKEN_HINT = (
    " (something listens there: does this process have the cluster's token? RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH)"
)
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")  # the names Ray rewrites to a routable address


@dataclass
class RaySession:
    """The cluster this run talks to; ``local`` when this process started it."""

    address: str
    local: bool
    _restore: dict[str, Any] = field(default_factory=dict, repr=False)

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        if self._restore:
            _set_cluster_mode(**self._restore)
            self._restore = {}


def _quiet_ray() -> None:
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    warnings.filterwarnings("ignore", module="ray")
    for name in ("ray", "ray._private", "ray.util"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _set_cluster_mode(env: str | None, enabled: bool) -> None:
    """Set Ray's multi-node switch: the env var (for child processes) and the imported constant."""
    from ray._private import ray_constants

    if env is None:
        os.environ.pop(LOOPBACK_ENV, None)
    else:
        os.environ[LOOPBACK_ENV] = env
    ray_constants.ENABLE_RAY_CLUSTER = enabled


def _loopback_only() -> dict[str, Any]:
    """Make Ray resolve this node's IP to loopback; returns what to restore afterwards."""
    from ray._private import ray_constants

    previous = {"env": os.environ.get(LOOPBACK_ENV), "enabled": ray_constants.ENABLE_RAY_CLUSTER}
    _set_cluster_mode("0", False)
    return previous


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``host:port`` address; None for ``auto``, ``ray://`` and the like."""
    if "://" in address or ":" not in address:
        return None
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    return (host, int(port)) if port.isdigit() and host else None


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Fail in seconds, with a clear message, where Ray would retry an unreachable GCS for minutes."""
    target = _host_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout_s):
            pass
    except OSError as exc:
        raise AiperfError(f"cannot join the Ray cluster at {address}: {exc.strerror or exc}") from None


def _join(ray: Any, address: str, kwargs: dict[str, Any]) -> RaySession:
    """Connect to a running cluster; a loopback address keeps this driver on loopback too."""
    _check_reachable(address)
    target = _host_port(address)
    restore: dict[str, Any] = {}
    if target is not None and target[0] in LOOPBACK_NAMES:
        # Ray would rewrite 127.0.0.1 to this machine's routable address and look for the cluster there.
        restore = _loopback_only()
        kwargs = {**kwargs, "_node_ip_address": LOOPBACK_IP}
    try:
        info = ray.init(address=address, **kwargs)
    except Exception as exc:  # ConnectionError, RuntimeError, ray.exceptions.AuthenticationError (missing token), ...
        if restore:
            _set_cluster_mode(**restore)
        kind = "" if isinstance(exc, (ConnectionError, RuntimeError, ValueError)) else f"{type(exc).__name__}: "
        raise AiperfError(f"cannot join the Ray cluster at {address}: {kind}{first_line(exc)}{TOKEN_HINT}") from None
    return RaySession(info.address_info.get("gcs_address", address), local=False, _restore=restore)


def start_ray(
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    worker_env: dict[str, str] | None = None,
) -> RaySession:
    """Join ``address`` (or ``RAY_ADDRESS``) if given, else start a loopback-only local instance."""
    _quiet_ray()
    # The pool reads every result it consumes (pool.py, _drain); the only unread errors are those
    # of trials still queued on a worker when the run ends (a run stopped because its trials all
    # fail the same way leaves one or two). Ray would print each one's traceback on stderr when
    # its reference is dropped, around the run's own one-line reason. Read by the driver only.
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.ERROR,
        "configure_logging": True,
    }
    if worker_env:
        kwargs["runtime_env"] = {"env_vars": dict(worker_env)}
    if address:
        return _join(ray, address, kwargs)
    restore = _loopback_only()
    try:
        info = ray.init(num_cpus=num_cpus, num_gpus=num_gpus, _node_ip_address=LOOPBACK_IP, **kwargs)
    except Exception as exc:
        _set_cluster_mode(**restore)
        raise AiperfError(f"cannot start a local Ray instance: {first_line(exc)}") from None
    protect_token_file()
    # ray.init is annotated as returning BaseContext; a local start returns a RayContext, which has address_info.
    address = info.address_info.get("gcs_address", "local")  # type: ignore[attr-defined]
    return RaySession(address, local=True, _restore=restore)


def protect_token_file() -> None:
    """Make Ray's authentication token readable by its owner only.

    Ray writes ``~/.ray/auth_token`` (or ``RAY_AUTH_TOKEN_PATH``) with the process umask,
    which usually leaves it world-readable; anyone who can read it can join the cluster.
    """
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        if path.is_file() and path.stat().st_mode & 0o077:
            path.chmod(0o600)
    except OSError:  # not ours to change (shared or read-only home): leave it as the admin set it
        pass


def _is_loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip == "::1" or ip.startswith("::ffff:127.")


def non_loopback_listeners(pids: set[int] | None = None) -> list[str]:
    """Listening TCP sockets (of ``pids``, or of any process) reachable beyond loopback."""
    import psutil

    bad = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or not conn.laddr:
            continue
        if pids is not None and conn.pid not in pids:
            continue
        if not _is_loopback(conn.laddr.ip):
            bad.append(f"{conn.laddr.ip}:{conn.laddr.port} (pid {conn.pid})")
    return bad


def _is_ray_process(name: str, cmdline: list[str]) -> bool:
    cmd = " ".join(cmdline)
    return "ray" in name or "ray/" in cmd or "raylet" in cmd or "gcs_server" in cmd


def ray_process_ids(root: int | None = None) -> set[int]:
    """PIDs of this user's Ray processes (raylet, GCS, workers, agents).

    With ``root``, only that process (a driver that started Ray) and the Ray processes
    descending from it — so other Ray instances on the same machine do not count.
    """
    import psutil

    if root is not None:
        try:
            top = psutil.Process(root)
            family = [top, *top.children(recursive=True)]
        except psutil.Error:
            return set()
        out = {root}
        for proc in family[1:]:
            try:
                if _is_ray_process(proc.name(), proc.cmdline()):
                    out.add(proc.pid)
            except psutil.Error:
                continue
        return out
    out = set()
    me = os.getuid()
    for proc in psutil.process_iter(["pid", "name", "cmdline", "uids"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real != me:
                continue
            if _is_ray_process(proc.info["name"] or "", proc.info["cmdline"] or []):
                out.add(proc.info["pid"])
        except (psutil.Error, TypeError):
            continue
    return out
