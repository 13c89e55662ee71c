"""aiperf's engine against Ray Tune + Optuna on identical work: how much of the wall time becomes counted OPS.

Both engines train the default config's seed network (``small_resnet`` on MNIST) with TPE-sampled
hyperparameters, on 2 slots of 1 CPU each, for the same time budget; the engines alone differ:

* ``aiperf``: ``aiperf run --config default --set search.retune_fraction=1.0`` (every trial after
  the seed re-tunes the seed architecture, so no architecture search), 2 concurrent trials x 1
  CPU, through the CLI in a subprocess; read back from the run's ledger and summary.
* ``tune-defaults``: ``tune.Tuner`` + ``OptunaSearch`` (TPE: seeded, constant liar, multivariate,
  as aiperf's tuner) over aiperf's hyperparameter space (learning rate and weight decay log-uniform,
  dropout, batch size choice, epochs; the kernel size is the seed's), the default
  hyperparameters evaluated first (aiperf's seed trial), ``max_concurrent_trials=2``,
  1 CPU per trial, ``ray.init(num_cpus=2)``. The function trainable trains with aiperf's own
  ``TrialRunner`` -- the same model, input, step, evaluation and trainer settings a worker uses --
  and reports every epoch (val_acc and its counted operations) with ``tune.report``. Each trial
  gets a new ``TrialRunner`` (a self-contained trainable; aiperf's compiled-model cache lives in its
  long-lived worker), and a new actor, so it imports TensorFlow and loads the dataset again.
* ``tune-reuse``: the same with ``reuse_actors=True`` (the dataset is kept in the actor, loaded once).
* ``tune-reuse-kept``: ``reuse_actors=True`` and one ``TrialRunner`` kept per actor, so re-tunes of
  the seed reuse its compiled model as aiperf's workers do: it shows where aiperf's lead comes from.

Per engine: counted OPS (sum over completed epochs of train images x train FLOPs/image + eval
images x eval FLOPs/image, ``aiperf.families.image.flops.epoch_operations``, over the search's wall time:
aiperf's ledger ``t`` 0 -> ``run_stop``, Tune's ``Tuner.fit()`` call -> return; aiperf's own
``score.ops_per_s``, which stops its clock at the last counted epoch, is shown too, with the same
figure for Tune). Only epochs that end within the budget count, for both engines: aiperf's master
records none after it, and Tune lets a stopped trial run to its next report, so its later epochs
are listed (with the OPS they would give) but not counted. Also: epochs, trials, busy fraction
per slot (epochs' ``train_s + eval_s`` / (2 x wall)), idle per trial ((2 x wall - busy) / trials
started), mean first-step time (tracing and compiling plus one step), and the share of trials
that reused a compiled model. Outside both walls: Ray's start (and aiperf's master loading the
dataset before its ledger starts; Tune's trainables load it inside); each engine's whole
subprocess time is in the JSON as ``process_wall_s``.

Engines alternate within a round (``--rounds``; each round starts with the next engine). Before
each run the script waits for the 1-minute load average to drop below ``--quiet-load`` (at most
``--max-wait-s``) and records the load it started at. GPUs are hidden from both engines
(``CUDA_VISIBLE_DEVICES=""``): the comparison is of the engines on identical CPU work.

Needs the ``bench`` extra (Ray Tune is not a runtime dependency of aiperf)::

    pip install -e ".[bench]"
    PYTHONPATH=. python benchmarks/engine_overhead.py --rounds 1 --seconds 300 --json overhead.json

One engine, a short check: ``--engines tune-reuse --seconds 60``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import common

ENGINES = ("aiperf", "tune-defaults", "tune-reuse", "tune-reuse-kept")
TUNE_ENGINES = {  # engine -> (reuse_actors, keep one TrialRunner per actor)
    "tune-defaults": (False, False),
    "tune-reuse": (True, False),
    "tune-reuse-kept": (True, True),
}
SLOTS = 2  # concurrent trials, each on 1 CPU: what the 2-core development box runs
THREADS_PER_TRIAL = 1
METRIC = "best_val_acc"  # what aiperf tells its tuner about a trial: its best epoch so far


def search_overrides(seconds: float, extra: Sequence[str]) -> list[str]:
    """The config overrides both engines run under: seed-only re-tuning, 2 slots x 1 CPU, the budget."""
    return [
        "search.retune_fraction=1.0",
        f"run.time_budget_s={seconds:g}",
        f"cluster.max_concurrent_trials={SLOTS}",
        f"cluster.cpus_per_trial={THREADS_PER_TRIAL}",
        *extra,
    ]


# -- the Tune trainable (runs in Ray's worker processes) ------------------------------------------
# Per Ray worker process: the config, dataset, seed graph and, for tune-reuse-kept, the TrialRunner.
# A reused actor keeps it between trials; a fresh actor (tune-defaults) starts empty.
_ACTOR: dict[str, Any] = {}


def _append_event(path: str, event: dict[str, Any]) -> None:
    """One JSON line, written with a single ``write`` on an O_APPEND descriptor (concurrent actors)."""
    data = (json.dumps(event, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _trainer_settings(cfg: Any, threads: int) -> Any:
    """The ``TrainerSettings`` an aiperf worker of a ``threads``-CPU slot derives (``TrialWorker.__init__``)."""
    from aiperf.families.image.trainer import TrainerSettings
    from aiperf.training.backend import choose_jit, choose_precision, describe_device

    backend = cfg.model.backend
    device = describe_device(backend)
    decode = cfg.dataset.decode_threads
    return TrainerSettings(
        precision=choose_precision(cfg.model.precision, device),
        jit_compile=choose_jit(cfg.model.jit_compile, backend, device),
        bn_momentum=cfg.model.bn_momentum,
        momentum=cfg.train.momentum,
        eval_batch_size=cfg.train.eval_batch_size,
        max_batch_size=cfg.train.max_batch_size,
        device_memory_bytes=int(device.memory_bytes) if device.kind == "gpu" else 0,
        data_parallel=1,
        decode_threads=max(1, threads) if decode == "auto" else max(1, int(decode)),
        max_bad_fraction=cfg.dataset.max_bad_fraction,
        shuffle_buffer=cfg.dataset.shuffle_buffer,
        compiled_models=cfg.train.compiled_models,
    )


def _actor_setup(setup: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """This process's config, backend, dataset and seed graph, made on its first trial; (state, load seconds)."""
    if "cfg" in _ACTOR:
        return _ACTOR, 0.0
    from aiperf.config import load_config
    from aiperf.training.backend import configure_process

    cfg = load_config(setup["config"], setup["overrides"])
    configure_process(cfg.model.backend, THREADS_PER_TRIAL)  # before anything imports Keras
    from aiperf.datasets import load_dataset
    from aiperf.families.image.seed import seed_architecture

    t0 = time.perf_counter()
    dataset = load_dataset(cfg.dataset)
    load_s = time.perf_counter() - t0
    _ACTOR.update(
        cfg=cfg,
        dataset=dataset,
        seed_graph=seed_architecture(cfg, dataset),
        settings=_trainer_settings(cfg, THREADS_PER_TRIAL),
    )
    return _ACTOR, load_s


def _trial_seed(run_seed: int, trial_id: str) -> int:
    """aiperf's trial seed formula (``run.seed * 100_003 + n``) with n = 1 + Tune's trial index."""
    digits = trial_id.rsplit("_", 1)[-1]
    index = int(digits) if digits.isdigit() else abs(hash(trial_id)) % 100_000
    return run_seed * 100_003 + index + 1


def trial_hparams(config: dict[str, Any], cfg: Any) -> dict[str, Any]:
    """A Tune trial's hyperparameters as aiperf's trainer takes them (TPE's, the kernel size the config's)."""
    return {
        "learning_rate": float(config["learning_rate"]),
        "batch_size": int(config["batch_size"]),
        "weight_decay": float(config["weight_decay"]),
        "dropout": float(config["dropout"]),
        "kernel_size": int(cfg.train.kernel_size),
        "epochs": int(config["epochs"]),
    }


def tune_trial(config: dict[str, Any], setup: dict[str, Any]) -> None:
    """One Tune trial: the seed net with these hyperparameters, trained by aiperf's ``TrialRunner``."""
    from ray import tune

    entered = time.time()
    trial_id = tune.get_context().get_trial_id()
    state, load_s = _actor_setup(setup)
    from aiperf.families.image.flops import count_flops, epoch_operations
    from aiperf.families.image.trainer import TrialRunner
    from aiperf.training.trial import TrialSpec, apply_hparams
    from nas.serialize import graph_to_dict

    cfg = state["cfg"]
    runner = state.get("runner") if setup["keep_runner"] else None
    kept = runner is not None
    if runner is None:
        runner = TrialRunner(state["dataset"], state["settings"], cfg.model.backend)
        if setup["keep_runner"]:
            state["runner"] = runner
    hparams = trial_hparams(config, cfg)
    graph = apply_hparams(state["seed_graph"], hparams)  # what the master sends and counts
    cost = count_flops(graph)
    spec = TrialSpec(
        trial_id=trial_id,
        kind="tune",
        graph=graph_to_dict(graph),
        hparams=hparams,
        seed=_trial_seed(cfg.run.seed, trial_id),
        checkpoint_every_epoch=False,
    )
    events = setup["events"]
    _append_event(
        events,
        {
            "kind": "start",
            "trial": trial_id,
            "pid": os.getpid(),
            "wall": entered,
            "dataset_load_s": load_s,
            "runner_kept": kept,
            "hparams": hparams,
        },
    )
    best = 0.0
    for item in runner.run(spec):
        now_wall, now_perf = time.time(), time.perf_counter()
        if item["type"] == "epoch":
            train_ops, eval_ops = epoch_operations(cost, item["train_images"], item["eval_images"], item["batch_size"])
            best = max(best, item["val_acc"])
            begin, end = item["window"]
            epoch = {
                "kind": "epoch",
                "trial": trial_id,
                "pid": os.getpid(),
                "epoch": item["epoch"],
                "train_images": item["train_images"],
                "eval_images": item["eval_images"],
                "batch_size": item["batch_size"],
                "train_s": item["train_s"],
                "eval_s": item["eval_s"],
                "val_acc": item["val_acc"],
                "train_ops": train_ops,
                "eval_ops": eval_ops,
                "ops": train_ops + eval_ops,
                "wall_begin": now_wall - (now_perf - begin),
                "wall_end": now_wall - (now_perf - end),
                "wall": now_wall,
            }
            _append_event(events, epoch)
            tune.report({"val_acc": item["val_acc"], METRIC: best, "ops": train_ops + eval_ops, "epoch": item["epoch"]})
        elif item["type"] == "done":
            _append_event(
                events,
                {
                    "kind": "done",
                    "trial": trial_id,
                    "pid": os.getpid(),
                    "wall": now_wall,
                    "startup_s": item["startup_s"],
                    "first_step_s": item["first_step_s"],
                    "step_reused": item["step_reused"],
                },
            )


# -- one Tune run (in a child process of its own, as aiperf's run is) -----------------------------
def tune_space(cfg: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Optuna distributions, the default point): aiperf's TPE space and its seed trial, kernel size fixed.

    From ``aiperf.engine.search.search_settings``, as a run builds it; the seed trial's batch is the
    plan's (``auto`` is 64 on a CPU-only cluster).
    """
    from dataclasses import replace

    from aiperf.engine.search import search_settings

    plan_batch = 64 if cfg.train.batch_size == "auto" else int(cfg.train.batch_size)
    settings = search_settings(cfg, min(plan_batch, cfg.train.max_batch_size))
    space = replace(settings.hparam_space, kernel_sizes=(cfg.train.kernel_size,)).distributions()
    space.pop("kernel_size")
    default = {k: v for k, v in settings.default_hparams.items() if k != "kernel_size"}
    return space, default


def run_tune(engine: str, config: str, overrides: list[str], workdir: Path) -> dict[str, Any]:
    """One ``Tuner.fit()`` of ``engine``; returns its wall clock, events file and Tune's own counts."""
    import warnings

    import optuna
    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from aiperf.config import load_config

    reuse, keep = TUNE_ENGINES[engine]
    cfg = load_config(config, overrides)
    space, default = tune_space(cfg)
    workdir.mkdir(parents=True, exist_ok=True)
    events = workdir / "events.jsonl"
    events.unlink(missing_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(seed=cfg.run.seed, constant_liar=True, multivariate=True)
    searcher = OptunaSearch(space, metric=METRIC, mode="max", points_to_evaluate=[default], sampler=sampler)
    t0 = time.perf_counter()
    ray.init(num_cpus=SLOTS, include_dashboard=False, log_to_driver=False)
    ray_init_s = time.perf_counter() - t0
    try:
        setup = {"config": config, "overrides": overrides, "keep_runner": keep, "events": str(events)}
        trainable = tune.with_resources(tune.with_parameters(tune_trial, setup=setup), {"cpu": THREADS_PER_TRIAL})
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                search_alg=searcher,
                num_samples=-1,
                max_concurrent_trials=SLOTS,
                time_budget_s=cfg.run.time_budget_s,
                reuse_actors=reuse,
            ),
            run_config=tune.RunConfig(name=engine, storage_path=str(workdir / "tune"), verbose=0),
        )
        start_wall, start = time.time(), time.perf_counter()
        grid = tuner.fit()
        wall = time.perf_counter() - start
        end_wall = time.time()
        results = [grid[i] for i in range(len(grid))]
        errors = [str(r.error)[:300] for r in results if r.error is not None]
        reported = sum(int((r.metrics or {}).get("training_iteration", 0)) for r in results)
        trials = len(results)
    finally:
        ray.shutdown()
    return {
        "engine": engine,
        "reuse_actors": reuse,
        "keep_runner": keep,
        "ray_init_s": ray_init_s,
        "start_wall": start_wall,
        "end_wall": end_wall,
        "wall_s": wall,
        "budget_s": cfg.run.time_budget_s,
        "events": str(events),
        "tune_trials": trials,
        "tune_reported_epochs": reported,
        "tune_errors": errors,
    }


# -- reading the runs back ------------------------------------------------------------------------
def _mean(values: Iterable[float | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def figures(
    wall: float, last_epoch_t: float, epochs: list[dict[str, Any]], started: int, first_steps: list[float]
) -> dict[str, Any]:
    """The per-engine figures, computed the same way for both engines from epoch lists and a wall."""
    ops = sum(e["ops"] for e in epochs)
    busy = sum(e["train_s"] + e["eval_s"] for e in epochs)
    return {
        "wall_s": wall,
        "ops": ops,
        "ops_per_s": ops / wall if wall > 0 else 0.0,
        "ops_per_s_to_last_epoch": ops / last_epoch_t if last_epoch_t > 0 else 0.0,
        "epochs": len(epochs),
        "trials_started": started,
        "busy_s": busy,
        "busy_fraction_per_slot": busy / (SLOTS * wall) if wall > 0 else None,
        "idle_per_trial_s": (SLOTS * wall - busy) / started if started else None,
        "first_step_mean_s": _mean(first_steps),
        "first_step_n": len(first_steps),
        "best_val_acc": max((e["val_acc"] for e in epochs), default=None),
    }


def analyse_aiperf(run_dir: Path) -> dict[str, Any]:
    """aiperf's figures from its ledger (OPS recounted from the trials' graphs) and its summary's score."""
    from aiperf.families.image.flops import count_flops, epoch_operations
    from aiperf.ledger.store import read_raw_ledger
    from nas.serialize import graph_from_dict

    records = read_raw_ledger(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    starts = {r["trial"]: r for r in records if r["type"] == "trial_start"}
    costs = {t: count_flops(graph_from_dict(r["graph"])) for t, r in starts.items()}
    epochs = []
    for r in (r for r in records if r["type"] == "epoch"):
        train_ops, eval_ops = epoch_operations(costs[r["trial"]], r["train_images"], r["eval_images"], r["batch_size"])
        epochs.append({**r, "ops": train_ops + eval_ops, "ledger_ops": r["ops"]})
    ends = [r for r in records if r["type"] == "trial_end" and r.get("status") == "completed"]
    stops = [r for r in records if r["type"] == "run_stop"]
    wall = stops[-1]["t"] if stops else records[-1]["t"]
    last_epoch_t = max((e["t"] for e in epochs), default=0.0)
    out = figures(
        wall, last_epoch_t, epochs, len(starts), [r["first_step_s"] for r in ends if r.get("first_step_s") is not None]
    )
    reused = [r["step_reused"] for r in ends if r.get("step_reused") is not None]
    plan = records[0].get("plan", {})
    out.update(
        trials_completed=len(ends),
        step_reused_share=sum(reused) / len(reused) if reused else None,
        score_ops_per_s=summary["score"]["ops_per_s"],
        ledger_ops=sum(e["ledger_ops"] for e in epochs),
        kinds=sorted({r["kind"] for r in starts.values()}),
        architectures=len({r["arch_id"] for r in starts.values()}),
        plan={k: plan.get(k) for k in ("concurrency", "threads_per_trial", "batch_size", "precision", "backend")},
        run_dir=str(run_dir),
    )
    return out


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def analyse_tune(result: dict[str, Any]) -> dict[str, Any]:
    """A Tune run's figures from the trainables' events: only what happened inside ``Tuner.fit()`` counts."""
    t0, t1 = result["start_wall"], result["end_wall"]
    events = [e for e in read_events(Path(result["events"])) if e["wall"] <= t1]
    # aiperf's master counts no epoch that ends after its budget; Tune lets a stopped trial's epoch
    # finish (its stop takes effect at the next report), so the same rule is applied here.
    finished = [e for e in events if e["kind"] == "epoch"]
    epochs = [e for e in finished if e["wall"] - t0 <= result["budget_s"]]
    late = [e for e in finished if e["wall"] - t0 > result["budget_s"]]
    starts = [e for e in events if e["kind"] == "start"]
    dones = [e for e in events if e["kind"] == "done"]
    last_epoch_t = max((e["wall"] - t0 for e in epochs), default=0.0)
    out = figures(
        result["wall_s"],
        last_epoch_t,
        epochs,
        len(starts),
        [e["first_step_s"] for e in dones if e["first_step_s"] is not None],
    )
    loads = [e["dataset_load_s"] for e in starts if e["dataset_load_s"] > 0]
    reused = [e["step_reused"] for e in dones]
    out.update(
        trials_completed=len(dones),
        step_reused_share=sum(reused) / len(reused) if reused else None,
        epochs_after_budget=len(late),
        ops_after_budget=sum(e["ops"] for e in late),
        ops_per_s_with_late_epochs=(out["ops"] + sum(e["ops"] for e in late)) / out["wall_s"]
        if out["wall_s"]
        else None,
        actor_processes=len({e["pid"] for e in starts}),
        dataset_loads=len(loads),
        dataset_load_mean_s=_mean(loads),
        ray_init_s=result["ray_init_s"],
        tune_trials=result["tune_trials"],
        tune_reported_epochs=result["tune_reported_epochs"],
        tune_errors=result["tune_errors"],
    )
    return out


# -- running the engines ----------------------------------------------------------------------------
def wait_for_quiet(threshold: float, max_wait_s: float) -> dict[str, Any]:
    """Wait until the 1-minute load average is below ``threshold`` (or ``max_wait_s`` passed)."""
    t0 = time.monotonic()
    while os.getloadavg()[0] >= threshold and time.monotonic() - t0 < max_wait_s:
        time.sleep(5.0)
    one, five, fifteen = os.getloadavg()
    return {"waited_s": time.monotonic() - t0, "quiet": one < threshold, "load_at_start": [one, five, fifteen]}


def child_env() -> dict[str, str]:
    """The environment both engines run in: the repository importable, GPUs hidden, TensorFlow quiet."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(common.REPO), env.get("PYTHONPATH", "")) if p)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


def run_engine(engine: str, args: argparse.Namespace, overrides: list[str], workdir: Path) -> dict[str, Any]:
    """One run of ``engine`` in a subprocess of its own; its output goes to ``workdir/console.log``."""
    workdir.mkdir(parents=True, exist_ok=True)
    timeout = args.seconds + 900
    t0 = time.perf_counter()
    if engine == "aiperf":
        run_dir, _, _ = common.run_cli(args.config, overrides, workdir, timeout_s=timeout)
        out = analyse_aiperf(run_dir)
    else:
        result_path = workdir / "tune-result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", engine, "--child-dir", str(workdir)]
        cmd += ["--config", args.config, "--seconds", f"{args.seconds:g}"]
        for item in args.overrides:
            cmd += ["--set", item]
        log = workdir / "console.log"
        with open(log, "a") as fh:
            proc = subprocess.run(
                cmd, env=child_env(), stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, cwd=common.REPO
            )
        if proc.returncode != 0 or not result_path.exists():
            raise SystemExit(f"{engine} failed (exit {proc.returncode}); last output:\n{log.read_text()[-3000:]}")
        out = analyse_tune(json.loads(result_path.read_text()))
    out["process_wall_s"] = time.perf_counter() - t0
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarise(runs: list[dict[str, Any]], engines: Sequence[str]) -> dict[str, Any]:
    """Per engine the median over rounds; aiperf / each Tune variant as the median of per-round ratios."""
    keys = (
        "ops_per_s",
        "ops_per_s_to_last_epoch",
        "epochs",
        "trials_started",
        "busy_fraction_per_slot",
        "idle_per_trial_s",
        "first_step_mean_s",
    )
    per_engine = {}
    for engine in engines:
        mine = [r for r in runs if r["engine"] == engine]
        per_engine[engine] = {
            k: common.median([r[k] for r in mine if r.get(k) is not None]) if mine else None for k in keys
        }
    ratios: dict[str, dict[str, float | None]] = {}
    if "aiperf" in engines:
        for engine in (e for e in engines if e != "aiperf"):
            pairs = [
                (a, t)
                for a in runs
                if a["engine"] == "aiperf"
                for t in runs
                if t["engine"] == engine and t["round"] == a["round"]
            ]
            ratios[engine] = {}
            for k in ("ops_per_s", "ops_per_s_to_last_epoch", "epochs", "busy_fraction_per_slot"):
                values = [v for v in (_ratio(a.get(k), t.get(k)) for a, t in pairs) if v is not None]
                ratios[engine][k] = common.median(values) if values else None
    return {"per_engine": per_engine, "aiperf_over": ratios}


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _pct(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f} %"


def print_table(runs: list[dict[str, Any]]) -> None:
    print(
        f"\n{'round':>5} {'engine':16} {'OPS':>11} {'OPS@last ep':>11} {'epochs':>6} {'trials':>6} "
        f"{'busy/slot':>9} {'idle/trial':>10} {'1st step':>8} {'reused':>6} {'wall':>7}  load at start"
    )
    for r in runs:
        print(
            f"{r['round']:>5} {r['engine']:16} {common.si(r['ops_per_s'], 'OPS'):>11} "
            f"{common.si(r['ops_per_s_to_last_epoch'], 'OPS'):>11} {r['epochs']:>6} {r['trials_started']:>6} "
            f"{_pct(r['busy_fraction_per_slot'], 1):>9} "
            f"{_fmt(r['idle_per_trial_s'], '.2f', ' s'):>10} {_fmt(r['first_step_mean_s'], '.2f', ' s'):>8} "
            f"{_pct(r['step_reused_share'], 0):>6} "
            f"{r['wall_s']:>6.1f}s  {'/'.join(f'{v:.2f}' for v in r['load_at_start'])}"
        )


def print_details(runs: list[dict[str, Any]]) -> None:
    for r in runs:
        if r["engine"] == "aiperf":
            print(
                f"  round {r['round']} aiperf: score.ops_per_s {common.si(r['score_ops_per_s'], 'OPS')} (summary.json; "
                f"recount {common.si(r['ops_per_s_to_last_epoch'], 'OPS')}, ledger ops {r['ledger_ops']:.4g} vs "
                f"recount {r['ops']:.4g}); trial kinds {r['kinds']}, {r['architectures']} architecture(s), "
                f"plan {r['plan']}; {r['run_dir']}"
            )
        else:
            print(
                f"  round {r['round']} {r['engine']}: {r['actor_processes']} actor process(es), "
                f"{r['dataset_loads']} dataset load(s) of {_fmt(r['dataset_load_mean_s'], '.2f', ' s')} mean, "
                f"Tune saw {r['tune_trials']} trials and {r['tune_reported_epochs']} reported epochs, "
                f"{r['epochs_after_budget']} epoch(s) ended after the budget (not counted; counted, OPS would be "
                f"{common.si(r['ops_per_s_with_late_epochs'], 'OPS')}), "
                f"ray.init {r['ray_init_s']:.1f} s (outside the wall), {len(r['tune_errors'])} trial error(s)"
                + (f": {r['tune_errors'][0]}" if r["tune_errors"] else "")
            )


def print_summary(summary: dict[str, Any]) -> None:
    for engine, ratio in summary["aiperf_over"].items():
        print(
            f"aiperf / {engine:16} OPS x{_fmt(ratio['ops_per_s'], '.2f')}, "
            f"OPS to last epoch x{_fmt(ratio['ops_per_s_to_last_epoch'], '.2f')}, "
            f"epochs x{_fmt(ratio['epochs'], '.2f')}, busy/slot x{_fmt(ratio['busy_fraction_per_slot'], '.2f')}"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=300.0, help="each run's time budget")
    p.add_argument("--rounds", type=int, default=1, help="rounds of all engines, alternated")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    p.add_argument("--config", default="default", help="built-in config or file (default: default, MNIST)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="both engines")
    p.add_argument("--quiet-load", type=float, default=0.6, help="wait for a 1-min load average below this")
    p.add_argument("--max-wait-s", type=float, default=600.0, help="longest wait for a quiet machine per run")
    p.add_argument("--workdir", default=None, help="runs, Tune results and logs (default: a temporary directory)")
    p.add_argument("--json", default=None, metavar="OUT")
    p.add_argument("--child", default=None, choices=sorted(TUNE_ENGINES), help=argparse.SUPPRESS)
    p.add_argument("--child-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if Path(args.config).is_file():  # Tune runs trainables in their trial folders: a relative path breaks there
        args.config = str(Path(args.config).resolve())
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in args.engines if e not in ENGINES]
    if unknown:
        p.error(f"unknown engine {unknown[0]!r} (known: {', '.join(ENGINES)})")
    return args


def child_main(args: argparse.Namespace) -> None:
    """The ``--child`` process: one Tune run, its result written as JSON beside its events."""
    workdir = Path(args.child_dir)
    result = run_tune(args.child, args.config, search_overrides(args.seconds, args.overrides), workdir)
    (workdir / "tune-result.json").write_text(json.dumps(result, indent=2) + "\n")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.child:
        child_main(args)
        return {}
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # aiperf's CLI inherits it: both engines on the same CPUs
    facts = common.machine_facts()
    overrides = search_overrides(args.seconds, args.overrides)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="aiperf-overhead-"))
    print(
        f"engine_overhead: {', '.join(args.engines)} x {args.rounds} round(s), {args.seconds:g} s each, "
        f"config {args.config} {' '.join('--set ' + o for o in overrides)}; {SLOTS} slots x "
        f"{THREADS_PER_TRIAL} CPU; {facts['date']}; {facts['host']}; {facts['cpu']}; {facts['load']}; "
        f"versions {facts['versions']}; workdir {workdir}",
        flush=True,
    )
    runs = []
    for rnd in range(1, args.rounds + 1):
        turn = (rnd - 1) % len(args.engines)  # each round starts with the next engine: no engine always goes first
        for engine in args.engines[turn:] + args.engines[:turn]:
            quiet = wait_for_quiet(args.quiet_load, args.max_wait_s)
            print(
                f"round {rnd} {engine}: load at start {'/'.join(f'{v:.2f}' for v in quiet['load_at_start'])}"
                f" after waiting {quiet['waited_s']:.0f} s{'' if quiet['quiet'] else ' (not quiet)'}",
                flush=True,
            )
            result = run_engine(engine, args, overrides, workdir / f"round{rnd}-{engine}")
            runs.append({"round": rnd, "engine": engine, **quiet, **result})
    summary = summarise(runs, args.engines)
    print_table(runs)
    print_details(runs)
    print_summary(summary)
    print(f"{common.load_note()} after the runs")
    out = {
        "facts": facts,
        "config": args.config,
        "overrides": overrides,
        "seconds": args.seconds,
        "slots": SLOTS,
        "threads_per_trial": THREADS_PER_TRIAL,
        "runs": runs,
        "summary": summary,
        "load_after": common.load_note(),
    }
    common.write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
