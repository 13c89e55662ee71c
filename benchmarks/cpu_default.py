"""CPU figures for the embedded default (``aiperf run`` with no config: MNIST digits, small_resnet).

So that a regression shows on any laptop or CI machine, not only on a GPU host:

1. **seed training**: images/s (and counted FLOP/s) of the default seed -- small_resnet
   width 16 on 28x28x1 MNIST, batch 64, float32, TensorFlow, XLA as the engine picks on
   CPU -- trained by ``TrialRunner`` exactly as a worker does, against the hand-written
   reference loop of ``trial_throughput.py``, interleaved round by round. Measured with 1
   thread (what each of the default plan's two workers gets on a 2-core machine) and with
   every core, each in a fresh process.
2. **short default run**: ``aiperf run`` (default config) for ``--minutes``: its score
   (counted OPS), the workers' step fraction, and the score as a fraction of the fp32
   matmul peak of the cores the run used.

    PYTHONPATH=. python benchmarks/cpu_default.py --minutes 3 --json cpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import busy_fraction
import common
import trial_throughput
import whole_run


def seed_throughput(threads: int, epochs: int, reps: int, backend: str) -> dict[str, Any]:
    """The default seed on the default data: trainer vs reference, images/s, in this process."""
    common.configure_backend(backend, threads)
    from aiperf.config import load_config
    from aiperf.datasets import load_dataset
    from aiperf.families.image.flops import count_flops
    from aiperf.families.image.seed import seed_architecture
    from aiperf.families.image.trainer import TrainerSettings, TrialRunner
    from aiperf.training.backend import choose_jit, choose_precision, describe_device
    from aiperf.training.trial import TrialSpec

    cfg = load_config("default")
    dataset = load_dataset(cfg.dataset)
    graph = seed_architecture(cfg, dataset)
    device = describe_device(backend)
    precision = choose_precision(cfg.model.precision, device)
    jit = choose_jit(cfg.model.jit_compile, backend, device)
    batch = 64 if cfg.train.batch_size == "auto" else int(cfg.train.batch_size)
    settings = TrainerSettings(
        precision=precision,
        jit_compile=jit,
        bn_momentum=cfg.model.bn_momentum,
        momentum=cfg.train.momentum,
        eval_batch_size=cfg.train.eval_batch_size,
    )
    hparams = {
        "learning_rate": cfg.train.learning_rate,
        "batch_size": batch,
        "weight_decay": cfg.train.weight_decay,
        "dropout": cfg.train.dropout,
        "kernel_size": cfg.train.kernel_size,
        "epochs": epochs,
    }
    warm = trial_throughput.warm_up(precision, jit, 0)
    runner = TrialRunner(dataset, settings)
    steps = dataset.train_size // batch
    items, wall, ref_rates, setup = trial_throughput.paired_runs(
        runner,
        TrialSpec("seed", "seed", graph.to_dict(), hparams, seed=1),
        lambda: trial_throughput.make_reference(graph, dataset, precision, bool(jit), batch, backend),
        steps,
        batch,
        reps,
        backend == "jax",
    )
    trainer = trial_throughput.trainer_summary(items, wall)
    flop = count_flops(graph).train_per_image(batch)
    ref = common.median(ref_rates)
    return {
        "threads": threads,
        "backend": backend,
        "precision": precision,
        "jit": jit,
        "batch_size": batch,
        "train_images": dataset.train_size,
        "train_flop_per_image": flop,
        "reference": {**setup, "images_per_s": ref, "images_per_s_all": ref_rates},
        "trainer": trainer,
        "ratio": trainer["images_per_s"] / ref,
        "trainer_flop_per_s": trainer["images_per_s"] * flop,
        "first_trial_in_process": warm,
        "load": common.load_note(),
    }


def seed_throughput_subprocess(threads: int, epochs: int, reps: int, backend: str) -> dict[str, Any]:
    """:func:`seed_throughput` in a fresh process (the thread count is fixed when the framework starts)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "seed.json"
        cmd = [
            sys.executable,
            __file__,
            "--seed-only",
            "--threads",
            str(threads),
            "--epochs",
            str(epochs),
            "--reps",
            str(reps),
            "--backend",
            backend,
            "--json",
            str(out),
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(common.REPO), env.get("PYTHONPATH", "")) if p)
        subprocess.run(cmd, check=True, env=env, timeout=1800)
        return json.loads(out.read_text())


def default_run(minutes: float) -> dict[str, Any]:
    """A short ``aiperf run`` of the default config: score, fraction of peak, step fraction."""
    from aiperf.ledger.store import read_raw_ledger

    run = whole_run.main(["--config", "default", "--minutes", str(minutes)])
    busy = busy_fraction.analyse(read_raw_ledger(Path(run["run_dir"])))
    keys = ("busy_fraction", "steady_busy_fraction", "share", "idle_before_s", "startup_s", "first_step_s")
    return {**run, "busy": {k: busy[k] for k in keys}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=3.0, help="the default run's time budget")
    p.add_argument("--epochs", type=int, default=4, help="seed trial epochs (the first holds the compile)")
    p.add_argument("--reps", type=int, default=3, help="reference timings at least")
    p.add_argument("--backend", default="tensorflow", help="the default config's backend")
    p.add_argument("--threads", type=int, default=None, help="with --seed-only: framework threads")
    p.add_argument("--seed-only", action="store_true", help="measure only the seed's training, in this process")
    p.add_argument("--no-run", dest="run", action="store_false", help="skip the short default run")
    p.add_argument("--json", default=None, metavar="OUT")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.seed_only:
        result = seed_throughput(args.threads or common.cores(), args.epochs, args.reps, args.backend)
        common.write_json(args.json, result)
        return result
    facts = common.machine_facts()
    print(f"cpu_default: {facts['date']}; {facts['cpu']}, {facts['cores']} cores; {facts['load']}", flush=True)
    out: dict[str, Any] = {"facts": facts, "seed": []}
    for threads in sorted({1, common.cores()}):
        seed = seed_throughput_subprocess(threads, args.epochs, args.reps, args.backend)
        out["seed"].append(seed)
        t = seed["trainer"]
        print(
            f"seed, {threads} thread(s): trainer {t['images_per_s']:.0f} img/s "
            f"({common.si(seed['trainer_flop_per_s'], 'FLOP/s')}) = {100 * seed['ratio']:.1f} % of the reference "
            f"{seed['reference']['images_per_s']:.0f} img/s; start-up {t['startup_s']:.2f} s, first step "
            f"{t['first_step_s'] or math.nan:.2f} s; {seed['load']}",
            flush=True,
        )
        common.write_json(args.json, out)
    if args.run:
        out["run"] = default_run(args.minutes)
        busy = out["run"]["busy"]
        print(
            f"default run: {common.si(out['run']['ops_per_s'], 'OPS')} = {100 * out['run']['fraction_of_peak']:.2f} % "
            f"of the {out['run']['run_threads']}-core fp32 matmul peak; steps {100 * busy['busy_fraction']:.1f} % "
            f"of worker time",
            flush=True,
        )
    common.write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
