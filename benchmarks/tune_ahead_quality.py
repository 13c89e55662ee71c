"""Does asking TPE ahead make the tuning worse? Same objective, same seeds, ``ahead`` side by side.

The master asks TPE ``tune_ahead`` re-tunes early (nas.tuner_ahead), so a value is chosen
before the latest few results are known. With ``--workers`` trials in flight a value is
already chosen before the last ``workers`` results are known (the constant liar stands in for
them), so ``ahead`` adds little; this measures how little. The objective is a smooth function
of the hyperparameters with one optimum (log learning rate, log weight decay, dropout, batch,
kernel, epochs) plus noise; each trial's result arrives ``workers`` asks after it was asked.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/tune_ahead_quality.py --workers 256 --asks 1500 --seeds 0,1,2,3,4
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from nas.hpo import HyperparameterSpace, HyperparameterTuner
from nas.tuner_ahead import AheadTuner


def objective(params: dict, rng: np.random.Generator) -> float:
    """A gain with one optimum: lr 0.02, wd 3e-4, dropout 0.2, batch 128, kernel 5, 6 epochs (plus noise)."""
    z = (
        ((math.log10(params["learning_rate"]) - math.log10(0.02)) / 0.5) ** 2
        + ((math.log10(params["weight_decay"]) - math.log10(3e-4)) / 0.8) ** 2
        + ((params["dropout"] - 0.2) / 0.15) ** 2
        + ((math.log2(params["batch_size"]) - 7) / 1.5) ** 2
        + ((params["kernel_size"] - 5) / 2.0) ** 2
        + ((params["epochs"] - 6) / 4.0) ** 2
    )
    return float(math.exp(-0.5 * z) + rng.normal(0, 0.02))


def run(seed: int, ahead: int, workers: int, asks: int) -> dict[str, float]:
    tuner = AheadTuner(HyperparameterTuner(HyperparameterSpace(), seed=seed), ahead)
    rng = np.random.default_rng(seed + 100)
    in_flight: list[tuple[str, float]] = []
    values = []
    started = time.process_time()
    for k in range(asks):
        trial_id = f"t{k}"
        params = tuner.ask(trial_id)
        in_flight.append((trial_id, objective(params, rng)))
        if len(in_flight) > workers:
            done, value = in_flight.pop(0)
            tuner.tell(done, value)
            values.append(value)
    return {
        "best": max(values),
        "last_mean": float(np.mean(values[-200:])),
        "top10": float(np.mean(sorted(values)[-10:])),
        "cpu_s": time.process_time() - started,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=256)
    p.add_argument("--asks", type=int, default=1500)
    p.add_argument("--aheads", default="0,8")
    p.add_argument("--seeds", default="0,1,2,3,4")
    args = p.parse_args(argv)
    aheads = [int(a) for a in args.aheads.split(",")]
    print(f"workers={args.workers} asks={args.asks}")
    print(f"{'seed':>4} {'ahead':>5} {'best':>7} {'top10':>7} {'last200':>7} {'cpu_s':>6}")
    means: dict[int, list[dict[str, float]]] = {a: [] for a in aheads}
    for seed in (int(s) for s in args.seeds.split(",")):
        for ahead in aheads:
            r = run(seed, ahead, args.workers, args.asks)
            means[ahead].append(r)
            print(f"{seed:>4} {ahead:>5} {r['best']:7.4f} {r['top10']:7.4f} {r['last_mean']:7.4f} {r['cpu_s']:6.1f}")
    for ahead, rows in means.items():
        best, top, last = (float(np.mean([r[k] for r in rows])) for k in ("best", "top10", "last_mean"))
        print(f"mean ahead={ahead}: best {best:.4f}, top10 {top:.4f}, last 200 {last:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
