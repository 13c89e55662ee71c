"""What the cluster has, node by node: CPUs, accelerators and memory.

Ray's resource view gives what Ray will *schedule* (CPU and GPU counts); a tiny probe task
pinned to each node adds what only the node itself knows: accelerator model and memory
from nvidia-smi (none without a driver: a CPU-only node), CPU model and host memory. The
plan sizes concurrency from Ray's counts — a worker can only get what Ray schedules — and
uses the probe to size batches and to warn about accelerators Ray does not schedule.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from aiperf.training.backend import NvidiaGpu

logger = logging.getLogger(__name__)

ACCELERATOR_TYPE_PREFIX = "accelerator_type:"  # Ray's per-node resource naming the GPU model


@dataclass
class NodeInfo:
    """One alive node of the cluster."""

    node_id: str
    address: str
    cpus: float  # CPUs Ray schedules on this node
    gpus: float  # GPUs Ray schedules on this node
    memory_bytes: int  # host memory (the node's total when probed, else Ray's schedulable memory)
    hostname: str = ""
    cpu_model: str = ""
    accelerators: list[NvidiaGpu] = field(default_factory=list)  # nvidia-smi rows, all the node has
    resources: dict[str, float] = field(default_factory=dict)
    is_head: bool = False
    description: dict[str, object] = field(default_factory=dict)  # aiperf.system.node.NodeDescription, when probed

    @property
    def gpu_memory_bytes(self) -> int:
        return min((a.get("memory_bytes", 0) for a in self.accelerators), default=0)

    @property
    def accelerator_name(self) -> str:
        if self.accelerators:
            return str(self.accelerators[0]["name"])
        for key in self.resources:
            if key.startswith(ACCELERATOR_TYPE_PREFIX):
                return key[len(ACCELERATOR_TYPE_PREFIX) :]
        return ""

    def to_dict(self) -> dict[str, object]:
        """What the ledger's ``system.nodes`` holds (the full description is recorded once per kind of node)."""
        data = asdict(self)
        del data["description"]
        return data


class RayNode(TypedDict, total=False):
    """One entry of ``ray.nodes()``, the keys read here (``ray_session.gcs_nodes`` lists the same)."""

    NodeID: str
    Alive: bool
    NodeManagerAddress: str
    NodeManagerHostname: str
    Resources: dict[str, float]


def probe_this_node(backend: str = "") -> dict[str, Any]:  # typed otherwise, Ray's stubs see a task of no arguments
    """Facts only the node itself can tell (runs on the node, as a Ray task or locally).

    ``description`` is the full measured description (:mod:`aiperf.system.node`) that
    ``aiperf system`` writes and ``run_start`` records, once per kind of node.
    """
    import psutil

    from aiperf.system.node import describe_node
    from aiperf.training.backend import cpu_model, nvidia_gpus

    try:
        description: dict[str, object] = describe_node(backend).to_dict()
    except Exception as exc:  # a node that cannot describe itself is still planned from the facts below
        logger.debug("node description failed: %s", exc)
        description = {}
    return {
        "description": description,
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "physical_cores": psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        "memory_bytes": psutil.virtual_memory().total,
        "accelerators": nvidia_gpus(),
        "platform": platform.platform(),
    }


def node_from_ray(raw: RayNode) -> NodeInfo:
    """A :class:`NodeInfo` from one entry of ``ray.nodes()`` (counts only, before any probe)."""
    res = raw.get("Resources", {}) or {}
    return NodeInfo(
        node_id=raw["NodeID"],
        address=raw.get("NodeManagerAddress", ""),
        cpus=float(res.get("CPU", 0)),
        gpus=float(res.get("GPU", 0)),
        memory_bytes=int(res.get("memory", 0)),
        hostname=raw.get("NodeManagerHostname", "") or "",
        resources={k: float(v) for k, v in res.items() if not k.startswith("node:")},
        is_head="node:__internal_head__" in res,
    )


def apply_probe(node: NodeInfo, facts: Mapping[str, Any]) -> None:
    """Fold a node's own report into what Ray said about it."""
    node.hostname = facts.get("hostname") or node.hostname
    node.cpu_model = facts.get("cpu_model", "")
    node.accelerators = list(facts.get("accelerators") or [])
    node.description = dict(facts.get("description") or {})
    if facts.get("memory_bytes"):
        node.memory_bytes = int(facts["memory_bytes"])


def cluster_nodes(probe: bool = True, timeout_s: float = 60.0, backend: str = "") -> list[NodeInfo]:
    """Alive nodes from Ray, head first; each enriched by an on-node probe when ``probe``
    (``backend``: the Keras backend the run uses, named in each node's description).

    A node whose probe does not answer within ``timeout_s`` (busy, or dying) keeps Ray's
    counts: it is still planned, just without accelerator details.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [node_from_ray(raw) for raw in ray.nodes() if raw.get("Alive")]
    if probe and nodes:
        task = ray.remote(num_cpus=0)(probe_this_node)
        refs = [
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)).remote(backend)
            for n in nodes
        ]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for ref in pending:
            try:
                ray.cancel(ref, force=True)
            except Exception as exc:  # the probe finished or its node died meanwhile
                logger.debug("cancelling a node probe: %s", exc)
        for n, ref in zip(nodes, refs, strict=True):
            if ref not in ready:
                continue
            try:
                facts = ray.get(ref)
            except Exception as exc:  # a probe that fails leaves the node described by Ray's counts only
                logger.debug("probe of node %s failed: %s", n.node_id, exc)
                continue
            apply_probe(n, facts)
    nodes.sort(key=lambda n: (not n.is_head, n.node_id))
    return nodes
