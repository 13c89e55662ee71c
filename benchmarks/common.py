"""Shared pieces of the performance benchmarks: machine facts, test nets, data, matmul peaks, runs.

A throughput figure means nothing without the machine, the load and the software it was
measured on, so every benchmark prints :func:`machine_facts` next to its numbers. The
matmul peaks are measured, not taken from a data sheet, so that "fraction of peak" compares
two figures taken on the same device, under the same load, in the same session.

Keras must not be imported before :func:`configure_backend` (it binds the backend and
thread counts for the process), so nothing here imports it at module level.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
ARCHS = ("seed", "resnet50", "searched")
SEARCHED_MORPHS = 6  # random morphs applied to the seed to stand in for a net the search found
PACKAGES = ("keras", "tensorflow", "jax", "jaxlib", "numpy", "ray", "optuna")


# -- where and when ---------------------------------------------------------------------------------
def cores() -> int:
    """CPU cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def load_note() -> str:
    """``load 1.92/2.10/2.31 on 2 cores``: how busy the machine was, next to each figure."""
    one, five, fifteen = load_average()
    return f"load {one:.2f}/{five:.2f}/{fifteen:.2f} on {os.cpu_count()} cores"


def gpu_names() -> list[str]:
    from aiperf.training.backend import nvidia_gpus

    return [g["name"] for g in nvidia_gpus()]


def machine_facts() -> dict[str, Any]:
    """Date, host, CPU, GPUs, load and package versions: what a figure needs to be reproducible."""
    from aiperf.training.backend import cpu_model  # imports no Keras

    versions = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return {
        "date": datetime.now().astimezone().strftime("%a %b %d %H:%M:%S %Z %Y"),
        "utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": cpu_model(),
        "cores": cores(),
        "machine_cores": os.cpu_count(),
        "gpus": gpu_names(),
        "load": load_note(),
        "keras_backend": os.environ.get("KERAS_BACKEND"),
        "versions": versions,
    }


def configure_backend(backend: str, threads: int) -> None:
    """Select the Keras backend and thread counts exactly as a worker does, before Keras is imported."""
    from aiperf.training.backend import configure_process

    configure_process(backend, threads)


def device_kind(backend: str) -> str:
    """``gpu`` when the backend sees an accelerator, else ``cpu`` (imports the framework)."""
    from aiperf.training.backend import describe_device

    return describe_device(backend).kind


# -- what to train ----------------------------------------------------------------------------------
def benchmark_net(
    arch: str,
    image_size: int,
    channels: int = 3,
    classes: int = 10,
    width: int = 32,
    morphs: int = SEARCHED_MORPHS,
    seed: int = 0,
) -> Any:
    """One of the benchmark nets: the seed, ResNet-50, or the seed grown by ``morphs`` random morphs.

    The "searched" net is reproducible (fixed RNG seed), so the figure can be compared across
    sessions; it has the branches and odd widths a real search produces, unlike the zoo nets.
    """
    import numpy as np

    from nas import zoo
    from nas.morph import random_morph

    shape = (image_size, image_size, channels)
    if arch == "seed":
        return zoo.small_resnet(shape, classes, width=width)
    if arch == "resnet50":
        return zoo.resnet(50, shape, classes)
    if arch == "searched":
        graph = zoo.small_resnet(shape, classes, width=width)
        rng = np.random.default_rng(seed)
        for _ in range(morphs):
            grown = random_morph(graph, rng, kernel_size=3)
            if grown is None:
                break
            graph = grown[0]
        return graph
    raise SystemExit(f"unknown --arch {arch!r} (known: {', '.join(ARCHS)})")


def synthetic_dataset(shape: Sequence[int], classes: int, train_size: int, val_size: int, seed: int = 0) -> Any:
    """Random uint8 images in memory, through the engine's own synthetic loader."""
    from aiperf.config import DatasetConfig, SyntheticConfig
    from aiperf.datasets import load_dataset

    spec = SyntheticConfig(shape=tuple(shape), classes=classes, train_size=train_size, val_size=val_size)
    return load_dataset(DatasetConfig(name="synthetic", synthetic=spec, split_seed=seed))


# -- the device's ceiling ---------------------------------------------------------------------------
def numpy_matmul_rate(n: int, reps: int) -> float:
    """Best FLOP/s of an n x n float32 matmul in NumPy (its BLAS threads are set by the environment)."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # warm the BLAS threads
    best = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2.0 * n**3 / (time.perf_counter() - t0))
    return best


def tensorflow_matmul_rate(n: int, reps: int, threads: int) -> float:
    """Best FLOP/s of an n x n float32 matmul in TensorFlow with ``threads`` intra-op threads."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    a = tf.random.normal((n, n), dtype=tf.float32)
    b = tf.random.normal((n, n), dtype=tf.float32)
    tf.linalg.matmul(a, b).numpy()
    best = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        tf.linalg.matmul(a, b).numpy()
        best = max(best, 2.0 * n**3 / (time.perf_counter() - t0))
    return best


def cpu_matmul_peak(threads: int, n: int = 2048, reps: int = 10) -> dict[str, float]:
    """Float32 matmul FLOP/s on ``threads`` cores, NumPy and TensorFlow, each in a fresh process.

    A fresh process per library so its thread pool is sized by the environment we give it
    (BLAS reads the variables once, at import). The peak is the faster of the two.
    """
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH_DIR), str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    out: dict[str, float] = {}
    probes = {
        "numpy": f"numpy_matmul_rate({n}, {reps})",
        "tensorflow": f"tensorflow_matmul_rate({n}, {reps}, {threads})",
    }
    for lib, call in probes.items():
        if lib == "tensorflow" and not _installed("tensorflow"):
            continue
        code = f"import common; print(common.{call})"
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode == 0:
            out[lib] = float(proc.stdout.strip().splitlines()[-1])
    out["peak"] = max(out.values(), default=0.0)
    out["threads"] = threads
    return out


def jax_matmul_peak(dtype: str = "bfloat16", n: int = 8192, chain: int = 20, reps: int = 5) -> dict[str, float]:
    """Best FLOP/s of chained n x n matmuls on JAX's default device (the accelerator's dense peak).

    The chain runs inside one jitted loop so dispatch costs nothing; ``a`` is scaled by
    1/sqrt(n) so the chained products keep their magnitude (no overflow in bf16).
    """
    import jax
    import jax.numpy as jnp

    key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
    scale = 1.0 / float(n) ** 0.5
    a = (jax.random.normal(key_a, (n, n), jnp.float32) * scale).astype(dtype)
    b = jax.random.normal(key_b, (n, n), jnp.float32).astype(dtype)

    @jax.jit
    def chained(a: Any, b: Any) -> Any:
        return jax.lax.fori_loop(0, chain, lambda _, c: a @ c, b)

    chained(a, b).block_until_ready()
    best = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        chained(a, b).block_until_ready()
        best = max(best, chain * 2.0 * n**3 / (time.perf_counter() - t0))
    return {"peak": best, "dtype": dtype, "n": n, "device": str(jax.devices()[0].device_kind)}


def _installed(package: str) -> bool:
    try:
        metadata.version(package)
    except metadata.PackageNotFoundError:
        return False
    return True


# -- whole runs through the CLI ---------------------------------------------------------------------
def run_cli(config: str, overrides: Sequence[str], results_dir: Path, timeout_s: float) -> tuple[Path, float, int]:
    """``aiperf run`` as a user runs it, in a subprocess; returns (run dir, wall seconds, exit code).

    The run's console output goes to ``results_dir/console.log`` (and its last lines to stderr
    if it fails), so a long benchmark does not flood the terminal.
    """
    results_dir.mkdir(parents=True, exist_ok=True)
    before = {p for p in results_dir.iterdir() if p.is_dir()}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    cmd = [sys.executable, "-m", "aiperf.cli", "run", "--config", config, "--set", f"run.results_dir={results_dir}"]
    for item in overrides:
        cmd += ["--set", item]
    log = results_dir / "console.log"
    t0 = time.perf_counter()
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s, cwd=REPO)
    wall = time.perf_counter() - t0
    new = sorted(p for p in results_dir.iterdir() if p.is_dir() and p not in before)
    if proc.returncode != 0 or not new:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"aiperf run failed (exit {proc.returncode}); last output:\n{tail}")
    return new[-1], wall, proc.returncode


class UtilisationSampler:
    """Samples GPU (NVML, else nvidia-smi) and host CPU utilisation in a thread while a run goes."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._nvml = _open_nvml()
        self._smi = shutil.which("nvidia-smi") if self._nvml is None else None

    def __enter__(self) -> UtilisationSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _gpu_util(self) -> list[float]:
        if self._nvml is not None:
            nvml, handles = self._nvml
            return [float(nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in handles]
        if self._smi:
            out = subprocess.run(
                [self._smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
            return [float(v) for v in out.split() if v.strip().replace(".", "", 1).isdigit()]
        return []

    def _loop(self) -> None:
        last = _cpu_times()
        while not self._stop.wait(self.interval_s):
            now = _cpu_times()
            busy = (now[0] - last[0]) / max(now[1] - last[1], 1e-9)
            last = now
            try:
                gpus = self._gpu_util()
            except Exception:  # a failed query loses one sample, never the run
                gpus = []
            self.samples.append({"wall": time.time(), "cpu_percent": 100.0 * busy, "gpu_percent": gpus})

    def mean(self, start_wall: float, end_wall: float) -> dict[str, float | None]:
        """Mean utilisations over the samples taken between two Unix times."""
        window = [s for s in self.samples if start_wall <= s["wall"] <= end_wall]
        gpu = [statistics.fmean(s["gpu_percent"]) for s in window if s["gpu_percent"]]
        return {
            "samples": len(window),
            "gpu_percent_mean": statistics.fmean(gpu) if gpu else None,
            "cpu_percent_mean": statistics.fmean(s["cpu_percent"] for s in window) if window else None,
        }


def _open_nvml() -> tuple[Any, list[Any]] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, [pynvml.nvmlDeviceGetHandleByIndex(k) for k in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no pynvml, no driver: fall back to nvidia-smi or none
        return None


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat") as fh:
        fields = [float(v) for v in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


# -- output -----------------------------------------------------------------------------------------
def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def write_json(path: str | None, data: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def si(value: float | None, unit: str) -> str:
    """``12.3 GFLOP/s``-style formatting (three significant digits)."""
    if value is None:
        return "-"
    from aiperf.metrics.score import format_ops

    return format_ops(float(value), unit)
