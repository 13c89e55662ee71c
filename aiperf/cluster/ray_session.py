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

Ray's control plane (the GCS) can stop answering -- frozen, overloaded, partitioned -- while
the workers go on training: trials stream their results to the master directly, not through
the GCS. But any call that asks the GCS (``ray.nodes()``, ``ray.shutdown()``) then blocks for
as long as it is silent, and the run's budget with it. So during a run nothing asks the GCS on
the master's thread: :class:`ControlPlaneWatch` asks it on a thread of its own, every call with
a deadline, and says since when it has not answered; :meth:`RaySession.shutdown` gives Ray
``SHUTDOWN_WAIT_S`` to shut down and then kills the local instance's processes
(docs/cluster.md, "When Ray stops answering").
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, TypedDict

from aiperf.errors import AiperfError, first_line

if TYPE_CHECKING:
    from aiperf.cluster.resources import RayNode

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
WORKER_NICENESS_ENV = "RAY_worker_niceness"  # read by the raylet when it starts; its default is 15
LOOPBACK_IP = "127.0.0.1"
# Ray reports a missing or wrong token only in its own log lines; the error itself says "failed to connect".
TOKEN_HINT = (
    " (something listens there: does this process have the cluster's token? RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH)"
)
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")  # the names Ray rewrites to a routable address

CONTROL_PLANE_PROBE_S = 2.0  # how often the watch asks the GCS a question (and each question's deadline)
CONTROL_PLANE_TIMEOUT_S = 5.0  # unanswered this long: the control plane stopped answering
SHUTDOWN_WAIT_S = 10.0  # ray.shutdown's time; then a local instance's processes are killed, and it gets as long again

logger = logging.getLogger(__name__)


@dataclass
class RaySession:
    """The cluster this run talks to; ``local`` when this process started it."""

    address: str
    local: bool
    _restore: _ClusterMode = field(default_factory=lambda: _ClusterMode(), repr=False)

    def shutdown(self, wait_s: float = SHUTDOWN_WAIT_S) -> str | None:
        """Disconnect, and stop the instance this process started, in bounded time.

        ``ray.shutdown()`` waits for the GCS for as long as it is silent (a frozen GCS holds it
        forever, and Ray's own exit handler after it). After ``wait_s`` the Ray processes this
        process started are killed, which releases it, and it gets ``wait_s`` more. Returns a
        line saying what had to be forced, or None when Ray shut down by itself.
        """
        import ray

        for watch in list(_WATCHES):  # a run that raised left its watch asking: no question into a Ray going away
            watch.stop()
        note = None
        if ray.is_initialized():
            done = _in_thread(ray.shutdown, "aiperf-ray-shutdown")
            if not done.wait(wait_s):
                if self.local:
                    killed = kill_local_ray()
                    done.wait(wait_s)
                    note = f"Ray did not shut down within {wait_s:g} s: its {killed} local process(es) were killed"
                else:
                    note = f"disconnecting from the Ray cluster at {self.address} did not finish within {wait_s:g} s"
                if not done.is_set():
                    note += "; Ray's own exit may still wait for its control plane"
        if self._restore:
            _set_cluster_mode(self._restore["env"], self._restore["enabled"])
            self._restore = {}
        return note


def _in_thread(fn: Callable[[], object], name: str) -> threading.Event:
    """Run ``fn`` on a daemon thread; the event is set when it returned or raised."""
    done = threading.Event()

    def run() -> None:
        try:
            fn()
        except Exception as exc:  # the caller only waits for the end; what went wrong is logged
            logger.debug("%s: %s", name, exc)
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    return done


def kill_local_ray() -> int:
    """SIGKILL the Ray processes descending from this one (a local instance it started); how many.

    SIGKILL also ends a stopped (SIGSTOP) process, which SIGTERM would not until it is resumed.
    """
    me = os.getpid()
    killed = 0
    for pid in ray_process_ids(me) - {me}:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except OSError:  # gone already, or not ours
            continue
    return killed


class _NodeId(Protocol):
    def hex(self) -> str: ...


class _GcsNodeInfo(Protocol):
    """The fields of Ray's ``GcsNodeInfo`` message (generated protobuf, untyped) that :func:`gcs_nodes` reads."""

    node_id: _NodeId
    state: int
    node_manager_address: str
    node_manager_hostname: str
    resources_total: Mapping[str, float]


class _GcsClient(Protocol):
    """What this module asks of Ray's private, untyped ``GcsClient``; every call has a deadline."""

    def internal_kv_get(self, key: bytes, namespace: bytes, *, timeout: float) -> bytes | None: ...

    def get_all_node_info(self, *, timeout: float) -> Mapping[object, _GcsNodeInfo]: ...


def _gcs_client(ray: ModuleType) -> _GcsClient:
    """This driver's client of the GCS (AttributeError where there is none: a Ray Client connection)."""
    return ray._private.worker.global_worker.gcs_client


def gcs_ping(timeout_s: float) -> None:
    """One round trip to the GCS with a deadline (raises on no answer): a key nobody writes."""
    import ray

    _gcs_client(ray).internal_kv_get(b"aiperf-ping", b"aiperf", timeout=timeout_s)


def gcs_nodes(timeout_s: float) -> list[RayNode]:
    """The cluster's alive nodes as ``ray.nodes()`` lists them, asked with a deadline (``ray.nodes()`` has none)."""
    import ray
    from ray.core.generated import gcs_pb2

    alive = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")  # type: ignore[attr-defined]  # generated, untyped
    infos = _gcs_client(ray).get_all_node_info(timeout=timeout_s)
    return [
        {
            "NodeID": info.node_id.hex(),
            "Alive": info.state == alive,
            "NodeManagerAddress": info.node_manager_address,
            "NodeManagerHostname": info.node_manager_hostname,
            "Resources": dict(info.resources_total),
        }
        for info in infos.values()
    ]


_WATCHES: weakref.WeakSet[ControlPlaneWatch] = weakref.WeakSet()  # started and not stopped


class ControlPlaneWatch:
    """Asks Ray's control plane a question every ``probe_s`` on a thread of its own, each with a deadline.

    The master's loop never waits for the GCS: it reads :meth:`silent_since` (since when the
    GCS has not answered, once that is ``timeout_s`` or more) and :meth:`take_nodes` (the newest
    node listing, asked every ``resync_s``). ``ping`` and ``list_nodes`` take their deadline in
    seconds and raise when it passes.
    """

    def __init__(
        self,
        resync_s: float = 10.0,
        probe_s: float = CONTROL_PLANE_PROBE_S,
        timeout_s: float = CONTROL_PLANE_TIMEOUT_S,
        ping: Callable[[float], object] = gcs_ping,
        list_nodes: Callable[[float], list[RayNode]] = gcs_nodes,
    ) -> None:
        self.resync_s, self.probe_s, self.timeout_s = resync_s, probe_s, timeout_s
        self._ping, self._list_nodes = ping, list_nodes
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._asking_since: float | None = None  # a question is out since then
        self._failing_since: float | None = None  # the first question of the current run of failed ones
        self._nodes: list[RayNode] | None = None
        self._last_listing = float("-inf")
        self._thread: threading.Thread | None = None
        self.unavailable: str | None = None  # why this Ray cannot be watched (the pool then asks it directly)

    def start(self) -> ControlPlaneWatch:
        self._thread = threading.Thread(target=self._loop, name="aiperf-control-plane", daemon=True)
        self._thread.start()
        _WATCHES.add(self)
        return self

    def stop(self, wait_s: float | None = None) -> None:
        """Stop asking; waits for a question in flight (its own deadline bounds it) unless ``wait_s`` is 0."""
        self._stop.set()
        _WATCHES.discard(self)
        if self._thread is not None:
            self._thread.join(self.probe_s + 1.0 if wait_s is None else wait_s)

    def ask_once(self) -> None:
        """One question: the node listing when it is due, else a ping."""
        began = time.monotonic()
        with self._lock:
            self._asking_since = began
        deadline = max(0.1, min(self.probe_s, self.timeout_s))
        try:
            if began - self._last_listing >= self.resync_s:
                nodes = self._list_nodes(deadline)
                self._last_listing = began
                with self._lock:
                    self._nodes = nodes
            else:
                self._ping(deadline)
        except (
            AttributeError,
            ImportError,
        ) as exc:  # this Ray (a client connection, another version) has no GCS client
            logger.debug("Ray's control plane cannot be watched: %s", exc)
            with self._lock:
                self._asking_since = None
                self.unavailable = f"{type(exc).__name__}: {exc}"
            self._stop.set()
            return
        except Exception as exc:  # no answer in time (or an error instead of one): still silent
            logger.debug("Ray's control plane did not answer: %s", exc)
            with self._lock:
                self._asking_since = None
                if self._failing_since is None:
                    self._failing_since = began
            return
        with self._lock:
            self._asking_since = None
            self._failing_since = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.ask_once()
            self._stop.wait(max(0.0, self.probe_s - (time.monotonic() - began)))

    def silent_since(self, now: float | None = None) -> float | None:
        """``time.monotonic()`` when the control plane stopped answering, once that is ``timeout_s`` ago; else None."""
        with self._lock:
            since = self._failing_since if self._failing_since is not None else self._asking_since
        if since is None:
            return None
        now = time.monotonic() if now is None else now
        return since if now - since >= self.timeout_s else None

    def take_nodes(self) -> list[RayNode] | None:
        """The newest node listing not yet taken (``ray.nodes()``'s shape), or None."""
        with self._lock:
            nodes, self._nodes = self._nodes, None
        return nodes


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


class _InitOptions(TypedDict, total=False):
    """What every ``ray.init`` of this driver passes (a joined cluster's on loopback adds ``_node_ip_address``)."""

    include_dashboard: bool
    log_to_driver: bool
    logging_level: int
    configure_logging: bool
    runtime_env: dict[str, dict[str, str]]
    _node_ip_address: str


class _ClusterMode(TypedDict, total=False):
    """How Ray resolved this node's IP before :func:`_loopback_only` (empty: nothing to restore)."""

    env: str | None
    enabled: bool


def _loopback_only() -> _ClusterMode:
    """Make Ray resolve this node's IP to loopback; returns what to restore afterwards."""
    from ray._private import ray_constants

    previous = _ClusterMode(env=os.environ.get(LOOPBACK_ENV), enabled=ray_constants.ENABLE_RAY_CLUSTER)
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


def _join(ray: ModuleType, address: str, kwargs: _InitOptions) -> RaySession:
    """Connect to a running cluster; a loopback address keeps this driver on loopback too."""
    _check_reachable(address)
    target = _host_port(address)
    restore = _ClusterMode()
    if target is not None and target[0] in LOOPBACK_NAMES:
        # Ray would rewrite 127.0.0.1 to this machine's routable address and look for the cluster there.
        restore = _loopback_only()
        kwargs = {**kwargs, "_node_ip_address": LOOPBACK_IP}
    try:
        info = ray.init(address=address, **kwargs)
    except Exception as exc:  # ConnectionError, RuntimeError, ray.exceptions.AuthenticationError (missing token), ...
        if restore:
            _set_cluster_mode(restore["env"], restore["enabled"])
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
    kwargs: _InitOptions = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.ERROR,
        "configure_logging": True,
    }
    if worker_env:
        kwargs["runtime_env"] = {"env_vars": dict(worker_env)}
    if address:
        return _join(ray, address, kwargs)
    # Ray starts its worker processes at niceness 15 by default: below every other program on the machine,
    # so on a shared box the trials got what the others left (no worker of a smoke run beside two busy
    # processes became ready in 90 s). The trials are the work the run measures: they run at the priority
    # the user started aiperf with. The launchers set the same for clusters they start (launch/ray_node.sh).
    os.environ.setdefault(WORKER_NICENESS_ENV, "0")
    restore = _loopback_only()
    try:
        info = ray.init(num_cpus=num_cpus, num_gpus=num_gpus, _node_ip_address=LOOPBACK_IP, **kwargs)
    except Exception as exc:
        _set_cluster_mode(restore["env"], restore["enabled"])
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
