"""How much of a whole run's wall time the workers spend inside training and evaluation steps.

Runs ``aiperf run`` (the CLI, in a subprocess) for ``--minutes`` on this machine, samples
GPU utilisation (NVML, else nvidia-smi) and host CPU utilisation meanwhile, then reads
the run's ledger and splits every worker's life into:

* **steps**: the epochs' ``train_s + eval_s`` (what the engine calls busy); of which
  **compile**: the trials' ``compile_s`` (each first step and first evaluation beyond an ordinary
  one: the tracing/compiling alone; ``first_step_s`` in ledgers written before that field);
* **idle between trials**: the epochs' ``idle_before_s`` (the previous trial's last step to
  this trial's first step: build, compile set-up, weight surgery, Ray hand-over);
* **head**: worker ready -> its first trial's first step; **tail**: its last counted epoch ->
  retirement (the trial stopped by the time budget; its partial epoch is not counted);
* **unaccounted**: the rest (inside trials, between epochs: weight copies, checkpoint
  transfers, the master's bookkeeping).

Target: steps >= 95 % of the workers' time. The GPU's own utilisation, sampled over the same
window, is the cross-check (it should be at least the step fraction).

GPU host (one H100, JAX)::

    KERAS_BACKEND=jax PYTHONPATH=/tmp/site312:. python benchmarks/busy_fraction.py --minutes 5 --json out.json

CPU::

    PYTHONPATH=. python benchmarks/busy_fraction.py --minutes 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import common


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"count": 0, "sum": 0.0, "mean": None, "median": None, "max": None}
    return {
        "count": len(values),
        "sum": sum(values),
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "max": max(values),
    }


def _compile_s(trial_end: dict[str, Any]) -> float:
    """A completed trial's compilation: ``compile_s``, else (older ledgers) its whole first step."""
    value = trial_end.get("compile_s")
    return float(value if value is not None else trial_end.get("first_step_s") or 0.0)


def worker_breakdown(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each worker's alive time split into steps, compile, idle gaps, head, tail and the unaccounted rest."""
    epochs = [r for r in records if r["type"] == "epoch"]
    ends = [r for r in records if r["type"] == "trial_end" and r.get("status") == "completed"]
    out = {}
    for w in (r for r in records if r["type"] == "worker"):
        name = w["worker"]
        alive = w.get("alive_s")
        if not alive:
            continue
        mine = [e for e in epochs if e.get("worker") == name]
        ready_t = w["t"] - alive
        steps = sum(e["train_s"] + e["eval_s"] for e in mine)
        compile_s = sum(_compile_s(r) for r in ends if r.get("worker") == name)
        gaps = [e["idle_before_s"] for e in mine if e.get("idle_before_s") is not None]
        head = (mine[0]["t"] - mine[0]["train_s"] - mine[0]["eval_s"] - ready_t) if mine else alive
        tail = (w["t"] - mine[-1]["t"]) if mine else 0.0
        rest = alive - steps - sum(gaps) - head - tail
        out[name] = {
            "alive_s": alive,
            "steps_s": steps,
            "compile_s": compile_s,
            "idle_gaps_s": sum(gaps),
            "head_s": head,
            "tail_s": tail,
            "unaccounted_s": rest,
            "busy_fraction": steps / alive,
            "busy_fraction_engine": w.get("busy_fraction"),
            "steady_busy_fraction": (steps - compile_s) / alive,
            "trials": len({e["trial"] for e in mine}),
            "device": (w.get("device") or {}).get("name"),
        }
    return out


def analyse(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The run-level figures: busy fractions, idle gaps and per-trial start-up, from the ledger alone."""
    from aiperf.ledger.schema import parse_records
    from aiperf.metrics.score import compute_score

    workers = worker_breakdown(records)
    alive = sum(w["alive_s"] for w in workers.values())
    steps = sum(w["steps_s"] for w in workers.values())
    compile_s = sum(w["compile_s"] for w in workers.values())
    stop = [r for r in records if r["type"] == "run_stop"]
    run_wall = stop[-1]["t"] if stop else records[-1]["t"]
    ends = [r for r in records if r["type"] == "trial_end" and r.get("status") == "completed"]
    epochs = [r for r in records if r["type"] == "epoch"]
    score = compute_score(parse_records(records))
    return {
        "workers": workers,
        "busy_fraction": steps / alive if alive else None,
        "steady_busy_fraction": (steps - compile_s) / alive if alive else None,
        "busy_fraction_of_run_wall": steps / (run_wall * len(workers)) if workers and run_wall else None,
        "share": {
            k: sum(w[k] for w in workers.values()) / alive if alive else None
            for k in ("steps_s", "compile_s", "idle_gaps_s", "head_s", "tail_s", "unaccounted_s")
        },
        "idle_before_s": _stats([e["idle_before_s"] for e in epochs if e.get("idle_before_s") is not None]),
        "startup_s": _stats([r["startup_s"] for r in ends if r.get("startup_s") is not None]),
        "first_step_s": _stats([r["first_step_s"] for r in ends if r.get("first_step_s") is not None]),
        "compile_s": _stats([r["compile_s"] for r in ends if r.get("compile_s") is not None]),
        "worker_init_s": _stats([r["init_s"] for r in records if r["type"] == "worker" and r.get("init_s")]),
        "run_wall_s": run_wall,
        "first_trial_t": min((r["t"] for r in records if r["type"] == "trial_start"), default=None),
        "score_ops_per_s": score.ops_per_s,
        "trials_completed": score.trials_completed,
        "epochs": score.epochs,
    }


def telemetry_mean(run_dir: Path) -> dict[str, Any] | None:
    """The engine's own telemetry (``telemetry.jsonl``), when the run recorded it."""
    from aiperf.sampling.telemetry import read_telemetry

    samples = read_telemetry(run_dir)
    if not samples:
        return None
    gpu = [a["util_percent"] for s in samples for a in s.get("accelerators", []) if a.get("util_percent") is not None]
    cpu = [s["cpu_percent"] for s in samples if s.get("cpu_percent") is not None]
    return {
        "samples": len(samples),
        "gpu_percent_mean": statistics.fmean(gpu) if gpu else None,
        "cpu_percent_mean": statistics.fmean(cpu) if cpu else None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0, help="the run's time budget")
    p.add_argument("--config", default=None, help="default: synthetic with a GPU, else default (MNIST)")
    p.add_argument("--backend", default=os.environ.get("KERAS_BACKEND"), help="model.backend (default: the config's)")
    p.add_argument("--single", action="store_true", help="one trial at a time (cluster.max_concurrent_trials=1)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--results-dir", default=None, help="default: a temporary directory")
    p.add_argument("--sample-s", type=float, default=1.0, help="utilisation sampling interval")
    p.add_argument("--json", default=None, metavar="OUT")
    return p.parse_args(argv)


def overrides_for(args: argparse.Namespace) -> list[str]:
    items = [f"run.time_budget_s={args.minutes * 60:g}"]
    if args.backend:
        items.append(f"model.backend={args.backend}")
    if args.single:
        items.append("cluster.max_concurrent_trials=1")
    return items + list(args.overrides)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from aiperf.ledger.store import read_raw_ledger

    args = parse_args(argv)
    facts = common.machine_facts()
    config = args.config or ("synthetic" if facts["gpus"] else "default")
    results = Path(args.results_dir or tempfile.mkdtemp(prefix="aiperf-busy-"))
    overrides = overrides_for(args)
    print(
        f"busy_fraction: aiperf run --config {config} {' '.join('--set ' + o for o in overrides)}; "
        f"{facts['date']}; {facts['load']}; GPUs {facts['gpus'] or 'none'}",
        flush=True,
    )
    with common.UtilisationSampler(args.sample_s) as sampler:
        run_dir, wall, _ = common.run_cli(config, overrides, results, timeout_s=args.minutes * 60 + 900)
    records = read_raw_ledger(run_dir)
    result = analyse(records)
    first_wall = next((r["wall"] for r in records if r["type"] == "trial_start"), records[0]["wall"])
    last_wall = records[-1]["wall"]
    result["sampled"] = sampler.mean(first_wall, last_wall)
    result["telemetry"] = telemetry_mean(run_dir)
    out = {
        "facts": facts,
        "config": config,
        "overrides": overrides,
        "run_dir": str(run_dir),
        "cli_wall_s": wall,
        "load_after": common.load_note(),
        **result,
    }
    _print(out)
    common.write_json(args.json, out)
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _print(out: dict[str, Any]) -> None:
    share = out["share"]
    print(
        f"\nrun {out['run_dir']}: {out['trials_completed']} trials, {out['epochs']} epochs, "
        f"{len(out['workers'])} worker(s), run wall {out['run_wall_s']:.1f} s (CLI {out['cli_wall_s']:.1f} s)"
    )
    print(
        f"  in steps (train+eval)   {_pct(out['busy_fraction'])} of worker time"
        f"  (without compile {_pct(out['steady_busy_fraction'])};"
        f" of the run's wall {_pct(out['busy_fraction_of_run_wall'])})"
    )
    print(
        f"  split                   steps {_pct(share['steps_s'])} (compile {_pct(share['compile_s'])}), "
        f"idle between trials {_pct(share['idle_gaps_s'])}, head {_pct(share['head_s'])}, "
        f"tail {_pct(share['tail_s'])}, unaccounted {_pct(share['unaccounted_s'])}"
    )
    for key in ("idle_before_s", "startup_s", "first_step_s", "compile_s", "worker_init_s"):
        s = out[key]
        if s["count"]:
            print(
                f"  {key:23} median {s['median']:.2f} s, mean {s['mean']:.2f} s, max {s['max']:.2f} s (n={s['count']})"
            )
    sampled = out["sampled"]
    if sampled["gpu_percent_mean"] is not None:
        print(f"  GPU utilisation         {sampled['gpu_percent_mean']:.1f} % (sampled, n={sampled['samples']})")
    if sampled["cpu_percent_mean"] is not None:
        print(f"  host CPU utilisation    {sampled['cpu_percent_mean']:.1f} % (all cores, includes other processes)")
    if out.get("telemetry"):
        print(f"  engine telemetry        {out['telemetry']}")
    print(f"  score                   {common.si(out['score_ops_per_s'], 'OPS')}; {out['load_after']}")


if __name__ == "__main__":
    main()
