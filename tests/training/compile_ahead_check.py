"""Check compiling a trial's steps ahead on JAX; run in a subprocess with ``KERAS_BACKEND=jax``.

    KERAS_BACKEND=jax python tests/training/compile_ahead_check.py

Prints one JSON line of facts that tests/training/test_compile_ahead.py asserts on:
a trial trained from a model prepared ahead against the same trial on a fresh worker
(same epochs, same weights), the compiled executables' hits and misses, a trial that arrives
while its model is still compiling (it waits, nothing compiles twice), a kept model prepared
again for another batch size, and a batch size nobody prepared (compiled just in time).
Exit code 77 when JAX is not importable (the caller skips).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SKIP = 77


def _spec(dataset: Any, width: int, batch: int, trial: str, seed: int = 3) -> Any:
    from aiperf.training.trial import TrialSpec
    from nas.serialize import graph_to_dict
    from nas.zoo import small_resnet

    graph = small_resnet(width=width, input_shape=dataset.input_shape, num_classes=dataset.num_classes)
    hparams = {"learning_rate": 0.05, "weight_decay": 5e-4, "dropout": 0.0, "kernel_size": 3}
    return TrialSpec.from_dict(
        {
            "trial_id": trial,
            "kind": "seed",
            "graph": graph_to_dict(graph),
            "hparams": {**hparams, "batch_size": batch, "epochs": 2},
            "seed": seed,
        }
    )


def _train(runner: Any, spec: Any) -> dict[str, Any]:
    epochs, done = [], {}
    for item in runner.run(spec):
        if item["type"] == "epoch":
            epochs.append({k: item[k] for k in ("train_loss", "val_acc", "val_loss", "compile_s", "compile_wait_s")})
        elif item["type"] == "done":
            done = item
    steps = runner.last_model._aiperf_ahead
    weights = done["weights"]
    return {
        "epochs": epochs,
        "step_reused": done["step_reused"],
        "checksum": float(sum(float(abs(w).sum()) for arrays in weights.values() for w in arrays)),
        "train_hits": steps.train.hits,
        "train_misses": steps.train.misses,
        "predict_hits": steps.predict.hits,
        "predict_misses": steps.predict.misses,
    }


def main() -> int:
    if importlib.util.find_spec("jax") is None:
        print(json.dumps({"skipped": "jax is not installed"}))
        return SKIP
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    from aiperf.config import DatasetConfig
    from aiperf.datasets.synthetic import load_synthetic
    from aiperf.families.image.trainer import TrainerSettings, TrialRunner

    dataset = load_synthetic(
        DatasetConfig(
            name="synthetic", synthetic={"shape": [12, 12, 3], "classes": 4, "train_size": 256, "val_size": 64}
        )
    )
    settings = TrainerSettings(jit_compile=True, eval_batch_size=64)
    out: dict[str, Any] = {}

    fresh = TrialRunner(dataset, settings, "jax")
    out["fresh"] = _train(fresh, _spec(dataset, 8, 32, "a"))

    ahead = TrialRunner(dataset, settings, "jax")
    out["prepared"] = ahead.prepare(_spec(dataset, 8, 32, "a"))
    out["prepared_again"] = ahead.prepare(_spec(dataset, 8, 32, "a"))  # already compiled for these shapes
    out["ahead"] = _train(ahead, _spec(dataset, 8, 32, "a"))

    # A trial that arrives while its model is still compiling waits for it, and nothing compiles twice.
    spec = _spec(dataset, 6, 32, "b")
    thread = threading.Thread(target=ahead.prepare, args=(spec,))
    thread.start()
    while not ahead._preparing and thread.is_alive():
        time.sleep(0.001)
    out["waiting"] = _train(ahead, spec)
    thread.join()

    # The kept model of "a" prepared again for another batch size: a second executable, no miss.
    out["other_batch_prepared"] = ahead.prepare(_spec(dataset, 8, 16, "c"))
    out["other_batch"] = _train(ahead, _spec(dataset, 8, 16, "c"))
    # ... and a batch size nobody prepared: Keras's own jitted step compiles it in place.
    out["unprepared_batch"] = _train(ahead, _spec(dataset, 8, 64, "d"))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
