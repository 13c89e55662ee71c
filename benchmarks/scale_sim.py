"""Weak scaling of the master: the real master, search and ledger driving thousands of simulated workers.

Each worker is simulated (``SimulatedWorkerPool``): a trial takes ``--trial-minutes`` of
simulated time, split into ``--epochs`` epochs that report plausible accuracies. Time is a
hybrid clock: every real second the master spends (proposing with the real Bayesian
search, counting FLOPs, writing and fsync'ing the real ledger, bookkeeping) passes on the
simulated clock too, while waiting for workers jumps straight to the next event. So any
master slowness shows up as workers with nothing to run: the *idle fraction*

    idle = 1 - sum over workers of time spent running trials / (workers x run length)

is the share of worker time lost waiting for the master. It includes the start, when the
master must propose ``queue_depth x workers`` trials before every worker has one; the
steady-state figure leaves out the first trial length. Target: < 1 % at 4,096 workers
with 10-minute trials. ``load`` is the master's real seconds per simulated second over
the last trial length: its headroom (at 1 it is saturated, and from then on workers start
to wait once their queued trial is done).

``--windows`` also prints, per window of ``--window-minutes`` simulated minutes, how the
master's cost develops as the history grows: trials proposed, past trials at the window's
end, load (real and CPU seconds per simulated second), worker idle share, the master's
whole CPU time per proposal (search, FLOPs counting, ledger, pool) and the search's own CPU
time per ask (architecture asks and tune asks apart) and per tell. A flat CPU time per
proposal is what lets one master run for hours.

    PYTHONPATH=. python benchmarks/scale_sim.py --workers 64,512,4096
    PYTHONPATH=. python benchmarks/scale_sim.py --workers 4096 --trials-per-worker 36 --windows
    PYTHONPATH=. python benchmarks/scale_sim.py --workers 4096 --profile 25   # where the master's time goes
    PYTHONPATH=. python benchmarks/scale_sim.py --workers 65536 --trials-per-worker 3 --startup-only --cpu-clock

``--startup-only`` ends the run once every worker has its first trial (``all_busy`` is the start-up;
the run length still paces the size schedule, so keep the length whose start-up you mean), and
``--cpu-clock`` lets the master's CPU seconds, not its real seconds, flow into simulated time.
Each submission costs the master's clock the serialisation of its arguments, done as Ray does it,
and ``--ray-call-us`` for the rest of Ray's remote call (measured with benchmarks/submit_cost.py;
0 leaves it out, as every run before 2026-11-27 22:30 UTC did).

Run it on an otherwise idle core: every real second the master loses to other processes
counts against it, exactly as it would on a head node (the CPU columns do not depend on that),
or with ``--cpu-clock`` on a box shared with other work (which then leaves out the master's
waits for the disk, too).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import resource
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aiperf.cluster.sim_pool import HybridClock, SimulatedWorkerPool, default_accuracy, learning_curve
from aiperf.config import load_config
from aiperf.engine.assembly import open_session, run_start_record
from aiperf.engine.search import make_search
from aiperf.engine.weights import WeightStore
from aiperf.ledger.schema import DatasetHeader
from aiperf.training.trial import TrialSpec
from nas import zoo
from nas.graph import Graph
from nas.proposer import Proposer, TrialProposal

WORKERS_PER_NODE = 8  # eight accelerators per node, one trial each
# What Ray's remote call costs the submitting thread beyond serialising the arguments: a streaming
# call to an actor took 125-170 us of the calling thread's CPU, 9 us of it serialising the spec
# (benchmarks/submit_cost.py, 2-vCPU VM, three runs, 2026-11-27); the lowest, less the serialisation.
RAY_CALL_US = 116.0


def bump_accuracy(seed: int) -> Callable[[TrialSpec], tuple[float, ...]]:
    """A search objective with an optimum to find: accuracy peaks around one architecture's features.

    The default simulated accuracy rises with depth alone, so any search that grows deep nets
    tops it out. Here the final accuracy is ``0.5 + 0.45 exp(-|z|^2 / 2)`` with ``z`` the
    scaled distance between the net's features (depth, log2 width, adds, concats, mean kernel,
    log10 parameters) and those of a random architecture 8 morphs from the seed (seeded);
    epochs approach it as ``1 - 0.5^epoch``. Deterministic per architecture, like a re-run.
    """
    from nas.limits import Limits
    from nas.random_search import grow

    rng = np.random.default_rng(1000 + seed)
    seed_graph = zoo.small_resnet((28, 28, 1), 10, width=16)
    target_graph, _ = grow(seed_graph, rng, 8, 3, Limits(60, 5_000_000, 1e12).admits)
    target = _features(target_graph)
    scale = 1.5 * rng.uniform(0.5, 1.5, size=len(target)) * np.array([3.0, 1.0, 1.5, 1.5, 1.0, 0.5])
    finals: dict[str, float] = {}

    def accuracy(spec: TrialSpec) -> tuple[float, ...]:
        key = json.dumps(spec.graph["nodes"], sort_keys=True)
        final = finals.get(key)
        if final is None:
            z = (_features(spec.architecture()) - target) / scale
            final = finals[key] = float(0.5 + 0.45 * np.exp(-0.5 * z @ z))
        return learning_curve(final, spec)

    return accuracy


def _features(graph: Graph) -> np.ndarray:
    convs = [n for n in graph.nodes if n.op == "conv"]
    width = sum(n.attrs["filters"] for n in convs) or 1
    kernel = float(np.mean([n.attrs["kernel"][0] for n in convs])) if convs else 1.0
    return np.array(
        [graph.depth, np.log2(width), graph.count("add"), graph.count("concat"), kernel, np.log10(graph.param_count)]
    )


class WindowMeter:
    """The master's real and CPU seconds, summed per window of simulated time."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.real: dict[int, float] = {}
        self.cpu: dict[int, float] = {}
        self._last: tuple[float, float] | None = None

    def sample(self, sim_t: float) -> None:
        """Called at every wait: the time since the previous wait was the master's own work."""
        now = (time.perf_counter(), time.process_time())
        if self._last is not None:
            k = int(sim_t // self.window_s)
            self.real[k] = self.real.get(k, 0.0) + now[0] - self._last[0]
            self.cpu[k] = self.cpu.get(k, 0.0) + now[1] - self._last[1]
        self._last = now


class RecordingPool(SimulatedWorkerPool):
    """The simulated pool, remembering when each submitted trial runs on its worker."""

    def __init__(
        self,
        *args: Any,
        meter: WindowMeter,
        keep_s: float,
        on_all_busy: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.intervals: dict[str, list[tuple[float, float]]] = {}
        self.on_all_busy = on_all_busy  # called once, when the last worker gets its first trial
        self.meter = meter
        self.keep_s = keep_s
        self.last_samples: deque[tuple[float, float]] = deque()  # (simulated, real) at each wait, the latest keep_s

    def wait(self, timeout: float) -> list[Any]:
        now = self.clock()
        self.meter.sample(now)
        self.last_samples.append((now, time.perf_counter()))
        while self.last_samples[0][0] < now - self.keep_s:
            self.last_samples.popleft()
        return super().wait(timeout)

    def _sent(self, w: Any, task: Any) -> None:
        self.intervals.setdefault(w.worker_id, []).append((task.start, w.free_at))
        if self.on_all_busy is not None and len(self.intervals) == len(self._workers):
            self.on_all_busy()
            self.on_all_busy = None


@dataclass
class _SearchCost:
    asks: list[tuple[float, float, str]] = field(default_factory=list)  # (simulated t, CPU s, kind)
    tells: dict[int, list[float]] = field(default_factory=dict)  # window -> [count, CPU s]


class TimedProposer(Proposer[TrialProposal]):
    """Delegates to the real search, timing each ask and tell in CPU seconds."""

    def __init__(self, inner: Proposer, clock: HybridClock, window_s: float) -> None:
        self.inner = inner
        self.clock = clock
        self.window_s = window_s
        self.cost = _SearchCost()

    def ask(self, trial_id: str) -> TrialProposal:
        c0 = time.process_time()
        proposal = self.inner.ask(trial_id)
        self.cost.asks.append((self.clock(), time.process_time() - c0, proposal.kind))
        return proposal

    def tell(self, trial_id: str, value: float, final: bool) -> None:
        c0 = time.process_time()
        self.inner.tell(trial_id, value, final)
        slot = self.cost.tells.setdefault(int(self.clock() // self.window_s), [0, 0.0])
        slot[0] += 1
        slot[1] += time.process_time() - c0

    def forget(self, trial_id: str) -> None:
        self.inner.forget(trial_id)

    def restore(self, trial_id: str, proposal: TrialProposal, value: float | None, final: bool) -> None:
        self.inner.restore(trial_id, proposal, value, final)

    def close(self) -> None:
        self.inner.close()


@dataclass
class WindowRow:
    start_min: float
    proposed: int
    history: int  # trials proposed before the window's end
    load: float  # master real seconds per simulated second
    cpu_load: float  # master CPU seconds per simulated second
    idle_fraction: float
    cpu_ms_per_proposal: float  # all of the master's CPU time in the window / proposals in it
    arch_ask_ms: float  # mean CPU time of an architecture ask
    tune_ask_ms: float  # mean CPU time of a tune ask
    tell_us: float  # mean CPU time of a tell


@dataclass
class ScaleResult:
    workers: int
    trial_s: float
    run_s: float  # simulated run length
    wall_s: float  # real seconds the simulation took (all of it master time)
    master_cpu_s: float
    trials_started: int
    epochs: int
    idle_fraction: float
    steady_idle_fraction: float  # after the first trial length
    first_trial_all_busy_s: float | None  # simulated time until every worker was running
    first_trial_mean_s: float | None  # a worker's mean wait for its first trial: the start-up's share of the idle
    startup_nodes: int  # start-up nodes whose children were handed out
    startup_nodes_in_master: int  # of those, expanded by the master while its expansion processes were behind
    master_load_last: float  # real master seconds per simulated second over the last trial length (1 = saturated)
    search_batch: int = 1  # architectures per GP fit
    best_reward: float = 0.0  # best final simulated accuracy of a completed trial
    distinct_architectures: int = 0  # among all proposed trials
    master_peak_rss_mib: float = 0.0  # the process's peak resident memory after this simulation
    ledger_records: int = 0
    ledger_bytes: int = 0
    windows: list[WindowRow] = field(default_factory=list)
    head_cpu: str = ""  # the CPU the simulation ran on (the head's), and its single-core speed: figures
    head_speed: float = 0.0  # from different heads compare through it (head_speed(); 0: not measured)


def _busy(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(end, hi) - max(start, lo)) for start, end in intervals)


def _busy_per_window(pool: RecordingPool, window_s: float, end: float) -> list[float]:
    """Worker-seconds spent running trials in each window (one pass over all intervals)."""
    out = [0.0] * max(1, math.ceil(end / window_s))
    for intervals in pool.intervals.values():
        for start, stop in intervals:
            stop = min(stop, end)
            k = int(start // window_s)
            while start < stop and k < len(out):
                edge = min(stop, (k + 1) * window_s)
                out[k] += edge - start
                start, k = edge, k + 1
    return out


def _mean_ms(values: list[float]) -> float:
    return 1e3 * sum(values) / len(values) if values else float("nan")


def _windows(pool: RecordingPool, timed: TimedProposer, workers: int, end: float) -> list[WindowRow]:
    window_s = pool.meter.window_s
    busy = _busy_per_window(pool, window_s, end)
    asks: dict[int, dict[str, list[float]]] = {}
    for t, cpu, kind in timed.cost.asks:
        asks.setdefault(int(t // window_s), {}).setdefault("tune" if kind == "tune" else "arch", []).append(cpu)
    rows, history = [], 0
    for k, worker_busy in enumerate(busy):
        length = min(window_s, end - k * window_s)
        if length < 0.01 * window_s:  # the run's end just past a window edge
            break
        by_kind = asks.get(k, {})
        proposed = sum(len(v) for v in by_kind.values())
        history += proposed
        tells = timed.cost.tells.get(k, [0, 0.0])
        cpu = pool.meter.cpu.get(k, 0.0)
        rows.append(
            WindowRow(
                start_min=k * window_s / 60,
                proposed=proposed,
                history=history,
                load=pool.meter.real.get(k, 0.0) / length,
                cpu_load=cpu / length,
                idle_fraction=max(0.0, 1.0 - worker_busy / (workers * length)),
                cpu_ms_per_proposal=1e3 * cpu / proposed if proposed else float("nan"),
                arch_ask_ms=_mean_ms(by_kind.get("arch", [])),
                tune_ask_ms=_mean_ms(by_kind.get("tune", [])),
                tell_us=1e6 * tells[1] / tells[0] if tells[0] else float("nan"),
            )
        )
    return rows


def simulate(
    workers: int,
    trial_s: float,
    epochs: int,
    trials_per_worker: float,
    seed: int,
    ledger_dir: Path,
    window_s: float | None = None,
    batch: str = "auto",
    reward: str = "depth",
    cpu_clock: bool = False,
    startup_only: bool = False,
    weights_on_nodes: bool = True,
    processes: str = "0",
    ray_call_us: float = RAY_CALL_US,
    actors: str = "per_node",
) -> ScaleResult:
    budget = trial_s * trials_per_worker
    cfg = load_config(
        "default",
        [
            f"hpo.epochs=[{epochs},{epochs}]",
            f"train.epochs_per_trial={epochs}",
            f"run.seed={seed}",
            f"run.time_budget_s={budget}",
            f"search.batch={batch}",
            f"search.processes={processes}",
            f"cluster.actors={actors}",
        ],
    )
    window_s = window_s or trial_s
    # A real run makes its search and writes its header before it creates its workers
    # (aiperf/engine/run.py: make_search, run_start_record, then RayWorkerPool). The simulated
    # workers are there from the clock's zero, so the clock starts where a real run's workers
    # do: at the pool's creation. The header needs the pool's plan, so it is made after the pool
    # here, with the clock held.
    search = make_search(cfg, zoo.small_resnet((28, 28, 1), 10, width=cfg.model.width), 256, workers=workers)
    clock = HybridClock(cpu=cpu_clock)
    proposer = TimedProposer(search, clock, window_s)
    pool = RecordingPool(
        workers,
        clock,
        meter=WindowMeter(window_s),
        keep_s=1.5 * trial_s,
        nodes=max(1, workers // WORKERS_PER_NODE),
        epoch_s=trial_s / epochs,
        queue_depth=cfg.cluster.queue_depth,
        batch_size=256,
        images=(50_000, 10_000),
        accuracy_fn=bump_accuracy(seed) if reward == "bump" else default_accuracy,
        weights_on_nodes=weights_on_nodes,
        call_s=ray_call_us * 1e-6,
        per_node=actors == "per_node",
    )
    # Assembled as every run is (run_start, the MLPerf-style log, the master from the config, run_stop).
    system = {"simulated": True, "workers": workers}
    dataset = DatasetHeader(name="simulated", train_images=50_000, eval_images=10_000)
    with clock.unseen():
        header = run_start_record(
            cfg, run_id=f"scale-{workers}", plan=pool.plan, dataset=dataset, system=system, backend="simulated", t=0.0
        )
    weights = WeightStore(cfg.cluster.keep_weights)
    run = open_session(
        cfg, ledger_dir, header=header, plan=pool.plan, system=system, proposer=proposer, pool=pool, weights=weights,
        clock=clock,
    )  # fmt: skip
    if startup_only:  # the run ends once every worker has its first trial (the budget still sets the size band)
        pool.on_all_busy = lambda: run.master.request_stop("every worker has its first trial")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    outcome = run.run()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    end = clock()
    total = sum(_busy(v, 0.0, end) for v in pool.intervals.values())
    steady = sum(_busy(v, trial_s, end) for v in pool.intervals.values())
    starts = [v[0][0] for v in pool.intervals.values() if v]
    window = [(t, r) for t, r in pool.last_samples if t >= end - trial_s]
    load = (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0]) if len(window) > 1 else float("nan")
    epoch_records, best, keys, records = 0, 0.0, set(), 0
    for line in (ledger_dir / "ledger.jsonl").open():
        records += 1
        if '"type":"epoch"' in line:
            epoch_records += 1
        elif '"type":"trial_start"' in line:
            keys.add(json.loads(line)["arch_id"])
        elif '"type":"trial_end"' in line:
            record = json.loads(line)
            if record.get("status") == "completed" and record.get("best_val_acc") is not None:
                best = max(best, float(record["best_val_acc"]))
    return ScaleResult(
        workers=workers,
        trial_s=trial_s,
        run_s=end,
        wall_s=wall,
        master_cpu_s=cpu,
        trials_started=outcome.trials_started,
        epochs=epoch_records,
        idle_fraction=max(0.0, 1.0 - total / (workers * end)),
        steady_idle_fraction=max(0.0, 1.0 - steady / (workers * (end - trial_s))) if end > trial_s else float("nan"),
        first_trial_all_busy_s=max(starts) if len(starts) == workers else None,
        first_trial_mean_s=sum(starts) / workers if len(starts) == workers else None,
        master_load_last=load,
        search_batch=proposer.inner.settings.batch,
        best_reward=best,
        distinct_architectures=len(keys),
        master_peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        ledger_records=records,
        ledger_bytes=(ledger_dir / "ledger.jsonl").stat().st_size,
        windows=_windows(pool, proposer, workers, end),
        startup_nodes=search.startup.nodes_taken if search.startup else 0,
        startup_nodes_in_master=search.startup.expanded_here if search.startup else 0,
    )


def head_speed(rounds: int = 5, seconds: float = 0.2) -> float:
    """One core's speed at the start-up fill's kind of work, in rounds per second (best of ``rounds``).

    A fixed pure-Python workload, independent of aiperf's code so that figures stay comparable across
    versions: a 64-node layer graph built as dicts, sorted into topological order, encoded as sorted
    JSON and hashed -- what making, keying and counting a child architecture spends its time on.
    """
    import hashlib

    def one() -> None:
        nodes = {f"n{k}": {"op": ("conv", "bn", "relu", "add")[k % 4], "width": 8 + k % 57, "inputs": [f"n{k - 1}"]}
                 for k in range(1, 64)}  # fmt: skip
        nodes["n0"] = {"op": "input", "width": 3, "inputs": []}
        order, seen = [], set()
        for name in sorted(nodes, key=lambda n: int(n[1:])):
            if all(i in seen for i in nodes[name]["inputs"]):
                order.append(name)
                seen.add(name)
        hashlib.sha1(json.dumps([nodes[n] for n in order], sort_keys=True).encode()).hexdigest()

    best = 0.0
    for _ in range(rounds):
        done, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds:
            one()
            done += 1
        best = max(best, done / elapsed)
    return best


def _row(r: ScaleResult) -> str:
    busy = "-" if r.first_trial_all_busy_s is None else f"{r.first_trial_all_busy_s:.1f}"
    mean = "-" if r.first_trial_mean_s is None else f"{r.first_trial_mean_s:.2f}"
    return (
        f"{r.workers:>7} {r.trial_s / 60:>6.1f} {r.run_s / 60:>7.1f} {r.trials_started:>8} {r.epochs:>8}"
        f" {r.wall_s:>8.1f} {r.master_cpu_s:>8.1f} {busy:>9} {mean:>10} {100 * r.idle_fraction:>7.3f}"
        f" {100 * r.steady_idle_fraction:>8.3f} {r.master_load_last:>6.3f} {r.search_batch:>5}"
        f" {r.best_reward:>7.4f} {r.distinct_architectures:>7} {r.master_peak_rss_mib:>7.0f}"
    )


def _window_table(r: ScaleResult) -> str:
    lines = [
        f"  {'win_min':>7} {'proposed':>8} {'history':>8} {'load':>6} {'cpu_load':>8} {'idle_%':>7}"
        f" {'cpu_ms/trial':>12} {'arch_ask_ms':>11} {'tune_ask_ms':>11} {'tell_us':>7}"
    ]
    for w in r.windows:
        lines.append(
            f"  {w.start_min:>7.0f} {w.proposed:>8} {w.history:>8} {w.load:>6.3f} {w.cpu_load:>8.3f}"
            f" {100 * w.idle_fraction:>7.3f} {w.cpu_ms_per_proposal:>12.2f} {w.arch_ask_ms:>11.2f}"
            f" {w.tune_ask_ms:>11.2f} {w.tell_us:>7.0f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="64,512,4096", help="comma-separated worker counts")
    p.add_argument("--trial-minutes", type=float, default=10.0)
    p.add_argument("--epochs", type=int, default=5, help="epochs per trial (each reports to the master)")
    p.add_argument("--trials-per-worker", type=float, default=3.0, help="run length in trial lengths")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--windows", action="store_true", help="print the master's cost per window of simulated time")
    p.add_argument("--window-minutes", type=float, default=None, help="window length (default: one trial length)")
    p.add_argument(
        "--startup-only",
        action="store_true",
        help="stop once every worker has its first trial (the run length still sets the size schedule's pace)",
    )
    p.add_argument(
        "--cpu-clock",
        action="store_true",
        help="the master's CPU seconds flow into simulated time instead of its real seconds (on a shared box)",
    )
    p.add_argument(
        "--weights-on-nodes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="trials report their weights as references on their node, as Ray workers do (the master holds one per"
        " running trial); --no-weights-on-nodes: as arrays (empty ones here)",
    )
    p.add_argument(
        "--ray-call-us",
        type=float,
        default=RAY_CALL_US,
        help="what Ray's remote call costs the master's thread per submission beyond serialising it, charged to its"
        f" clock (default {RAY_CALL_US:g}: measured by benchmarks/submit_cost.py; 0: the serialisation alone)",
    )
    p.add_argument(
        "--actors",
        choices=("per_node", "per_worker"),
        default="per_node",
        help="cluster.actors: one node agent per node, whose trials submitted in a row share one Ray call (the"
        " default here: how a machine of thousands of nodes is run), or one actor per worker, a call per trial",
    )
    p.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile the largest run; print N rows")
    p.add_argument("--ledger-dir", default=None, help="where the ledgers go (default: a temporary directory)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--batch", default="auto", help="search.batch: architectures per GP fit (auto: workers / 64)")
    p.add_argument(
        "--processes",
        default="0",
        help="search.processes: other processes expanding the start-up children (auto: by workers and cores; with"
        " them, time the master by the wall clock on a machine with cores to spare, not --cpu-clock)",
    )
    p.add_argument(
        "--reward",
        choices=("depth", "bump"),
        default="depth",
        help="simulated accuracy: grows with depth, or peaks around one architecture (to compare search quality)",
    )
    args = p.parse_args(argv)
    if not 0.0 <= args.ray_call_us <= 1e6:
        p.error("--ray-call-us must be in [0, 1000000]")
    counts = [int(x) for x in args.workers.split(",") if x.strip()]
    base = Path(args.ledger_dir) if args.ledger_dir else Path(tempfile.mkdtemp(prefix="scale-sim-"))
    window_s = 60 * args.window_minutes if args.window_minutes else None
    from aiperf.training.backend import cpu_model

    head = (cpu_model(), head_speed())
    print(f"scale_sim: head {head[0]}, single-core speed {head[1]:,.0f} rounds/s (head_speed())", flush=True)
    print(
        f"scale_sim: {args.trial_minutes:g}-minute trials of {args.epochs} epochs, "
        f"{args.trials_per_worker:g} trial lengths per run, {args.ray_call_us:g} us of Ray's call charged a"
        f" call, actors {args.actors}, ledgers in {base}",
        flush=True,
    )
    header = (
        f"{'workers':>7} {'trial':>6} {'run':>7} {'trials':>8} {'epochs':>8} {'wall_s':>8} {'cpu_s':>8}"
        f" {'all_busy':>9} {'first_mean':>10} {'idle_%':>7} {'steady_%':>8} {'load':>6} {'batch':>5} {'best':>7}"
        f" {'archs':>7} {'rss_MiB':>7}"
    )
    print(header, flush=True)
    results = []
    for k, n in enumerate(counts):
        profiler = cProfile.Profile() if args.profile and k == len(counts) - 1 else None
        if profiler:
            profiler.enable()
        r = simulate(
            n, 60 * args.trial_minutes, args.epochs, args.trials_per_worker, args.seed, base / f"w{n}", window_s,
            args.batch, args.reward, args.cpu_clock, args.startup_only, args.weights_on_nodes, args.processes,
            args.ray_call_us, args.actors,
        )  # fmt: skip
        if profiler:
            profiler.disable()
        r.head_cpu, r.head_speed = head
        results.append(r)
        print(_row(r), flush=True)
        if r.startup_nodes_in_master:
            print(f"  start-up: the master expanded {r.startup_nodes_in_master} of {r.startup_nodes} nodes itself")
        if args.windows:
            print(_window_table(r), flush=True)
            if k < len(counts) - 1:
                print(header, flush=True)
        if profiler:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(args.profile)
            print(out.getvalue())
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.profile)
            print(out.getvalue())
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
