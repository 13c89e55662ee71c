"""Kinds of node: identical nodes described once, with their count.

A cluster of 4,096 identical nodes is one description and a list of node ids, not 4,096
copies; a heterogeneous cluster has one kind per distinct configuration. Two nodes are of
one kind when everything but their name and identity agrees (host memory to the GiB, since
firmware reservations differ by megabytes between identical machines).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from aiperf.system.node import NodeDescriptionDict

IDENTITY = ("hostname",)
ACCELERATOR_IDENTITY = ("index", "pci_bus_id")


@dataclass
class NodeKind:
    """Identical nodes: how many, which, and the description they share (without a hostname)."""

    count: int
    nodes: list[str]  # Ray node ids (a run) or hostnames (``aiperf system``)
    hostnames: list[str]
    description: NodeDescriptionDict
    used_accelerators: int = 0  # of this kind's accelerators, those a run trains on (a run only)
    used_cores: int = 0  # physical cores a run trains on, on its CPU-only nodes of this kind (a run only)
    # aiperf.system.peak.device_peaks; untyped values: its readers index it by a computed key (per_accelerator
    # or per_core)
    peaks: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _shared(description: NodeDescriptionDict) -> dict[str, object]:
    """The part of a node's description that identical nodes share."""
    out = {k: v for k, v in description.items() if k not in IDENTITY}
    out["memory_bytes"] = round((description.get("memory_bytes") or 0) / 2**30) * 2**30
    out["accelerators"] = [
        {k: v for k, v in a.items() if k not in ACCELERATOR_IDENTITY} for a in description.get("accelerators") or []
    ]
    return out


def group_nodes(described: Sequence[tuple[str, Mapping[str, object]]]) -> list[NodeKind]:
    """``(node id, NodeDescription.to_dict())`` pairs grouped into kinds, in order of first appearance."""
    kinds: dict[str, NodeKind] = {}
    for node_id, raw in described:
        description = cast(NodeDescriptionDict, raw)  # as the node's NodeDescription.to_dict() wrote it
        shared = _shared(description)
        key = json.dumps(shared, sort_keys=True, default=str)
        kind = kinds.get(key)
        if kind is None:
            first = cast(NodeDescriptionDict, {k: v for k, v in description.items() if k not in IDENTITY})
            kinds[key] = NodeKind(1, [node_id], [str(description.get("hostname", ""))], first)
        else:
            kind.count += 1
            kind.nodes.append(node_id)
            kind.hostnames.append(str(description.get("hostname", "")))
    return list(kinds.values())


def attach_usage(kinds: list[NodeKind], slots: Sequence[tuple[str, float, float]]) -> None:
    """Set each kind's devices a run trains on, from its plan's ``(node id, CPUs, GPUs)`` slots.

    A GPU node counts the accelerators its slots hold (fractional slots rounded up to whole
    devices); a CPU-only node counts physical cores, at most one per CPU Ray gives its slots.
    """
    per_node: dict[str, tuple[float, float]] = {}
    for node_id, cpus, gpus in slots:
        c, g = per_node.get(node_id, (0.0, 0.0))
        per_node[node_id] = (c + cpus, g + gpus)
    for kind in kinds:
        devices = len(kind.description.get("accelerators") or [])
        cores = int((kind.description.get("cpu") or {}).get("cores") or 0)
        kind.used_accelerators, kind.used_cores = 0, 0
        for node_id in kind.nodes:
            cpus, gpus = per_node.get(node_id, (0.0, 0.0))
            if gpus > 0:
                whole = math.ceil(round(gpus, 6))
                kind.used_accelerators += min(devices or whole, whole)
            elif cpus > 0:
                whole = math.ceil(round(cpus, 6))
                kind.used_cores += min(cores or whole, whole)
