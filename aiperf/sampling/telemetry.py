"""Per-node hardware telemetry while a run is going: utilisation, memory and power.

The score counts operations analytically, so it says nothing about how hard the machines
actually worked or what the work cost in energy. Telemetry fills that in: one small sampler
actor per node (no CPU reserved, pinned to its node) reports the accelerators (through NVML
when ``pynvml`` is installed), the host CPU and memory; a thread in the master polls them every
``run.telemetry_interval_s`` seconds and appends one JSON line per node and sample to
``telemetry.jsonl`` in the run directory. A node that stops answering is recorded once and
then left alone: telemetry never stops or slows a run.

Line format (one per node per sample)::

    {"wall": 1795415211.77, "node_wall": 1795415211.80, "node": "<ray node id>", "hostname": "gpu-07",
     "cpu_percent": 87.5, "host_mem_used_bytes": ..., "host_mem_total_bytes": ...,
     "accelerators": [{"index": 0, "name": "NVIDIA H100", "util_percent": 98.0,
                       "mem_used_bytes": ..., "mem_total_bytes": ..., "power_w": 612.3,
                       "energy_mj": 81234567}],
     "rapl": [{"zone": "intel-rapl:0", "name": "package-0", "energy_uj": ..., "max_energy_range_uj": ...}],
     "meter": {"source": "bmc-watts", "scope": "node", "reading": "watts", "covers": [...], "power_w": 702.0}}

``wall`` is the master's Unix time when it asked (the same for every node of a round, and on
the same clock as the ledger's ``wall``); ``node_wall`` is the node's own clock when it
answered. A node that failed to answer gets ``{"wall": ..., "node": ..., "error": "..."}`` once.
Energy counters are written raw (``energy_mj``, ``rapl``; ``meter`` only where a site meter is
configured) and turned into energy by :mod:`aiperf.sampling.energy`; older files without them
still read.

A shared machine. Each sample also carries ``cpus`` (the host's logical CPUs),
``cpu_busy_s`` (the host's busy CPU seconds since boot) and ``run_cpu_s`` (CPU seconds used,
since the sampler started, by *this run's* processes on the host: every process of the run's
Ray session -- raylets, GCS, workers, agents, found through the session directory named on
the raylet's command line -- with its descendants, and the master with its descendants).
Between two samples, busy time not used by the run was used by something else; the summary
reports that as a share of the host's CPU capacity (:func:`cpu_shares`), and when it reaches
``SHARED_MACHINE_PERCENT`` the verdict says so (:func:`shared_machine_notes`). Where NVML
reports per-process GPU use, each accelerator also carries ``outside_util_percent`` (the SM
utilisation of processes outside the run; ``null`` when a process cannot be attributed, as
from inside a container with its own PID namespace).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import (
    TYPE_CHECKING,
    NamedTuple,
    NoReturn,
    NotRequired,
    Protocol,
    TextIO,
    TypedDict,
    TypeGuard,
    TypeVar,
    cast,
)

from aiperf.errors import AiperfError, first_line
from aiperf.ledger.files import LineTooLong, bounded_lines, open_regular
from aiperf.sampling.energy import (
    POWERCAP_ROOT,
    MeterReading,
    MeterSpec,
    PowercapZones,
    RaplZone,
    SiteMeter,
    TelemetrySample,
)

if TYPE_CHECKING:
    from pynvml import c_nvmlDevice_t
    from ray import ObjectRef
    from ray.actor import ActorHandle


logger = logging.getLogger(__name__)

TELEMETRY_NAME = "telemetry.jsonl"
MAX_POWER_READINGS = 4096  # a node's power readings waiting for the master (34 min at 2 a second)
MAX_SAMPLE_BYTES = 1 << 20  # a node's sample with 8 accelerators and its RAPL zones is about 2 KB
_SAMPLE_TIMEOUT_S = 10.0  # a node slower than this to answer misses the sample, not the run
# At the run's end: how long the sampling thread and the samplers' release may take. A batch system that ends
# the job (scancel, the time limit) stops Ray's control plane with the master, and a call into Ray then waits
# for its own timeout (a minute): longer than Slurm's KillWait, and the run_stop, written after, was lost.
_STOP_WAIT_S = 2.0
# CPU or GPU time used outside the run, as a share of the host's capacity, from which the
# verdict notes a shared machine: well above what the OS, the sampler's neighbours and short-lived
# tools use on an idle host, well below what a second run on the host takes (about half of it).
# Measured figures: benchmarks/RESULTS.md, "Figures moved from code comments".
SHARED_MACHINE_PERCENT = 10.0
_SESSION = re.compile(r"session_[0-9][\w.-]*")
T = TypeVar("T")


class _Node(Protocol):
    """A node to sample (``aiperf.cluster.resources.NodeInfo``; the cluster layer sits above this one)."""

    node_id: str


class MasterProcess(TypedDict, total=False):
    """The run's master, as the recorder tells each sampler (its CPU time counts as the run's on its host)."""

    pid: int
    started: float  # the process's create time
    host: str


class AcceleratorSample(TypedDict):
    """One accelerator of a sample; None where NVML cannot tell."""

    index: int
    name: str | None
    util_percent: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    power_w: float | None
    outside_util_percent: float | None
    energy_mj: int | None  # NVML's energy counter since the driver loaded (Volta and later)


class AcceleratorPower(TypedDict):
    index: int
    power_w: float | None
    energy_mj: int | None


class PowerReading(TypedDict):
    """One reading of a node's power sources by its power thread (``NodeSample.power``)."""

    node_wall: float
    accelerators: list[AcceleratorPower]
    rapl: list[RaplZone]
    meter: NotRequired[MeterReading]


class NodeSample(TypedDict):
    """What a node's sampler reports (the recorder adds ``node``, its own ``wall`` and ``node_wall``)."""

    wall: float
    hostname: str
    cpu_percent: float
    cpus: int
    cpu_busy_s: float
    run_cpu_s: float
    host_mem_used_bytes: int
    host_mem_total_bytes: int
    accelerators: list[AcceleratorSample]
    rapl: list[RaplZone]  # every powercap RAPL zone, raw (aiperf.sampling.energy.PowercapZones)
    meter: NotRequired[MeterReading]  # the site meter's reading, where one is configured for this node
    power: NotRequired[list[PowerReading]]  # the power thread's readings since the last sample (run.power_interval_s)
    power_cpu_s: NotRequired[float]  # the CPU seconds those readings have cost this node so far


class CpuShares(TypedDict):
    """CPU time of the run and of everything else on its hosts, in % of their capacity (None: not measured)."""

    cpu_run_percent: float | None
    cpu_outside_percent: float | None


class TelemetrySummary(CpuShares):
    """The ``telemetry`` section of the summary."""

    samples: int
    nodes: int
    nodes_lost: list[str]
    interval_s: float | None
    span_s: float
    cpu_util_mean_percent: float | None
    host_mem_peak_bytes: int | None
    accelerators: int
    accelerator_util_mean_percent: float | None
    accelerator_mem_peak_bytes: int | None
    accelerator_outside_util_mean_percent: float | None


def _nvml_value(call: Callable[..., T], *args: object) -> T | None:
    """One NVML query; ``None`` when the device does not support it (power on some boards) or it fails."""
    try:
        return call(*args)
    except Exception:  # pynvml raises its own NVMLError subclasses; any failure means "unknown"
        return None


def host_busy_cpu_s(psutil: ModuleType) -> float:
    """CPU seconds the host has been busy since boot: user, nice, system and interrupts (not idle, I/O wait, steal)."""
    times = psutil.cpu_times()
    return float(sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq")))


class RunProcesses:
    """The CPU seconds this run's processes on one host have used since the first :meth:`update`.

    The run's processes are found afresh at every update (workers come and go): every
    process whose command line names the run's Ray session directory (raylet, GCS,
    agents), every descendant of those (the workers, whose titles Ray rewrites), and the
    master with its descendants when it runs on this host. Each process's CPU time is
    followed by (PID, start time), so an exited process costs at most its last interval
    and a reused PID is not mistaken for it.
    """

    def __init__(
        self, psutil: ModuleType, session: str | None, master_pid: int | None, master_started: float | None
    ) -> None:
        self._psutil = psutil
        self.session = session
        self.master = (master_pid, master_started)
        self._seen: dict[tuple[int, float], float] = {}
        self._last_update: float | None = None
        self.cpu_s = 0.0
        self.pids: set[int] = set()

    def update(self) -> float:
        """Account for the CPU time used since the previous call; returns the running total."""
        psutil = self._psutil
        parents: dict[int, list[int]] = {}
        info: dict[int, tuple[float, float]] = {}  # pid -> (start time, cpu seconds)
        roots: set[int] = set()
        attrs = ["pid", "ppid", "create_time", "cpu_times", "cmdline"]
        for proc in psutil.process_iter(attrs):
            try:
                data = proc.info
                pid, times = data["pid"], data["cpu_times"]
                if times is None or data["create_time"] is None:
                    continue
                info[pid] = (float(data["create_time"]), float(times.user + times.system))
                parents.setdefault(data["ppid"] or 0, []).append(pid)
                if self.session and any(self.session in part for part in data["cmdline"] or ()):
                    roots.add(pid)
            except (psutil.Error, KeyError, TypeError, AttributeError):
                continue
        master_pid, master_started = self.master
        if master_pid in info and master_started is not None and abs(info[master_pid][0] - master_started) < 1.0:
            roots.add(master_pid)
        members, stack = set(), list(roots)
        while stack:
            pid = stack.pop()
            if pid not in members:
                members.add(pid)
                stack.extend(parents.get(pid, ()))
        now = time.time()
        seen: dict[tuple[int, float], float] = {}
        for pid in members:
            if pid not in info:
                continue
            started, cpu = info[pid]
            key = (pid, started)
            seen[key] = cpu
            if self._last_update is None:
                continue  # the first update only sets the baselines
            before = self._seen.get(key)
            if before is not None:
                self.cpu_s += max(0.0, cpu - before)
            elif started >= self._last_update - 1.0:  # new since the last update: all of its time is the run's
                self.cpu_s += cpu
        self._seen, self._last_update, self.pids = seen, now, {pid for pid, _ in seen}
        return self.cpu_s


def _ray_session(psutil: ModuleType) -> str | None:
    """The Ray session directory name (``session_2026-...``) from the raylet this process descends from."""
    try:
        proc = psutil.Process()
        for _ in range(6):
            proc = proc.parent()
            if proc is None:
                return None
            if proc.name() == "raylet":
                match = _SESSION.search(" ".join(proc.cmdline()))
                return match.group(0) if match else None
    except psutil.Error:
        return None
    return None


class NodeSampler:
    """Reads this node's counters; runs as a Ray actor on the node it describes.

    ``master`` (``{"pid", "started", "host"}``) identifies the run's master, so its CPU time
    counts as the run's on the host it runs on; ``meter`` is the site power meter this node
    reads, if any.
    """

    def __init__(
        self,
        master: MasterProcess | None = None,
        meter: MeterSpec | None = None,
        powercap: str = POWERCAP_ROOT,
        power_interval_s: float = 0.0,
    ) -> None:
        import socket

        import psutil

        self._psutil = psutil
        self.hostname = socket.gethostname()
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement window
        self._nvml, self._handles = _open_nvml()
        master = master or {}
        here = master.get("host") == self.hostname
        self.run = RunProcesses(
            psutil,
            _ray_session(psutil),
            master.get("pid") if here else None,
            master.get("started") if here else None,
        )
        self.run.update()
        self._gpu_seen: dict[int, int] = {}  # NVML timestamp of the last per-process sample read, per device
        self._rapl = PowercapZones(powercap)
        self._meter = SiteMeter(meter) if meter else None
        # Power sources read every power_interval_s on this node and handed over with the next sample
        # (MLPerf's power rule: at least one reading a second through the timed run; the master polls less often).
        self._power: collections.deque[PowerReading] = collections.deque(maxlen=MAX_POWER_READINGS)
        self._power_cpu_s = 0.0  # what reading them has cost this node's CPU
        self._power_stop = threading.Event()
        self._power_thread: threading.Thread | None = None
        if power_interval_s > 0:
            self._power_thread = threading.Thread(
                target=self._power_loop, args=(float(power_interval_s),), name="aiperf-power", daemon=True
            )
            self._power_thread.start()

    def _power_loop(self, interval_s: float) -> None:
        next_at = time.monotonic()
        while not self._power_stop.is_set():
            cpu0 = time.thread_time()
            try:
                self._power.append(self.power_reading())
            except Exception as exc:  # a reading that fails is a gap in the series, never a stopped run
                logger.debug("power reading failed: %s", exc)
            self._power_cpu_s += time.thread_time() - cpu0
            next_at += interval_s
            self._power_stop.wait(max(0.0, next_at - time.monotonic()))

    def power_reading(self) -> PowerReading:
        """Every power source of this node now: accelerators' power and energy counter, RAPL, the site meter."""
        reading: PowerReading = {
            "node_wall": round(time.time(), 3),
            "accelerators": [self._accelerator_power(k, h) for k, h in enumerate(self._handles)],
            "rapl": self._rapl.read(),
        }
        if self._meter is not None:
            reading["meter"] = self._meter.read()
        return reading

    def _accelerator_power(self, index: int, handle: c_nvmlDevice_t) -> AcceleratorPower:
        nvml = self._nvml
        assert nvml is not None
        milliwatts = _nvml_value(nvml.nvmlDeviceGetPowerUsage, handle)
        energy = _nvml_value(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        return {
            "index": index,
            "power_w": milliwatts / 1000.0 if milliwatts is not None else None,
            "energy_mj": int(energy) if energy is not None else None,
        }

    def sample(self) -> NodeSample:
        mem = self._psutil.virtual_memory()
        run_cpu_s = self.run.update()
        sample: NodeSample = {
            "wall": round(time.time(), 3),
            "hostname": self.hostname,
            "cpu_percent": float(self._psutil.cpu_percent(interval=None)),
            "cpus": int(self._psutil.cpu_count() or 0),
            "cpu_busy_s": round(host_busy_cpu_s(self._psutil), 3),
            "run_cpu_s": round(run_cpu_s, 3),
            "host_mem_used_bytes": int(mem.total - mem.available),
            "host_mem_total_bytes": int(mem.total),
            "accelerators": [self._accelerator(k, h) for k, h in enumerate(self._handles)],
            "rapl": self._rapl.read(),
        }
        if self._power_thread is not None:  # the power thread reads the meter; its readings travel here
            readings = []
            while self._power:
                readings.append(self._power.popleft())
            sample["power"] = readings
            sample["power_cpu_s"] = round(self._power_cpu_s, 4)
        elif self._meter is not None:  # last: a slow meter delays nothing else of the sample
            sample["meter"] = self._meter.read()
        return sample

    def _accelerator(self, index: int, handle: c_nvmlDevice_t) -> AcceleratorSample:
        nvml = self._nvml
        assert nvml is not None  # there are handles only while NVML is open
        name = _nvml_value(nvml.nvmlDeviceGetName, handle)
        util = _nvml_value(nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = _nvml_value(nvml.nvmlDeviceGetMemoryInfo, handle)
        milliwatts = _nvml_value(nvml.nvmlDeviceGetPowerUsage, handle)
        energy_query = getattr(nvml, "nvmlDeviceGetTotalEnergyConsumption", None)  # older bindings lack it
        millijoules = _nvml_value(energy_query, handle) if energy_query is not None else None
        return {
            "index": index,
            "name": name.decode() if isinstance(name, bytes) else name,
            "util_percent": float(util.gpu) if util is not None else None,
            "mem_used_bytes": int(memory.used) if memory is not None else None,
            "mem_total_bytes": int(memory.total) if memory is not None else None,
            "power_w": milliwatts / 1000.0 if isinstance(milliwatts, (int, float)) else None,
            "outside_util_percent": self._outside_gpu_util(index, handle),
            "energy_mj": int(millijoules) if isinstance(millijoules, int) and millijoules >= 0 else None,
        }

    def _outside_gpu_util(self, index: int, handle: c_nvmlDevice_t) -> float | None:
        """SM utilisation of processes outside the run since the last sample, where NVML can tell.

        ``nvmlDeviceGetProcessUtilization`` returns samples newer than the timestamp passed;
        None when the call is unsupported or a process is not visible here (another PID
        namespace), 0.0 when only the run's processes (or none) used the device.
        """
        query = getattr(self._nvml, "nvmlDeviceGetProcessUtilization", None)
        samples = _nvml_value(query, handle, self._gpu_seen.get(index, 0)) if query is not None else None
        if samples is None:
            return None
        outside = 0.0
        newest = self._gpu_seen.get(index, 0)
        latest: dict[int, float] = {}
        for item in samples:
            pid, util, stamp = getattr(item, "pid", None), getattr(item, "smUtil", None), getattr(item, "timeStamp", 0)
            if not isinstance(pid, int) or not isinstance(util, (int, float)):
                continue
            newest = max(newest, int(stamp or 0))
            latest[pid] = max(latest.get(pid, 0.0), float(util))
        for pid, util in latest.items():
            if pid in self.run.pids:
                continue
            if not self._psutil.pid_exists(pid):
                return None
            outside += util
        self._gpu_seen[index] = newest
        return min(100.0, outside)

    def close(self) -> None:
        self._power_stop.set()
        if self._power_thread is not None:
            self._power_thread.join(timeout=_SAMPLE_TIMEOUT_S)
        if self._nvml is not None:
            _nvml_value(self._nvml.nvmlShutdown)


def _open_nvml() -> tuple[ModuleType | None, list[c_nvmlDevice_t]]:
    """(pynvml, device handles) when NVML works on this node, else (None, [])."""
    try:
        import pynvml
    except ImportError:
        return None, []
    try:
        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
        return pynvml, [pynvml.nvmlDeviceGetHandleByIndex(k) for k in range(count)]
    except Exception:  # no driver, no device, or a driver/library mismatch: no accelerator telemetry
        return None, []


class TelemetryRecorder:
    """Samples every node of the run in the background and appends the samples to ``telemetry.jsonl``."""

    def __init__(
        self, run_dir: str | Path, interval_s: float, meter: MeterSpec | None = None, power_interval_s: float = 0.0
    ) -> None:
        if not interval_s > 0:
            raise AiperfError(f"telemetry interval must be positive, got {interval_s}")
        self.path = Path(run_dir) / TELEMETRY_NAME
        self.interval_s = float(interval_s)
        self.power_interval_s = max(0.0, float(power_interval_s))
        self.meter = meter
        self._actors: dict[str, ActorHandle[NodeSampler]] = {}  # node id -> its sampler's Ray actor handle
        self._stop = threading.Event()
        self._run_stopping = threading.Event()  # the run was signalled: a sampler that dies now went with the job
        self._thread: threading.Thread | None = None
        self._fh: TextIO | None = None
        self._file_lock = threading.Lock()  # a sample is written whole, and none after the file is closed
        self.samples = 0
        self.failure: str | None = None  # why telemetry stopped early, if it did
        self._digest = hashlib.sha256()  # of every byte of the file, what an earlier session wrote included
        self._bytes = 0

    def start(self, nodes: Sequence[_Node]) -> None:
        """Place one sampler on each node and begin polling (the first sample is taken at once).

        Telemetry that cannot start (its file cannot be opened) is reported and skipped: the
        run does not depend on it.
        """
        import platform

        import psutil
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if not self.open():
            return
        me = psutil.Process()
        master: MasterProcess = {"pid": me.pid, "started": me.create_time(), "host": platform.node()}
        remote = ray.remote(num_cpus=0, max_restarts=0)(NodeSampler)
        meters = self.meters_for(nodes)
        for node in nodes:
            strategy = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
            self._actors[node.node_id] = cast(  # Ray's stubs allow the class itself here; it is a handle
                "ActorHandle[NodeSampler]",
                remote.options(scheduling_strategy=strategy).remote(
                    master, meters.get(node.node_id), POWERCAP_ROOT, self.power_interval_s
                ),
            )
        self._thread = threading.Thread(target=self._loop, name="aiperf-telemetry", daemon=True)
        self._thread.start()

    def meters_for(self, nodes: Sequence[_Node]) -> dict[str, MeterSpec]:
        """Which nodes read the site meter: a system meter on the head node (else the first) only; a node
        meter once per host (several Ray nodes of one host, a simulated cluster, would read the same meter)."""
        if self.meter is None or not nodes:
            return {}
        if self.meter["scope"] == "system":
            head = next((n for n in nodes if getattr(n, "is_head", False)), nodes[0])
            return {head.node_id: self.meter}
        out: dict[str, MeterSpec] = {}
        hosts: set[str] = set()
        for node in nodes:
            host = getattr(node, "hostname", None) or node.node_id
            if host not in hosts:
                hosts.add(host)
                out[node.node_id] = self.meter
        return out

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except OSError as exc:  # the disk filled up, the file system went away
                self._give_up(f"cannot write {self.path} ({exc.strerror or exc})")
                return
            except Exception as exc:  # telemetry never stops the run: report it once and stop sampling
                self._give_up(f"{type(exc).__name__}: {first_line(exc)}"[:300])
                return
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _give_up(self, reason: str) -> None:
        self.failure = reason
        self._stop.set()
        self._close()
        logger.warning(f"telemetry stopped: {reason}; the run goes on without it")

    def sample_once(self) -> None:
        """Ask every live sampler for one reading and append what comes back."""
        import ray

        asked = round(time.time(), 3)  # the master's clock, like the ledger's wall: one time per round
        refs: dict[str, ObjectRef[NodeSample]] = {node: actor.sample.remote() for node, actor in self._actors.items()}
        if not refs:
            return
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=_SAMPLE_TIMEOUT_S)
        done = set(ready)
        for node, ref in refs.items():
            if ref not in done:
                continue  # slow this time; asked again next interval
            try:
                reading = ray.get(ref)
                self.write({**reading, "node": node, "wall": asked, "node_wall": reading["wall"]})
            except Exception as exc:  # the node or its actor died: record it once, stop asking it
                self._actors.pop(node, None)
                if self._run_stopping.is_set():  # scancel, a time limit: the batch system stopped the node too
                    logger.debug("telemetry sampler on node %s ended with the run: %s", node, exc)
                    continue
                self.write({"wall": round(time.time(), 3), "node": node, "error": first_line(exc)})

    def run_stopping(self) -> None:
        """The run was signalled to stop (SIGTERM): samplers that stop answering from now on are not lost nodes.

        A batch system signals every process of a job at once, the nodes' Ray processes with the
        master, so their samplers die while the master is still writing its results.
        """
        self._run_stopping.set()

    def open(self) -> bool:
        """Open ``telemetry.jsonl`` to append (``start`` does); False, reported, when it cannot be written.

        What an earlier session of the run wrote is hashed first, so the ``run_stop`` binds the
        whole file; a line a crash tore is ended, so the next sample is not glued to it.
        """
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="ascii")  # noqa: SIM115 - held open while the recorder runs
            self._bytes, torn = _hash_file(self.path, self._digest)
            if torn:
                self._append("\n")
        except OSError as exc:
            self._give_up(f"cannot write {self.path} ({exc.strerror or exc})")
            return False
        return True

    def write(self, sample: Mapping[str, object]) -> None:
        """Append one sample (a line of JSON) and flush it; nothing once the recorder stopped."""
        line = json.dumps(sample, sort_keys=True) + "\n"  # ASCII: json.dumps escapes the rest
        with self._file_lock:
            if self._fh is None or self._fh.closed:
                return
            self._append(line)
            self._fh.flush()
            if "error" not in sample:
                self.samples += 1

    def _close(self) -> None:
        """Close the file: what it holds now is what the run_stop binds (a sample asked for later is dropped)."""
        with self._file_lock, contextlib.suppress(OSError):  # a full disk: what was written is what there is
            if self._fh is not None and not self._fh.closed:
                self._fh.close()

    def _append(self, text: str) -> None:
        assert self._fh is not None
        self._fh.write(text)
        data = text.encode("ascii")
        self._digest.update(data)
        self._bytes += len(data)

    def run_stop_fields(self) -> dict[str, int | str]:
        """What the run's ``run_stop`` binds of ``telemetry.jsonl``: its size and SHA-256, when all of it was written
        here; nothing when telemetry stopped early or never started (what is on disk is then not known).

        The file is not in the hash chain; bound by its last record, an edit or an invented reading
        (RAPL counters on a VM with none) no longer reaches the energy figure (:func:`read_bound_telemetry`).
        """
        if self.failure is not None or self._fh is None:
            return {}
        return {"telemetry_bytes": self._bytes, "telemetry_sha256": self._digest.hexdigest()}

    def stop(self) -> None:
        """Stop polling, close the file and release the samplers, within seconds whatever Ray does (safe to call
        twice).

        The file is closed first: a round of samples still waiting on Ray writes nothing after it, so
        the thread is not waited for beyond ``_STOP_WAIT_S``. The samplers are released on a thread of
        their own, waited for as long: a node gone with the job (or a control plane that no longer
        answers) cannot hold the run's end; its sampler goes with its Ray node.
        """
        self._stop.set()
        self._close()
        if self._thread is not None:
            self._thread.join(timeout=_STOP_WAIT_S)
            self._thread = None
        if self._actors:
            actors, self._actors = list(self._actors.values()), {}
            release = threading.Thread(target=_release, args=(actors,), name="aiperf-telemetry-release", daemon=True)
            release.start()
            release.join(timeout=_STOP_WAIT_S)


def _release(actors: list[ActorHandle[NodeSampler]]) -> None:
    """End each sampler actor (the run is over); one already gone with its node is skipped."""
    import ray

    for actor in actors:
        try:
            ray.kill(actor)
        except Exception as exc:  # already gone with its node
            logger.debug("releasing a telemetry sampler: %s", exc)


# --- reading and summarising ----------------------------------------------------------------


def _number(value: object, low: float = 0.0, high: float = 1e300) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


_SAMPLE_NUMBERS = ("node_wall", "cpu_percent", "cpus", "cpu_busy_s", "run_cpu_s")
_SAMPLE_BYTES = ("host_mem_used_bytes", "host_mem_total_bytes")
_DEVICE_NUMBERS = ("util_percent", "mem_used_bytes", "mem_total_bytes", "power_w", "outside_util_percent", "energy_mj")
_ZONE_NUMBERS = ("energy_uj", "max_energy_range_uj")
_METER_NUMBERS = ("power_w", "energy_j")


def _clean_sample(sample: object) -> TelemetrySample | None:
    """A sample with every field a reader uses of the right type (a wrong one becomes None), or None.

    ``telemetry.jsonl`` is not part of the hash chain and may be edited: a line that is not
    a sample (no numeric ``wall``, no string ``node``) is skipped like a torn one, and so is a
    power reading in it without a numeric ``node_wall``.
    """
    if not isinstance(sample, dict) or not _number(sample.get("wall"), 0, 253402300799.0):
        return None
    if not isinstance(sample.get("node"), str):
        return None
    out = dict(sample)
    if "error" in out:
        return cast(TelemetrySample, out)  # a sampler's error: node, wall and why
    out["hostname"] = out.get("hostname") if isinstance(out.get("hostname"), str) else None
    for key in (*_SAMPLE_NUMBERS, *_SAMPLE_BYTES, "power_cpu_s"):
        if key in out and not _number(out[key]):
            out[key] = None
    _clean_power_fields(out)
    if "power" in out:
        readings = out["power"]
        out["power"] = [
            _clean_power_fields(dict(r))
            for r in (readings if isinstance(readings, list) else [])
            if isinstance(r, dict) and _number(r.get("node_wall"), 0, 253402300799.0)
        ]
    return cast(TelemetrySample, out)  # every field a reader uses checked above


def _clean_power_fields(out: dict[str, object]) -> dict[str, object]:
    """``out``'s accelerators, RAPL zones and meter reading with every number a reader uses checked (in place)."""
    devices = out.get("accelerators")
    out["accelerators"] = [
        {**a, **{k: a[k] if _number(a.get(k)) else None for k in _DEVICE_NUMBERS if k in a}}
        for a in (devices if isinstance(devices, list) else [])
        if isinstance(a, dict) and (a.get("index") is None or _number(a.get("index"), 0, 2**31))
    ]
    if "rapl" in out:  # absent in files written before RAPL was read: "not recorded", not "none"
        zones = out["rapl"]
        out["rapl"] = [
            {**z, **{k: z[k] if _number(z.get(k)) else None for k in _ZONE_NUMBERS if k in z}}
            for z in (zones if isinstance(zones, list) else [])
            if isinstance(z, dict) and isinstance(z.get("zone"), str)
        ]
    if "meter" in out:
        meter = out["meter"]
        if isinstance(meter, dict) and meter.get("scope") in ("node", "system"):
            covers = meter.get("covers")
            out["meter"] = {
                **meter,
                **{k: meter[k] if _number(meter.get(k)) else None for k in _METER_NUMBERS if k in meter},
                "covers": [c for c in covers if isinstance(c, str)] if isinstance(covers, list) else [],
            }
        else:
            del out["meter"]
    return out


def _hash_file(path: Path, digest: _Digest, limit: int | None = None) -> tuple[int, bool]:
    """Feed ``digest`` the file's bytes (its first ``limit``); (bytes fed, whether the last line is unfinished)."""
    total, last = 0, b"\n"
    with open(path, "rb") as fh:
        while limit is None or total < limit:
            chunk = fh.read(2**20 if limit is None else min(2**20, limit - total))
            if not chunk:
                break
            digest.update(chunk)
            total += len(chunk)
            last = chunk[-1:]
    return total, total > 0 and last != b"\n"


class _Digest(Protocol):
    """What :func:`_hash_file` feeds: a hashlib object."""

    def update(self, data: bytes, /) -> None: ...


@dataclass(frozen=True)
class TelemetryBinding:
    """What a ``run_stop`` records of ``telemetry.jsonl``: its size and SHA-256 when the run stopped."""

    bytes: int
    sha256: str


@dataclass(frozen=True)
class BoundTelemetry:
    """A run's samples, and whether they are the ones its ledger binds: True, False (the file differs: no
    samples), or None (the ledger binds none: written before 2026-12-07, or the run did not end)."""

    samples: list[TelemetrySample]
    bound: bool | None


def read_bound_telemetry(run_dir: str | Path, binding: TelemetryBinding | None) -> BoundTelemetry:
    """The samples of the prefix ``binding`` names, when the file's first ``binding.bytes`` hash to it; else none."""
    if binding is None:
        return BoundTelemetry(read_telemetry(run_dir), None)
    path = Path(run_dir) / TELEMETRY_NAME
    digest = hashlib.sha256()
    try:
        fed, _ = _hash_file(path, digest, binding.bytes)
    except OSError:
        return BoundTelemetry([], False)
    if fed != binding.bytes or digest.hexdigest() != binding.sha256:
        return BoundTelemetry([], False)
    return BoundTelemetry(read_telemetry(run_dir, binding.bytes), True)


def read_telemetry(run_dir: str | Path, upto: int | None = None) -> list[TelemetrySample]:
    """The samples of a run (an absent file is no samples; a torn or malformed line is dropped), of its first
    ``upto`` bytes when given.

    Read line by line: a line longer than ``MAX_SAMPLE_BYTES`` is no sample a node writes and is
    refused by its offset before it is held in memory.
    """
    path = Path(run_dir) / TELEMETRY_NAME
    try:
        fh = open_regular(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise AiperfError(f"{path}: cannot read ({exc.strerror or exc})") from None
    out = []
    with fh:
        try:
            for _, offset, line in bounded_lines(fh, MAX_SAMPLE_BYTES):
                if upto is not None and offset + len(line) > upto:
                    break  # past what the ledger binds
                try:
                    sample = _clean_sample(json.loads(line, parse_constant=_no_constant))
                except (ValueError, RecursionError):
                    continue  # a line cut by a crash, or not JSON
                if sample is not None:
                    out.append(sample)
        except LineTooLong as exc:
            raise AiperfError(
                f"{path}: the line at byte {exc.offset:,} is longer than {exc.limit:,} bytes, "
                "the most a telemetry sample may hold: not a sample aiperf writes"
            ) from None
        except OSError as exc:
            raise AiperfError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return out


def _no_constant(name: str) -> NoReturn:
    raise ValueError(name)


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def summarize_telemetry(samples: Sequence[TelemetrySample], interval_s: float | None = None) -> TelemetrySummary:
    """Mean utilisation, peak memory and CPU shares of a run's samples.

    Energy and OPS per watt are the summary's ``energy`` section (:func:`aiperf.sampling.energy.summarize_energy`).
    """
    good = [s for s in samples if "error" not in s]
    accelerators = [a for s in good for a in s.get("accelerators") or []]
    shares = cpu_shares(good)
    walls = [s["wall"] for s in good]
    span = (max(walls) - min(walls)) if walls else 0.0
    return {
        "samples": len(good),
        "nodes": len({s["node"] for s in good}),
        "nodes_lost": sorted({s["node"] for s in samples if "error" in s}),
        "interval_s": interval_s,
        "span_s": span,
        "cpu_util_mean_percent": _mean(s.get("cpu_percent") for s in good),
        "host_mem_peak_bytes": max((s.get("host_mem_used_bytes") or 0 for s in good), default=None),
        "accelerators": len({(s["node"], a.get("index")) for s in good for a in s.get("accelerators") or []}),
        "accelerator_util_mean_percent": _mean(a.get("util_percent") for a in accelerators),
        "accelerator_mem_peak_bytes": max((a.get("mem_used_bytes") or 0 for a in accelerators), default=None),
        **shares,
        "accelerator_outside_util_mean_percent": _mean(a.get("outside_util_percent") for a in accelerators),
    }


class _CpuPoint(NamedTuple):
    """A sample's CPU counters, each a checked number (:func:`cpu_shares`)."""

    node_wall: float
    wall: float
    cpus: float
    cpu_busy_s: float
    run_cpu_s: float


def cpu_shares(samples: Sequence[TelemetrySample]) -> CpuShares:
    """CPU time of the run and of everything else on its hosts, as shares of their CPU capacity.

    For each sampler, between its consecutive samples: the host's busy CPU seconds, of which
    ``run_cpu_s`` were the run's; the rest was used outside the run. Capacity is the host's
    logical CPUs times the interval on its own clock. Several Ray nodes on one host (a
    simulated cluster) report the same host-wide counters, so each host counts once per
    polling round (the master's ``wall``); a resumed run's new sampler simply continues the
    host's series. Intervals where a counter went backwards are skipped. All None without
    the counters (runs recorded before they existed).
    """
    series: dict[tuple[str, str], list[_CpuPoint]] = {}
    for s in samples:
        busy, run, cpus, node_wall = s.get("cpu_busy_s"), s.get("run_cpu_s"), s.get("cpus"), s.get("node_wall")
        if _number(busy) and _number(run) and _number(cpus) and _number(node_wall):
            point = _CpuPoint(node_wall, s["wall"], cpus, busy, run)
            series.setdefault((s.get("hostname") or s["node"], s["node"]), []).append(point)
    rounds: dict[tuple[str, float], tuple[float, float, float]] = {}  # (host, wall) -> (capacity, run, outside)
    for (host, _), points in sorted(series.items()):
        points.sort(key=lambda p: p.node_wall)
        for a, b in itertools.pairwise(points):
            dt = b.node_wall - a.node_wall
            busy = b.cpu_busy_s - a.cpu_busy_s
            used = b.run_cpu_s - a.run_cpu_s
            if dt <= 0 or busy < 0 or used < 0 or not b.cpus or (host, b.wall) in rounds:
                continue
            rounds[(host, b.wall)] = (dt * b.cpus, min(used, busy), max(0.0, busy - used))
    capacity = sum(r[0] for r in rounds.values())
    if capacity <= 0:
        return {"cpu_run_percent": None, "cpu_outside_percent": None}
    run = sum(r[1] for r in rounds.values())
    outside = sum(r[2] for r in rounds.values())
    return {"cpu_run_percent": 100.0 * run / capacity, "cpu_outside_percent": 100.0 * outside / capacity}


def shared_machine_notes(telemetry: TelemetrySummary) -> list[str]:
    """``shared machine: 47 % of CPU time outside the run`` (and GPU) when at least ``SHARED_MACHINE_PERCENT``."""
    notes = []
    for key, what in (("cpu_outside_percent", "CPU"), ("accelerator_outside_util_mean_percent", "GPU")):
        share = telemetry.get(key)
        if _number(share) and share >= SHARED_MACHINE_PERCENT:
            notes.append(f"shared machine: {share:.0f} % of {what} time outside the run")
    return notes
