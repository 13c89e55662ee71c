"""The measured ceiling: its timing logic on a NumPy stand-in for keras.ops, and on the real backend (slow)."""

from __future__ import annotations

import sys
from types import ModuleType

import numpy as np
import pytest

from aiperf.system.ceiling import AUTO_SECONDS, ceiling_seconds, measure_ceiling


def _numpy_keras(fail_at: int | None = None) -> ModuleType:
    """A ``keras`` whose ops are NumPy's (``fail_at``: a size whose multiply raises, as an OOM would)."""

    def matmul(a, b):
        if fail_at is not None and a.shape[0] == fail_at:
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory\nsecond line")
        return a @ b

    ops = ModuleType("keras.ops")
    ops.matmul = matmul
    ops.cast = lambda x, dtype: np.asarray(x, dtype=dtype)
    ops.convert_to_tensor = np.asarray
    ops.convert_to_numpy = np.asarray
    keras = ModuleType("keras")
    keras.ops = ops
    return keras


def test_zero_seconds_measures_nothing_and_auto_depends_on_the_device():
    assert measure_ceiling(0, "float32", "tensorflow", (64,)) is None
    assert ceiling_seconds("auto", "cpu") == AUTO_SECONDS["cpu"] <= 2
    assert ceiling_seconds("auto", "gpu") == AUTO_SECONDS["gpu"]
    assert ceiling_seconds(0.25, "gpu") == 0.25


def test_the_best_rate_of_a_few_sizes_is_kept_within_about_the_budget(monkeypatch):
    monkeypatch.setitem(sys.modules, "keras", _numpy_keras())
    ceiling = measure_ceiling(0.3, "float32", "numpy", (32, 64, 128), devices=2, device_ids="0,1")
    assert ceiling is not None and ceiling.error is None
    assert [r.n for r in ceiling.rates] == [32, 64, 128][: len(ceiling.rates)] and ceiling.rates  # in order
    assert ceiling.flops_per_s == max(r.flops_per_s for r in ceiling.rates) > 0
    assert all(r.reps >= 1 for r in ceiling.rates)
    assert ceiling.seconds < 2.0  # about the 0.3 s budget, warm-ups included (loose: CI boxes are busy)
    assert (ceiling.devices, ceiling.device_ids, ceiling.dtype) == (2, "0,1", "float32")


def test_a_box_that_gets_busy_mid_batch_does_not_hold_the_worker_s_start(monkeypatch):
    # Each batch doubles the one before while it fits the budget; should the box get busy during one (seen
    # in CI: 5.9 s for a 0.3 s budget), the batch stops at the deadline rather than running to its end.
    import time

    keras = _numpy_keras()
    calls = []

    def slowing(a, b):
        calls.append(1)
        if len(calls) > 40:  # from here on each multiply takes 0.2 s
            time.sleep(0.2)
        return a @ b

    keras.ops.matmul = slowing
    monkeypatch.setitem(sys.modules, "keras", keras)
    ceiling = measure_ceiling(0.3, "float32", "numpy", (16,))
    assert ceiling is not None and ceiling.rates and ceiling.rates[0].reps < len(calls)
    assert ceiling.seconds < 1.0, ceiling.seconds  # the budget and the one multiply under way, not a batch


def test_a_failing_size_keeps_what_was_measured_and_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "keras", _numpy_keras(fail_at=64))
    ceiling = measure_ceiling(0.2, "float32", "numpy", (32, 64, 128))
    assert ceiling is not None
    assert [r.n for r in ceiling.rates] == [32]
    assert ceiling.error == "RESOURCE_EXHAUSTED: out of memory"


@pytest.mark.slow
def test_the_real_backend_measures_float32_and_bfloat16_on_this_cpu():
    import subprocess

    from helpers import cli_env

    code = (
        "from aiperf.training.backend import configure_process; configure_process('tensorflow', 1)\n"
        "from aiperf.system.ceiling import measure_ceiling\n"
        "a, b = (measure_ceiling(0.5, dtype, 'tensorflow', (128, 256)) for dtype in ('float32', 'bfloat16'))\n"
        "print(a.flops_per_s > 1e8, b.flops_per_s > 1e8, a.error, b.error)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert out.stdout.split() == ["True", "True", "None", "None"], out.stderr[-2000:]


def test_the_first_size_is_timed_even_when_its_warm_up_takes_the_whole_budget():
    # CI once measured no size at all: on a busy box the first warm-up took over half its share.
    from aiperf.system.ceiling import _rate_at

    ops = _numpy_keras().ops
    a = b = np.ones((32, 32), dtype=np.float32)
    assert _rate_at(ops, a, b, 32, 1e-9) is None  # a later size out of time is left out
    rate = _rate_at(ops, a, b, 32, 1e-9, first=True)
    assert rate is not None and rate.n == 32 and rate.reps >= 1 and rate.flops_per_s > 0
