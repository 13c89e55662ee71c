"""Does the search keep pace with its size schedule? The real master and search on simulated workers.

Each seed runs the config (default: the embedded default, 300 s) against
:class:`~aiperf.cluster.sim_pool.SimulatedWorkerPool` workers whose epochs take their counted
operations at ``--device-gflops`` (a worker of the 2-core box trains the default's nets at
40-90 GFLOP/s) after ``--startup-s`` per trial (build and compile), and prints the summary's
``size_pace`` section: per tenth of the run, the trained networks' mean size over the band's
low edge (issue 52's target: >= 0.9 from the second tenth on). A run takes seconds, so a change
to the search is tried on many seeds before a real run confirms it on the box.

    PYTHONPATH=. python benchmarks/size_pace.py --seeds 0 1 2 --json pace.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import common


def simulated_pace(config: str, seed: int, workers: int, gflops: float, startup_s: float, overrides: list[str]) -> dict:
    from aiperf.config import load_config
    from aiperf.datasets import load_dataset
    from aiperf.engine.scaling import SimulationSettings, simulate_run
    from aiperf.families.image.seed import seed_architecture

    cfg = load_config(config, [*overrides, f"run.seed={seed}"])
    dataset = load_dataset(cfg.dataset)
    seed_graph = seed_architecture(cfg, dataset)
    facts = {**dataset.describe(), "fingerprint": dataset.fingerprint()}
    sim = SimulationSettings(workers_per_node=workers, device_ops_per_s=gflops * 1e9, startup_s=startup_s)
    with tempfile.TemporaryDirectory() as tmp:
        summary = simulate_run(cfg, 1, Path(tmp) / f"seed{seed}", seed_graph, facts, sim)
    return {"seed": seed, "ops_per_s": summary["score"]["ops_per_s"], "size_pace": summary.get("size_pace")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="default")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device-gflops", type=float, default=60.0)
    parser.add_argument("--startup-s", type=float, default=1.5)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for seed in args.seeds:
        row = simulated_pace(args.config, seed, args.workers, args.device_gflops, args.startup_s, args.set)
        rows.append(row)
        pace = row["size_pace"]
        ratios = " ".join("  -  " if t["ratio"] is None else f"{t['ratio']:.2f}" for t in pace["per_tenth"])
        print(f"seed {seed}: {row['ops_per_s'] / 1e9:7.1f} GOPS  per tenth {ratios}  kept pace {pace['kept_pace']}")
    ops = [r["ops_per_s"] for r in rows]
    cv = statistics.pstdev(ops) / statistics.mean(ops) if len(ops) > 1 else 0.0
    print(f"mean {statistics.mean(ops) / 1e9:.1f} GOPS, CV {100 * cv:.1f} %")
    if args.json:
        common.write_json(args.json, {"machine": common.machine_facts(), "args": vars(args), "runs": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
