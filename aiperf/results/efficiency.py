"""Efficiency: the run's OPS against its devices' Rpeak and against their measured matmul ceiling.

Computed from the ledger alone, like the rest of the summary: ``run_start.system.kinds``
holds each kind of node's devices the run trained on and their peaks at every precision,
the epochs say which precision each node computed in and how many operations it counted,
and each ``worker`` record holds the ceiling its worker measured. A figure that is not
known for every device the run used is not known for the run (a partial sum would inflate
the efficiency); the section says which device lacks it (docs/system.md).
"""

from __future__ import annotations

from collections import Counter
from typing import NotRequired, TypedDict

from aiperf.ledger.schema import (
    EpochRecord,
    NodeKindHeader,
    PeakFigureHeader,
    Record,
    RunStartRecord,
    WorkerRecord,
    of_type,
)
from aiperf.metrics.score import format_ops, format_percent
from aiperf.system.peak import arithmetic_of


class DeviceEfficiency(TypedDict):
    """One kind of device the run trained on (one kind of node's accelerators, or its CPU cores)."""

    device: str
    unit: str  # accelerator | core
    nodes: int
    devices: int  # accelerators (or physical cores) the run trained on
    precision: str
    rpeak_flops: float | None
    rpeak_per_device: float | None
    rpeak_source: str | None  # table | formula | declared
    rpeak_arithmetic: str | None
    rpeak_reference: str | None
    ceiling_flops: float | None
    workers_measured: int
    ops_per_s: float
    ops_over_rpeak: float | None
    ops_over_ceiling: float | None


class EfficiencySummary(TypedDict):
    """The summary's ``efficiency`` section."""

    ops_per_s: float
    rpeak_flops: float | None
    rpeak_sources: list[str]
    ops_over_rpeak: float | None
    ceiling_flops: float | None
    ops_over_ceiling: float | None
    by_device: list[DeviceEfficiency]
    notes: list[str]
    # OPS over slots x the steady device rate, where the summary has a device_time section
    # (aiperf.results.device_time.engine_efficiency; absent before 2026-12-07).
    engine: NotRequired[float | None]


def _ratio(ops: float, reference: float | None) -> float | None:
    return ops / reference if reference else None


class NodeEpochs:
    """What efficiency needs of the epochs, per node: operations, and how many epochs ran at each precision.

    Kept one epoch at a time (:meth:`add`), so a ledger of millions of epochs is summarised in the
    memory of its nodes, not of its epochs.
    """

    def __init__(self) -> None:
        self.ops: dict[str | None, float] = {}
        self.precisions: dict[str | None, dict[str, list[int]]] = {}  # node -> precision -> [epochs, first epoch]
        self._count = 0

    def add(self, epoch: EpochRecord) -> None:
        node = epoch.node
        self.ops[node] = self.ops.get(node, 0.0) + float(epoch.ops or 0)
        seen = self.precisions.setdefault(node, {}).setdefault(epoch.precision, [0, self._count])
        seen[0] += 1
        self._count += 1

    def counter(self, nodes: set[str]) -> Counter[str]:
        """``Counter(e.precision for e in epochs if e.node in nodes)``, its ties in the same order."""
        merged: dict[str, list[int]] = {}
        for node in nodes:
            for precision, (count, first) in self.precisions.get(node, {}).items():
                slot = merged.setdefault(precision, [0, first])
                slot[0] += count
                slot[1] = min(slot[1], first)
        return Counter({p: c for p, (c, _) in sorted(merged.items(), key=lambda item: item[1][1])})

    def ops_on(self, nodes: set[str]) -> float:
        return sum(ops for node, ops in self.ops.items() if node in nodes)


def _precision(kind: NodeKindHeader, epochs: NodeEpochs, workers: list[WorkerRecord], start: RunStartRecord) -> str:
    """What the kind's nodes computed in: their epochs' policy, else their workers', else the plan's, else float32."""
    nodes = set(kind.nodes)
    seen = epochs.counter(nodes) or Counter(w.precision for w in workers if w.node in nodes and w.precision)
    if seen:
        return str(seen.most_common(1)[0][0])
    requested = start.plan.precision
    return requested if requested and requested != "auto" else "float32"


def _ceiling(kind: NodeKindHeader, workers: list[WorkerRecord], accelerators: bool) -> tuple[float | None, int]:
    """The kind's measured ceiling: workers on one GPU share it (the best of them counts), CPU workers add up."""
    nodes = set(kind.nodes)
    measured = [w for w in workers if w.node in nodes and w.ceiling is not None and w.ceiling.flops_per_s]
    if not measured:
        return None, 0
    if not accelerators:
        return sum(float(w.ceiling.flops_per_s or 0) * w.ceiling.devices for w in measured if w.ceiling), len(measured)
    best: dict[tuple[str, str], float] = {}
    for w in measured:
        assert w.ceiling is not None
        key = (w.node or "", w.ceiling.device_ids or w.worker)
        best[key] = max(best.get(key, 0.0), float(w.ceiling.flops_per_s or 0) * w.ceiling.devices)
    return sum(best.values()), len(measured)


def _device(
    kind: NodeKindHeader, start: RunStartRecord, epochs: NodeEpochs, workers: list[WorkerRecord], wall_s: float
) -> DeviceEfficiency | None:
    accelerators = kind.used_accelerators > 0
    devices = kind.used_accelerators if accelerators else kind.used_cores
    if devices <= 0:
        return None  # none of this kind's devices trained
    precision = _precision(kind, epochs, workers, start)
    figures = kind.peaks.per_accelerator if accelerators else kind.peaks.per_core
    figure: PeakFigureHeader | None = figures.get(arithmetic_of(precision))
    name = (kind.peaks.accelerator if accelerators else kind.peaks.cpu) or "unknown device"
    nodes = set(kind.nodes)
    ops = epochs.ops_on(nodes)
    ops_per_s = ops / wall_s if wall_s > 0 else 0.0
    rpeak = devices * float(figure.flops_per_s) if figure is not None else None
    ceiling, measured = _ceiling(kind, workers, accelerators)
    return {
        "device": name,
        "unit": "accelerator" if accelerators else "core",
        "nodes": kind.count,
        "devices": devices,
        "precision": precision,
        "rpeak_flops": rpeak,
        "rpeak_per_device": float(figure.flops_per_s) if figure is not None else None,
        "rpeak_source": figure.source if figure is not None else None,
        "rpeak_arithmetic": figure.arithmetic if figure is not None else None,
        "rpeak_reference": figure.reference if figure is not None else None,
        "ceiling_flops": ceiling,
        "workers_measured": measured,
        "ops_per_s": ops_per_s,
        "ops_over_rpeak": _ratio(ops_per_s, rpeak),
        "ops_over_ceiling": _ratio(ops_per_s, ceiling),
    }


def _notes(by_device: list[DeviceEfficiency]) -> list[str]:
    notes = []
    for d in by_device:
        if d["rpeak_flops"] is None:
            notes.append(
                f"no Rpeak for {d['device']} at {d['precision']}: not in the table; a site file can declare it"
            )
        elif d["ceiling_flops"] is not None and d["ceiling_flops"] > d["rpeak_flops"]:
            notes.append(
                f"{d['device']}: the measured ceiling exceeds Rpeak ({d['rpeak_reference']}): the device ran"
                " faster than the clock or arithmetic Rpeak assumes"
            )
    return notes


def efficiency_summary(records: list[Record], ops_per_s: float, wall_s: float) -> EfficiencySummary:
    """OPS over Rpeak and over the measured ceiling, for the run and per kind of device it trained on."""
    start = records[0]
    assert isinstance(start, RunStartRecord)  # summarize checked it
    epochs = NodeEpochs()
    for epoch in of_type(records, EpochRecord):
        epochs.add(epoch)
    last: dict[str, WorkerRecord] = {}
    for w in of_type(records, WorkerRecord):
        last[w.worker] = w  # a worker's last record states its life
    return efficiency_of(start, epochs, list(last.values()), ops_per_s, wall_s)


def efficiency_of(
    start: RunStartRecord, epochs: NodeEpochs, workers: list[WorkerRecord], ops_per_s: float, wall_s: float
) -> EfficiencySummary:
    """:func:`efficiency_summary` from the epochs per node and each worker's last record (a streaming reader's)."""
    by_device = [d for k in start.system.kinds if (d := _device(k, start, epochs, workers, wall_s)) is not None]
    notes = _notes(by_device)
    if not start.system.kinds:
        notes.append("the ledger records no measured system (written before 2026-11-25, or a simulated run)")
    known_peak = bool(by_device) and all(d["rpeak_flops"] is not None for d in by_device)
    known_ceiling = bool(by_device) and all(d["ceiling_flops"] is not None for d in by_device)
    rpeak = sum(d["rpeak_flops"] or 0.0 for d in by_device) if known_peak else None
    ceiling = sum(d["ceiling_flops"] or 0.0 for d in by_device) if known_ceiling else None
    return {
        "ops_per_s": ops_per_s,
        "rpeak_flops": rpeak,
        "rpeak_sources": sorted({d["rpeak_source"] for d in by_device if d["rpeak_source"]}),
        "ops_over_rpeak": _ratio(ops_per_s, rpeak),
        "ceiling_flops": ceiling,
        "ops_over_ceiling": _ratio(ops_per_s, ceiling),
        "by_device": by_device,
        "notes": notes,
    }


def format_efficiency(e: EfficiencySummary | None) -> str:
    """One line: OPS / Rpeak and OPS / measured ceiling, with the figures and where Rpeak comes from."""
    if not e:
        return "- (not recorded)"
    if not e["by_device"]:
        return f"- ({'; '.join(e['notes']) or 'no device trained'})"
    rpeak = (
        f"{format_percent(e['ops_over_rpeak'])} of Rpeak {format_ops(e['rpeak_flops'], 'FLOP/s')}"
        f" ({', '.join(e['rpeak_sources'])}, dense)"
        if e["rpeak_flops"]
        else "Rpeak unknown"
    )
    ceiling = (
        f"{format_percent(e['ops_over_ceiling'])} of the measured matmul ceiling "
        f"{format_ops(e['ceiling_flops'], 'FLOP/s')}"
        if e["ceiling_flops"]
        else "ceiling not measured"
    )
    devices = "; ".join(f"{d['devices']} x {d['device']} ({d['unit']}s) at {d['precision']}" for d in e["by_device"])
    notes = "".join(f"; note: {n}" for n in e["notes"])
    return f"{rpeak}; {ceiling}" + (f"; {devices}" if devices else "") + notes
