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
                       "mem_used_bytes": ..., "mem_total_bytes": ..., "power_w": 612.3}]}

``wall`` is the master's Unix time when it asked (the same for every node of a round, and on
the same clock as the ledger's ``wall``); ``node_wall`` is the node's own clock when it
answered. A node that failed to answer gets ``{"wall": ..., "node": ..., "error": "..."}`` once.

"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from aiperf.errors import AiperfError
from aiperf.record.files import read_regular

TELEMETRY_NAME = "telemetry.jsonl"
_SAMPLE_TIMEOUT_S = 10.0  # a node slower than this to answer misses the sample, not the run


def _nvml_value(call: Any, *args: Any) -> Any:
    """One NVML query; ``None`` when the device does not support it (power on some boards) or it fails."""
    try:
        return call(*args)
    except Exception:  # pynvml raises its own NVMLError subclasses; any failure means "unknown"
        return None


class NodeSampler:
    """Reads this node's counters; runs as a Ray actor on the node it describes."""

    def __init__(self) -> None:
        import socket

        import psutil

        self._psutil = psutil
        self.hostname = socket.gethostname()
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement window
        self._nvml, self._handles = _open_nvml()

    def sample(self) -> dict[str, Any]:
        mem = self._psutil.virtual_memory()
        return {
            "wall": round(time.time(), 3),
            "hostname": self.hostname,
            "cpu_percent": float(self._psutil.cpu_percent(interval=None)),
            "host_mem_used_bytes": int(mem.total - mem.available),
            "host_mem_total_bytes": int(mem.total),
            "accelerators": [self._accelerator(k, h) for k, h in enumerate(self._handles)],
        }

    def _accelerator(self, index: int, handle: Any) -> dict[str, Any]:
        nvml = self._nvml
        name = _nvml_value(nvml.nvmlDeviceGetName, handle)
        util = _nvml_value(nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = _nvml_value(nvml.nvmlDeviceGetMemoryInfo, handle)
        milliwatts = _nvml_value(nvml.nvmlDeviceGetPowerUsage, handle)
        return {
            "index": index,
            "name": name.decode() if isinstance(name, bytes) else name,
            "util_percent": float(util.gpu) if util is not None else None,
            "mem_used_bytes": int(memory.used) if memory is not None else None,
            "mem_total_bytes": int(memory.total) if memory is not None else None,
            "power_w": milliwatts / 1000.0 if isinstance(milliwatts, (int, float)) else None,
        }

    def close(self) -> None:
        if self._nvml is not None:
            _nvml_value(self._nvml.nvmlShutdown)


def _open_nvml() -> tuple[Any, list[Any]]:
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

    def __init__(self, run_dir: str | Path, interval_s: float) -> None:
        if not interval_s > 0:
            raise AiperfError(f"telemetry interval must be positive, got {interval_s}")
        self.path = Path(run_dir) / TELEMETRY_NAME
        self.interval_s = float(interval_s)
        self._actors: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fh: Any = None
        self.samples = 0
        self.failure: str | None = None  # why telemetry stopped early, if it did
        self.on_warning: Callable[[str], None] = lambda message: None

    def start(self, nodes: list[Any]) -> None:
        """Place one sampler on each node and begin polling (the first sample is taken at once).

        Telemetry that cannot start (its file cannot be opened) is reported and skipped: the
        run does not depend on it.
        """
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a")  # noqa: SIM115 - held open while the recorder runs
            if self._fh.tell() > 0 and not self.path.read_bytes().endswith(b"\n"):
                self._fh.write("\n")  # end a line torn by a crash, so the next sample is not glued to it
        except OSError as exc:
            self._give_up(f"cannot write {self.path} ({exc.strerror or exc})")
            return
        remote = ray.remote(num_cpus=0, max_restarts=0)(NodeSampler)
        for node in nodes:
            strategy = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
            self._actors[node.node_id] = remote.options(scheduling_strategy=strategy).remote()
        self._thread = threading.Thread(target=self._loop, name="aiperf-telemetry", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except OSError as exc:  # the disk filled up, the file system went away
                self._give_up(f"cannot write {self.path} ({exc.strerror or exc})")
                return
            except Exception as exc:  # telemetry never stops the run: report it once and stop sampling
                self._give_up(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300])
                return
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _give_up(self, reason: str) -> None:
        self.failure = reason
        self._stop.set()
        with contextlib.suppress(OSError):
            if self._fh is not None and not self._fh.closed:
                self._fh.close()
        self.on_warning(f"telemetry stopped: {reason}; the run goes on without it")

    def sample_once(self) -> None:
        """Ask every live sampler for one reading and append what comes back."""
        import ray

        asked = round(time.time(), 3)  # the master's clock, like the ledger's wall: one time per round
        refs = {node: actor.sample.remote() for node, actor in self._actors.items()}
        if not refs:
            return
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=_SAMPLE_TIMEOUT_S)
        done = set(ready)
        for node, ref in refs.items():
            if ref not in done:
                continue  # slow this time; asked again next interval
            try:
                reading = ray.get(ref)
                self._write({**reading, "node": node, "wall": asked, "node_wall": reading["wall"]})
            except Exception as exc:  # the node or its actor died: record it once, stop asking it
                self._actors.pop(node, None)
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                self._write({"wall": round(time.time(), 3), "node": node, "error": first[:300]})

    def _write(self, sample: dict[str, Any]) -> None:
        if self._fh is None or self._fh.closed:
            return
        self._fh.write(json.dumps(sample, sort_keys=True) + "\n")
        self._fh.flush()
        if "error" not in sample:
            self.samples += 1

    def stop(self) -> None:
        """Stop polling, release the samplers and close the file (safe to call twice)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + _SAMPLE_TIMEOUT_S + 5)
            self._thread = None
        if self._actors:
            import ray

            for actor in self._actors.values():
                with contextlib.suppress(Exception):  # already gone with its node
                    ray.kill(actor)
            self._actors.clear()
        if self._fh is not None and not self._fh.closed:
            with contextlib.suppress(OSError):  # a full disk: what was written is what there is
                self._fh.close()


# --- reading and summarising ----------------------------------------------------------------


def _number(value: Any, low: float = 0.0, high: float = 1e300) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


_SAMPLE_NUMBERS = ("node_wall", "cpu_percent")
_SAMPLE_BYTES = ("host_mem_used_bytes", "host_mem_total_bytes")
_DEVICE_NUMBERS = ("util_percent", "mem_used_bytes", "mem_total_bytes", "power_w")


def _clean_sample(sample: Any) -> dict[str, Any] | None:
    """A sample with every field a reader uses of the right type (a wrong one becomes None), or None.

    ``telemetry.jsonl`` is not part of the hash chain and may be edited: a line that is not
    a sample (no numeric ``wall``, no string ``node``) is skipped like a torn one.
    """
    if not isinstance(sample, dict) or not _number(sample.get("wall"), 0, 253402300799.0):
        return None
    if not isinstance(sample.get("node"), str):
        return None
    out = dict(sample)
    if "error" in out:
        return out
    out["hostname"] = out.get("hostname") if isinstance(out.get("hostname"), str) else None
    for key in (*_SAMPLE_NUMBERS, *_SAMPLE_BYTES):
        if key in out and not _number(out[key]):
            out[key] = None
    devices = out.get("accelerators")
    out["accelerators"] = [
        {**a, **{k: a[k] if _number(a.get(k)) else None for k in _DEVICE_NUMBERS if k in a}}
        for a in (devices if isinstance(devices, list) else [])
        if isinstance(a, dict) and (a.get("index") is None or _number(a.get("index"), 0, 2**31))
    ]
    return out


def read_telemetry(run_dir: str | Path) -> list[dict[str, Any]]:
    """The samples of a run (an absent file is no samples; a torn or malformed line is dropped)."""
    path = Path(run_dir) / TELEMETRY_NAME
    try:
        data = read_regular(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise AiperfError(f"{path}: cannot read ({exc.strerror or exc})") from None
    out = []
    for line in data.splitlines():
        try:
            sample = _clean_sample(json.loads(line, parse_constant=_no_constant))
        except (ValueError, RecursionError):
            continue  # a line cut by a crash, or not JSON
        if sample is not None:
            out.append(sample)
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def _energy_j(samples: list[dict[str, Any]]) -> float | None:
    """Trapezoidal integral of each accelerator's power over its samples, summed over accelerators."""
    series: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for s in samples:
        for acc in s.get("accelerators") or []:
            if isinstance(acc.get("power_w"), (int, float)):
                series.setdefault((s["node"], acc.get("index", 0)), []).append((s["wall"], acc["power_w"]))
    if not series:
        return None
    total = 0.0
    for points in series.values():
        points.sort()
        total += sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in itertools.pairwise(points))
    return total


def summarize_telemetry(
    samples: list[dict[str, Any]], total_ops: float, interval_s: float | None = None
) -> dict[str, Any]:
    """Mean utilisation, peak memory, mean power, energy and OPS per watt of a run's samples.

    ``power_mean_w`` is the mean total accelerator power (energy over the sampled span).
    Energy is accelerator power integrated over the sampled span (board power as NVML reports
    it; host power is not measured). OPS per watt is the run's counted operations divided by
    that energy (operations per joule), so idle time before the first and after the last
    counted epoch costs efficiency, as it costs energy.
    """
    good = [s for s in samples if "error" not in s]
    accelerators = [a for s in good for a in s.get("accelerators") or []]
    energy = _energy_j(good)
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
        "power_mean_w": (energy / span) if energy is not None and span > 0 else None,
        "energy_j": energy,
        "ops_per_watt": (total_ops / energy) if energy else None,
    }
