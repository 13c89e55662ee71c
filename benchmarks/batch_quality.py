"""Does proposing in batches make the search worse? Same simulated budget, same seeds, batch sizes side by side.

Runs ``scale_sim.simulate`` (the real master, search and ledger on simulated workers) with the
``bump`` reward -- a simulated accuracy that peaks around one architecture, so the search has
an optimum to find -- once per (seed, ``search.batch``), and reports per run: the best final
simulated accuracy, the mean of the ten best, the distinct architectures trained, trials
proposed and the master's CPU seconds. Same seed, same workers, same budget: only the batch
differs.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/batch_quality.py --workers 1024 --batches 1,16,64 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_sim import simulate


def _top_rewards(ledger: Path, k: int = 10) -> list[float]:
    best = []
    for line in ledger.open():
        if '"type":"trial_end"' in line:
            record = json.loads(line)
            if record.get("status") == "completed" and record.get("best_val_acc") is not None:
                best.append(float(record["best_val_acc"]))
    return sorted(best, reverse=True)[:k]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=1024)
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--trial-minutes", type=float, default=10.0)
    p.add_argument("--trials-per-worker", type=float, default=4.0)
    args = p.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="batch-quality-"))
    print(f"{'seed':>4} {'batch':>5} {'trials':>7} {'archs':>6} {'best':>7} {'top10':>7} {'cpu_s':>7}", flush=True)
    table: dict[str, list[tuple[float, float, int]]] = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        for batch in args.batches.split(","):
            out = base / f"s{seed}-b{batch}"
            r = simulate(
                args.workers, 60 * args.trial_minutes, 5, args.trials_per_worker, seed, out,
                batch=batch, reward="bump",
            )  # fmt: skip
            top = _top_rewards(out / "ledger.jsonl")
            table.setdefault(batch, []).append((r.best_reward, float(np.mean(top)), r.distinct_architectures))
            print(
                f"{seed:>4} {r.search_batch:>5} {r.trials_started:>7} {r.distinct_architectures:>6}"
                f" {r.best_reward:>7.4f} {np.mean(top):>7.4f} {r.master_cpu_s:>7.1f}",
                flush=True,
            )
    print("mean over seeds:")
    for batch, rows in table.items():
        best, top, archs = (np.mean([row[k] for row in rows]) for k in range(3))
        print(f"  batch {batch:>5}: best {best:.4f}, top-10 mean {top:.4f}, distinct architectures {archs:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
