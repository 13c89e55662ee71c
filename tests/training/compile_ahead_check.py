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
    from aiperf.families.image.compiled_models import compile_key
    from aiperf.families.image.trainer import TrainerSettings, TrialRunner
    from aiperf.training.trial import apply_hparams

    dataset = load_synthetic(
        DatasetConfig(
            name="synthetic", synthetic={"shape": [12, 12, 3], "classes": 4, "train_size": 256, "val_size": 64}
        )
    )
    settings = TrainerSettings(jit_compile=True, eval_batch_size=64, compile_ahead=True)
    out: dict[str, Any] = {}

    fresh = TrialRunner(dataset, settings, "jax")
    out["fresh"] = _train(fresh, _spec(dataset, 8, 32, "a"))

    ahead = TrialRunner(dataset, settings, "jax")
    out["prepared"] = ahead.prepare(_spec(dataset, 8, 32, "a"))
    out["prepared_again"] = ahead.prepare(_spec(dataset, 8, 32, "a"))  # already compiled for these shapes
    out["ahead"] = _train(ahead, _spec(dataset, 8, 32, "a"))

    # A trial that arrives while its model is still compiling waits for it, and nothing compiles twice.
    spec = _spec(dataset, 6, 32, "b")
    spec_key = compile_key(apply_hparams(spec.architecture(), spec.hparams))
    thread = threading.Thread(target=ahead.prepare, args=(spec,))
    thread.start()
    while not ahead._ahead.busy(spec_key) and thread.is_alive():
        time.sleep(0.001)
    out["waiting"] = _train(ahead, spec)
    thread.join()

    # The kept model of "a" prepared again for another batch size: a second executable, no miss.
    out["other_batch_prepared"] = ahead.prepare(_spec(dataset, 8, 16, "c"))
    out["other_batch"] = _train(ahead, _spec(dataset, 8, 16, "c"))
    # ... and a batch size nobody prepared: Keras's own jitted step compiles it in place.
    out["unprepared_batch"] = _train(ahead, _spec(dataset, 8, 64, "d"))
    out["language"] = _language()
    print(json.dumps(out))
    return 0


class _Source:
    streaming = False

    def __init__(self, data: Any) -> None:
        self.data = data

    def windows(self) -> Any:
        return self.data


def _language() -> dict[str, Any]:
    """A language trial prepared ahead against the same trial on a fresh worker: same losses, no compile in it."""
    from aiperf.families.language.runner import LMRunnerSettings, LMTrialRunner
    from aiperf.families.language.text_corpus import load_text_corpus
    from aiperf.training.trial import TrialSpec
    from nas.language.spec import TransformerSpec

    corpus = load_text_corpus(max_bytes=100_000, seed=0)
    spec = TransformerSpec(vocab_size=256, seq_len=16, width=16, head_dim=8, heads=(2,), mlp_hidden=(32,))
    hparams = {"learning_rate": 3e-3, "warmup_fraction": 0.25, "weight_decay": 0.01, "batch_size": 4, "seq_len": 16}
    trial = TrialSpec(trial_id="lm1", kind="seed", graph=spec.to_dict(), hparams={**hparams, "epochs": 2}, seed=5)
    out: dict[str, Any] = {}
    for name, ahead in (("fresh", False), ("ahead", True)):
        settings = LMRunnerSettings("float32", True, steps_per_epoch=3, eval_windows=6, compile_ahead=ahead)
        runner = LMTrialRunner(_Source(corpus), settings)
        prepared = runner.prepare(trial)
        items = list(runner.run(trial))
        steps = runner.last_training.model._aiperf_ahead if ahead else None
        out[name] = {
            "prepared": prepared,
            "losses": [i["val_loss"] for i in items if i["type"] == "epoch"],
            "compile_s": [i["compile_s"] for i in items if i["type"] == "epoch"],
            "step_reused": items[-1]["step_reused"],
            "misses": None if steps is None else steps.misses,
            "hits": None if steps is None else steps.train.hits + steps.test.hits,
        }
    return out


if __name__ == "__main__":
    sys.exit(main())
