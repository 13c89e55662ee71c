"""Size the run to the cluster: how many trials at once, with how many CPUs/GPUs each.

Placement modes (config ``cluster.placement``), for nodes with GPUs:

* ``per_accelerator`` (default): one trial per GPU, the node's CPUs split between them.
* ``per_node``: one trial per node, data-parallel over all of the node's GPUs.
* ``fractional``: ``trials_per_accelerator`` small trials share each GPU.

CPU-only nodes run one trial per ``cpus_per_trial`` cores (auto: 1 core per trial below
16 cores, else 4). A CPU-only cluster with fewer slots than ``min_concurrent_trials``
oversubscribes its cores so that the search always has several trials in flight. In a
cluster that has GPUs, CPU-only nodes (typically the head) run no trials: a CPU trial
would be orders of magnitude slower than its GPU siblings and hold back the search.

Every slot asks Ray for no more than its node has (CPU shares are rounded *down*), so no
worker waits forever for resources that do not exist and no accelerator stays idle.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from aiperf.cluster.resources import NodeInfo
from aiperf.cluster.workload_choice import WorkloadChoice, mismatch_note
from aiperf.config import Config
from aiperf.families import family_for

# Ray accounts resources in units of 1/10,000; shares are rounded down to what it can represent.
_GPU_DIGITS = 4
_CPU_DIGITS = 3


@dataclass(frozen=True)
class Slot:
    """Room for one concurrent trial: a worker actor with these resources on this node."""

    node_id: str
    cpus: float
    gpus: float
    index: int  # slot number within the node

    @property
    def name(self) -> str:
        return f"{self.node_id[:8]}/{self.index}"


@dataclass
class Plan:
    """The sizing decision, printed before the run and recorded in the ledger."""

    placement: str
    slots: list[Slot]
    batch_size: int
    backend: str
    precision: str  # requested policy; workers resolve "auto" on their device
    threads_per_trial: int
    nodes: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # why some capacity is unused or shared
    actors: str = "per_worker"  # cluster.actors: one Ray actor per worker, or one node agent per node
    compile_ahead: bool = False  # train.compile_ahead as resolved for this machine (see compile_ahead_choice)
    compile_ahead_why: str = ""
    workload: str = ""  # the built-in config chosen for this host when no --config was named (workload_choice)
    workload_why: str = ""
    trial_sizing: str = ""  # how a trial's epochs are sized (the family's Family.trial_sizing)

    @property
    def concurrency(self) -> int:
        return len(self.slots)

    def to_dict(self) -> dict[str, Any]:
        """The plan as ``run_start`` records it: what ``dataclasses.asdict`` gives, plus the concurrency.

        Written out because ``asdict`` walks every slot through its generic deep copy: 65,536
        slots took about 0.4 s of the header's 0.55 s (benchmarks/RESULTS.md, "Workers from
        the pool's creation").
        """
        return {
            "placement": self.placement,
            "slots": [{"node_id": s.node_id, "cpus": s.cpus, "gpus": s.gpus, "index": s.index} for s in self.slots],
            "batch_size": self.batch_size,
            "backend": self.backend,
            "precision": self.precision,
            "threads_per_trial": self.threads_per_trial,
            "nodes": copy.deepcopy(self.nodes),
            "notes": list(self.notes),
            "actors": self.actors,
            "compile_ahead": self.compile_ahead,
            "compile_ahead_why": self.compile_ahead_why,
            "workload": self.workload,
            "workload_why": self.workload_why,
            "trial_sizing": self.trial_sizing,
            "concurrency": self.concurrency,
        }


def _floor(value: float, digits: int) -> float:
    scale = 10**digits
    return math.floor(value * scale + 1e-9) / scale


def _node_label(node: NodeInfo) -> str:
    return node.hostname or node.node_id[:8]


def _cpu_share(cpus: float, count: int) -> float:
    """CPUs for each of ``count`` trials on a node: whole cores when there are enough, never more than exist."""
    each = max(cpus, 0.0) / count
    return float(int(each)) if each >= 1 else _floor(each, _CPU_DIGITS)


def _cpu_slots(node: NodeInfo, cfg: Config) -> list[Slot]:
    cpus = max(node.cpus, 0.0)
    per = cfg.cluster.cpus_per_trial
    if per == "auto":
        per = 1 if cpus < 16 else 4
    count = int(cpus // per)
    return [Slot(node.node_id, float(per), 0.0, k) for k in range(count)]


def _gpu_slots(node: NodeInfo, cfg: Config) -> list[Slot]:
    gpus = int(node.gpus)
    placement = cfg.cluster.placement
    if placement == "per_node":
        return [Slot(node.node_id, _floor(max(node.cpus, 0.0), _CPU_DIGITS), float(gpus), 0)]
    share = cfg.cluster.trials_per_accelerator if placement == "fractional" else 1
    count = gpus * share
    per_gpu = 1.0 if share == 1 else _floor(1.0 / share, _GPU_DIGITS)
    return [Slot(node.node_id, _cpu_share(node.cpus, count), per_gpu, k) for k in range(count)]


def _oversubscribed(nodes: list[NodeInfo], want: int) -> list[Slot]:
    """Split CPU-only nodes' cores between ``want`` trials in all (at least one per node with cores)."""
    usable = [n for n in nodes if _cpu_share(n.cpus, 1) > 0]
    total = sum(n.cpus for n in usable)
    exact = [want * n.cpus / total for n in usable]
    counts = [max(1, int(x)) for x in exact]
    # Largest remainders first, so the counts add up to `want` (or more: every node gets one).
    by_remainder = sorted(range(len(usable)), key=lambda k: (counts[k] - exact[k], k))
    for k in by_remainder[: max(0, want - sum(counts))]:
        counts[k] += 1
    slots: list[Slot] = []
    for node, count in zip(usable, counts, strict=True):
        per = _cpu_share(node.cpus, count)
        while per <= 0 and count > 1:  # cores too few to split that finely
            count -= 1
            per = _cpu_share(node.cpus, count)
        slots.extend(Slot(node.node_id, per, 0.0, k) for k in range(count))
    return slots


def _round_robin(slots: list[Slot]) -> list[Slot]:
    """Interleave nodes so a concurrency cap spreads trials over the cluster."""
    by_node: dict[str, list[Slot]] = {}
    for s in slots:
        by_node.setdefault(s.node_id, []).append(s)
    out: list[Slot] = []
    lists = list(by_node.values())
    for k in range(max((len(v) for v in lists), default=0)):
        out.extend(v[k] for v in lists if k < len(v))
    return out


def _capped(slots: list[Slot], cap: int, nodes: list[NodeInfo], auto_cpus: bool) -> list[Slot]:
    """Keep ``cap`` slots spread over the nodes; with automatic sizing the kept ones share all the node's CPUs."""
    kept = _round_robin(slots)[:cap]
    if not auto_cpus:
        return kept
    cpus = {n.node_id: n.cpus for n in nodes}
    per_node: dict[str, int] = {}
    for s in kept:
        per_node[s.node_id] = per_node.get(s.node_id, 0) + 1
    out = []
    for s in kept:
        share = _cpu_share(cpus[s.node_id], per_node[s.node_id])
        out.append(Slot(s.node_id, max(share, s.cpus), s.gpus, s.index))
    return out


def _notes(nodes: list[NodeInfo], slots: list[Slot], has_gpu: bool) -> list[str]:
    notes = []
    used = {s.node_id for s in slots}
    for node in nodes:
        label = _node_label(node)
        detected = len(node.accelerators)
        if detected > int(node.gpus):
            notes.append(
                f"node {label}: {detected} GPUs detected but Ray schedules {int(node.gpus)}; "
                "start Ray there with --num-gpus (or fix CUDA_VISIBLE_DEVICES) so none stays idle"
            )
        if node.node_id in used:
            continue
        if has_gpu and node.gpus < 1:
            notes.append(f"node {label}: CPU-only node in a GPU cluster: runs no trials (left to the master)")
        elif node.cpus <= 0 and node.gpus < 1:
            notes.append(f"node {label}: no CPUs or GPUs Ray can schedule: runs no trials")
        else:
            notes.append(f"node {label}: {node.cpus:g} CPUs, fewer than one trial needs: runs no trials")
    return notes


def compile_ahead_choice(requested: bool | str, nodes: list[NodeInfo], slots: list[Slot]) -> tuple[bool, str]:
    """Whether workers compile their queued trial ahead (``train.compile_ahead``), and why.

    Compiling ahead moves a trial's compile off the device's critical path onto a host core. That
    core must be one no trial trains on: on a CPU node whose every core trains, the compile takes
    the same time from training either way (measured: benchmarks/RESULTS.md, "Compiling ahead on
    TensorFlow"), so ``auto`` compiles ahead on accelerators and where a node keeps a core free.
    """
    if requested is True or requested is False:
        return requested, "train.compile_ahead"
    if any(s.gpus > 0 for s in slots):
        return True, "trials train on accelerators; their hosts' cores compile the next ones"
    used: dict[str, float] = {}
    for s in slots:
        used[s.node_id] = used.get(s.node_id, 0.0) + s.cpus
    free = [n for n in nodes if n.node_id in used and n.cpus - used[n.node_id] >= 1]
    if free and len(free) == len(used):
        return True, "every node keeps a core no trial trains on: it compiles the next trials"
    return False, "every core trains a trial: a compile ahead would take its time from training"


def make_plan(nodes: list[NodeInfo], cfg: Config, choice: WorkloadChoice | None = None) -> Plan:
    """Decide the slots for ``nodes`` under ``cfg`` (pure: no Ray calls, so it is unit-testable).

    ``choice``: how ``cfg`` was chosen where no ``--config`` was named (the plan states it).
    """
    has_gpu = any(n.gpus >= 1 for n in nodes)
    slots: list[Slot] = []
    for node in nodes:
        if node.gpus >= 1:
            slots.extend(_gpu_slots(node, cfg))
        elif not has_gpu:
            slots.extend(_cpu_slots(node, cfg))
    want = cfg.cluster.min_concurrent_trials
    extra: list[str] = []
    if not has_gpu and nodes and len(slots) < want:
        oversubscribed = _oversubscribed(nodes, want)
        if len(oversubscribed) > len(slots):
            slots = oversubscribed
            extra.append(
                f"CPU-only cluster with room for fewer than {want} trials (cluster.min_concurrent_trials): "
                "cores are shared between trials"
            )
    cap = cfg.cluster.max_concurrent_trials
    if cap is not None and len(slots) > cap:
        slots = _capped(slots, cap, nodes, auto_cpus=cfg.cluster.cpus_per_trial == "auto")
        extra.append(f"capped at {cap} concurrent trials (cluster.max_concurrent_trials)")
    family = family_for(cfg.family)
    batch = family.default_batch(cfg, accelerators=has_gpu)
    threads = max(1, int(min((s.cpus for s in slots), default=1)))
    ahead, ahead_why = compile_ahead_choice(cfg.train.compile_ahead, nodes, slots)
    mismatch = mismatch_note(choice, has_gpu)
    if mismatch:
        extra.append(mismatch)
    return Plan(
        placement=cfg.cluster.placement if has_gpu else "per_cpu_slot",
        actors=cfg.cluster.actors,
        slots=slots,
        batch_size=batch,
        backend=cfg.model.backend,
        precision=cfg.model.precision,
        threads_per_trial=threads,
        nodes=[
            {
                "node_id": n.node_id,
                "hostname": n.hostname,
                "address": n.address,
                "cpus": n.cpus,
                "gpus": n.gpus,
                "memory_bytes": n.memory_bytes,
                "cpu_model": n.cpu_model,
                "accelerator": n.accelerator_name,
                "gpu_memory_bytes": n.gpu_memory_bytes,
            }
            for n in nodes
        ],
        notes=_notes(nodes, slots, has_gpu) + extra,
        compile_ahead=ahead,
        compile_ahead_why=ahead_why,
        workload=choice.config if choice else "",
        workload_why=choice.why if choice else "",
        trial_sizing=family.trial_sizing(cfg),
    )


def format_plan(plan: Plan) -> str:
    """Human-readable sizing, one line per node plus the totals and any notes."""
    lines = [
        f"plan: {plan.concurrency} concurrent trials on {len(plan.nodes)} node(s), placement {plan.placement}, "
        f"backend {plan.backend}, precision {plan.precision}, batch size {plan.batch_size}"
    ]
    for node in plan.nodes:
        mine = [s for s in plan.slots if s.node_id == node["node_id"]]
        acc = ""
        if node["gpus"]:
            memory = f" ({node['gpu_memory_bytes'] / 2**30:.0f} GiB)" if node["gpu_memory_bytes"] else ""
            acc = f", {node['gpus']:g}x {node['accelerator'] or 'GPU'}{memory}"
        per = "-"
        if mine:
            per = f"{mine[0].cpus:g} CPU" + (f" + {mine[0].gpus:g} GPU" if mine[0].gpus else "")
        lines.append(
            f"  node {node['hostname'] or node['node_id'][:8]}: {node['cpus']:g} CPUs"
            f"{acc}, {node['memory_bytes'] / 2**30:.1f} GiB -> {len(mine)} trial(s) x {per}"
        )
    if plan.workload:
        lines.append(f"  workload: {plan.workload} ({plan.workload_why})")
    lines.extend(f"  note: {n}" for n in plan.notes)
    if plan.trial_sizing:
        lines.append(f"  trials: {plan.trial_sizing}")
    if plan.compile_ahead_why:
        lines.append(f"  compile ahead: {'on' if plan.compile_ahead else 'off'} ({plan.compile_ahead_why})")
    return "\n".join(lines)
