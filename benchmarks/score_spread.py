"""How much the score moves between runs of one config on one machine, and why.

Runs ``aiperf run`` (the CLI, one run at a time) for each config, duration and seed asked,
or reads runs already made (``--analyse DIR...``), then prints per run and per group
(config, duration, overrides) the OPS, regulated score and best accuracy with their median,
coefficient of variation (CV), min and max, and the causes of the spread:

* ``OPS = workers x busy share x device rate``: the **busy share** is the workers' time in
  steps over workers x the scored wall time (start-up, idle gaps and the tail lower it); the
  **device rate** is the operations per second of step time, which depends on the trials that
  ran: their **FLOPs per image** and **batch size** (larger networks and batches keep a
  device busier per step). The variance of ``log OPS`` is split between the two.
* **start-up share**: master time to the first step over the scored wall time; **tail
  share**: time after the last counted epoch over the run's end.
* **window CV**: the run's own spread across windows of its steady part
  (:mod:`aiperf.metrics.steadiness`), the figure the summary reports.
* per epoch, the slope of ``log rate`` on ``log FLOPs per image`` and ``log batch size``
  over all runs: how strongly the network size drives the device rate.

The default config at its duration, seeds 0-2 and seed 0 again::

    PYTHONPATH=. python benchmarks/score_spread.py --configs default --seeds 0 1 2 0 --json spread.json

Existing runs (for example from ``aiperf run --repeat``)::

    PYTHONPATH=. python benchmarks/score_spread.py --analyse results/run-a results/run-b
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import common


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def analyse_run(run_dir: Path) -> dict[str, Any]:
    """One run's score and the figures that explain it, from its ledger alone."""
    from aiperf.ledger.schema import EpochRecord, RunStartRecord, RunStopRecord, TrialStartRecord, WorkerRecord, of_type
    from aiperf.ledger.store import read_ledger
    from aiperf.metrics.score import compute_score
    from aiperf.metrics.steadiness import steadiness

    records = read_ledger(run_dir)
    score = compute_score(records)
    start = of_type(records, RunStartRecord)[0]
    epochs = of_type(records, EpochRecord)
    stops = of_type(records, RunStopRecord)
    flops = {r.trial: float(r.flops.train_per_image) for r in of_type(records, TrialStartRecord)}
    busy = sum(float(e.train_s or 0) + float(e.eval_s or 0) for e in epochs)
    images = sum(int(e.train_images or 0) for e in epochs)
    workers = len({w.worker for w in of_type(records, WorkerRecord)}) or len({e.worker for e in epochs})
    first_step = min((float(e.t) - float(e.train_s or 0) - float(e.eval_s or 0) for e in epochs), default=0.0)
    run_end = float(stops[-1].t) if stops else score.wall_s
    steady = steadiness(records)
    per_epoch = [
        (
            math.log(float(e.ops) / (float(e.train_s) + float(e.eval_s or 0))),
            math.log(flops[e.trial]),
            math.log(float(e.batch_size)),
        )
        for e in epochs
        if e.ops and e.train_s and e.batch_size and e.trial in flops
    ]
    return {
        "run_dir": str(run_dir),
        "config": start.config.run.name,
        "seed": start.config.run.seed,
        "budget_s": start.config.run.time_budget_s,
        "ops_per_s": score.ops_per_s,
        "regulated": score.regulated,
        "best_val_acc": score.best_val_acc,
        "epochs": score.epochs,
        "trials_completed": score.trials_completed,
        "wall_s": score.wall_s,
        "workers": workers,
        "flops_per_image": score.train_ops / images if images else None,
        "batch_size": sum(int(e.batch_size or 0) * int(e.train_images or 0) for e in epochs) / images
        if images
        else None,
        "device_rate": score.total_ops / busy if busy else None,
        "busy_share": _share(busy, workers * score.wall_s),
        "startup_share": _share(first_step, score.wall_s),
        "tail_share": _share(run_end - score.wall_s, run_end),
        "window_cv": steady.window_cv if steady else None,
        "size_by_tenth": size_trajectory(epochs, flops, score.wall_s),
        "steady_ops_per_s": steady.steady_ops_per_s if steady else None,
        "per_epoch": per_epoch,
    }


def spread(values: list[float | None]) -> dict[str, float | None]:
    """Median, coefficient of variation, min and max (``aiperf.metrics.repeats``, as ``--repeat`` prints)."""
    from aiperf.metrics.repeats import spread as combine

    present = [v for v in values if v is not None]
    if not present:
        return {"median": None, "cv": None, "min": None, "max": None}
    s = combine(present)
    return {"median": s.median, "cv": s.cv, "min": s.min, "max": s.max}


def size_trajectory(epochs: list[Any], flops: dict[str, float], wall_s: float, parts: int = 10) -> list[float | None]:
    """Operation-weighted training FLOPs per image of the epochs ending in each tenth of the run."""
    sums, weights = [0.0] * parts, [0.0] * parts
    for e in epochs:
        if e.trial in flops and e.ops and wall_s > 0:
            part = min(parts - 1, int(parts * float(e.t) / wall_s))
            sums[part] += float(e.ops) * flops[e.trial]
            weights[part] += float(e.ops)
    return [s / w if w else None for s, w in zip(sums, weights, strict=True)]


def _log_var(values: list[float | None]) -> float:
    logs = [math.log(v) for v in values if v]
    return statistics.variance(logs) if len(logs) > 1 else 0.0


def size_slopes(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    """Least-squares slopes of per-epoch log rate on log FLOPs per image and log batch size."""
    import numpy as np

    rows = [row for run in runs for row in run["per_epoch"]]
    if len(rows) < 4:
        return None
    data = np.array(rows)
    design = np.column_stack([np.ones(len(data)), data[:, 1], data[:, 2]])
    coef, *_ = np.linalg.lstsq(design, data[:, 0], rcond=None)
    return {"flops_per_image": float(coef[1]), "batch_size": float(coef[2]), "epochs": len(rows)}


def summarise_group(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The spread of a group of runs of one config and duration, and its split between busy share and rate."""
    out = {
        key: spread([r[key] for r in runs])
        for key in ("ops_per_s", "regulated", "best_val_acc", "flops_per_image", "batch_size", "device_rate")
    }
    out.update({key: spread([r[key] for r in runs]) for key in ("busy_share", "startup_share", "tail_share")})
    out["window_cv"] = spread([r["window_cv"] for r in runs])
    tenths = zip(*(r["size_by_tenth"] for r in runs), strict=True)
    out["size_by_tenth_cv"] = [spread(list(column))["cv"] for column in tenths]
    total = _log_var([r["ops_per_s"] for r in runs])
    out["log_variance"] = {
        "ops": total,
        "busy_share": _log_var([r["busy_share"] for r in runs]),
        "device_rate": _log_var([r["device_rate"] for r in runs]),
    }
    out["runs"] = len(runs)
    out["slopes"] = size_slopes(runs)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", nargs="+", default=["default"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 0], help="one run per entry (repeat to repeat)")
    p.add_argument(
        "--durations", nargs="+", type=float, default=[], help="run.time_budget_s values (default: config's)"
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every run")
    p.add_argument("--analyse", nargs="+", type=Path, metavar="RUN_DIR", help="read these runs instead of running")
    p.add_argument("--results", type=Path, help="where the runs write (default: a temporary folder)")
    p.add_argument("--json")
    return p.parse_args(argv)


def make_runs(args: argparse.Namespace, results: Path) -> list[tuple[str, Path]]:
    """Run every (config, duration, seed) in turn; returns (group label, run dir)."""
    made = []
    for config in args.configs:
        for duration in args.durations or [None]:
            label = f"{config} {int(duration)} s" if duration else config
            for seed in args.seeds:
                overrides = [*args.set, f"run.seed={seed}"]
                if duration:
                    overrides.append(f"run.time_budget_s={duration}")
                timeout = 4 * (duration or 3600) + 600
                run_dir, _, _ = common.run_cli(config, overrides, results / label.replace(" ", "-"), timeout)
                print(f"{label} seed {seed}: {run_dir}", flush=True)
                made.append((label, run_dir))
    return made


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    facts = common.machine_facts()
    if args.analyse:
        labelled = [("given runs", d) for d in args.analyse]
    else:
        results = args.results or Path(tempfile.mkdtemp(prefix="score-spread-"))
        labelled = make_runs(args, results)
    groups: dict[str, list[dict[str, Any]]] = {}
    for label, run_dir in labelled:
        groups.setdefault(label, []).append(analyse_run(run_dir))
    out = {
        "machine": facts,
        "overrides": args.set,
        "groups": {label: {"summary": summarise_group(runs), "runs": runs} for label, runs in groups.items()},
    }
    _print(out)
    for group in out["groups"].values():
        for run in group["runs"]:
            run.pop("per_epoch")
    common.write_json(args.json, out)
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


COLUMNS = ("seed", "OPS", "regulated", "best acc", "epochs", "FLOPs/img", "batch", "device rate", "busy", "start-up")
COLUMNS += ("tail", "window CV")


def _print(out: dict[str, Any]) -> None:
    facts = out["machine"]
    print(f"# {facts['date']}, {facts['cpu']}, {facts['cores']} cores, {facts['load']}")
    for label, group in out["groups"].items():
        print(f"\n## {label} {' '.join(out['overrides'])}".rstrip())
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "---|" * len(COLUMNS))
        for r in group["runs"]:
            print(
                f"| {r['seed']} | {common.si(r['ops_per_s'], 'OPS')} | {common.si(r['regulated'], 'OPS')}"
                f" | {r['best_val_acc']:.4f} | {r['epochs']} | {common.si(r['flops_per_image'], 'FLOP')}"
                f" | {r['batch_size']:.0f} | {common.si(r['device_rate'], 'OPS')} | {_pct(r['busy_share'])}"
                f" | {_pct(r['startup_share'])} | {_pct(r['tail_share'])} | {_pct(r['window_cv'])} |"
            )
        s = group["summary"]
        print()
        for key in (
            "ops_per_s",
            "regulated",
            "best_val_acc",
            "flops_per_image",
            "batch_size",
            "device_rate",
            "busy_share",
        ):
            v = s[key]
            fmt = (
                (lambda x: f"{x:.4g}")
                if key in ("best_val_acc", "batch_size", "busy_share")
                else (lambda x: common.si(x, ""))
            )
            if v["median"] is None:
                continue
            print(f"- {key}: median {fmt(v['median'])}, CV {_pct(v['cv'])}, min {fmt(v['min'])}, max {fmt(v['max'])}")
        print("\nFLOPs per image (operation-weighted, MFLOP) by tenth of the run:")
        for r in group["runs"]:
            print(
                f"- seed {r['seed']}: " + " ".join("-" if v is None else f"{v / 1e6:.0f}" for v in r["size_by_tenth"])
            )
        print("- CV across runs: " + " ".join(_pct(v) for v in s["size_by_tenth_cv"]))
        print()
        lv = s["log_variance"]
        if lv["ops"] > 0:
            print(
                f"- variance of log OPS: busy share {lv['busy_share'] / lv['ops']:.0%},"
                f" device rate {lv['device_rate'] / lv['ops']:.0%} (the rest: their covariance)"
            )
        if s["slopes"]:
            sl = s["slopes"]
            print(
                f"- per epoch: rate ~ FLOPs/img^{sl['flops_per_image']:.2f} x batch^{sl['batch_size']:.2f}"
                f" ({sl['epochs']} epochs)"
            )


if __name__ == "__main__":
    main()
