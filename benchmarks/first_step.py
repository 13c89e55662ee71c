"""What a trial's first step costs when its worker starts cold, reuses a compiled model, or reads a warm cache.

A trial's first step traces (and on JAX or with XLA compiles) the train function. This
script trains the same architecture with different hyperparameters (a re-tune) in the ways a
worker meets it, each in a fresh process so nothing leaks between them:

* **cold**: a new worker process, empty compilation cache -- the first trial of a run;
* **warm cache**: a new process whose persistent compilation cache (``compile-cache/``, JAX; TensorFlow with
  XLA) holds what the cold process compiled -- a restarted worker or a resumed run;
* **reused**: in the cold process, a second trial of the architecture with other hyperparameters
  (learning rate, weight decay, dropout, batch size): the worker's kept compiled model;
* **rebuilt**: the same second trial with ``compiled_models=0`` -- what every trial paid before;
* **ahead**: the rebuilt case with the second trial prepared before it started (``TrialRunner.prepare``,
  as a worker's compile thread prepares a queued trial; JAX and TensorFlow).

Reported per case: ``first_step_s`` (fit start to the end of the first step) and the trial's
start-up (build/compile set-up), median of ``--reps`` processes.

CPU (TensorFlow, the default)::

    PYTHONPATH=. python benchmarks/first_step.py --backend tensorflow
    PYTHONPATH=. python benchmarks/first_step.py --backend jax

GPU host (ResNet-50 at 224, bf16)::

    KERAS_BACKEND=jax PYTHONPATH=/tmp/site312:. python benchmarks/first_step.py --backend jax --arch resnet50 \\
        --image 224 --batch 128 --steps 4 --json $OUT/first_step.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import common

CHILD = r"""
import json, os, sys
backend, arch, image, batch, steps, cache, keep, ahead = sys.argv[1:9]
sys.path.insert(0, "benchmarks")
from aiperf.training.backend import choose_jit, choose_precision, configure_process, describe_device
configure_process(backend, os.cpu_count() or 1, cache)
import common
from aiperf.families.image.trainer import TrainerSettings, TrialRunner
from aiperf.training.trial import TrialSpec
device = describe_device(backend)
graph = common.benchmark_net(arch, int(image))
ds = common.synthetic_dataset((int(image), int(image), 3), 10, int(batch) * int(steps), int(batch))
settings = TrainerSettings(precision=choose_precision("auto", device), jit_compile=choose_jit("auto", backend, device),
                           compiled_models=int(keep), compile_ahead=ahead == "1")
runner = TrialRunner(ds, settings, backend)
first = {"learning_rate": 0.05, "batch_size": int(batch), "weight_decay": 5e-4, "dropout": 0.1, "kernel_size": 3,
         "epochs": 1}
second = {**first, "learning_rate": 0.02, "weight_decay": 1e-3, "dropout": 0.3}
out = []
for hp in (first, second):
    if ahead == "1" and hp is second:  # prepared as a worker's compile thread prepares a queued trial
        out.append({"prepared": runner.prepare(TrialSpec("t", "tune", graph.to_dict(), hp, seed=1))})
    items = list(runner.run(TrialSpec("t", "tune", graph.to_dict(), hp, seed=1)))
    done = items[-1]
    out.append({"first_step_s": done["first_step_s"], "startup_s": done["startup_s"], "reused": done["step_reused"]})
print("RESULT " + json.dumps(out))
"""


def child(args: argparse.Namespace, cache: str, keep: int, ahead: bool = False) -> list[dict[str, Any]]:
    """One fresh process training the two trials (the first prepared ahead if ``ahead``); their first-step figures."""
    cmd = [sys.executable, "-c", CHILD, args.backend, args.arch, str(args.image), str(args.batch), str(args.steps)]
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}  # the child binds its own
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(common.REPO), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [*cmd, cache, str(keep), "1" if ahead else "0"], capture_output=True, text=True, cwd=common.REPO, env=env
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"first_step: the child failed:\n{proc.stderr[-3000:]}")
    results = json.loads(lines[-1][7:])
    if ahead and results.pop(1)["prepared"] is not True:
        raise SystemExit(f"first_step: {args.backend} prepared nothing ahead (train.compile_ahead applies to it?)")
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="tensorflow", choices=("tensorflow", "jax", "torch"))
    p.add_argument("--arch", default="searched", help="seed, searched or resnet50 (benchmarks/common.py)")
    p.add_argument("--image", type=int, default=32)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=8, help="steps per epoch (one epoch per trial)")
    p.add_argument("--reps", type=int, default=3, help="processes per case (median)")
    p.add_argument("--json", default=None, metavar="OUT")
    args = p.parse_args()
    print(f"first_step: {args.backend}, {args.arch} {args.image}x{args.image} b{args.batch}; {common.load_note()}")
    cases: dict[str, list[dict[str, Any]]] = {"cold": [], "warm cache": [], "reused": [], "rebuilt": [], "ahead": []}
    for _ in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="aiperf-first-step-") as tmp:
            cache = str(Path(tmp) / "compile-cache")
            cold = child(args, cache, keep=4)
            cases["cold"].append(cold[0])
            cases["reused"].append(cold[1])
            cases["warm cache"].append(child(args, cache, keep=4)[0])
            cases["rebuilt"].append(child(args, str(Path(tmp) / "none"), keep=0)[1])
            if args.backend != "torch":
                cases["ahead"].append(child(args, str(Path(tmp) / "none"), keep=0, ahead=True)[1])
    summary = {}
    for name, runs in cases.items():
        if not runs:
            continue
        first = common.median([r["first_step_s"] for r in runs if r["first_step_s"] is not None])
        startup = common.median([r["startup_s"] for r in runs])
        summary[name] = {"first_step_s": first, "startup_s": startup, "runs": runs}
        print(f"  {name:<11} first step {first:6.2f} s  start-up {startup:5.2f} s  (median of {len(runs)})")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "load": common.load_note(), "cases": summary}))


if __name__ == "__main__":
    main()
