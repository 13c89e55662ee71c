"""How fast the master proposes trials as the search history grows (no training involved).

For each history size a synthetic history is built -- architectures grown by random morphs
from the seed, a quarter of the trials re-tunes of earlier ones, synthetic accuracies from a
smooth function of the architecture plus noise -- and replayed into a fresh search through
``restore`` (as on ``--resume``). Then the master's steady state is simulated: ``--workers``
trials are in flight; each step reports one epoch and the end of the oldest trial (two
``tell`` calls) and asks for a new one. Ask and tell latencies are timed one by one, in wall
time and in the process's CPU time (what one unshared core would take: it stays meaningful
when other jobs share the machine).

Run on one core, as the master would run beside a cluster::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 taskset -c 0 \\
        env PYTHONPATH=. python benchmarks/search_scale.py

Targets at 10,000 architectures: p99 ask latency < 1 s and >= 20 proposals/s.
"""

from __future__ import annotations

import argparse
import gc
import math
import time

import numpy as np

from aiperf.families.image.flops import TrainFlopsPerImage
from nas.graph import Graph
from nas.hpo import HyperparameterSpace
from nas.limits import Limits
from nas.morph import random_morph
from nas.proposer import TrialProposal
from nas.search import SearchSettings, make_proposer
from nas.zoo import by_name

BATCH = 128


def synthetic_accuracy(graph: Graph, rng: np.random.Generator) -> float:
    """Deeper, wider and skip-richer nets do better, with diminishing returns and noise."""
    width = sum(n.attrs["filters"] for n in graph.nodes if n.op == "conv")
    z = 0.08 * graph.depth + 0.25 * math.log2(max(width, 1)) + 0.1 * graph.count("add", "concat") - 2.5
    return float(np.clip(0.55 + 0.4 * math.tanh(z) + rng.normal(0, 0.01), 0.0, 0.999))


def synthetic_history(
    seed_graph: Graph, limits: Limits, settings: SearchSettings, size: int, rng: np.random.Generator
) -> list[tuple[str, TrialProposal, float]]:
    """``size`` finished trials: a seed, arch children by one random morph, and re-tunes."""
    space = settings.hparam_space
    defaults = dict(settings.default_hparams)
    history = [("h000000", TrialProposal(seed_graph, "seed", defaults), synthetic_accuracy(seed_graph, rng))]
    archs = [0]
    while len(history) < size:
        trial_id = f"h{len(history):06d}"
        if rng.random() < settings.retune_fraction and len(archs) > 1:
            root = history[archs[int(rng.integers(len(archs)))]][1]
            hparams = {
                "learning_rate": float(np.exp(rng.uniform(*np.log(space.learning_rate)))),
                "batch_size": int(rng.choice(space.batch_sizes)),
                "weight_decay": float(np.exp(rng.uniform(*np.log(space.weight_decay)))),
                "dropout": float(rng.uniform(*space.dropout)),
                "kernel_size": root.hparams["kernel_size"],  # the root's graph stays valid
                "epochs": int(rng.integers(space.epochs[0], space.epochs[1] + 1)),
            }
            proposal = TrialProposal(
                root.graph, "tune", hparams, parent=root.parent, inherit=root.inherit, morphs=root.morphs
            )
        else:
            # Parents skew to recent trials, as a search's frontier does.
            parent_at = archs[max(0, len(archs) - 1 - int(rng.exponential(len(archs) / 4)))]
            parent_id, parent, _ = history[parent_at]
            grown = random_morph(parent.graph, rng, kernel_size=3, accept=limits.admits)
            if grown is None:
                continue
            proposal = TrialProposal(
                grown[0], "arch", dict(parent.hparams), parent=parent_id, inherit=parent_id, morphs=(grown[1],)
            )
            archs.append(len(history))
        history.append((trial_id, proposal, synthetic_accuracy(proposal.graph, rng)))
    return history


def measure(size: int, args: argparse.Namespace) -> dict[str, float]:
    rng = np.random.default_rng(args.seed)
    seed_graph = by_name(args.seed_architecture)
    limits = Limits(args.max_layers, args.max_params, args.max_flops, flops_fn=TrainFlopsPerImage(BATCH))
    settings = SearchSettings(
        strategy=args.strategy,
        seed=args.seed,
        candidates=args.candidates,
        gp_window=args.gp_window,
        batch=args.batch,
        processes=args.processes,
        tune_ahead=args.tune_ahead,
        hparam_space=HyperparameterSpace(),
        default_hparams={
            "learning_rate": 0.05,
            "batch_size": BATCH,
            "weight_decay": 5e-4,
            "dropout": 0.0,
            "kernel_size": 3,
            "epochs": 3,
        },
    )
    started = time.perf_counter()
    history = synthetic_history(seed_graph, limits, settings, size, rng)
    built = time.perf_counter() - started
    search = make_proposer(settings, seed_graph, limits)
    started = time.perf_counter()
    for trial_id, proposal, value in history:
        search.restore(trial_id, proposal, value, True)
    restored = time.perf_counter() - started
    if args.freeze_gc:  # what a master can do after a restore: long-lived state leaves the GC's scans
        gc.collect()
        gc.freeze()
    in_flight: list[tuple[str, TrialProposal]] = []
    for k in range(args.workers):  # fill the cluster (not timed: a one-off burst)
        trial_id = f"w{k:06d}"
        in_flight.append((trial_id, search.ask(trial_id)))
    ask_s, ask_cpu, tell_s = [], [], []
    for k in range(args.asks):
        done_id, done = in_flight.pop(0)
        value = synthetic_accuracy(done.graph, rng)
        t0 = time.perf_counter()
        search.tell(done_id, 0.9 * value, False)
        search.tell(done_id, value, True)
        tell_s.append((time.perf_counter() - t0) / 2)
        trial_id = f"n{k:06d}"
        t0, c0 = time.perf_counter(), time.process_time()
        proposal = search.ask(trial_id)
        ask_s.append(time.perf_counter() - t0)
        ask_cpu.append(time.process_time() - c0)
        in_flight.append((trial_id, proposal))
    if args.freeze_gc:
        gc.unfreeze()
    search.close()  # its expansion processes, if any
    asks, cpu = np.array(ask_s), np.array(ask_cpu)
    return {
        "cpu_median_ms": 1e3 * float(np.median(cpu)),
        "cpu_p99_ms": 1e3 * float(np.quantile(cpu, 0.99)),
        "cpu_per_s": len(cpu) / float(cpu.sum()),
        "history": size,
        "median_ms": 1e3 * float(np.median(asks)),
        "p99_ms": 1e3 * float(np.quantile(asks, 0.99)),
        "max_ms": 1e3 * float(asks.max()),
        "per_s": len(asks) / float(asks.sum()),
        "tell_ms": 1e3 * float(np.median(tell_s)),
        "build_s": built,
        "restore_s": restored,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--asks", type=int, default=300, help="timed asks per history size")
    parser.add_argument("--workers", type=int, default=64, help="trials in flight")
    parser.add_argument("--strategy", default="bayesian", choices=["bayesian", "random"])
    parser.add_argument("--seed-architecture", default="small_resnet")
    parser.add_argument("--candidates", type=int, default=64)
    parser.add_argument("--gp-window", type=int, default=256)
    parser.add_argument("--max-layers", type=int, default=60)
    parser.add_argument("--max-params", type=int, default=5_000_000)
    parser.add_argument("--max-flops", type=float, default=2e9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--freeze-gc", action="store_true", help="gc.freeze() after the restore")
    parser.add_argument("--batch", type=int, default=1, help="architectures per GP fit (search.batch)")
    parser.add_argument(
        "--processes", type=int, default=0, help="expansion processes (search.processes); their CPU is not the master's"
    )
    parser.add_argument("--tune-ahead", type=int, default=0, help="TPE asks made early (8 from 1,024 workers on)")
    args = parser.parse_args()
    print(
        f"strategy={args.strategy} seed_architecture={args.seed_architecture} candidates={args.candidates} "
        f"gp_window={args.gp_window} workers_in_flight={args.workers} timed_asks={args.asks} "
        f"freeze_gc={args.freeze_gc} batch={args.batch}"
    )
    header = (
        "history",
        "ask median ms",
        "ask p99 ms",
        "ask max ms",
        "proposals/s",
        "CPU median ms",
        "CPU p99 ms",
        "proposals/CPU-s",
        "tell median ms",
        "build s",
        "restore s",
    )
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for size in args.sizes:
        r = measure(size, args)
        print(
            f"{r['history']:,} | {r['median_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} | "
            f"{r['per_s']:.1f} | {r['cpu_median_ms']:.1f} | {r['cpu_p99_ms']:.1f} | {r['cpu_per_s']:.1f} | "
            f"{r['tell_ms']:.2f} | {r['build_s']:.1f} | {r['restore_s']:.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
