"""``aiperf scaling``: a weak-scaling study — the benchmark at 1, 2, 4, ... nodes.

Weak scaling keeps the work per node fixed (each node brings the same workers) and asks
whether the score grows in proportion: the efficiency at N nodes is the score per node at N
divided by the score per node at the smallest size. Below 1 means something that does not
grow with the cluster — the master proposing trials, the object store moving weights —
holds the nodes back.

With ``--simulate`` each size runs the real master and search against
:class:`~aiperf.cluster.sim_pool.SimulatedWorkerPool` (``workers_per_node`` simulated workers
per node, each epoch taking its counted operations at ``device_ops_per_s``, so bigger
architectures take proportionally longer), on a hybrid clock in which the
master's own computing time is real: what the simulation measures is how the master and
search keep up as the cluster grows. Every size writes a complete run directory (ledger,
MLPerf-style log and summary, marked ``backend: simulated``), so each point can be verified
and reported.

Without ``--simulate`` each size is a real ``aiperf run`` held to exactly N nodes of the
cluster through the config field ``cluster.max_nodes``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from aiperf import cli_limits as limits
from aiperf.config import Config, load_config
from aiperf.errors import AiperfError
from aiperf.metrics.score import format_ops
from nas.graph import Graph

if TYPE_CHECKING:
    from aiperf.results.summary_model import RunSummary

TABLE_COLUMNS = [
    "nodes",
    "workers",
    "trials",
    "epochs",
    "total_ops",
    "wall_s",
    "ops_per_s",
    "ops_per_s_per_node",
    "regulated",
    "regulated_per_node",
    "best_val_acc",
    "busy_fraction",
    "efficiency",
    "run_dir",
]


@dataclass(frozen=True)
class SimulationSettings:
    """The simulated hardware: the same at every size, which is what makes the study weak scaling."""

    workers_per_node: int = 8
    device_ops_per_s: float = 1e9  # each simulated worker's speed: epochs take their counted ops at this rate
    startup_s: float = 0.5


def simulate_run(
    cfg: Config,
    nodes: int,
    run_dir: str | Path,
    seed_graph: Graph,
    dataset: dict[str, Any],
    sim: SimulationSettings | None = None,
) -> RunSummary:
    """One simulated run on ``nodes`` nodes into ``run_dir``; returns its summary.

    ``dataset`` is the dataset's ledger description (``Dataset.describe()`` plus
    ``fingerprint``); its image counts size every simulated epoch, so operations are counted
    exactly as in a real run of the same architectures.
    """
    from aiperf.cluster.sim_pool import HybridClock, SimulatedWorkerPool
    from aiperf.engine.assembly import open_session, run_start_record
    from aiperf.engine.search import make_search
    from aiperf.engine.weights import WeightStore
    from aiperf.ledger.schema import DatasetHeader
    from aiperf.results.summary import write_summary

    sim = sim or SimulationSettings()
    if nodes < 1 or sim.workers_per_node < 1:
        raise AiperfError(f"a simulated run needs at least one node and one worker per node, got {nodes} nodes")
    limits.NODES.check(nodes)
    if nodes * sim.workers_per_node > limits.SIMULATED_WORKERS_MAX:  # before the pool allocates per worker
        raise AiperfError(
            f"{nodes:,} nodes x {sim.workers_per_node} workers is more than the simulator's "
            f"{limits.SIMULATED_WORKERS_MAX:,} workers"
        )
    batch = cfg.train.batch_size if isinstance(cfg.train.batch_size, int) else 64
    # As a real run (aiperf/engine/run.py): the search is made and the header written before the
    # workers exist, so neither counts on the simulated clock, which starts with the workers.
    proposer = make_search(cfg, seed_graph, batch, workers=nodes * sim.workers_per_node)
    clock = HybridClock()
    pool = SimulatedWorkerPool(
        nodes * sim.workers_per_node,
        clock,
        nodes=nodes,
        device_ops_per_s=sim.device_ops_per_s,
        startup_s=sim.startup_s,
        queue_depth=cfg.cluster.queue_depth,
        images=(int(dataset["train_images"]), int(dataset["eval_images"])),
        batch_size=batch,
        per_node=cfg.cluster.actors == "per_node",
    )
    system = {
        "simulated": True,
        "nodes": nodes,
        "workers_per_node": sim.workers_per_node,
        "device_ops_per_s": sim.device_ops_per_s,
        "startup_s": sim.startup_s,
    }
    run_dir = Path(run_dir)
    with clock.unseen():  # made after the pool only because it records the pool's plan
        header = run_start_record(
            cfg,
            run_id=run_dir.name,
            plan=pool.plan,
            dataset=DatasetHeader(**dataset),
            system=system,
            backend="simulated",
            seed_graph=seed_graph,
            t=0.0,
        )
    run = open_session(
        cfg,
        run_dir,
        header=header,
        plan=pool.plan,
        system=system,
        proposer=proposer,
        pool=pool,
        weights=WeightStore(cfg.cluster.keep_weights),
        clock=clock,
    )
    run.run()
    return write_summary(run_dir)


def _row(nodes: int, summary: RunSummary, run_dir: Path) -> dict[str, object]:
    score = summary["score"]
    return {
        "nodes": nodes,
        "workers": summary["devices"]["concurrency"],
        "trials": summary["trials"]["started"],
        "epochs": score["epochs"],
        "total_ops": score["total_ops"],
        "wall_s": score["wall_s"],
        "ops_per_s": score["ops_per_s"],
        "regulated": score["regulated"],
        "best_val_acc": score["best_val_acc"],
        "busy_fraction": summary["workers"]["busy_fraction_mean"],
        "run_dir": str(run_dir),
    }


def scaling_table(rows: list[dict[str, object]]) -> pd.DataFrame:
    """Rows by node count, with score per node and the efficiency against the smallest size."""
    table = pd.DataFrame(rows).sort_values("nodes").reset_index(drop=True)
    table["ops_per_s_per_node"] = table["ops_per_s"] / table["nodes"]
    table["regulated_per_node"] = table["regulated"] / table["nodes"]
    base = table["ops_per_s_per_node"].iloc[0]
    table["efficiency"] = table["ops_per_s_per_node"] / base if base > 0 else math.nan
    return table[TABLE_COLUMNS]


def _percent(value: object) -> str:
    return f"{value * 100:.1f}%" if isinstance(value, float) and math.isfinite(value) else "-"


def markdown(table: pd.DataFrame, title: str) -> str:
    """The table for people: scores with SI prefixes, efficiency and worker busy time as percentages."""
    header = [
        "nodes",
        "workers",
        "trials",
        "epochs",
        "OPS",
        "OPS per node",
        "regulated per node",
        "best accuracy",
        "workers busy",
        "efficiency",
    ]
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for r in table.itertuples():
        acc = f"{r.best_val_acc:.4f}" if isinstance(r.best_val_acc, float) and math.isfinite(r.best_val_acc) else "-"
        cells = [
            r.nodes,
            r.workers,
            r.trials,
            r.epochs,
            format_ops(r.ops_per_s),
            format_ops(r.ops_per_s_per_node),
            format_ops(r.regulated_per_node),
            acc,
            _percent(r.busy_fraction),
            _percent(r.efficiency),
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(table: pd.DataFrame, out_dir: Path, title: str) -> list[Path]:
    """``scaling.csv``, ``scaling.md`` and ``scaling.png`` in ``out_dir``."""
    from aiperf.results import plots

    out_dir.mkdir(parents=True, exist_ok=True)
    csv, md, png = out_dir / "scaling.csv", out_dir / "scaling.md", out_dir / "scaling.png"
    table.to_csv(csv, index=False)
    md.write_text(markdown(table, title))
    image = plots.scaling(table)
    written = [csv, md]
    if image is not None:
        png.write_bytes(image)
        written.append(png)
    return written


def simulated_study(
    cfg: Config, counts: list[int], out_dir: Path, sim: SimulationSettings | None = None
) -> pd.DataFrame:
    """Simulate every size in ``counts`` with the same config, seed and simulated hardware."""
    from aiperf.datasets import load_dataset
    from aiperf.families.image.seed import seed_architecture

    dataset = load_dataset(cfg.dataset)
    seed_graph = seed_architecture(cfg, dataset)
    facts = {**dataset.describe(), "fingerprint": dataset.fingerprint()}
    rows = []
    for n in sorted(set(counts)):
        run_dir = out_dir / f"nodes-{n:04d}"
        if run_dir.exists():
            raise AiperfError(f"{run_dir} already exists; give a new --output directory")
        rows.append(_row(n, simulate_run(cfg, n, run_dir, seed_graph, facts, sim), run_dir))
    return scaling_table(rows)


def real_study(
    counts: list[int], config: str | None, overrides: list[str], address: str | None, out_dir: Path
) -> pd.DataFrame:
    """A real run per size, each held to exactly N nodes of the cluster by ``cluster.max_nodes``."""
    from aiperf.cluster.ray_session import start_ray
    from aiperf.cluster.resources import cluster_nodes
    from aiperf.engine.run import run_benchmark

    cfg = load_config(config, overrides)
    session = start_ray(address or cfg.cluster.address)
    try:
        alive = len(cluster_nodes(probe=False))
    finally:
        session.shutdown()
    if alive < max(counts):
        raise AiperfError(f"--nodes asks for {max(counts)} nodes but the cluster has {alive} alive node(s)")
    rows = []
    for n in sorted(set(counts)):
        sized = [*overrides, f"cluster.max_nodes={n}", f"run.results_dir={out_dir}", f"run.name=scaling-{n}-nodes"]
        run_dir, summary = run_benchmark(load_config(config, sized), address=address)
        if summary["devices"]["nodes"] != n:
            raise AiperfError(f"the run for {n} nodes used {summary['devices']['nodes']} ({run_dir})")
        rows.append(_row(n, summary, run_dir))
    return scaling_table(rows)


def scaling_command(
    counts: list[int],
    simulate: bool,
    config: str | None,
    overrides: list[str],
    address: str | None,
    output: str | None,
) -> str:
    """Run the study and write its table and plot; returns the text the CLI prints."""
    if not counts or len(counts) > limits.NODE_SIZES_MAX:
        raise AiperfError(f"--nodes: give from 1 to {limits.NODE_SIZES_MAX} node counts")
    for n in counts:
        limits.NODES.check(n)
    cfg = load_config(config, overrides)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out_dir = Path(output) if output else Path(cfg.run.results_dir) / f"scaling-{stamp}"
    if simulate:
        sim = SimulationSettings()
        table = simulated_study(cfg, counts, out_dir, sim)
        title = (
            f"Weak scaling, simulated: {sim.workers_per_node} workers per node at {sim.device_ops_per_s:.3g} OPS each, "
            f"{cfg.run.time_budget_s:g} s budget ({cfg.run.name})"
        )
    else:
        table = real_study(counts, config, overrides, address, out_dir)
        title = f"Weak scaling on the cluster: {cfg.run.time_budget_s:g} s budget per size ({cfg.run.name})"
    written = write_outputs(table, out_dir, title)
    return markdown(table, title) + "\n" + "\n".join(f"wrote {p}" for p in written)
