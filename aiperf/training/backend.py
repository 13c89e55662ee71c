"""Everything that depends on the Keras backend or the device, and nothing else.

The trainer talks to Keras only; the few things Keras cannot tell portably — how to pin
threads before the framework starts, which accelerators exist and how much memory they
have, which precision runs fast on them, what an out-of-memory error looks like — live
here, one function each.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import platform
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from aiperf.errors import AiperfError

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

logger = logging.getLogger(__name__)

TF_GLOBAL_SEED = 0  # TensorFlow's global seed in every process that trains trials (see seed_trial)
MIN_CACHED_COMPILE_S = 0.5  # compilations shorter than this are not worth a file read
BACKEND_PACKAGES = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}


def check_backend_installed(backend: str) -> None:
    """A fast, clear error on the head when the configured Keras backend is not installed there.

    Looks the package up without importing it (milliseconds; the master never imports the
    framework). Workers on other nodes that lack it fail to start, and the run says so.
    """
    package = BACKEND_PACKAGES.get(backend, backend)
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise AiperfError(
            f"model.backend={backend}: the {package} package is not installed on this machine "
            f"(pip install {package}; every node needs it), or choose another model.backend"
        )


class NvidiaGpu(TypedDict):
    """One GPU as nvidia-smi reports it."""

    index: int  # nvidia-smi's numbering (CUDA_VISIBLE_DEVICES refers to it)
    name: str
    memory_bytes: int
    compute_capability: tuple[int, int] | None
    driver: str


@dataclass
class DeviceInfo:
    """What one worker process can compute on."""

    kind: str  # "cpu" or "gpu"
    name: str
    count: int = 0
    memory_bytes: int = 0  # per accelerator (0 for CPU)
    compute_capability: tuple[int, int] | None = None
    cpu_model: str = ""
    extra: dict[str, str | None] = field(default_factory=dict)  # the GPU driver's version

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def configure_process(backend: str, threads: int, compile_cache: str = "") -> None:
    """Select the Keras backend and pin framework threads; must run before Keras is imported.

    ``compile_cache``: a directory for the backend's persistent compilation cache (JAX's
    cache; TensorFlow's XLA cache, used when XLA is on), so a restarted worker or a resumed
    run loads the executables it compiled before instead of compiling them again.
    """
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    threads = max(1, int(threads))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if backend == "jax":
        flags = os.environ.get("XLA_FLAGS", "")
        if threads == 1 and "xla_cpu_multi_thread_eigen" not in flags:
            os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
    if (
        compile_cache
        and backend == "tensorflow"
        and "tf_xla_persistent_cache_directory" not in os.environ.get("TF_XLA_FLAGS", "")
    ):
        flags = os.environ.get("TF_XLA_FLAGS", "")
        os.environ["TF_XLA_FLAGS"] = f"{flags} --tf_xla_persistent_cache_directory={compile_cache}".strip()
    if backend == "tensorflow":
        import tensorflow as tf

        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
        except RuntimeError:  # already initialised in this process: keep what it has
            pass
        for gpu in tf.config.list_physical_devices("GPU"):
            with contextlib.suppress(RuntimeError):
                tf.config.experimental.set_memory_growth(gpu, True)
    elif backend == "torch":
        import torch

        torch.set_num_threads(threads)
    if compile_cache and backend == "jax":
        import jax

        jax.config.update("jax_compilation_cache_dir", compile_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_CACHED_COMPILE_S)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    import keras  # noqa: F401  (binds the backend now)


def seed_trial(seed: int) -> None:
    """Seed what a trial draws from -- Python, NumPy, Keras's global seed (initializers), torch -- as
    ``keras.utils.set_random_seed`` does, except TensorFlow's global seed.

    Setting TensorFlow's global seed clears its kernel cache (``context._set_global_seed``), so
    every compiled model a worker keeps had its train and predict functions instantiated and
    optimised again at the next trial's first step: most of a kept model's first step
    (benchmarks/RESULTS.md). TensorFlow's global seed is instead the same constant in every process
    that trains (set once, when it is anything else): tf.data's shuffles take their op seed from
    the trial, so a trial shuffles the same way in a worker, in ``aiperf audit --retrain`` and
    after any other trials. Falls back to Keras's own function if its seed state moved.
    """
    import keras

    try:
        from keras.src.backend.common import global_state
        from keras.src.random import seed_generator
        from keras.src.utils import rng_utils

        keys = (rng_utils.GLOBAL_RANDOM_SEED, seed_generator.GLOBAL_SEED_GENERATOR)
    except (ImportError, AttributeError):  # another Keras layout: its own seeding, cache clear and all
        keras.utils.set_random_seed(seed)
        return
    global_state.set_global_attribute(keys[0], seed)
    global_state.set_global_attribute(keys[1], None)  # recreated from the seed at the next draw
    random.seed(seed)
    np.random.seed(seed)
    if "tensorflow" in sys.modules:  # on JAX or torch only tf.data uses it, and only once imported
        import tensorflow as tf

        if tf.compat.v1.get_seed(0)[0] != TF_GLOBAL_SEED:
            tf.random.set_seed(TF_GLOBAL_SEED)
    if keras.backend.backend() == "torch":
        import torch

        torch.manual_seed(seed)


def node_compile_cache(root: str) -> str:
    """This node's directory of persistent compiled executables under ``root`` ("" if it cannot be made).

    One directory per host: nodes that share the run directory do not write each other's
    entries, and a node that cannot create it (no shared file system, read-only) falls back
    to its local temporary directory.
    """
    if not root:
        return ""
    host = re.sub(r"[^\w.-]", "_", socket.gethostname()) or "node"
    for base in (Path(root), Path(tempfile.gettempdir()) / "aiperf-compile-cache" / Path(root).parent.name):
        path = base / host
        try:
            path.mkdir(parents=True, exist_ok=True)
            return str(path)
        except OSError:
            continue
    return ""


def cpu_model() -> str:
    """The CPU's marketing name (for the ledger's system description and benchmark headers)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvidia_gpus() -> list[NvidiaGpu]:
    """GPUs visible to this process as nvidia-smi reports them (empty without a driver)."""
    if not shutil.which("nvidia-smi"):
        return []
    query = "name,memory.total,compute_cap,driver_version"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    rows: list[NvidiaGpu] = []
    for k, line in enumerate(out.strip().splitlines()):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue
        try:
            major, minor = (int(x) for x in parts[2].split("."))
            cap = (major, minor)
        except ValueError:
            cap = None
        rows.append(
            {
                "index": k,
                "name": parts[0],
                "memory_bytes": int(float(parts[1]) * 2**20),
                "compute_capability": cap,
                "driver": parts[3],
            }
        )
    if visible not in (None, ""):
        keep = {int(v) for v in visible.split(",") if v.strip().isdigit()}
        rows = [r for r in rows if r["index"] in keep] if keep else rows
    return rows


def describe_device(backend: str) -> DeviceInfo:
    """The accelerators this process sees through its backend, with their memory."""
    gpus = nvidia_gpus()
    count = 0
    if backend == "tensorflow":
        import tensorflow as tf

        count = len(tf.config.list_physical_devices("GPU"))
    elif backend == "jax":
        import jax

        count = sum(1 for d in jax.devices() if d.platform == "gpu")
    elif backend == "torch":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return DeviceInfo("cpu", cpu_model(), cpu_model=cpu_model())
    if not gpus:  # the backend sees GPUs that nvidia-smi does not list
        return DeviceInfo("gpu", "gpu", count, 0, None, cpu_model(), {"driver": None})
    first = gpus[0]
    return DeviceInfo(
        "gpu",
        first["name"],
        count,
        first["memory_bytes"],
        first["compute_capability"],
        cpu_model(),
        {"driver": first["driver"]},
    )


def choose_precision(requested: str, device: DeviceInfo) -> str:
    """The Keras dtype policy: bf16 where the device runs it fast, fp16 on older GPUs, else fp32.

    On CPUs without native bf16 matrix units Keras's mixed_bfloat16 trains several times
    slower than float32, so ``auto`` keeps float32 there.
    """
    if requested != "auto":
        return requested
    if device.kind == "gpu":
        cap = device.compute_capability or (0, 0)
        if cap >= (8, 0):
            return "mixed_bfloat16"
        if cap >= (7, 0):
            return "mixed_float16"
    return "float32"


def choose_jit(requested: str, backend: str, device: DeviceInfo) -> bool | str:
    """Compile train steps with XLA on accelerators; on CPU the per-architecture compile costs more."""
    if requested == "on":
        return True
    if requested == "off":
        return False
    if backend == "jax":
        return True  # JAX always compiles; Keras's jit flag only toggles the outer jit
    return device.kind == "gpu"


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether a framework error means the device ran out of memory (so a smaller batch may fit)."""
    text = f"{type(exc).__name__}: {exc}"
    markers = ("ResourceExhausted", "RESOURCE_EXHAUSTED", "OutOfMemory", "out of memory", "OOM when allocating")
    return any(m in text for m in markers)


def versions(backend: str) -> dict[str, str]:
    """Software versions worth recording next to a score."""
    import keras
    import numpy

    out = {
        "python": platform.python_version(),
        "keras": keras.__version__,
        "numpy": numpy.__version__,
        "backend": backend,
    }
    try:
        if backend == "tensorflow":
            import tensorflow as tf

            out["tensorflow"] = tf.__version__
            build = tf.sysconfig.get_build_info()
            if build.get("cuda_version"):
                out["cuda"] = str(build["cuda_version"])
        elif backend == "jax":
            import jax

            out["jax"] = jax.__version__
        elif backend == "torch":
            import torch

            out["torch"] = torch.__version__
            if torch.version.cuda:
                out["cuda"] = torch.version.cuda
    except Exception as exc:  # a framework without build info: the versions above still stand
        logger.debug("framework version details unavailable: %s", exc)
    gpus = nvidia_gpus()
    if gpus:
        out["driver"] = gpus[0]["driver"]
    return out


class DataParallel:
    """Data parallelism over ``devices`` local accelerators (``per_node`` placement).

    JAX uses Keras's distribution API, a process-wide setting that ``clear_session`` drops,
    so the trainer calls :meth:`activate` after every clean-up; TensorFlow uses a
    MirroredStrategy, whose :meth:`scope` must surround building and compiling a model.
    With one device both are no-ops. CPU devices stand in when there are no GPUs (tests).
    """

    def __init__(self, backend: str, devices: int) -> None:
        self.devices = max(1, int(devices))
        self._distribution: keras.distribution.DataParallel | None = None
        self._strategy: tf.distribute.MirroredStrategy | None = None
        if self.devices == 1:
            return
        if backend == "jax":
            import keras

            try:
                found = keras.distribution.list_devices("gpu")
            except RuntimeError:  # JAX raises when it has no GPU platform at all
                found = []
            found = found or keras.distribution.list_devices("cpu")
            if len(found) < self.devices:
                raise AiperfError(f"data-parallel training over {self.devices} devices, but JAX sees {len(found)}")
            self._distribution = keras.distribution.DataParallel(devices=found[: self.devices])
        elif backend == "tensorflow":
            import tensorflow as tf

            found = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
            if len(found) < self.devices:
                raise AiperfError(
                    f"data-parallel training over {self.devices} devices, but TensorFlow sees {len(found)}"
                )
            self._strategy = tf.distribute.MirroredStrategy([d.name for d in found[: self.devices]])
        else:
            raise AiperfError(
                "per_node placement (data-parallel over a node's GPUs) needs the jax or tensorflow backend"
            )
        self.activate()

    def activate(self) -> None:
        """(Re-)install the process-wide distribution, if the backend uses one."""
        if self._distribution is not None:
            import keras

            keras.distribution.set_distribution(self._distribution)

    def scope(self) -> AbstractContextManager[object]:
        """The context in which models are built and compiled."""
        return self._strategy.scope() if self._strategy is not None else contextlib.nullcontext()
