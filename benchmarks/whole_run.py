"""Sustained counted OPS of a whole run as a fraction of the device's measured matmul peak.

Runs ``aiperf run`` (the CLI, in a subprocess) for ``--minutes``; its score, ``score.ops_per_s``
(counted operations of completed epochs over the master's wall clock: search, evaluation,
data, compiles and idle time all included), is set against the dense matmul peak measured
in the same script, after the run, on the same device:

* GPU: chained bf16 n x n matmuls in JAX (``--peak-dtype``), the figure tensor-core ratings
  describe;
* CPU: float32 matmul in NumPy and TensorFlow with as many threads as the run's workers had
  in all (the faster of the two).

Target on one H100: >= 25 % with 32x32 images (``--config synthetic``: 32x32x3, 10 classes).

GPU host::

    KERAS_BACKEND=jax PYTHONPATH=/tmp/site312:. python benchmarks/whole_run.py --minutes 5 --json out.json

CPU::

    PYTHONPATH=. python benchmarks/whole_run.py --minutes 3 --config default
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import common


def run_cores(start: dict[str, Any]) -> int:
    """CPU threads the run's workers used in all (the plan's slots times threads per trial)."""
    plan = start.get("plan", {})
    return max(1, int(plan.get("threads_per_trial", 1)) * int(plan.get("concurrency") or len(plan.get("slots", []))))


def measure_peak(kind: str, backend: str, threads: int, dtype: str) -> dict[str, Any]:
    if kind == "gpu":
        if backend != "jax":
            raise SystemExit("the GPU peak is measured with JAX: run with --backend jax")
        return common.jax_matmul_peak(dtype)
    return common.cpu_matmul_peak(threads)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0, help="the run's time budget")
    p.add_argument("--config", default="synthetic", help="built-in config or file (default: synthetic, 32x32x3)")
    p.add_argument("--backend", default=os.environ.get("KERAS_BACKEND"), help="model.backend (default: the config's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--results-dir", default=None, help="default: a temporary directory")
    p.add_argument("--peak-dtype", default="bfloat16", help="GPU matmul peak dtype")
    p.add_argument("--json", default=None, metavar="OUT")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from aiperf.ledger.store import read_raw_ledger

    args = parse_args(argv)
    facts = common.machine_facts()
    overrides = [f"run.time_budget_s={args.minutes * 60:g}"]
    if args.backend:
        overrides.append(f"model.backend={args.backend}")
    overrides += args.overrides
    results = Path(args.results_dir or tempfile.mkdtemp(prefix="aiperf-whole-"))
    print(
        f"whole_run: aiperf run --config {args.config} {' '.join('--set ' + o for o in overrides)}; "
        f"{facts['date']}; {facts['load']}; GPUs {facts['gpus'] or 'none'}",
        flush=True,
    )
    run_dir, wall, _ = common.run_cli(args.config, overrides, results, timeout_s=args.minutes * 60 + 900)
    summary = json.loads((run_dir / "summary.json").read_text())
    records = read_raw_ledger(run_dir)
    start = records[0]
    backend = start["plan"].get("backend") or args.backend or "tensorflow"
    kind = "gpu" if summary["devices"].get("gpus") else "cpu"
    threads = run_cores(start)
    load_after_run = common.load_note()
    peak = measure_peak(kind, backend, threads, args.peak_dtype)
    score = summary["score"]
    out = {
        "facts": facts,
        "config": args.config,
        "overrides": overrides,
        "run_dir": str(run_dir),
        "cli_wall_s": wall,
        "device_kind": kind,
        "run_threads": threads,
        "ops_per_s": score["ops_per_s"],
        "train_ops": score["train_ops"],
        "eval_ops": score["eval_ops"],
        "wall_s": score["wall_s"],
        "trials_completed": score["trials_completed"],
        "epochs": score["epochs"],
        "best_val_acc": score["best_val_acc"],
        "precision": summary.get("precision"),
        "busy_fraction_mean": summary.get("workers", {}).get("busy_fraction_mean"),
        "peak": peak,
        "fraction_of_peak": score["ops_per_s"] / peak["peak"] if peak.get("peak") else None,
        "load_after_run": load_after_run,
    }
    print(
        f"\nrun {run_dir}: {score['trials_completed']} trials, {score['epochs']} epochs over {score['wall_s']:.1f} s, "
        f"precision {', '.join(summary.get('precision') or [])}"
    )
    print(
        f"  score                {common.si(score['ops_per_s'], 'OPS')} "
        f"(train {100 * score['train_ops'] / max(score['total_ops'], 1):.1f} % of the counted operations)"
    )
    print(f"  measured peak        {common.si(peak['peak'], 'FLOP/s')} ({peak})")
    print(f"  fraction of peak     {100 * out['fraction_of_peak']:.2f} %; {load_after_run}")
    common.write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
