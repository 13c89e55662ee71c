"""aiperf's whole default run against a plain Ray Tune + Optuna driver doing the same work: counted OPS of each.

``engine_overhead.py`` compares the engines on the seed alone (TPE re-tuning one network). This is
the full workload (issue 52): architecture search interleaved with TPE under the size schedule,
2 slots x 1 CPU, the same budget:

* ``aiperf``: ``aiperf run --config default`` (the README's first command, its budget and slots
  as set), read back from its ledger.
* ``tune-search``: ``tune.Tuner`` with ``reuse_actors=True``, one aiperf ``TrialRunner`` kept per
  actor (the compiled-model cache a long-lived aiperf worker has), and a searcher that asks
  Optuna's TPE (seeded, constant liar, multivariate, aiperf's space and default point, the
  kernel size fixed at the config's) for the hyperparameters and picks the architecture as a
  simple script would with aiperf's own parts: the seed first; random 1-3-morph children of the
  seed trained from scratch until a trial completes; then ``nas.random_search.RandomMorphSearch``
  -- a random completed architecture, 1 to ``search.max_morphs_per_child`` random morphs, the
  first draw inside aiperf's ``SizeSchedule`` at the moment asked, else the nearest below it --
  whose child inherits its parent's trained weights (saved by the parent's trainable, the
  morphs replayed by aiperf's ``inherit_weights``). Ops are counted by aiperf's FLOPs counter,
  with the ledger's wall rule (an epoch ending after the budget is not counted).

Both orders run back to back (``--rounds``; each round starts with the other engine). Figures per
engine: counted OPS over the wall, epochs, trials, busy share per slot, the mean training FLOPs per
image of the counted epochs (epoch-weighted), and aiperf / Tune per round. Needs ``pip install -e ".[bench]"``::

    PYTHONPATH=.:benchmarks python benchmarks/engine_search.py --rounds 2 --json search.json
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
import engine_overhead as overhead

ENGINES = ("aiperf", "tune-search")


def search_overrides(seconds: float, extra: list[str]) -> list[str]:
    """The whole default workload, only the budget and the slots set (as engine_overhead's, without re-tune-only)."""
    return [
        f"run.time_budget_s={seconds:g}",
        f"cluster.max_concurrent_trials={overhead.SLOTS}",
        f"cluster.cpus_per_trial={overhead.THREADS_PER_TRIAL}",
        *extra,
    ]


def search_trial(config: dict[str, Any], setup: dict[str, Any]) -> None:
    """One Tune trial: the searcher's architecture with TPE's hyperparameters, trained by aiperf's ``TrialRunner``."""
    from ray import tune

    entered = time.time()
    trial_id = tune.get_context().get_trial_id()
    state, load_s = overhead._actor_setup(setup)
    from aiperf.families.image.flops import count_flops, epoch_operations
    from aiperf.families.image.trainer import TrialRunner
    from aiperf.training.trial import TrialSpec, apply_hparams
    from nas.serialize import graph_from_dict, graph_to_dict

    cfg = state["cfg"]
    runner = state.get("runner")
    if runner is None:
        runner = state["runner"] = TrialRunner(state["dataset"], state["settings"], cfg.model.backend)
    hparams = overhead.trial_hparams(config, cfg)
    graph = apply_hparams(graph_from_dict(config["graph"]), hparams)
    cost = count_flops(graph)
    parent = config.get("parent")
    parent_weights = None
    if parent:
        with open(Path(setup["weights"]) / f"{parent}.pkl", "rb") as fh:
            parent_weights = pickle.load(fh)
    spec = TrialSpec(
        trial_id=trial_id,
        kind="arch" if parent or config.get("morphs") else "seed",
        graph=graph_to_dict(graph),
        hparams=hparams,
        seed=overhead._trial_seed(cfg.run.seed, trial_id),
        parent_graph=config.get("parent_graph") if parent else None,
        morphs=list(config.get("morphs") or []) if parent else [],
        checkpoint_every_epoch=False,
    )
    events = setup["events"]
    size = cost.train_per_image(hparams["batch_size"])
    start = {"kind": "start", "trial": trial_id, "pid": os.getpid(), "wall": entered, "dataset_load_s": load_s,
             "runner_kept": True, "hparams": hparams, "train_per_image": size}  # fmt: skip
    overhead._append_event(events, start)
    best = 0.0
    for item in runner.run(spec, parent_weights):
        now_wall, now_perf = time.time(), time.perf_counter()
        if item["type"] == "epoch":
            train_ops, eval_ops = epoch_operations(cost, item["train_images"], item["eval_images"], item["batch_size"])
            best = max(best, item["val_acc"])
            begin, end = item["window"]
            overhead._append_event(
                events,
                {
                    "kind": "epoch", "trial": trial_id, "pid": os.getpid(), "epoch": item["epoch"],
                    "train_images": item["train_images"], "eval_images": item["eval_images"],
                    "batch_size": item["batch_size"], "train_s": item["train_s"], "eval_s": item["eval_s"],
                    "val_acc": item["val_acc"], "train_ops": train_ops, "eval_ops": eval_ops,
                    "ops": train_ops + eval_ops, "train_per_image": cost.train_per_image(item["batch_size"]),
                    "wall_begin": now_wall - (now_perf - begin), "wall_end": now_wall - (now_perf - end),
                    "wall": now_wall,
                },
            )  # fmt: skip
            tune.report({"val_acc": item["val_acc"], overhead.METRIC: best, "epoch": item["epoch"]})
        elif item["type"] == "done":
            with open(Path(setup["weights"]) / f"{trial_id}.pkl", "wb") as fh:
                pickle.dump(item["weights"], fh)
            overhead._append_event(
                events,
                {"kind": "done", "trial": trial_id, "pid": os.getpid(), "wall": now_wall,
                 "startup_s": item["startup_s"], "first_step_s": item["first_step_s"],
                 "step_reused": item["step_reused"]},
            )  # fmt: skip


def morph_searcher(cfg: Any, inner: Any, budget_s: float) -> Any:
    """The Tune searcher: TPE's hyperparameters (``inner``) with a random-morph architecture (see the docstring)."""
    import numpy as np
    from ray.tune.search import Searcher

    from aiperf.datasets import load_dataset
    from aiperf.engine.search import size_schedule
    from aiperf.families.image.flops import TrainFlopsPerImage
    from aiperf.families.image.seed import seed_architecture
    from nas.limits import Limits
    from nas.random_search import Origin, Origins, RandomMorphSearch, grow
    from nas.serialize import graph_to_dict

    seed_graph = seed_architecture(cfg, load_dataset(cfg.dataset))
    plan_batch = 64 if cfg.train.batch_size == "auto" else int(cfg.train.batch_size)
    limits = Limits(
        cfg.search.max_layers, cfg.search.max_params, cfg.search.max_flops_per_image, TrainFlopsPerImage(plan_batch)
    )
    schedule = size_schedule(cfg, seed_graph, limits)
    kernel = int(cfg.train.kernel_size)

    class MorphSearch(Searcher):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(metric=overhead.METRIC, mode="max")
            self.t0: float | None = None
            self.rng = np.random.default_rng(cfg.run.seed)
            self.origins = Origins()
            self.trials: dict[str, tuple[Any, str]] = {}  # trial id -> (graph, key)
            self.owner: dict[str, str] = {}  # architecture key -> the trial that completed it
            self.taken: set[str] = set()
            self.strategy = RandomMorphSearch(
                limits.admits, self.rng, cfg.search.max_morphs_per_child, size_rank=self.size_rank
            )

        def progress(self) -> float:
            return 0.0 if self.t0 is None else min(1.0, (time.monotonic() - self.t0) / budget_s)

        def size_rank(self, graph: Any) -> float:
            flops = limits.flops(graph)
            if schedule is None or flops is None:
                return 0.0
            if not schedule.admits(flops, self.progress()):
                return float("inf")
            return schedule.shortfall(flops, self.progress())

        def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
            return bool(inner.set_search_properties(metric, mode, config, **spec))

        def suggest(self, trial_id: str) -> dict[str, Any] | None:
            if self.t0 is None:
                self.t0 = time.monotonic()
            hparams = inner.suggest(trial_id)
            if not isinstance(hparams, dict):
                return hparams
            arch: dict[str, Any] = {"parent": None, "parent_graph": None, "morphs": []}
            if not self.trials:
                graph = seed_graph
            elif not len(self.origins):
                steps = int(self.rng.integers(1, 4))
                grown = grow(seed_graph, self.rng, steps, kernel, limits.admits)
                graph = grown[0] if grown is not None else seed_graph
            else:
                child = self.strategy.propose(self.origins, lambda key: key in self.taken)
                if child is None:
                    graph = seed_graph
                else:
                    graph = child.graph
                    arch = {
                        "parent": self.owner[child.origin.key],
                        "parent_graph": graph_to_dict(child.origin.graph),
                        "morphs": [m.to_dict() for m in child.morphs],
                    }
            key = graph.key()
            self.taken.add(key)
            self.trials[trial_id] = (graph, key)
            return {**hparams, **arch, "graph": graph_to_dict(graph)}

        def on_trial_result(self, trial_id: str, result: dict) -> None:
            inner.on_trial_result(trial_id, result)

        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
            inner.on_trial_complete(trial_id, result, error)
            graph, key = self.trials.get(trial_id, (None, ""))
            if graph is not None and result and not error and overhead.METRIC in result:
                known = self.origins.get(key)
                value = float(result[overhead.METRIC])
                if known is None or value > known.value:
                    self.origins.put(Origin(key, graph, value, kernel))
                    self.owner[key] = trial_id

    return MorphSearch()


def run_tune_search(config: str, overrides: list[str], workdir: Path) -> dict[str, Any]:
    """One ``Tuner.fit()`` of the search driver; returns its wall clock, events file and Tune's own counts."""
    import warnings

    import optuna
    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from aiperf.config import load_config

    cfg = load_config(config, overrides)
    space, default = overhead.tune_space(cfg)
    workdir.mkdir(parents=True, exist_ok=True)
    events, weights = workdir / "events.jsonl", workdir / "weights"
    events.unlink(missing_ok=True)
    weights.mkdir(exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(seed=cfg.run.seed, constant_liar=True, multivariate=True)
    inner = OptunaSearch(space, metric=overhead.METRIC, mode="max", points_to_evaluate=[default], sampler=sampler)
    searcher = morph_searcher(cfg, inner, cfg.run.time_budget_s)
    t0 = time.perf_counter()
    ray.init(num_cpus=overhead.SLOTS, include_dashboard=False, log_to_driver=False)
    ray_init_s = time.perf_counter() - t0
    try:
        setup = {"config": config, "overrides": overrides, "keep_runner": True, "events": str(events),
                 "weights": str(weights)}  # fmt: skip
        trainable = tune.with_resources(
            tune.with_parameters(search_trial, setup=setup), {"cpu": overhead.THREADS_PER_TRIAL}
        )
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                search_alg=searcher,
                num_samples=-1,
                max_concurrent_trials=overhead.SLOTS,
                time_budget_s=cfg.run.time_budget_s,
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(name="tune-search", storage_path=str(workdir / "tune"), verbose=0),
        )
        start_wall, start = time.time(), time.perf_counter()
        grid = tuner.fit()
        wall = time.perf_counter() - start
        end_wall = time.time()
        results = [grid[i] for i in range(len(grid))]
    finally:
        ray.shutdown()
    return {
        "engine": "tune-search", "reuse_actors": True, "keep_runner": True, "ray_init_s": ray_init_s,
        "start_wall": start_wall, "end_wall": end_wall, "wall_s": wall, "budget_s": cfg.run.time_budget_s,
        "events": str(events), "tune_trials": len(results),
        "tune_reported_epochs": sum(int((r.metrics or {}).get("training_iteration", 0)) for r in results),
        "tune_errors": [str(r.error)[:300] for r in results if r.error is not None],
    }  # fmt: skip


def mean_size(epochs: list[dict[str, Any]]) -> float | None:
    """The counted epochs' epoch-weighted mean training FLOPs per image."""
    sizes = [e["train_per_image"] for e in epochs if e.get("train_per_image")]
    return sum(sizes) / len(sizes) if sizes else None


def run_engine(engine: str, args: argparse.Namespace, overrides: list[str], workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if engine == "aiperf":
        run_dir, _, _ = common.run_cli(args.config, overrides, workdir, timeout_s=args.seconds + 900)
        out = overhead.analyse_aiperf(run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        out["device_time"] = summary.get("device_time")
        out["size_pace"] = summary.get("size_pace")
        records = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines() if line]
        size = {r["trial"]: r["flops"]["train_per_image"] for r in records if r["type"] == "trial_start"}
        out["mean_train_per_image"] = mean_size(
            [{"train_per_image": size[r["trial"]]} for r in records if r["type"] == "epoch"]
        )
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(workdir), "--config", args.config,
               "--seconds", f"{args.seconds:g}", *[a for o in args.overrides for a in ("--set", o)]]  # fmt: skip
        log = workdir / "console.log"
        with open(log, "a") as fh:
            proc = subprocess.run(cmd, env=overhead.child_env(), stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=args.seconds + 900, cwd=common.REPO)  # fmt: skip
        result_path = workdir / "tune-result.json"
        if proc.returncode != 0 or not result_path.exists():
            raise SystemExit(f"{engine} failed (exit {proc.returncode}); last output:\n{log.read_text()[-3000:]}")
        result = json.loads(result_path.read_text())
        out = overhead.analyse_tune(result)
        t_end = result["start_wall"] + result["budget_s"]
        counted = [
            e for e in overhead.read_events(Path(result["events"])) if e["kind"] == "epoch" and e["wall"] <= t_end
        ]
        out["mean_train_per_image"] = mean_size(counted)
    out["process_wall_s"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=300.0)
    p.add_argument("--rounds", type=int, default=2, help="rounds of both engines, each starting with the other")
    p.add_argument("--config", default="default")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--quiet-load", type=float, default=0.6)
    p.add_argument("--max-wait-s", type=float, default=600.0)
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None, metavar="OUT")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    overrides = search_overrides(args.seconds, args.overrides)
    if args.child:
        result = run_tune_search(args.config, overrides, Path(args.child))
        (Path(args.child) / "tune-result.json").write_text(json.dumps(result, indent=2) + "\n")
        return {}
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    facts = common.machine_facts()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="aiperf-search-"))
    print(f"engine_search: {args.rounds} round(s) of {', '.join(ENGINES)}, {args.seconds:g} s, {facts['cpu']}, "
          f"{facts['load']}; workdir {workdir}", flush=True)  # fmt: skip
    runs = []
    for rnd in range(1, args.rounds + 1):
        order = ENGINES if rnd % 2 else tuple(reversed(ENGINES))
        for engine in order:
            quiet = overhead.wait_for_quiet(args.quiet_load, args.max_wait_s)
            result = run_engine(engine, args, overrides, workdir / f"round{rnd}-{engine}")
            runs.append({"round": rnd, "engine": engine, **quiet, **result})
            size = result.get("mean_train_per_image")
            busy = 100 * (result["busy_fraction_per_slot"] or 0)
            print(f"round {rnd} {engine}: {common.si(result['ops_per_s'], 'OPS')}, {result['epochs']} epochs, "
                  f"{result['trials_started']} trials, busy/slot {busy:.1f} %, "
                  f"mean size {size / 1e6 if size else 0:.1f} MFLOP/image", flush=True)  # fmt: skip
    summary = overhead.summarise(runs, ENGINES)
    overhead.print_summary(summary)
    out = {"facts": facts, "config": args.config, "overrides": overrides, "seconds": args.seconds, "runs": runs,
           "summary": summary, "load_after": common.load_note()}  # fmt: skip
    common.write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
